"""Operators: what each model needs of a stack, what the stack lacks, the verdicts predicted before running
and the porting plan (docs/ops.md).

``coverage`` reads a sweep's operator census (the ``ops`` fields of its rows), asks a stack what it does with
each operator (the device adapter's ``op_coverage``, in a child process that loads the backend) and predicts
each model's verdict from it; ``plan`` orders the missing operators by the models each one unlocks. Both
work from the census alone: no model runs.
"""

from .coverage import ModelOps, predict, stack_coverage, sweep_models
from .plan import PlanStep, porting_plan

__all__ = ["ModelOps", "PlanStep", "porting_plan", "predict", "stack_coverage", "sweep_models"]
