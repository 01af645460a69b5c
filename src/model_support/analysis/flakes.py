"""The baseline a running sweep's verdicts are screened against (``sweep.reruns``), as the report and ``diff`` see it.

Why here: the sweep room does not read the dataset's tables, and the baseline must be the one the sweep's report
picks (``previous_sweep_id``: the last sweep of the same name and device with results) and be read as the diff reads
a sweep (``diff._outcomes``: the latest run of each (model, variant); suspect by ``pass_check_col``). The CLI hands
``baseline_for`` to ``sweep.runner.run``.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ..record import store
from ..record.sweep_meta import SweepMeta
from . import diff
from .frames import SUSPECT_CHECKS, pass_check_col
from .history import SWEEP_CACHE, previous_sweep_id, sweep_index


class Baseline:
    """A baseline sweep's outcomes, and a record's outcome read the same way (``sweep.reruns.Screen``)."""

    def __init__(self, sweep_id: str, outcomes: dict[tuple[str, str], tuple[str | None, bool]]):
        self.sweep_id, self.outcomes = sweep_id, outcomes

    def before(self, model_id: str, variant: str) -> tuple[str | None, bool] | None:
        return self.outcomes.get((model_id, variant))

    @staticmethod
    def outcome(record) -> tuple[str | None, bool]:
        """(status, suspect) of one record, by the report's own rule (``pass_check_col``)."""
        row = pl.DataFrame(
            {"status": [record.get("status")], "numerics": [record.get("numerics")], "fluent": [record.get("fluent")]},
            schema={"status": pl.String, "numerics": pl.String, "fluent": pl.Boolean},
        )
        check = row.select(pass_check_col())[0, 0]
        return record.get("status"), check in SUSPECT_CHECKS


def outcomes(data_dir: Path | str, sweep_id: str) -> dict[tuple[str, str], tuple[str | None, bool]]:
    """{(model, variant): (status, suspect)} of a sweep's results, as the diff reads them."""
    rows = diff._outcomes(store.scan(Path(data_dir), "results"), sweep_id).collect()
    return {
        (r["model_id"], r["variant"]): (r["status"], r["check"] in SUSPECT_CHECKS) for r in rows.iter_rows(named=True)
    }


def baseline_for(data_dir: Path | str, meta: SweepMeta, device_type: str) -> Baseline | None:
    """The baseline of sweep ``meta`` (running on ``device_type``): the one it recorded (``meta.baseline``; "" for
    none), else the report's default (``previous_sweep_id``); None when there is none."""
    data_dir = Path(data_dir)
    chosen = meta.baseline
    if chosen is None:
        sweeps = sweep_index(data_dir, cache_dir=data_dir / SWEEP_CACHE)
        chosen = previous_sweep_id(sweeps, meta.sweep_id, device_type) or ""
    return Baseline(chosen, outcomes(data_dir, chosen)) if chosen else None
