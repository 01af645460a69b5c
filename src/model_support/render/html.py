"""The report's HTML pieces: data tables, the header facts (with whose failures they are), the
models not probed, the legend. The sections a porting team acts on (the split, failure modes, the
diff) are in ``sections``; the execution modes in ``modes``."""

from __future__ import annotations

import dataclasses
import html
import math
import shlex
from datetime import date, datetime
from urllib.parse import quote

import polars as pl

from .. import analysis
from ..analysis import unprobed_models
from ..analysis.tables import NOT_LOADED
from ..display import (
    Cell,
    html_table,
    show_html,  # the report notebook shows its sections with html.show_html
)
from ..probe.signatures import portable_paths
from ..record import schema
from .charts import chart_html

#: What the report's other terms mean (the verdicts and stages come from ``schema``).
TERM_HELP = {
    "excluded": "left out on purpose (not a text-generation model, too large, listed in params, or the "
    "whole sweep after the fact); never counted as a failure",
    **unprobed_models.UNPROBED_HELP,
    "failure signature": "the error type plus the message with volatile parts (numbers, paths, ids, names) "
    "replaced by placeholders: same cause, same signature",
    "pass rate": "PASS / models probed in the sweep (excluded, not probed and not tested models are not in "
    "the denominator)",
    "pass rate on the stack": "PASS / (models probed - failures attributed to the model): a model that fails the same "
    "way on the CPU reference (broken everywhere) is not counted against the stack; both and "
    "unknown failures still are",
    "whose failure (attribution)": "each failure at load, template, compile or generate is rerun once on the CPU reference: "
    "stack, model, both or unknown (see Attribution below)",
    "CPU agreement": "every step's top token agrees with the CPU reference, teacher-forced on the device's "
    "tokens (the reference would have generated the same tokens): match, mismatch, or not run "
    "(switched off, above the size limit, or no generation)",
    "newly suspect / no longer suspect": "a PASS whose check is suspect now (its logits diverge from the reference, or with no "
    "reference its text is not fluent) that was no suspect PASS in the baseline (listed after "
    "what the stack newly broke) / a suspect PASS in the baseline that is a clean PASS now",
    "newly broken by the stack": "PASS in the baseline and a FAIL now that the CPU reference passes: the stack's "
    "regression, what a porting team fixes (listed first)",
    "newly failing everywhere": "PASS in the baseline and a FAIL now that the CPU reference fails too (attribution model "
    "or both): usually a transformers or checkpoint change, not the stack's",
    "newly failing / newly passing": "PASS in the baseline and a FAIL now with no attribution recorded (no reference rerun) / "
    "a FAIL in the baseline and PASS now",
    "status changed / signature changed": "failing in both sweeps, with a different verdict / the same verdict but a different "
    "failure signature",
    "added / removed": "probed in only one of the two sweeps (a model not probed now is left out, not removed)",
    "vanished / not run / flaky / excluded / dropped": "the gate's words (docs/dataset.md): a verdict in the baseline and no row now with "
    "nothing to say why; still to run; passed once among its attempts; excluded in either "
    "sweep (the environment's doing, counted in neither direction); left out of this sweep's "
    "definition",
    "first_token_s": "time to the first generated token, including compilation",
    "variant": "a run's execution mode, KV cache and new-token count when not 8 (eager+dynamic, "
    "compile+static, eager+dynamic+32t); a sweep with a matrix probes each model in several, "
    "and then every count is of runs (model-variant pairs); older sweeps read as eager+dynamic",
    "new (failure signature)": "not among the baseline sweep's failure signatures",
    "devices (devices_used)": "how many devices the probe ran on; older records read as 1",
    "parallelism": "how the model was split over its devices: none (one device, or no plan), tp (tensor "
    "parallel: every weight cut across tp_size devices) or ep (expert parallel: whole experts "
    "on each of ep_size devices)",
}


#: What each size group of the breakdowns means (``analysis.tables.SIZE_GROUPS``).
SIZE_HELP = {
    **{b: b for b in analysis.SIZE_BUCKETS},
    "unknown": "num_params not recorded (the model loaded, or failed after loading)",
    NOT_LOADED: "failed at download or load, before its parameters could be counted: apart from unknown, "
    "so a size's pass rate is of models that ran",
}

FOLDED = ("error_message", "traceback", "repro_script")


def _cell(value, column: str) -> Cell:
    """One table cell: rates as percentages, numbers right-aligned (class ``num``), lists one
    item a line, long or multi-line text (a message, a traceback) folded under its first line."""
    if value is None:
        return Cell("")
    if isinstance(value, bool):
        return Cell(str(value).lower())
    if isinstance(value, float):
        if column in ("pass_rate", "share"):
            return Cell(f"{100 * value:.1f}%", cls="num")
        return Cell(f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}", cls="num")
    if isinstance(value, int):
        return Cell(f"{value:,}", cls="num")
    if isinstance(value, (list, tuple)):
        return Cell(lines=[str(v) for v in value])
    if isinstance(value, datetime):
        return Cell(value.strftime("%Y-%m-%d %H:%M UTC"))
    if isinstance(value, date):
        return Cell(value.isoformat())
    text = str(value)
    if column in FOLDED or "\n" in text or len(text) > 160:
        lines = text.strip().splitlines() or [""]
        if column == "traceback":  # the files it names, not the machine that ran them
            text = portable_paths(text) or ""
            first = f"traceback ({len(lines)} lines)"
        else:
            first = lines[0][:80] + ("…" if len(lines) > 1 or len(lines[0]) > 80 else "")
        return Cell(text, fold=first)
    return Cell(text)


def table_html(df: pl.DataFrame, *, max_rows: int = 100, empty: str = "none") -> str:
    """A small DataFrame as a plain HTML table (``display.html_table``): rates as percentages,
    long text folded."""
    if df.height == 0:
        return f'<p class="ms-note">{html.escape(empty)}</p>'
    rows = (
        [_cell(value, column) for column, value in row.items()]
        for row in df.head(max_rows).iter_rows(named=True)
    )
    more = (
        f'<p class="ms-note">{df.height - max_rows} more rows not shown.</p>'
        if df.height > max_rows
        else ""
    )
    return html_table(df.columns, rows, cls="ms-table") + more


def _percent(rate) -> str:
    return f"{100 * rate:.1f}%" if rate is not None else "-"


def tasks_text(by_task: pl.DataFrame) -> str:
    """The pass rate of each task the sweep probed: "text-generation 80.0% (28 of 35);
    image-text-to-text ..."."""
    parts = [
        f"{r['task']} {_percent(r['pass_rate'])} ({r['passed']:,} of {r['models']:,})"
        for r in by_task.iter_rows(named=True)
    ]
    return "; ".join(parts) or "-"


def split_html(attribution: pl.DataFrame) -> str:
    """Whose failures, inline: "3 failures: stack 1, model 1, both 0, unknown 1" (each in its own
    span)."""
    counts = dict(attribution.select("attribution", "count").rows())
    total = sum(counts.values())
    spans = ", ".join(
        f'<span class="ms-attr ms-attr-{k}">{html.escape(k)} {counts.get(k, 0):,}</span>'
        for k in analysis.ATTRIBUTION_KINDS
    )
    return f'<span class="ms-split">{total:,} failure{"s" if total != 1 else ""}: {spans}</span>'


def header_html(
    tables: dict[str, pl.DataFrame], sweep_id: str, baseline_sweep_id: str | None
) -> str:
    """The report's opening facts: the sweep, when, where, with what stack, and its headline
    numbers: whose failures they are (the stack's, the models', both, unknown), both pass rates,
    the suspect passes and the pass rate of each task."""
    sweeps = tables["sweeps"].filter(pl.col("sweep_id") == sweep_id).row(0, named=True)
    history = tables["history"].filter(pl.col("sweep_id") == sweep_id)
    versions = history.row(0, named=True) if history.height else {}
    summary = tables["summary"].row(0, named=True)
    rate = summary["pass_rate"]
    variants = tables["variant_stats"].height
    facts = {
        "sweep": sweep_id,
        "created": sweeps["created_at"].strftime("%Y-%m-%d %H:%M UTC")
        if sweeps["created_at"]
        else "unknown",
        "device": sweeps["device_type"] or "unknown",
        "host": sweeps["host"] or "unknown",
        "stack": ", ".join(f"{c} {versions.get(c) or '-'}" for c in analysis.VERSION_COMPONENTS),
    }
    # operators on the host: these runs are no verdict of the stack, said first
    if "what_if" in tables:
        facts["what-if"] = (
            "operators on the host's CPU kernels (host_ops: "
            f"{tables['what_if']['host_ops'][0]}): these runs are no verdict of the stack; "
            "they are kept apart (the what_if config), and no gate, export or support card "
            "counts them"
        )
    # the backend's own configuration is part of the stack (sections.add_bisect)
    if "settings" in tables:
        facts["backend settings"] = tables["settings"]["settings"][0]
    # sections.add_bisect
    packages = tables["packages"]["packages"][0] if "packages" in tables else ""
    if packages and baseline_sweep_id:  # what differs from the baseline's stack (sweep.json)
        facts["against the baseline"] = packages
    if variants > 1:
        models = tables["verdict_grid"].height
        facts["runs probed (model x variant)"] = (
            f"{summary['models']:,} ({models:,} models, {variants} variants)"
        )
    else:
        facts["models probed"] = f"{summary['models']:,}"
    raw = {"failures (whose)": split_html(tables["attribution"])}
    facts["failures (whose)"] = ""
    facts["passed (pass rate)"] = (
        f"{summary['passed']:,} ({100 * rate:.1f}%)" if rate is not None else "0"
    )
    checks = dict(tables["pass_checks"].select("check", "count").rows())
    facts["suspect passes"] = analysis.suspect_words(checks)
    can_run = summary["models"] - (summary["model_failures"] or 0)
    facts["pass rate on the stack"] = (
        f"{_percent(summary['stack_pass_rate'])} ({summary['passed']:,} of {can_run:,}: the "
        f"{summary['model_failures'] or 0:,} failing everywhere left out)"
    )
    facts["pass rate by task"] = tasks_text(tables["by_task"])
    facts["excluded (not failures)"] = f"{summary['excluded']:,}"
    facts["not probed (pending)"] = f"{tables['pending'].height:,}"
    if tables["not_tested"].height:
        facts["not tested (no record yet)"] = f"{tables['not_tested'].height:,}"
    if tables["pending"].height or tables["not_tested"].height:
        facts["to finish them"] = unprobed_models.resume_command(sweep_id)
    how = "`--baseline ID` chooses another"
    facts["baseline"] = (
        f"{baseline_sweep_id} ({how})"
        if baseline_sweep_id
        else f"none: no earlier sweep of the same name and device ({how})"
    )
    items = "".join(
        f"<dt>{html.escape(k)}</dt><dd>{raw[k] if k in raw else html.escape(str(v))}</dd>"
        for k, v in facts.items()
    )
    return f'<dl class="ms-head ms-facts">{items}</dl>'


def charted_model_types(by_type: pl.DataFrame) -> tuple[pl.DataFrame, str]:
    """The model types worth a pass-rate bar (more than one model: one model's 0% or 100% says
    nothing about its type), and the note that says so under the chart."""
    charted = by_type.filter(pl.col("distinct_models") > 1)
    single = by_type.height - charted.height
    note = (
        f"Charted: the {charted.height:,} model types with more than one model"
        + (f"; {single:,} types with a single model are only in the table" if single else "")
        + " (a single model's 0% or 100% says little about its type)."
    )
    return charted, f'<p class="ms-note">{html.escape(note)}</p>'


UNPROBED_COLUMNS = {
    "model_id": "model",
    "last_error": "last error",
    "at": "when",
    "listed_by": "listed by",
    "baseline_status": "in baseline",
}


def unprobed_html(tables: dict[str, pl.DataFrame], sweep_id: str) -> str:
    """The models the sweep listed but has no row for: pending (the network or the disk kept them
    from being probed, with their last error) and not tested (no record yet); none is a failure."""
    pending, not_tested = tables["pending"], tables["not_tested"]
    if tables["variant_stats"].height <= 1:  # one variant: the column says nothing
        pending, not_tested = (
            pending.drop("variant", strict=False),
            not_tested.drop("variant", strict=False),
        )
    if not pending.height and not not_tested.height:
        return '<p class="ms-note">Every model the sweep listed was probed or excluded.</p>'
    resume = f"<code>{html.escape(unprobed_models.resume_command(sweep_id))}</code>"
    parts = [
        f"<p><b>{pending.height:,} not probed, {not_tested.height:,} not tested.</b> To finish "
        f"them: {resume}</p>"
    ]
    parts.append(
        table_html(
            pending.rename(UNPROBED_COLUMNS, strict=False), max_rows=500, empty="None pending."
        )
    )
    if not_tested.height:
        parts.append(
            "<h4>Not tested</h4><p "
            f'class="ms-note">{html.escape(unprobed_models.UNPROBED_HELP["not tested"])}</p>'
        )
        parts.append(table_html(not_tested.rename(UNPROBED_COLUMNS, strict=False), max_rows=500))
    return "".join(parts)


def legend_html() -> str:
    """Every verdict and failure stage with its meaning, then the report's other terms."""

    def dl(title: str, entries: dict[str, str]) -> str:
        items = "".join(
            f"<dt><code>{html.escape(k)}</code></dt><dd>{html.escape(v)}</dd>"
            for k, v in entries.items()
        )
        return f'<h4>{html.escape(title)}</h4><dl class="ms-head ms-legend">{items}</dl>'

    return (
        dl("Verdicts", schema.VERDICT_HELP)
        + dl("Failure stages", schema.STAGE_HELP)
        + dl("Attribution (whose failure)", analysis.ATTRIBUTION_KIND_HELP)
        + dl("Is a PASS right? (what its check says)", analysis.PASS_CHECK_HELP)
        + dl("Other terms", TERM_HELP)
        + dl("Size buckets (num_params)", SIZE_HELP)
    )


def _size_text(n: int | None) -> str:
    """A parameter count as the size buckets say it: 1.2M, 350M, 7.2B."""
    if n is None:
        return ""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def _sorted_cell(value, column: str) -> Cell:
    """A number's cell (``_cell``) that a sortable table orders by its value, not its text
    ("1,234" or "0.5")."""
    if value is None:
        return Cell("")
    # NaN has no order: such a cell sorts by its text
    finite = not isinstance(value, float) or math.isfinite(value)
    return dataclasses.replace(_cell(value, column), sort=value if finite else None)


def repro_command(sweep_id: str, model_id: str, variant: str | None) -> str:
    """The command that prints a run's standalone repro script (``model-support repro``)."""
    command = f"model-support repro {shlex.quote(sweep_id)} {shlex.quote(model_id)}"
    if variant and variant != analysis.DEFAULT_VARIANT:
        command += f" --variant {shlex.quote(variant)}"
    return command


def _link(path: str) -> str:
    """A data-folder path as a link from the report's folder (``data/reports/``): ``../<path>``,
    quoted."""
    return "../" + quote(path)


#: The per-model table's numbers: (column, heading, what it is).
MODEL_NUMBERS = (
    ("tokens_in", "tokens in", "the prompt's tokens after the chat template (an image's included)"),
    ("tokens_out", "tokens out", "tokens generated"),
    ("load_s", "load s", "seconds to load the model onto the device"),
    (
        "first_token_s",
        "first token s",
        "seconds to the first generated token, compilation included",
    ),
    ("decode_tokens_per_s", "tokens/s", "decode tokens per second"),
    ("peak_host_mem_mb", "host MiB", "peak host memory"),
    ("peak_device_mem_mb", "device MiB", "peak device memory"),
)


def _model_row(row: dict, sweep_id: str, variants: bool, tasks: bool) -> list[Cell]:
    """One run of the per-model table: who, how it ended, what its check says, its numbers, its
    files."""
    check = row["check"] or ""
    if check == analysis.DIVERGES and row["numerics_step"] is not None:
        check += f" at step {row['numerics_step']}"
    # what judged it: a match by the KL alone says little of flat logits
    if check and row.get("check_measure"):
        check += f" ({row['check_measure']})"
    color = schema.VERDICT_COLORS.get(row["status"] or "")
    links = [("record", _link(row["record"]))] if row["record"] else []
    if row["repro_body"]:
        links.append(("repro", _link(row["repro_body"])))
    # model-support localise ran: its first wrong operator (or none) beside the record
    if row.get("localised"):
        links.append((f"wrong op: {row.get('localised_operator') or '?'}", _link(row["localised"])))
    cells = [Cell(row["model_id"], cls="ms-model")]
    if variants:
        cells.append(Cell(row["variant"]))
    if tasks:
        cells.append(Cell(row["task"]))
    cells += [
        Cell(_size_text(row["num_params"]), cls="num", sort=row["num_params"]),
        Cell(row["status"] or "", cls="ms-st", style=f"color:{color}" if color else None),
        Cell(row["attribution"] or ""),
        Cell(
            check,
            cls="ms-suspect" if row["check"] in analysis.SUSPECT_CHECKS else None,
            title=row["check_note"],
        ),
        Cell(
            row["failure_signature"] or "",
            cls="ms-sig",
            title=f"at {stage}" if (stage := row["failure_stage"]) else None,
        ),
        *(_sorted_cell(row[column], column) for column, _, _ in MODEL_NUMBERS),
        Cell(links=links) if links else Cell(""),
        Cell(repro_command(sweep_id, row["model_id"], row["variant"]), fold="command"),
    ]
    return cells


def models_html(tables: dict[str, pl.DataFrame], sweep_id: str) -> str:
    """Every run of the sweep, PASS included, in one table that sorts by any column and filters
    by text in the page (``templates/table.js``, which the page inlines: no network): its
    verdict, whose failure, its check (numerics against the CPU reference, or fluency), its
    numbers, a link to its record (and repro body) and its repro command."""
    models = tables["models"]
    if not models.height:
        return '<p class="ms-note">No model was probed in this sweep.</p>'
    variants = tables["variant_stats"].height > 1
    tasks = models["task"].n_unique() > 1
    unit = "runs" if variants else "models"
    head = [Cell("model", header=True)]
    head += [Cell("variant", header=True)] if variants else []
    head += [Cell("task", header=True)] if tasks else []
    head += [
        Cell("size", header=True, title="parameters of the loaded model"),
        Cell("verdict", header=True),
        Cell("whose", header=True, title="whose failure: stack, model, both or unknown"),
        Cell(
            "check",
            header=True,
            title="a PASS's check: its logits against the CPU reference, else fluency",
        ),
        Cell("signature", header=True, title="a failure's signature"),
        *(Cell(heading, header=True, title=what) for _, heading, what in MODEL_NUMBERS),
        Cell(
            "files", header=True, title="the run's record (JSON) and repro body, beside this report"
        ),
        Cell(
            "repro", header=True, title="the command that prints the run's standalone repro script"
        ),
    ]
    rows = (_model_row(row, sweep_id, variants, tasks) for row in models.iter_rows(named=True))
    table = html_table(head, rows, cls="ms-table ms-models ms-sortable", id="ms-models")
    return (
        '<div class="ms-filter-bar"><input type="search" id="ms-models-filter" '
        'class="ms-filter" placeholder="filter: any words of a row (a model, a verdict, a '
        'signature)" aria-label="filter the models"> <span id="ms-models-count" '
        f'class="ms-note" data-unit="{unit}">{models.height:,} {unit}</span></div><div '
        f'class="ms-scroll">{table}</div>'
    )


def show_table(df: pl.DataFrame, **kwargs) -> None:
    show_html(table_html(df, **kwargs))


def show_chart(chart, name: str) -> None:
    show_html(chart_html(chart, name))
