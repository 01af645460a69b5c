"""Operators in pages and on the terminal: the report's "What to implement next" (the porting
plan, the fallbacks ranked by how often they run, what the stack gained or lost; from
``analysis.ops_tables``) and ``model-support ops``' tables (docs/ops.md)."""

from __future__ import annotations

import functools
import io

import polars as pl
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..analysis.ops_tables import step_ops
from ..ops import ModelOps, PlanStep, passing_now, still_blocked
from ..ops.plan import (
    DIVERGES,
    earlier_words,
    fallback_work,
    not_localised,
    not_localised_line,
    standing,
)
from ..ops.proof import CONFIRMED, PREDICTED
from ..probe.model_ids import display_name
from ..record.ops_table import CPU_FALLBACK
from .html import table_html


def _names(keys: list[str], most: int = 8) -> str:
    shown = ", ".join(display_name(k) for k in keys[:most])
    return shown + (f" (+{len(keys) - most})" if len(keys) > most else "")


def implement_next_html(tables: dict[str, pl.DataFrame]) -> str:
    """The report's section (``layout.SECTIONS``): the porting plan over the sweep's own rows
    (what its stack lacks, from the census and the failures' operators), what keeps the models no
    step unlocks, the fallbacks ranked by how often they ran, and the operators the stack gained
    or lost since the baseline. A sweep without a census says so."""
    summary = tables["ops_summary"].row(0, named=True)
    if not summary["with_census"] and tables["ops_plan"].is_empty():
        return (
            '<p class="ms-note">No operator census in this sweep (older records, compile mode or '
            "sharded runs).</p>"
        )
    blocked, fixes = summary["blocked"], summary["to_implement"]
    wrong = summary.get("wrong") or 0
    lead = (
        f'<p class="ms-lead"><b>{blocked:,} model{"s are" if blocked != 1 else " is"} blocked by operators of this '
        f"stack (missing, crashing or wrong: {wrong:,} by wrong numbers); {fixes:,} operator"
        f"{'s' if fixes != 1 else ''} to fix</b> "
        f"({summary['passing']:,} of {summary['rows']:,} rows predicted PASS now; {summary['with_census']:,} have a "
        "census). Each step unlocks the models whose last blocker it fixes, missing and wrong operators alike (a "
        "wrong one is named by <code>model-support localise</code>); operators that only unlock together are "
        "one step; <i>passing</i> counts the models predicted PASS once it is done.</p>"
    )
    unlocalised = summary.get("not_localised") or 0
    if unlocalised:
        lead += (
            f'<p class="ms-note">{unlocalised:,} diverging PASS{"es" if unlocalised != 1 else ""} not localised: '
            "no operator is named for them yet, so no step counts them (the commands below; then <code>model-support "
            "report</code> renders this plan again).</p>"
        )
    plan = table_html(
        tables["ops_plan"],
        max_rows=100,
        empty="Nothing to fix: no census operator is missing, crashing or localised wrong.",
    )
    blocked_table = table_html(
        tables["ops_blocked"], empty="none: every model passes once the plan is done."
    )
    standing = tables.get("ops_standing")
    standing_table = (
        table_html(standing, max_rows=200, empty="no rows") if standing is not None else ""
    )
    ranked = table_html(
        tables["ops_fallbacks"], max_rows=100, empty="No operator falls back to the CPU."
    )
    changes = table_html(tables["ops_changes"], empty="none (or no baseline on this device)")
    return (
        lead
        + "<h3>The porting plan</h3>"
        + plan
        + "<h3>What no step unlocks</h3>"
        + blocked_table
        + ("<h3>Each model's standing</h3>" + standing_table if standing_table else "")
        + "<h3>CPU fallbacks, the most-run first</h3>"
        + '<p class="ms-note">They pass, slowly: each call runs on the host.</p>'
        + ranked
        + "<h3>Operators gained or lost since the baseline</h3>"
        + changes
    )


def census_note(models: list[ModelOps], on: str) -> str | None:
    """What the census a prediction ``--on`` a device comes from, where that is not the device's
    own: the models whose census was taken on another device (its kernels can differ: attention),
    and the stopped runs' censuses, whose operators after the stop are their CPU reference's.
    None when every census is ``on``'s."""
    taken = [m for m in models if m.ops is not None]
    elsewhere = sorted({m.device_type or "an unknown device" for m in taken if m.device_type != on})
    finished_on_cpu = [
        m for m in taken if m.source == "reference" and m.device_type == on and on != "cpu"
    ]
    said = []
    if elsewhere:
        count = sum(1 for m in taken if m.device_type != on)
        whose = (
            "The census was"
            if count == len(taken)
            else f"The census of {count} of {len(taken)} models was"
        )
        said.append(
            f"{whose} taken on {', '.join(elsewhere)}, not {on}: kernels chosen per device "
            "(attention) can differ (docs/ops.md)."
        )
    if finished_on_cpu:
        runs = (
            "1 stopped run" if len(finished_on_cpu) == 1 else f"{len(finished_on_cpu)} stopped runs"
        )
        ends = "ends its" if len(finished_on_cpu) == 1 else "end their"
        said.append(f"{runs} on {on} {ends} census with what the CPU reference alone called.")
    return " ".join(said) or None


def _verdicts_table(models: list[ModelOps], where: str) -> Table:
    """Each model's recorded and predicted verdict, where a run stops and what the stack lacks of
    it."""
    verdicts = Table(title=f"Predicted on {where}", title_justify="left")
    columns = (
        "model",
        "recorded",
        "predicted",
        "standing",
        "stops at",
        "missing",
        "crashing",
        "wrong",
        CPU_FALLBACK,
    )
    for column in columns:
        verdicts.add_column(column, overflow="fold")
    for m in models:
        cells = (
            display_name(m.key),
            m.status or "-",
            m.predicted,
            standing(m),
            m.first_missing or "",
            ", ".join(m.ops_missing),
            ", ".join(m.ops_crashing),
            ", ".join(m.ops_wrong),
            ", ".join(m.ops_fallback),
        )
        verdicts.add_row(*map(escape, cells))  # a variant's [brackets] are text, not rich's markup
    return verdicts


def _plan_table(models: list[ModelOps], steps: list[PlanStep], proofs: list | None = None) -> Table:
    """The plan, a step a row: what to fix, what it unlocks, and the models predicted PASS once
    it is done; with ``proofs`` (``ops.plan.step_proofs``: what running with its operators on the
    host said), a column saying it."""
    plan = Table(
        title=f"What to implement next ({passing_now(models)} of {len(models)} predicted PASS now)",
        title_justify="left",
    )
    for column in ("step", "fix", "unlocks", "passing", "blocks", *(("proof",) if proofs else ())):
        plan.add_column(column, overflow="fold")
    for i, s in enumerate(steps, 1):
        cells = [
            str(i),
            step_ops(s),
            _names(s.unlocks) or "-",
            f"{s.passing} of {len(models)}",
            _names(s.blocks),
        ]
        if proofs:
            earlier = earlier_words(models, steps, i)
            cells.append(proofs[i - 1].said + (f"; {earlier}" if earlier else ""))
        plan.add_row(*map(escape, cells))
    return plan


def ops_text(
    models: list[ModelOps],
    steps: list[PlanStep],
    on: str | None,
    census_devices: set | None = None,
    width: int = 140,
    proofs: list | None = None,
    proven: list[dict] | None = None,
) -> str:
    """``model-support ops``' terminal output: each model's predicted verdict and what it lacks,
    the plan (with ``proofs``, where its what-if runs exist: what running each step said), what
    keeps the models no step unlocks, where the census came from, and the last ``--prove``'s
    steps as they ran (``proven``: ``ops.prove.last_proof``). ``census_devices`` is not read (the
    note comes from ``models``)."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=False)
    where = f"the {on} stack of this machine" if on else "the sweep's own stack"
    console.print(_verdicts_table(models, where))
    say = functools.partial(console.print, markup=False, highlight=False)
    ran = proven or any(m.runs for m in models)
    if steps:
        console.print(_plan_table(models, steps, proofs if ran else None))
    else:
        say("Nothing to fix: no census operator is missing, crashing or localised wrong.")
    for why, keys in still_blocked(models):
        # the diverging PASSes not localised: below, with the commands that localise them
        if why != DIVERGES:
            say(f"Stay blocked, {len(keys)}: {why}: {_names(keys)}.")
    unlocalised = not_localised_line(models)
    if unlocalised:
        say(f"{unlocalised}.")
    # no verdict waits on them, every call pays a trip to the host
    for work in fallback_work(models):
        say(
            f"Then, a CPU fallback to implement: {work['op']}, called {work['calls']} times by "
            f"{len(work['models'])} model(s): {_names(work['models'])}."
        )
    note = census_note(models, on) if on else None
    if note:
        say(note)
    completed = [m for m in models if m.completed_by]
    if completed:
        which = ", ".join(f"{display_name(m.key)} ({m.completed_by})" for m in completed)
        say(
            "Census completed by running with every missing operator on the host (host_ops: "
            f"missing): {which}."
        )
    shown = {(tuple(p.sweep_ids), p.outcome) for p in proofs or []}
    if proven and any((tuple(step["sweep_ids"]), step["outcome"]) not in shown for step in proven):
        say(
            "The last proof (model-support ops --prove) as it ran, judged from its what-if records:"
        )
        for step in proven:
            say(f"  {step['line']}")
    return buffer.getvalue()


def _proven(proofs: list | None, index: int) -> str:
    """`` Confirmed by running: ...`` (or not, and why) for step ``index`` where it was run on
    the host; "" else."""
    found = proofs[index - 1] if proofs else None
    if found is None or found.outcome == PREDICTED:
        return ""
    where = (
        f" (what-if sweep {', '.join(f'`{s}`' for s in found.sweep_ids)})"
        if found.sweep_ids
        else ""
    )
    if found.outcome == CONFIRMED:
        return f" Confirmed by running: {found.said.removeprefix('confirmed: ')}{where}."
    return f" Not confirmed by running: {found.said.removeprefix('not confirmed: ')}{where}."


def plan_markdown(
    models: list[ModelOps], steps: list[PlanStep], keys: list[str], proofs: list | None = None
) -> list[str]:
    """The porting plan as it concerns the models ``keys`` (a drafted bug report's), Markdown
    lines: each step that unlocks one of them (a wrong operator's step says it was localised by
    ``model-support localise``; with ``proofs``, ``ops.plan.step_proofs``, a step run with its
    operators on the host says "confirmed by running" or not and why), each one's standing, and
    the command that localises a diverging PASS no one localised. [] when the plan says nothing
    of them."""
    wanted = set(keys)
    by_key = {m.key: m for m in models}
    unlocalised = {m.key for m in not_localised(models)}
    lines = []
    for i, s in enumerate(steps, 1):
        mine = [k for k in s.unlocks if k in wanted]
        if not mine:
            continue
        lines.append(
            f"- Step {i} of {len(steps)}: fix {step_ops(s, ' by `model-support localise`')}. "
            f"It unlocks {_names(mine)} ({s.passing} of {len(models)} models predicted PASS "
            "once it is done)." + _proven(proofs, i)
        )
    for key in keys:
        m = by_key.get(key)
        if m is not None:
            tail = f": run `{m.localise_command()}`" if key in unlocalised else ""
            lines.append(f"- {display_name(key)}: {standing(m)}{tail}.")
    return lines
