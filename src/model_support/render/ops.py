"""Operators in pages and on the terminal: the report's "What to implement next" (the porting plan, the
fallbacks ranked by how often they run, what the stack gained or lost; from ``analysis.ops_tables``) and
``model-support ops``' tables (docs/ops.md)."""

from __future__ import annotations

import io

import polars as pl
from rich.console import Console
from rich.table import Table

from ..ops import ModelOps, PlanStep
from ..probe.model_ids import display_name
from .html import table_html


def _names(keys: list[str], most: int = 8) -> str:
    shown = ", ".join(display_name(k) for k in keys[:most])
    return shown + (f" (+{len(keys) - most})" if len(keys) > most else "")


def implement_next_html(tables: dict[str, pl.DataFrame]) -> str:
    """The report's section (``layout.SECTIONS``): the porting plan over the sweep's own rows (what its stack
    lacks, from the census), the fallbacks ranked by how often they ran, and the operators the stack gained or
    lost since the baseline. A sweep without a census says so."""
    summary = tables["ops_summary"].row(0, named=True)
    if not summary["with_census"]:
        return '<p class="ms-note">No operator census in this sweep (older records, compile mode or sharded runs).</p>'
    blocked, steps = summary["blocked"], summary["to_implement"]
    lead = (
        f'<p class="ms-lead"><b>{blocked:,} model{"s" if blocked != 1 else ""} lack{"" if blocked != 1 else "s"} '
        f"operators of this stack; {steps:,} operator{'s' if steps != 1 else ''} to implement</b> "
        f"({summary['with_census']:,} of {summary['rows']:,} rows have a census). Each step unlocks the models whose "
        "last missing operator it is.</p>"
    )
    plan = table_html(tables["ops_plan"], max_rows=100, empty="Nothing is missing: every census operator runs.")
    ranked = table_html(tables["ops_fallbacks"], max_rows=100, empty="No operator falls back to the CPU.")
    changes = table_html(tables["ops_changes"], empty="none (or no baseline on this device)")
    return (
        lead
        + "<h3>The porting plan</h3>"
        + plan
        + "<h3>CPU fallbacks, the most-run first</h3>"
        + '<p class="ms-note">They pass, slowly: each call runs on the host.</p>'
        + ranked
        + "<h3>Operators gained or lost since the baseline</h3>"
        + changes
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
