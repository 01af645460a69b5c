"""The report's operator tables (docs/ops.md): the porting plan on the sweep's own stack (with what keeps the
models no step unlocks), the CPU fallbacks ranked by how often they ran, and the operators the stack gained or
lost since the baseline, from the census (``model_support.ops``), as Polars frames for ``report_tables``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import polars as pl

from ..ops import ModelOps, PlanStep, passing_now, porting_plan, predict, still_blocked, sweep_models
from ..ops.changes import stack_changes
from ..ops.plan import DIVERGES, not_localised, not_localised_line, standing
from ..probe.model_ids import display_name


def _names(keys: list[str], most: int = 8) -> str:
    shown = ", ".join(display_name(k) for k in keys[:most])
    return shown + (f" (+{len(keys) - most})" if len(keys) > most else "")


def step_ops(step: PlanStep, by: str = "") -> str:
    """The step's operators, each with the dtype signatures and ranks needed of it and what is wrong with it where
    it is not simply missing (``PlanStep.fault``): ``aten::rsqrt for f32, 3 dims``, ``aten::relu for bf16, 3 dims
    (crashes)``, ``aten::rsqrt for f32, 3 dims (wrong numbers in 2 models, localised)`` (``by`` after localised: who
    localised it); a group joined by `` + ``."""
    return " + ".join(step.precise_op(op) + (f" ({step.fault(op, by)})" if step.fault(op) else "") for op in step.ops)


def plan_frame(steps: list[PlanStep]) -> pl.DataFrame:
    """step, fix (the operators: a group only unlocks together), unlocks (how many), passing (models predicted PASS
    once done, cumulative), models unlocked, blocks (how many), models blocked."""
    return pl.DataFrame(
        [
            {
                "step": i,
                "fix": step_ops(s),
                "unlocks": len(s.unlocks),
                "passing": s.passing,
                "models unlocked": _names(s.unlocks),
                "blocks": len(s.blocks),
                "models blocked": _names(s.blocks),
            }
            for i, s in enumerate(steps, 1)
        ],
        schema={
            "step": pl.Int64,
            "fix": pl.String,
            "unlocks": pl.Int64,
            "passing": pl.Int64,
            "models unlocked": pl.String,
            "blocks": pl.Int64,
            "models blocked": pl.String,
        },
    )


def blocked_frame(models: list[ModelOps]) -> pl.DataFrame:
    """The models no step unlocks, by what keeps them: blocked by, models (how many), which; a diverging PASS not
    localised with the command that localises it."""
    rows = [
        {"blocked by": why, "models": len(keys), "which": _names(keys)}
        for why, keys in still_blocked(models)
        if why != DIVERGES  # said with their commands, below
    ]
    unlocalised = not_localised(models)
    if unlocalised:
        keys = [m.key for m in unlocalised]
        rows.append({"blocked by": not_localised_line(models), "models": len(keys), "which": _names(keys)})
    return pl.DataFrame(rows, schema={"blocked by": pl.String, "models": pl.Int64, "which": pl.String})


def standing_frame(models: list[ModelOps]) -> pl.DataFrame:
    """Each model's one standing in the plan (``ops.plan.standing``): model, recorded, predicted, standing."""
    rows = [
        {"model": display_name(m.key), "recorded": m.status, "predicted": m.predicted, "standing": standing(m)}
        for m in models
    ]
    columns = ("model", "recorded", "predicted", "standing")
    return pl.DataFrame(rows, schema=dict.fromkeys(columns, pl.String))


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
    """ops_summary (rows, with_census, passing, blocked, to_implement, steps, wrong: the models blocked by a wrong
    operator, not_localised: the diverging PASSes no one localised), ops_plan, ops_blocked, ops_standing (each
    model's standing), ops_fallbacks and ops_changes (op, before, after, change; empty without a baseline on the
    same device)."""
    models = predict(sweep_models(Path(data_dir), sweep_id))
    steps = porting_plan(models)
    changes = stack_changes(Path(data_dir), baseline_sweep_id, sweep_id) if baseline_sweep_id else []
    summary = {
        "rows": len(models),
        "with_census": sum(m.ops is not None for m in models),
        "passing": passing_now(models),
        "blocked": sum(1 for m in models if m.blockers),
        "to_implement": sum(len(s.ops) for s in steps),
        "steps": len(steps),
        "wrong": sum(1 for m in models if m.ops_wrong),
        "not_localised": len(not_localised(models)),
    }
    return {
        "ops_summary": pl.DataFrame([summary]),
        "ops_plan": plan_frame(steps),
        "ops_blocked": blocked_frame(models),
        "ops_standing": standing_frame(models),
        "ops_fallbacks": fallback_frame(models),
        "ops_changes": pl.DataFrame(
            changes, schema={"op": pl.String, "before": pl.String, "after": pl.String, "change": pl.String}
        ),
    }
