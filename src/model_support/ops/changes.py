"""Which operators a stack gained or lost between two sweeps, from the ``ops`` config (each
sweep's status of each operator its census saw): gained, an operator missing or falling back
before that runs now (or a missing one that now falls back); lost, the other way. An operator
only one of the two censuses saw says nothing, nor do two sweeps on different devices (two
stacks, not one that changed). Per operator: its worst status over its dtype signatures (the
config's rows)."""

from __future__ import annotations

from pathlib import Path

from ..record import ops_table, store

#: How good a status of the ``ops`` config is, for the direction of a change.
RANK = {
    ops_table.ROW_STATUS[ops_table.MISSING]: 0,
    ops_table.ROW_STATUS[ops_table.UNKNOWN]: 1,
    ops_table.ROW_STATUS[ops_table.FALLBACK]: 1,
    ops_table.ROW_STATUS[ops_table.IMPLEMENTED]: 2,
}


def stack_changes(data_dir: Path, before: str, after: str) -> list[dict]:
    """[{"op", "before", "after", "change": gained | lost}], gained first, by operator name."""
    import polars as pl

    frame = (
        store.scan_ops(Path(data_dir))
        .filter(pl.col("sweep_id").is_in([before, after]))
        .select("sweep_id", "op", "status", "device_type")
    )
    rows = frame.collect()
    # two devices: two stacks, not one that changed
    if rows["device_type"].drop_nulls().n_unique() > 1:
        return []
    # an operator's worst status over its dtype signatures (one row each)
    status: dict[tuple, str] = {}
    for r in rows.iter_rows(named=True):
        key = (r["sweep_id"], r["op"])
        if key not in status or RANK.get(r["status"], 2) < RANK.get(status[key], 2):
            status[key] = r["status"]
    changes = []
    for op in sorted({op for _, op in status}):
        was, now = status.get((before, op)), status.get((after, op))
        if was is None or now is None or was == now or RANK.get(was) == RANK.get(now):
            continue
        changes.append(
            {
                "op": op,
                "before": was,
                "after": now,
                "change": "gained" if RANK[now] > RANK[was] else "lost",
            }
        )
    changes.sort(key=lambda c: (c["change"] != "gained", c["op"]))
    return changes


def changes_text(changes: list[dict]) -> str:
    """One line per direction: ``operators gained: aten::gelu (missing -> implemented), ...``; ""
    for none."""
    lines = []
    for change in ("gained", "lost"):
        part = [
            f"{c['op']} ({c['before']} -> {c['after']})" for c in changes if c["change"] == change
        ]
        if part:
            lines.append(f"operators {change}: {', '.join(part)}")
    return "\n".join(lines)
