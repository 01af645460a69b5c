"""The report's sections, in the one order the report shows them (``SECTIONS``): what a porting
engineer came for first (the verdicts, what changed since the baseline, whose failures they are,
whether the passes are right, the failure modes), then the breakdowns, the legend, and last how the
report is made.

A section is a heading, a short paragraph saying what it shows, and its HTML from the tables
(``analysis.report_tables``); a section whose HTML is "" is left out (the execution modes of a sweep
without a matrix). The report notebook shows ``report_parts`` one after another, so a new section
(the operators to implement next, what changed the verdicts) is one ``Section`` inserted where it
belongs here.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import polars as pl

from . import charts, modes_section, ops, perf_section, sections, stacks_section, what_if_section
from .html import charted_model_types, legend_html, models_html, table_html, unprobed_html


@dataclass(frozen=True)
class Context:
    """What every section renders from: the report's tables, the sweep and its baseline ("" or
    None: none)."""

    tables: dict[str, pl.DataFrame]
    sweep_id: str
    baseline_sweep_id: str | None


def _device_time(ctx: Context) -> str:
    """One line: how the devices were used (held-idle share, utilisation; ``sweep.device_time``),
    or ""."""
    from ..sweep.device_time import sentence

    used = ctx.tables.get("device_time")
    if used is None or used.is_empty():
        return ""
    return f'<p class="ms-note">{html.escape(sentence(used.row(0, named=True)).capitalize())}.</p>'


@dataclass(frozen=True)
class Section:
    """One section: ``anchor`` (its heading's id), ``title``, ``intro`` (HTML; "" for none) and
    ``render``. ``title`` None: ``render`` writes its own heading (and says "" when there is
    nothing to show)."""

    anchor: str
    title: str | None
    intro: str
    render: Callable[[Context], str]


def _chart(chart, name: str) -> str:
    return charts.chart_html(chart, name)


def _verdicts(ctx: Context) -> str:
    tables = ctx.tables
    unit = "runs (model x variant)" if tables["variant_stats"].height > 1 else "models"
    return (
        f'<div class="ms-row">{_chart(charts.verdict_chart(tables["verdicts"], unit), "verdicts")}'
        f"{table_html(tables['verdicts'])}</div>"
        + table_html(tables["excluded"], empty="No model was excluded from this sweep.")
    )


def _breakdowns(ctx: Context) -> str:
    tables = ctx.tables
    charted, note = charted_model_types(tables["by_model_type"])
    parts = [
        _chart(charts.rate_chart(tables["by_task"], "task", title="Pass rate by task"), "by-task"),
        table_html(tables["by_task"]),
    ]
    if charted.height:
        parts.append(_chart(charts.rate_chart(charted, "model_type"), "by-model-type"))
    parts += [
        note,
        _chart(
            charts.rate_chart(tables["by_size"], "size_bucket", title="Pass rate by model size"),
            "by-size",
        ),
        table_html(tables["by_size"]),
        table_html(tables["by_model_type"], max_rows=50),
    ]
    return "".join(parts)


def _memory(ctx: Context) -> str:
    by_size = ctx.tables["memory_by_size"]
    chart = (
        _chart(charts.memory_chart(by_size), "memory")
        if by_size.height
        else '<p class="ms-note">No peak memory was recorded in this sweep.</p>'
    )
    return chart + table_html(ctx.tables["memory"])


def _history(ctx: Context) -> str:
    """Pass rate over sweeps, and by stack version where a component's version changed (a chart
    of one version per component would repeat the pass rate), then both tables."""
    tables = ctx.tables
    by_version = charts.version_chart(tables["by_version"])
    return (
        _chart(charts.history_chart(tables["history"]), "history")
        + (
            _chart(by_version, "by-version")
            if by_version is not None
            else '<p class="ms-note">Every sweep ran the same version of each stack component: no chart by '
            "version (the table below lists them).</p>"
        )
        + table_html(tables["by_version"], max_rows=200)
        + table_html(tables["history"].reverse(), max_rows=100)
    )


def _about(ctx: Context) -> str:
    return (
        '<p class="ms-note">Rendered by <code>model_support.render.report.render_report</code>, which executes '
        "<code>notebooks/report.ipynb</code> (kept beside this page as <code>reports/&lt;sweep_id&gt;.ipynb</code>) "
        "and turns it into this self-contained page with nbconvert; the tables come from "
        "<code>model_support.analysis</code>, which is where the logic (and its tests) live; the sections, in this "
        "order, are declared in <code>model_support.render.layout.SECTIONS</code>. The page needs no network: the "
        "chart library is inlined once.</p>"
    )


#: The lists of the known-and-new-failures section (``analysis.expectations.standing``'s kinds):
#: anchor, heading.
_STANDING_LISTS = {
    "new failure": ("new-failures", "New failures (not expected)"),
    "known failure": ("known-failures", "Known failures (expected, with their reason)"),
    "flaky": ("flaky", "Flaky (the rerun gave another verdict: not counted as a change)"),
    "unexpectedly passing": (
        "unexpectedly-passing",
        "Unexpectedly passing: remove the expectation",
    ),
    "expired expectation": ("expired-expectations", "Expired expectations: renew or remove them"),
}


def _standing(ctx: Context) -> str:
    """Known failures (the sweep definition's ``expect:``, with their reason) apart from new
    ones, the flaky runs, the expectations to remove or renew, and the models that flipped or
    keep failing; "" when none of it applies."""
    from ..analysis.history import streak_words

    table, streaks = ctx.tables.get("expectations"), ctx.tables.get("streaks")
    parts = []
    if table is not None and table.height and set(table["kind"]) - {"new failure"}:
        for kind, (anchor, heading) in _STANDING_LISTS.items():
            rows = table.filter(pl.col("kind") == kind).drop("kind")
            if rows.height:
                parts.append(
                    f'<h3 id="{anchor}">{html.escape(heading)} '
                    f"({rows.height})</h3>{table_html(rows)}"
                )
    if streaks is not None and streaks.height:
        labels = (
            dict(ctx.tables["sweeps"].select("sweep_id", "label").rows())
            if "sweeps" in ctx.tables
            else {}
        )
        words = streaks.select(
            "model_id",
            "variant",
            pl.Series("history", [streak_words(r, labels) for r in streaks.iter_rows(named=True)]),
        )
        parts.append(f'<h3 id="flips-and-streaks">Flips and streaks</h3>{table_html(words)}')
    if not parts:
        return ""
    return (
        '<h2 id="known-and-new-failures">Known and new failures</h2><p>The failures the sweep definition expects '
        "(<code>expect:</code>) are known; the others are new. A run whose verdict differed from the baseline's was "
        "rerun before it counted: one whose attempts disagree is flaky, neither new nor known.</p>"
        + "".join(parts)
    )


SECTIONS: tuple[Section, ...] = (
    Section(
        "verdicts",
        "Verdicts",
        "Excluded models are not failures: they are counted apart and are not in the pass rate.",
        _verdicts,
    ),
    Section(
        "changes-since-the-baseline",
        "Changes since the baseline",
        "One list per kind of change, newly broken by the stack first (the CPU reference "
        "passes: the stack's regression), then newly suspect (a PASS whose logits now diverge "
        "from the reference, or with no reference whose text is not fluent), then newly "
        "failing with no attribution, then newly failing everywhere (usually a transformers "
        "or checkpoint change).",
        lambda ctx: sections.changes_html(ctx.tables, ctx.sweep_id, ctx.baseline_sweep_id),
    ),
    Section(
        "whose-failures",
        "Whose failures",
        "Every failure at load, template, compile or generate is rerun once on the CPU "
        "reference: the <b>stack's</b> when the reference passes (what a porting team fixes), "
        "the <b>model's</b> when it fails the same way there (broken everywhere), <b>both</b> "
        "when it fails differently, <b>unknown</b> when no rerun was possible. The pass rate "
        "on the stack leaves the models' own failures out of the denominator.",
        lambda ctx: sections.whose_html(ctx.tables),
    ),
    Section("known-and-new-failures", None, "", lambda ctx: _standing(ctx)),
    Section(
        "is-a-pass-right",
        "Is a PASS right?",
        "A PASS says the model ran. Each PASS is also checked, without changing its verdict: "
        "where the CPU reference can run, its logits, teacher-forced on the device's own "
        "tokens, against the device's step by step (<b>agrees</b>; <b>agrees within ties</b>: "
        "flips only where the reference's best tokens are within the margin; <b>diverges</b>: "
        "a token the reference does not consider close, or distributions apart beyond the "
        "bound); where no reference can run (too big for the host, sharded), a small language "
        "model judges whether the text is fluent. Suspect passes come first, with the step "
        "where the device diverges (docs/numerics.md).",
        lambda ctx: sections.checks_html(ctx.tables),
    ),
    Section(
        "failure-signatures",
        "Failure signatures",
        "The failure modes, the one that affects the most models first: the error with its "
        "volatile parts replaced, whose failures they are, whether the baseline had it, three "
        "example models, and one full message and traceback. One table for every task: in a "
        "sweep of both tasks, a signature says its task when only one task has it (else all).",
        lambda ctx: sections.signatures_html(ctx.tables, ctx.baseline_sweep_id),
    ),
    Section(
        "what-to-implement-next",
        "What to implement next",
        "From the operator census of each probe (the operators it dispatched to its device, "
        "composite operators decomposed) and the wrong operators <code>model-support "
        "localise</code> named in this sweep: the operators to implement or fix in the order "
        "that unlocks the most models (a model is unlocked by the step that gives its last "
        "missing or wrong operator; a diverging PASS not localised yet is said with the "
        "command that localises it), each model's standing, the operators the stack runs on "
        "the CPU (fallbacks), the most-run first, and what the stack gained or lost since the "
        "baseline. <code>model-support ops SWEEP_ID</code> prints the same plan and predicts "
        "the verdicts on another stack (docs/ops.md).",
        lambda ctx: ops.implement_next_html(ctx.tables),
    ),
    Section(
        "what-if",
        "What if",
        "The plan proven by running (<code>model-support ops SWEEP_ID --prove</code>): each "
        "step's operators, with the earlier steps', on the host of the sweep's device "
        "(what-if sweeps: kept apart, never the stack's verdicts), over the models the step "
        "unlocks; confirmed when each PASSes and agrees with the CPU reference, else not "
        "confirmed with why (an operator the census did not see, wrong numbers). Then the "
        "models that run with operators on the host, which, and how often per token "
        "(docs/ops.md).",
        lambda ctx: what_if_section.what_if_html(ctx.tables, ctx.sweep_id),
    ),
    Section("execution-modes", None, "", lambda ctx: modes_section.modes_html(ctx.tables)),
    Section("stacks", None, "", lambda ctx: stacks_section.stacks_html(ctx.tables)),
    Section("devices-and-parallelism", None, "", lambda ctx: sections.devices_html(ctx.tables)),
    Section(
        "not-probed",
        "Not probed (pending)",
        "Models the sweep listed but has no row for: the network or the disk kept them from "
        "being probed (with their last error), or the sweep has not reached them yet (still "
        "running, or stopped). None of them is a failure: no verdict, not in the pass rate, "
        "not in the diff.",
        lambda ctx: unprobed_html(ctx.tables, ctx.sweep_id),
    ),
    Section(
        "every-model",
        "Every model",
        "Every run of this sweep, PASS included: its verdict, whose failure it is, what its "
        "check says (a PASS's logits against the CPU reference, else the judge's fluency), "
        "its size, tokens, times and peak memory, its record and how to reproduce it. Click a "
        "heading to sort by it (again: the other way); type in the box to keep the rows that "
        "hold every word typed.",
        lambda ctx: models_html(ctx.tables, ctx.sweep_id),
    ),
    Section(
        "pass-rate-by-task-model-type-and-size",
        "Pass rate by task, model type and size",
        "The tasks: text-generation (a prompt) and image-text-to-text (the probe image and a "
        "prompt, through the model's processor); a row older than the task column reads as "
        "text-generation. By size, the models that failed before loading (at download or "
        "load: no parameters counted) are a group of their own, apart from the ones of "
        "unknown size.",
        _breakdowns,
    ),
    Section(
        "tokens",
        "Tokens",
        "<code>tokens_in</code> counts the prompt after the chat template (for an "
        "image-text-to-text model the whole input, the image's tokens included); "
        "<code>image_tokens</code> the image's share of it; <code>tokens_out</code> the "
        "tokens generated beyond it. Sweeps that predate these columns show a count of 0.",
        lambda ctx: table_html(ctx.tables["tokens"]),
    ),
    Section(
        "timings",
        "Timings",
        "",
        lambda ctx: (
            _chart(charts.timing_chart(ctx.tables["timing_histogram"]), "timings")
            + table_html(ctx.tables["timings"])
            + _device_time(ctx)
        ),
    ),
    Section(
        "performance",
        "Performance",
        "Every PASS timed on its device (the perf phase: on a device with a clock of its own "
        "the verdict's own generation is its warm-up and, in eager and fused modes, gives "
        "TPOT; on the host's clock a warm-up of its own runs first; then repeats of "
        "<code>perf_tokens</code> new tokens (at least 4 where they give TPOT, 16 on the CPU) "
        "until TPOT's spread is within <code>perf_spread</code>, or the phase would pass "
        "<code>perf_budget</code> of the probe's device time or half the time the probe had "
        "left, or <code>perf_repeats</code> ran; the table says how many ran and why they "
        "stopped): TTFT (the prompt's prefill and first token) and TPOT (per token after it) "
        "as medians, ± half their spread over the repeats; tokens/s over a whole generation; "
        "the first call, compilation included; the peak device memory; the share of the "
        "device's declared memory bandwidth a decode step reaches (parameters and KV cache "
        "read per token); the operators that took longest in the verdict's generation where "
        "they were timed. Against the baseline, a run counts as slower or faster when a "
        "median of two like runs moved by more than 5% and beyond the repeats' noise "
        "(<code>model-support diff --fail-on perf</code>).",
        lambda ctx: perf_section.perf_html(ctx.tables),
    ),
    Section(
        "host-cost",
        "What a PASS costs the host",
        "PASS runs whose decode tokens each wait on the device more than once (device-to-host "
        "syncs: <code>.item()</code>, copies to the host; generate's own end-of-sequence "
        "check is one) or run an operator on the CPU (fallbacks), as the stack's backend "
        "counted them in the verdict's generation, the prompt's prefill apart and the probe's "
        "own syncs apart (harness). Stacks that keep no such counts say <code>not "
        "measured</code> in <code>host_cost_note</code>.",
        lambda ctx: table_html(
            ctx.tables["host_cost"],
            empty="No PASS syncs more than once or falls back to the CPU per token.",
        ),
    ),
    Section(
        "peak-memory",
        "Peak memory",
        "Host and device memory on their own scales: a device's peak of a few MB stays "
        "visible beside a host's of hundreds.",
        _memory,
    ),
    Section(
        "cpu-reference-agreement",
        "CPU reference agreement",
        "",
        lambda ctx: (
            _chart(charts.reference_chart(ctx.tables["reference"]), "reference")
            + table_html(ctx.tables["reference"])
        ),
    ),
    Section(
        "history-across-sweeps",
        "History across sweeps",
        "Pass rate per sweep, coloured by each stack component's version: a regression shows "
        "as a step where the colour changes.",
        _history,
    ),
    Section("legend", "Legend", "", lambda ctx: legend_html()),
    Section("about-this-report", "About this report", "", _about),
)


def section_html(section: Section, ctx: Context) -> str:
    """One section as HTML (heading, intro, body), or "" when it has nothing to show."""
    body = section.render(ctx)
    if not body or section.title is None:
        return body
    intro = f'<p class="ms-intro">{section.intro}</p>' if section.intro else ""
    return f'<h2 id="{section.anchor}">{html.escape(section.title)}</h2>{intro}{body}'


def report_parts(
    tables: dict[str, pl.DataFrame], sweep_id: str, baseline_sweep_id: str | None
) -> Iterator[str]:
    """Every section of the report that has something to show, in ``SECTIONS`` order."""
    ctx = Context(tables, sweep_id, baseline_sweep_id or None)
    for section in SECTIONS:
        part = section_html(section, ctx)
        if part:
            yield part
