"""The report's execution-modes section, shown only for a sweep with more than one variant: the
model x variant grid of verdicts (coloured like a support matrix), the models that pass eager and
fail compiled, compile accounting, speed and agreement with eager, per variant."""

from __future__ import annotations

import re

import polars as pl

from ..display import Cell, html_table
from ..record.schema import VERDICT_COLORS
from .charts import chart_html, variant_speed_chart
from .html import table_html


def verdict_slug(status: str | None) -> str:
    """The CSS class of a verdict, as the explorer names it: ``st-FAIL-gen-``; ``st-none`` for no
    run."""
    return "st-" + re.sub(r"[^A-Za-z0-9]+", "-", status) if status else "st-none"


def grid_html(grid: pl.DataFrame, max_rows: int = 300) -> str:
    """``analysis.verdict_grid`` as a table: one row per model, one column per variant, each cell
    its verdict on the verdict's colour (``schema.VERDICT_COLORS``); empty where the variant did
    not run."""
    if not grid.height:
        return '<p class="ms-note">No runs.</p>'
    variants = grid.columns[1:]
    head = [Cell("model", header=True), *(Cell(v, header=True, cls="ms-variant") for v in variants)]
    rows = (
        [Cell(row[0]), *(verdict_cell(status) for status in row[1:])]
        for row in grid.head(max_rows).iter_rows()
    )
    more = (
        f'<p class="ms-note">{grid.height - max_rows:,} more models not shown.</p>'
        if grid.height > max_rows
        else ""
    )
    return html_table(head, rows, cls="ms-table ms-grid") + more


def verdict_cell(status: str | None) -> Cell:
    """A grid cell: the verdict on its colour (white text), as a support matrix shows it; empty
    for no run."""
    color = VERDICT_COLORS.get(status or "")
    return Cell(
        status or "",
        cls=f"ms-verdict {verdict_slug(status)}",
        style=f"background:{color};color:#fff" if color else None,
    )


COMPILE_COLUMNS = {
    "variant": "variant",
    "runs": "runs",
    "passed": "passed",
    "pass_rate": "pass_rate",
    "compiled": "compiled runs",
    "compile_s_median": "compile_s median",
    "compile_s_max": "compile_s max",
    "graphs_median": "graphs (median)",
    "graph_breaks": "graph breaks",
    "runs_with_breaks": "runs with breaks",
    "recompilations": "recompilations",
}
SPEED_COLUMNS = {
    "variant": "variant",
    "first_token_s_median": "first_token_s median",
    "decode_tokens_per_s_median": "decode tokens/s median",
}
AGREEMENT_COLUMNS = {
    "variant": "variant",
    "matches_eager_yes": "matches eager",
    "matches_eager_no": "differs from eager",
    "matches_eager_unknown": "not compared",
}


def _models(n: int) -> str:
    return f"{n:,} model{'s' if n != 1 else ''}"


def _pick(df: pl.DataFrame, columns: dict) -> pl.DataFrame:
    return df.select(list(columns)).rename(columns)


def modes_html(tables: dict[str, pl.DataFrame]) -> str:
    """The whole section (heading included), or "" for a sweep with one variant."""
    stats = tables["variant_stats"]
    if stats.height <= 1:
        return ""
    grid = tables["verdict_grid"]
    broken = tables["eager_pass_compile_fail"]
    parts = [
        '<h2 id="execution-modes">Execution modes</h2>',
        f'<p class="ms-note">{grid.height:,} models x {stats.height} variants. The verdict counts and failure '
        "signatures of this report count runs (model-variant pairs). Models whose verdict differs between "
        "variants come first.</p>",
        grid_html(grid),
        f"<h3>Pass eager, fail compiled ({_models(broken['model_id'].n_unique())})</h3>",
        '<p class="ms-note">Models that pass in an eager variant and fail in a compile one: what torch.compile '
        "breaks on this stack.</p>",
        table_html(
            broken.rename(
                {"model_id": "model", "variant": "compiled variant", "attribution": "whose"}
            ),
            max_rows=300,
            empty="None: every model that passes eager passes compiled too.",
        ),
        "<h3>Compile time, graphs, graph breaks and recompilations</h3>",
        table_html(_pick(stats, COMPILE_COLUMNS)),
    ]
    if tables["graph_break_reasons"].height:
        parts += ["<h4>Graph-break reasons</h4>", table_html(tables["graph_break_reasons"])]
    flagged = tables.get("recompile_flags")
    # recompile_check: slow in production, whatever the verdict
    if flagged is not None and flagged.height:
        parts += [
            "<h4>Recompiles per prompt length or per token</h4>",
            '<p class="ms-note">Compiled runs that still recompiled at a third prompt length with automatic dynamic '
            "shapes on, with the guard that failed.</p>",
            table_html(
                flagged.rename({"model_id": "model", "recompiles_dynamic": "recompiles per length"})
            ),
        ]
    parts += [
        "<h3>Speed per variant</h3>",
        table_html(_pick(stats, SPEED_COLUMNS)),
        chart_html(variant_speed_chart(stats), "variant-speed"),
        "<h3>Agreement with eager</h3>",
        '<p class="ms-note">matches_eager: whether a run\'s greedy tokens equal the eager '
        "run's of the same model.</p>",
        table_html(_pick(stats, AGREEMENT_COLUMNS)),
    ]
    return "".join(parts)
