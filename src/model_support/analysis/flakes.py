"""The baseline a running sweep's verdicts are screened against (``sweep.reruns``), as the report
and ``diff`` see it.

Why here: the sweep room does not read the dataset's tables, and the baseline must be the one the
sweep's report picks (``previous_sweep_id``: the last sweep of the same name and device with
results) and be read as the diff reads a sweep (``decision.read_runs``: the latest run of each
(model, variant); suspect by ``pass_check_col``). The CLI hands ``baseline_for`` to
``sweep.runner.run``.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ..record import schema
from ..record.sweep_meta import SweepMeta
from . import decision
from .frames import SUSPECT_CHECKS, pass_check_col
from .history import SWEEP_CACHE, previous_sweep_id, sweep_index


class Baseline:
    """A baseline sweep's outcomes, and a record's outcome read the same way
    (``sweep.reruns.Screen``)."""

    def __init__(self, sweep_id: str, outcomes: dict[tuple[str, str], tuple[str | None, bool]]):
        self.sweep_id, self.outcomes = sweep_id, outcomes

    def before(self, model_id: str, variant: str) -> tuple[str | None, bool] | None:
        return self.outcomes.get((model_id, variant))

    @staticmethod
    def outcome(record) -> tuple[str | None, bool]:
        """(status, suspect) of one record, by the report's own rule (``pass_check_col``)."""
        row = pl.DataFrame(
            {
                "status": [record.get("status")],
                "numerics": [record.get("numerics")],
                "fluent": [record.get("fluent")],
            },
            schema={"status": pl.String, "numerics": pl.String, "fluent": pl.Boolean},
        )
        check = row.select(pass_check_col())[0, 0]
        return record.get("status"), check in SUSPECT_CHECKS


def outcomes(data_dir: Path | str, sweep_id: str) -> dict[tuple[str, str], tuple[str | None, bool]]:
    """{(model, variant): (status, suspect)} of a sweep's verdicts, as the gate reads them
    (``decision.read_runs``)."""
    from .decision import SUSPECT_PASS

    return {
        key: (schema.PASS, True) if run.state == SUSPECT_PASS else (run.state, False)
        for key, run in decision.read_runs(data_dir, sweep_id).runs.items()
        if run.has_verdict
    }


def baseline_id(
    data_dir: Path | str, meta: SweepMeta, device_type: str | None = None
) -> str | None:
    """The one rule for a sweep's baseline: the one it recorded (``meta.baseline``; "" for none),
    else the last sweep of the same name and device with results (``previous_sweep_id``, the
    report's default); None for none. ``device_type``: the sweep's own, where its rows do not say
    it yet (a sweep starting)."""
    data_dir = Path(data_dir)
    if meta.baseline is not None:
        return meta.baseline or None
    sweeps = sweep_index(data_dir, cache_dir=data_dir / SWEEP_CACHE)
    return previous_sweep_id(sweeps, meta.sweep_id, device_type)


def baseline_for(data_dir: Path | str, meta: SweepMeta, device_type: str) -> Baseline | None:
    """The baseline of sweep ``meta`` (running on ``device_type``, ``baseline_id``) and its
    outcomes; None when there is none."""
    chosen = baseline_id(data_dir, meta, device_type)
    return Baseline(chosen, outcomes(data_dir, chosen)) if chosen else None
