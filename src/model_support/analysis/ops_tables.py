"""The report's operator tables (docs/ops.md): the porting plan on the sweep's own stack (with
what keeps the models no step unlocks), the CPU fallbacks ranked by how often they ran, and the
operators the stack gained or lost since the baseline, from the census (``model_support.ops``),
as Polars frames for ``report_tables``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import polars as pl

from ..ops import (
    ModelOps,
    PlanStep,
    passing_now,
    porting_plan,
    predict,
    still_blocked,
    sweep_models,
)
from ..ops import proof as proof_mod
from ..ops.changes import stack_changes
from ..ops.plan import (
    DIVERGES,
    cumulative,
    earlier_words,
    not_localised,
    not_localised_line,
    standing,
    step_proofs,
)
from ..ops.prove import last_proof
from ..probe.model_ids import display_name


def _names(keys: list[str], most: int = 8) -> str:
    shown = ", ".join(display_name(k) for k in keys[:most])
    return shown + (f" (+{len(keys) - most})" if len(keys) > most else "")


def step_ops(step: PlanStep, by: str = "") -> str:
    """The step's operators, each with the dtype signatures and ranks needed of it and what is
    wrong with it where it is not simply missing (``PlanStep.fault``): ``aten::rsqrt for f32, 3
    dims``, ``aten::relu for bf16, 3 dims (crashes)``, ``aten::rsqrt for f32, 3 dims (wrong
    numbers in 2 models, localised)`` (``by`` after localised: who localised it); a group joined
    by `` + ``."""
    return " + ".join(
        step.precise_op(op) + (f" ({step.fault(op, by)})" if step.fault(op) else "")
        for op in step.ops
    )


def plan_frame(steps: list[PlanStep]) -> pl.DataFrame:
    """step, fix (the operators: a group only unlocks together), unlocks (how many), passing
    (models predicted PASS once done, cumulative), models unlocked, blocks (how many), models
    blocked."""
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
    """The models no step unlocks, by what keeps them: blocked by, models (how many), which; a
    diverging PASS not localised with the command that localises it."""
    rows = [
        {"blocked by": why, "models": len(keys), "which": _names(keys)}
        for why, keys in still_blocked(models)
        if why != DIVERGES  # said with their commands, below
    ]
    unlocalised = not_localised(models)
    if unlocalised:
        keys = [m.key for m in unlocalised]
        rows.append(
            {"blocked by": not_localised_line(models), "models": len(keys), "which": _names(keys)}
        )
    return pl.DataFrame(
        rows, schema={"blocked by": pl.String, "models": pl.Int64, "which": pl.String}
    )


def standing_frame(models: list[ModelOps]) -> pl.DataFrame:
    """Each model's one standing in the plan (``ops.plan.standing``): model, recorded, predicted,
    standing."""
    rows = [
        {
            "model": display_name(m.key),
            "recorded": m.status,
            "predicted": m.predicted,
            "standing": standing(m),
        }
        for m in models
    ]
    columns = ("model", "recorded", "predicted", "standing")
    return pl.DataFrame(rows, schema=dict.fromkeys(columns, pl.String))


def fallback_frame(models: list[ModelOps]) -> pl.DataFrame:
    """The operators the stack runs on the CPU, the most-run first: op, calls (over the sweep's
    probes), models."""
    calls: Counter = Counter()
    users: dict[str, list[str]] = {}
    for m in models:
        for op in m.ops_fallback:
            index = m.ops.index(op) if m.ops and op in m.ops else None
            calls[op] += (m.calls or [])[index] if index is not None and m.calls else 0
            users.setdefault(op, []).append(m.key)
    ranked = sorted(users, key=lambda op: (-calls[op], -len(users[op]), op))
    rows = [
        {"op": op, "calls": calls[op], "models": len(users[op]), "which": _names(users[op])}
        for op in ranked
    ]
    return pl.DataFrame(
        rows, schema={"op": pl.String, "calls": pl.Int64, "models": pl.Int64, "which": pl.String}
    )


def proof_frame(models: list[ModelOps], steps: list[PlanStep], unhostable: dict) -> pl.DataFrame:
    """The plan's steps as running says them (``ops.plan.step_proofs``): step, fix, on the host
    (the step's operators and every earlier step's), unlocks (the models), proof (confirmed, not
    confirmed, predicted), said."""
    proofs = step_proofs(models, steps, unhostable)
    rows = []
    for i, (s, p) in enumerate(zip(steps, proofs), 1):
        earlier = earlier_words(models, steps, i)
        rows.append(
            {
                "step": i,
                "fix": step_ops(s),
                "on the host": ", ".join(sorted(cumulative(steps, i))),
                "unlocks": _names(s.unlocks),
                "proof": p.outcome,
                "said": p.said + (f"; {earlier}" if earlier else ""),
                "what-if sweeps": ", ".join(p.sweep_ids),
            }
        )
    names = ("fix", "on the host", "unlocks", "proof", "said", "what-if sweeps")
    columns = {"step": pl.Int64, **dict.fromkeys(names, pl.String)}
    return pl.DataFrame(rows, schema=columns)


def proof_runs_frame(proven: list[dict], shown: pl.DataFrame) -> pl.DataFrame:
    """The last ``--prove``'s steps as they ran (``ops.prove.last_proof``): step, on the host,
    ran (the models), what-if sweeps, proof, said; empty when the plan's steps (``shown``,
    ``proof_frame``) say the same (its steps are the plan's, as proven) and none is stale (the
    plan changed since it ran: ``said`` says how)."""
    same = set(zip(shown["what-if sweeps"], shown["proof"]))
    if all(
        (", ".join(s.get("sweep_ids") or []), s["outcome"]) in same and not s.get("stale")
        for s in proven
    ):
        proven = []
    rows = [
        {
            "step": s["step"],
            "on the host": (s.get("host_ops") or "").replace(",", ", "),
            "ran": _names(s.get("ran") or []),
            "what-if sweeps": ", ".join(s.get("sweep_ids") or []),
            "proof": s["outcome"],
            "said": s["said"],
        }
        for s in proven
    ]
    columns = {
        "step": pl.Int64,
        **dict.fromkeys(("on the host", "ran", "what-if sweeps", "proof", "said"), pl.String),
    }
    return pl.DataFrame(rows, schema=columns)


def host_frame(models: list[ModelOps]) -> pl.DataFrame:
    """The models a what-if run said something of: model, recorded (the stack's verdict,
    unchanged), standing (runs with N operators on the host, or blocked by something no host
    operator fixes, ...), what-if sweep (the one that says it)."""
    rows = []
    for m in models:
        if not m.runs:
            continue
        run = proof_mod.on_host(m.runs) or m.runs[-1]
        said = {
            "model": display_name(m.key),
            "recorded": m.status,
            "standing": standing(m),
            "what-if sweep": run.sweep_id,
        }
        rows.append(said)
    return pl.DataFrame(
        rows, schema=dict.fromkeys(("model", "recorded", "standing", "what-if sweep"), pl.String)
    )


#: The operator tables of a sweep's report (``ops_tables``), by name.
OPS_TABLES = (
    "ops_summary",
    "ops_plan",
    "ops_blocked",
    "ops_standing",
    "ops_fallbacks",
    "ops_changes",
    "ops_proof",
    "ops_proof_runs",
    "ops_host",
)


def ops_tables(
    data_dir: Path | str, sweep_id: str, baseline_sweep_id: str | None
) -> dict[str, pl.DataFrame]:
    """ops_summary (rows, with_census, passing, blocked, to_implement, steps, wrong: the models
    blocked by a wrong operator, not_localised: the diverging PASSes no one localised, what_if:
    the models a what-if run said something of), ops_plan, ops_blocked, ops_standing (each
    model's standing), ops_fallbacks, ops_changes (op, before, after, change; empty without a
    baseline on the same device), and for the "What if" section ops_proof (each step as running
    says it), ops_proof_runs (the last ``--prove`` as it ran) and ops_host (the models a what-if
    run said something of)."""
    models = predict(sweep_models(Path(data_dir), sweep_id))
    steps = porting_plan(models)
    proven = proof_frame(models, steps, proof_mod.read(data_dir, sweep_id).get("unhostable") or {})
    changes = (
        stack_changes(Path(data_dir), baseline_sweep_id, sweep_id) if baseline_sweep_id else []
    )
    summary = {
        "rows": len(models),
        "with_census": sum(m.ops is not None for m in models),
        "passing": passing_now(models),
        "blocked": sum(1 for m in models if m.blockers),
        "to_implement": sum(len(s.ops) for s in steps),
        "steps": len(steps),
        "wrong": sum(1 for m in models if m.ops_wrong),
        "not_localised": len(not_localised(models)),
        "what_if": sum(1 for m in models if m.runs),
    }
    return {
        "ops_summary": pl.DataFrame([summary]),
        "ops_plan": plan_frame(steps),
        "ops_blocked": blocked_frame(models),
        "ops_standing": standing_frame(models),
        "ops_fallbacks": fallback_frame(models),
        "ops_changes": pl.DataFrame(
            changes,
            schema={"op": pl.String, "before": pl.String, "after": pl.String, "change": pl.String},
        ),
        "ops_proof": proven,
        "ops_proof_runs": proof_runs_frame(last_proof(data_dir, sweep_id, models, steps), proven),
        "ops_host": host_frame(models),
    }
