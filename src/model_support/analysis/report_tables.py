"""Everything one sweep's report shows, in two passes over the data.

One ``pl.collect_all`` reads the sweep's own rows (and its baseline's) and a small per-sweep summary
of every row (``history.sweep_stats``); a second one derives all the tables from those in memory.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from .. import store
from .coverage import unprobed
from .diff import _changes_q, _signature_changes_q
from .frames import MEMORY_METRICS, TIMING_METRICS, TOKEN_METRICS, VERSION_COMPONENTS, _sweep_rows
from .history import _by_version_q, _history_q, require_sweep, sweep_index, sweep_stats
from .tables import (
    _by_model_type_q,
    _by_size_q,
    _excluded_reasons_q,
    _histogram_q,
    _memory_by_size_q,
    _memory_stats_q,
    _reference_q,
    _signatures_q,
    _sweep_summary_q,
    _timing_stats_q,
    _token_stats_q,
    _verdict_counts_q,
)

# --------------------------------------------------------------------------------------------
# everything the report shows

#: Columns the per-sweep tables read.
SWEEP_COLUMNS = (
    "sweep_id",
    "model_id",
    "model_type",
    "num_params",
    "status",
    "failure_stage",
    "error_type",
    "error_message",
    "traceback",
    "failure_signature",
    "started_at",
    "device_type",
    *TOKEN_METRICS,
    *TIMING_METRICS,
    *MEMORY_METRICS,
    "reference_match",
)


def report_tables(data_dir: Path | str, sweep_id: str, baseline_sweep_id: str | None = None) -> dict[str, pl.DataFrame]:
    """Every table of one sweep's report, by name.

    The sweep's (and the baseline's) rows are read once; the per-sweep tables then run on them in
    memory, and the history tables over all sweeps, in one ``pl.collect_all``. Unknown ids raise
    ``ValueError`` (see ``require_sweep``). Keys: sweeps, summary, verdicts, excluded, by_model_type,
    by_size, signatures, tokens, timings, timing_histogram, memory, memory_by_size, reference,
    changes, signature_changes, history, by_version (the three components stacked), and the models
    listed but without a row (``coverage.unprobed``): pending (model_id, problem, last_error, at,
    baseline_status) and not_tested (model_id, listed_by, baseline_status). Those are no failures:
    they are left out of ``changes`` (where they would read as "removed").
    """
    results = store.scan(data_dir, "results")
    excluded = store.scan(data_dir, "excluded")
    wanted = [sweep_id] + ([baseline_sweep_id] if baseline_sweep_id else [])
    stats, rows, excluded_ids = pl.collect_all(
        [
            sweep_stats(results),
            results.select(SWEEP_COLUMNS).filter(pl.col("sweep_id").is_in(wanted)),
            excluded.filter(pl.col("sweep_id") == sweep_id).select("model_id"),
        ]
    )
    sweeps = sweep_index(data_dir, stats)
    require_sweep(sweeps, sweep_id)
    if baseline_sweep_id:
        require_sweep(sweeps, baseline_sweep_id)
    rows = rows.lazy()
    queries = {
        "summary": _sweep_summary_q(rows, sweep_id, excluded),
        "verdicts": _verdict_counts_q(rows, sweep_id),
        "excluded": _excluded_reasons_q(excluded, sweep_id),
        "by_model_type": _by_model_type_q(rows, sweep_id),
        "by_size": _by_size_q(rows, sweep_id),
        "signatures": _signatures_q(rows, sweep_id),
        "tokens": _token_stats_q(rows, sweep_id),
        "timings": _timing_stats_q(rows, sweep_id),
        "timing_histogram": _histogram_q(_sweep_rows(rows, sweep_id, TIMING_METRICS), TIMING_METRICS, 20),
        "memory": _memory_stats_q(rows, sweep_id),
        "memory_by_size": _memory_by_size_q(rows, sweep_id),
        "reference": _reference_q(rows, sweep_id),
        "history": _history_q(stats, sweeps, excluded),
        "by_version": pl.concat([_by_version_q(stats, c, sweeps) for c in VERSION_COMPONENTS]),
        "changes": _changes_q(rows, sweep_id, baseline_sweep_id or sweep_id),
        "signature_changes": _signature_changes_q(rows, sweep_id, baseline_sweep_id or sweep_id),
    }
    names = list(queries)
    tables = dict(zip(names, pl.collect_all([queries[n] for n in names])))
    tables["sweeps"] = sweeps
    probed = pl.concat([rows.filter(pl.col("sweep_id") == sweep_id).select("model_id").collect(), excluded_ids])
    pending, not_tested = unprobed(data_dir, sweep_id, probed)
    baseline = (
        rows.filter(pl.col("sweep_id") == baseline_sweep_id)
        .select("model_id", pl.col("status").alias("baseline_status"))
        .unique("model_id")
        .collect()
        if baseline_sweep_id
        else pl.DataFrame(schema={"model_id": pl.String, "baseline_status": pl.String})
    )
    tables["pending"] = pending.join(baseline, on="model_id", how="left", maintain_order="left")
    tables["not_tested"] = not_tested.join(baseline, on="model_id", how="left", maintain_order="left")
    unprobed_ids = pl.concat([pending.select("model_id"), not_tested.select("model_id")])
    tables["changes"] = tables["changes"].filter(
        ~((pl.col("change") == "removed") & pl.col("model_id").is_in(unprobed_ids["model_id"].implode()))
    )
    return tables
