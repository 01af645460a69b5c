"""The report's stacks section, shown only for a sweep run on several stacks (``stacks:`` in its
definition): one row per model and variant, one column per stack holding its verdict, and the
models whose verdict differs between the stacks named first, each in one line. Read from the
verdict grid the execution-modes section uses (its variants end in ``@<stack>``), so a stack is
compared exactly as a mode is."""

from __future__ import annotations

import html

import polars as pl

from ..display import Cell, html_table
from ..probe.probe_params import STACK_MARK
from .modes_section import verdict_cell


def stack_rows(
    grid: pl.DataFrame,
) -> tuple[list[str], list[tuple[str, str, dict[str, str | None]]]]:
    """The stacks (in the grid's order) and one (model, variant without its stack, {stack:
    verdict}) per run; no stacks when no variant names one."""
    stacks: list[str] = []
    rows: dict[tuple[str, str], dict[str, str | None]] = {}
    for column in grid.columns[1:]:
        base, mark, stack = column.partition(STACK_MARK)
        if not mark:
            continue
        if stack not in stacks:
            stacks.append(stack)
        for model_id, status in zip(grid["model_id"], grid[column], strict=True):
            rows.setdefault((model_id, base), {})[stack] = status
    return stacks, [(model, base, verdicts) for (model, base), verdicts in rows.items()]


def differs(verdicts: dict[str, str | None]) -> bool:
    """Whether a run's verdict differs between the stacks it ran on (a stack it did not run on is
    no verdict)."""
    return len({v for v in verdicts.values() if v is not None}) > 1


def stacks_html(tables: dict[str, pl.DataFrame], max_rows: int = 300) -> str:
    """The whole section (heading included), or "" for a sweep of one stack."""
    stacks, rows = stack_rows(tables["verdict_grid"])
    if len(stacks) < 2:
        return ""
    rows.sort(key=lambda r: (not differs(r[2]), r[0], r[1]))
    changed = [r for r in rows if differs(r[2])]
    lines = "".join(
        f"<li><b>{html.escape(model)}</b> [{html.escape(base)}]: "
        + ", ".join(
            f"{html.escape(v or 'not run')} on {html.escape(s)}" for s, v in verdicts.items()
        )
        + "</li>"
        for model, base, verdicts in changed
    )
    head = [
        Cell("model", header=True),
        Cell("variant", header=True),
        *(Cell(s, header=True, cls="ms-stack") for s in stacks),
    ]
    body = (
        [Cell(model), Cell(base), *(verdict_cell(verdicts.get(s)) for s in stacks)]
        for model, base, verdicts in rows[:max_rows]
    )
    more = (
        f'<p class="ms-note">{len(rows) - max_rows:,} more runs not shown.</p>'
        if len(rows) > max_rows
        else ""
    )
    said = (
        f"<p>{len(changed)} of {len(rows)} runs differ between the stacks:</p><ul>{lines}</ul>"
        if changed
        else f"<p>The stacks agree on every one of the {len(rows)} runs.</p>"
    )
    said += speed_html(tables.get("stack_speed"))
    return (
        '<h2 id="stacks">Stacks side by side</h2>'
        f'<p class="ms-note">The same models on {len(stacks)} stacks in one sweep (<code>stacks:</code>: '
        f"{html.escape(', '.join(stacks))}), each run's <code>stack_name</code> and variant naming its stack. "
        "Runs whose verdict differs between the stacks come first.</p>"
        + said
        + html_table(head, body, cls="ms-table ms-grid")
        + more
    )


def speed_html(speed: pl.DataFrame | None) -> str:
    """The runs whose speed on a stack moved beyond noise against the first stack
    (``analysis.perf.between_stacks``), one line each; "" when none did (or nothing was timed)."""
    if speed is None or not speed.height:
        return ""
    items = "".join(
        f"<li><b>{html.escape(r['model_id'])}</b> [{html.escape(r['variant'])}]: "
        f"{html.escape(r['direction'])} on {html.escape(r['stack'])} than on "
        f"{html.escape(r['reference'])}: {html.escape(r['metric'])} {r['before']:.4g} -> "
        f"{r['after']:.4g} ({r['change']:+.0%})</li>"
        for r in speed.iter_rows(named=True)
    )
    return (
        "<p>Speed beyond noise (the medians moved beyond the threshold and the repeats' noise, "
        f"the gate's rule):</p><ul>{items}</ul>"
    )
