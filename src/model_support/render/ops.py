"""Operators in pages and on the terminal: the report's "What to implement next" (the porting plan, then the
fallbacks ranked by how often they run) and ``model-support ops``' tables (docs/ops.md)."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import polars as pl
from rich.console import Console
from rich.table import Table

from ..ops import ModelOps, PlanStep, porting_plan, predict, sweep_models
from ..ops.changes import stack_changes
from ..probe.model_ids import display_name
from .html import table_html


def _names(keys: list[str], most: int = 8) -> str:
    shown = ", ".join(display_name(k) for k in keys[:most])
    return shown + (f" (+{len(keys) - most})" if len(keys) > most else "")


def fallback_table(models: list[ModelOps]) -> pl.DataFrame:
    """The operators the stack runs on the CPU, the most-run first: op, calls (over the sweep's probes), models."""
    calls: Counter = Counter()
    users: dict[str, list[str]] = {}
    for m in models:
        for op in m.ops_fallback:
            index = m.ops.index(op) if m.ops and op in m.ops else None
            calls[op] += (m.calls or [])[index] if index is not None and m.calls else 0
            users.setdefault(op, []).append(m.key)
    ranked = sorted(users, key=lambda op: (-calls[op], -len(users[op]), op))
    rows = [{"op": op, "calls": calls[op], "models": len(users[op]), "which": _names(users[op])} for op in ranked]
    return pl.DataFrame(rows, schema={"op": pl.String, "calls": pl.Int64, "models": pl.Int64, "which": pl.String})


def plan_table(steps: list[PlanStep]) -> pl.DataFrame:
    return pl.DataFrame(
        [
            {
                "step": i,
                "op": s.op,
                "unlocks": len(s.unlocks),
                "models unlocked": _names(s.unlocks),
                "blocks": len(s.blocks),
                "models blocked": _names(s.blocks),
            }
            for i, s in enumerate(steps, 1)
        ],
        schema={
            "step": pl.Int64,
            "op": pl.String,
            "unlocks": pl.Int64,
            "models unlocked": pl.String,
            "blocks": pl.Int64,
            "models blocked": pl.String,
        },
    )


def implement_next_html(data_dir: Path | str, sweep_id: str, baseline_sweep_id: str | None = None) -> str:
    """The report's section: the porting plan over the sweep's own rows (what its stack lacks, from the census),
    then the fallbacks ranked by how often they ran, then the operators the stack gained or lost since the
    baseline. A sweep without a census says so."""
    models = predict(sweep_models(Path(data_dir), sweep_id))
    with_census = sum(m.ops is not None for m in models)
    if not with_census:
        return '<p class="ms-note">No operator census in this sweep (older records, compile mode or sharded runs).</p>'
    steps = porting_plan(models)
    blocked = sum(1 for m in models if m.ops_missing)
    lead = (
        f'<p class="ms-lead"><b>{blocked:,} model{"s" if blocked != 1 else ""} lack{"" if blocked != 1 else "s"} '
        f"operators of this stack; {len(steps):,} operator{'s' if len(steps) != 1 else ''} to implement</b> "
        f"({with_census:,} of {len(models):,} rows have a census). Each step unlocks the models whose last missing "
        "operator it is.</p>"
    )
    plan = table_html(plan_table(steps), max_rows=100, empty="Nothing is missing: every census operator runs.")
    fallbacks = fallback_table(models)
    ranked = table_html(fallbacks, max_rows=100, empty="No operator falls back to the CPU.")
    changes = stack_changes(Path(data_dir), baseline_sweep_id, sweep_id) if baseline_sweep_id else []
    since = (
        "<h3>Operators gained or lost since the baseline</h3>" + table_html(pl.DataFrame(changes), empty="none")
        if baseline_sweep_id
        else ""
    )
    return (
        lead
        + "<h3>The porting plan</h3>"
        + plan
        + "<h3>CPU fallbacks, the most-run first</h3>"
        + '<p class="ms-note">They pass, slowly: each call runs on the host.</p>'
        + ranked
        + since
    )


def ops_text(
    models: list[ModelOps], steps: list[PlanStep], on: str | None, census_devices: set, width: int = 140
) -> str:
    """``model-support ops``' terminal output: each model's predicted verdict and what it lacks, then the plan."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=False)
    where = f"the {on} stack of this machine" if on else "the sweep's own stack"
    verdicts = Table(title=f"Predicted on {where}", title_justify="left")
    for column in ("model", "recorded", "predicted", "first missing", "missing", "fallback"):
        verdicts.add_column(column, overflow="fold")
    for m in models:
        verdicts.add_row(
            display_name(m.key),
            m.status or "-",
            m.predicted,
            m.first_missing or "",
            ", ".join(m.ops_missing),
            ", ".join(m.ops_fallback),
        )
    console.print(verdicts)
    plan = Table(title="What to implement next", title_justify="left")
    for column in ("step", "op", "unlocks", "blocks"):
        plan.add_column(column, overflow="fold")
    for i, s in enumerate(steps, 1):
        plan.add_row(str(i), s.op, _names(s.unlocks) or "-", _names(s.blocks))
    console.print(plan if steps else "Nothing to implement: no census operator is missing.")
    if on and census_devices - {on}:
        console.print(
            f"The census was taken on {', '.join(sorted(census_devices))}, not {on}: kernels chosen per device "
            "(attention) can differ (docs/ops.md)."
        )
    return buffer.getvalue()
