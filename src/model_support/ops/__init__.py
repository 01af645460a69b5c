"""Operators: what each model needs of a stack, what the stack lacks, the verdicts predicted before
running and the porting plan (docs/ops.md).

``coverage`` reads a sweep's operator census (the ``ops`` fields of its rows), asks a stack what it
does with each operator (the device adapter's ``op_coverage``, in a child process that loads the
backend) and predicts each model's verdict from it; ``plan`` orders what the stack lacks (missing,
crashing and wrong operators) by how many models each step makes a predicted PASS, and says what
keeps the others. Both work from the census alone: no model runs.
"""

from .coverage import ModelOps, predict, stack_coverage, sweep_models
from .plan import PlanStep, passing_now, porting_plan, still_blocked

__all__ = [
    "ModelOps",
    "PlanStep",
    "passing_now",
    "porting_plan",
    "predict",
    "stack_coverage",
    "still_blocked",
    "sweep_models",
]
