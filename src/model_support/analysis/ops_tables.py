"""The report's operator tables (docs/ops.md): the porting plan on the sweep's own stack, the CPU fallbacks
ranked by how often they ran, and the operators the stack gained or lost since the baseline, from the census
(``model_support.ops``), as Polars frames for ``report_tables``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import polars as pl

from ..ops import ModelOps, PlanStep, porting_plan, predict, sweep_models
from ..ops.changes import stack_changes
from ..probe.model_ids import display_name


def _names(keys: list[str], most: int = 8) -> str:
    shown = ", ".join(display_name(k) for k in keys[:most])
    return shown + (f" (+{len(keys) - most})" if len(keys) > most else "")


def plan_frame(steps: list[PlanStep]) -> pl.DataFrame:
    """step, op, unlocks (how many), models unlocked, blocks (how many), models blocked."""
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


def fallback_frame(models: list[ModelOps]) -> pl.DataFrame:
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


def ops_tables(data_dir: Path | str, sweep_id: str, baseline_sweep_id: str | None) -> dict[str, pl.DataFrame]:
    """ops_summary (rows, with_census, blocked, to_implement), ops_plan, ops_fallbacks and ops_changes (op,
    before, after, change; empty without a baseline on the same device)."""
    models = predict(sweep_models(Path(data_dir), sweep_id))
    steps = porting_plan(models)
    changes = stack_changes(Path(data_dir), baseline_sweep_id, sweep_id) if baseline_sweep_id else []
    summary = {
        "rows": len(models),
        "with_census": sum(m.ops is not None for m in models),
        "blocked": sum(1 for m in models if m.ops_missing),
        "to_implement": len(steps),
    }
    return {
        "ops_summary": pl.DataFrame([summary]),
        "ops_plan": plan_frame(steps),
        "ops_fallbacks": fallback_frame(models),
        "ops_changes": pl.DataFrame(
            changes, schema={"op": pl.String, "before": pl.String, "after": pl.String, "change": pl.String}
        ),
    }
