"""The porting plan: which missing operator to implement next, greedily, by the models each one unlocks.

A model is unlocked by the step that implements its *last* missing operator: counting first errors (failure
signatures) gives the wrong answer, since the first error hides the next one. Each step takes the operator
that unlocks the most models still blocked; ties go to the operator the most of them call, then by name.
Models that fail for other reasons than a missing operator (their own, or a census that cannot tell) are in
no step: implementing operators does not unlock them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .coverage import ModelOps


@dataclass(frozen=True)
class PlanStep:
    """One operator to implement: the models it unlocks at this step, and those it blocks (lack it) until then."""

    op: str
    unlocks: list[str]
    blocks: list[str]

    def as_json(self) -> dict:
        return {"op": self.op, "unlocks": self.unlocks, "blocks": self.blocks}


def porting_plan(models: list[ModelOps]) -> list[PlanStep]:
    """The greedy plan over ``models`` (predicted by ``coverage.predict``, so ``ops_missing`` is per model)."""
    remaining = {m.key: set(m.ops_missing) for m in models if m.ops_missing}
    steps = []
    while remaining:
        candidates = sorted({op for missing in remaining.values() for op in missing})

        def score(op: str) -> tuple[int, int, str]:
            unlocks = sum(1 for missing in remaining.values() if missing == {op})
            calls = sum(1 for missing in remaining.values() if op in missing)
            return (-unlocks, -calls, op)

        op = min(candidates, key=score)
        blocks = sorted(key for key, missing in remaining.items() if op in missing)
        unlocks = sorted(key for key in blocks if remaining[key] == {op})
        steps.append(PlanStep(op, unlocks, blocks))
        for key in blocks:
            remaining[key].discard(op)
            if not remaining[key]:
                del remaining[key]
    return steps


def plan_json(models: list[ModelOps], steps: list[PlanStep]) -> dict:
    """``model-support ops --json``: {"plan": [{"op", "unlocks", "blocks"}...], "models": {key: {"ops_missing",
    "ops_fallback", "predicted"}}}."""
    return {"plan": [s.as_json() for s in steps], "models": {m.key: m.as_json() for m in models}}
