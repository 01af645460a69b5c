"""Everything one sweep's report shows, in two passes over the data.

One ``pl.collect_all`` reads the sweep's own rows (and its baseline's) and a small per-sweep summary
of every row (``history.sweep_stats``); a second one derives all the tables from those in memory.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from ..record import store
from . import decision, host_cost, perf
from .checks import CHECK_COLUMNS, _pass_checks_q, _suspect_q
from .coverage import unprobed
from .diff import KEY, _changes_q, _signature_changes_q
from .frames import MEMORY_METRICS, TIMING_METRICS, TOKEN_METRICS, VERSION_COMPONENTS, _sweep_rows, variant_col
from .history import SWEEP_CACHE, _by_version_q, _history_q, require_sweep, sweep_index, sweep_stats
from .modes import (
    MODE_COLUMNS,
    _break_reasons_q,
    _eager_pass_compile_fail_q,
    _grid_long_q,
    _recompile_flags_q,
    _variant_stats_q,
    grid_from_long,
    order_variants,
)
from .ops_tables import ops_tables
from .parallel import MULTI_DEVICE_COLUMNS, _by_parallelism_q, _multi_device_q
from .tables import (
    _attribution_q,
    _by_model_type_q,
    _by_size_q,
    _by_task_q,
    _excluded_reasons_q,
    _histogram_q,
    _memory_by_size_q,
    _memory_stats_q,
    _models_q,
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
SWEEP_COLUMNS = tuple(
    dict.fromkeys(
        (
            "sweep_id",
            "model_id",
            "model_type",
            "task",
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
            "reference_signature",
            *CHECK_COLUMNS,
            "generated_text",
            *MODE_COLUMNS,
            *MULTI_DEVICE_COLUMNS,
            "repro_sha256",
        )
    )
)


def report_tables(data_dir: Path | str, sweep_id: str, baseline_sweep_id: str | None = None) -> dict[str, pl.DataFrame]:
    """Every table of one sweep's report, by name (long only because this docstring names every key and
    the body is one mapping of key -> query).

    The sweep's (and the baseline's) rows are read once; the per-sweep tables then run on them in
    memory, and the history tables over all sweeps, in one ``pl.collect_all``. Unknown ids raise
    ``ValueError`` (see ``require_sweep``). Keys: sweeps, summary (with model_failures and
    stack_pass_rate), attribution (whose failures), verdicts, excluded, by_task (the pass rate per task),
    by_model_type, by_size, signatures (with attribution, task and new since the baseline), tokens, timings,
    timing_histogram, memory, memory_by_size, reference, pass_checks (is a PASS right: the passes by what
    their check says) and suspect_passes (``analysis.checks``), changes (per model and variant), signature_changes, history, by_version
    (the three components stacked); the execution modes (``analysis.modes``): variant_stats (one row per
    variant: more than one means a matrix sweep), verdict_grid, eager_pass_compile_fail,
    graph_break_reasons; models bigger than one chip (``analysis.parallel``): multi_device (the runs on
    more than one device) and by_parallelism (none / tp / ep); models (every run, PASS included: ``tables.model_rows``
    with its record and repro body's paths, ``with_files``); and the runs listed but without a row
    (``coverage.unprobed``): pending (model_id, variant, problem, last_error, at, baseline_status) and
    not_tested (model_id, variant, listed_by, baseline_status). Those are no failures: they are left out of ``changes`` (where they would read as
    "removed"). The operators (``ops_tables``): ops_summary, ops_plan, ops_fallbacks, ops_changes. A what-if
    sweep's runs are read from the ``what_if`` config, where they are kept apart from the stack's, and ``what_if``
    (one row: its ``host_ops``) says it is one.
    """
    results = store.scan(Path(data_dir), "results")
    excluded = store.scan(Path(data_dir), "excluded")
    wanted = [sweep_id] + ([baseline_sweep_id] if baseline_sweep_id else [])
    host_ops = store.what_if_setting(Path(data_dir), sweep_id)  # a what-if sweep: no verdict of the stack, said
    own = store.scan(Path(data_dir), store.WHAT_IF_CONFIG) if host_ops else results  # where its runs are kept
    stats, read, excluded_keys = pl.collect_all(
        [
            sweep_stats(results),
            own.select(SWEEP_COLUMNS).filter(pl.col("sweep_id").is_in(wanted)),
            excluded.filter(pl.col("sweep_id") == sweep_id).select("model_id", "variant"),
        ]
    )
    sweeps = sweep_index(data_dir, stats, cache_dir=Path(data_dir) / SWEEP_CACHE)
    require_sweep(sweeps, sweep_id)
    if baseline_sweep_id:
        require_sweep(sweeps, baseline_sweep_id)
    rows = read.lazy()
    queries = {
        "summary": _sweep_summary_q(rows, sweep_id, excluded),
        "attribution": _attribution_q(rows, sweep_id),
        "verdicts": _verdict_counts_q(rows, sweep_id),
        "excluded": _excluded_reasons_q(excluded, sweep_id),
        "by_task": _by_task_q(rows, sweep_id),
        "by_model_type": _by_model_type_q(rows, sweep_id),
        "by_size": _by_size_q(rows, sweep_id),
        "signatures": _signatures_q(rows, sweep_id, baseline_sweep_id),
        "tokens": _token_stats_q(rows, sweep_id),
        "timings": _timing_stats_q(rows, sweep_id),
        "timing_histogram": _histogram_q(_sweep_rows(rows, sweep_id, TIMING_METRICS), TIMING_METRICS, 20),
        "memory": _memory_stats_q(rows, sweep_id),
        "memory_by_size": _memory_by_size_q(rows, sweep_id),
        "reference": _reference_q(rows, sweep_id),
        "pass_checks": _pass_checks_q(rows, sweep_id),
        "suspect_passes": _suspect_q(rows, sweep_id),
        "history": _history_q(stats, sweeps, excluded),
        "by_version": pl.concat([_by_version_q(stats, c, sweeps) for c in VERSION_COMPONENTS]),
        "changes": _changes_q(rows, sweep_id, baseline_sweep_id or sweep_id),
        "signature_changes": _signature_changes_q(rows, sweep_id, baseline_sweep_id or sweep_id),
        "variant_stats": _variant_stats_q(rows, sweep_id),
        "verdict_grid": _grid_long_q(rows, sweep_id, excluded),
        "eager_pass_compile_fail": _eager_pass_compile_fail_q(rows, sweep_id),
        "graph_break_reasons": _break_reasons_q(rows, sweep_id),
        "recompile_flags": _recompile_flags_q(rows, sweep_id),
        "multi_device": _multi_device_q(rows, sweep_id),
        "by_parallelism": _by_parallelism_q(rows, sweep_id),
        "models": _models_q(rows, sweep_id),
    }
    names = list(queries)
    tables = dict(zip(names, pl.collect_all([queries[n] for n in names])))
    tables["sweeps"] = sweeps
    if host_ops:
        tables["what_if"] = pl.DataFrame({"host_ops": [host_ops]})
    tables["device_time"] = _device_time(data_dir, sweep_id)
    tables["variant_stats"] = order_variants(tables["variant_stats"])
    tables["verdict_grid"] = grid_from_long(tables["verdict_grid"])
    probed = pl.concat(
        [rows.filter(pl.col("sweep_id") == sweep_id).select(*KEY).collect(), excluded_keys], how="vertical_relaxed"
    )
    pending, not_tested = unprobed(data_dir, sweep_id, probed)
    baseline = (
        rows.filter(pl.col("sweep_id") == baseline_sweep_id)
        .select("model_id", variant_col(), pl.col("status").alias("baseline_status"))
        .unique(KEY)
        .collect()
        if baseline_sweep_id
        else pl.DataFrame(schema={"model_id": pl.String, "variant": pl.String, "baseline_status": pl.String})
    )
    tables["pending"] = pending.join(baseline, on=KEY, how="left", maintain_order="left")
    tables["not_tested"] = not_tested.join(baseline, on=KEY, how="left", maintain_order="left")
    unprobed_keys = pl.concat([pending.select(KEY), not_tested.select(KEY)]).with_columns(pl.lit(True).alias("_u"))
    changes = tables["changes"].join(unprobed_keys.unique(KEY), on=KEY, how="left", maintain_order="left")
    changes = changes.filter(~((pl.col("change") == "removed") & pl.col("_u").fill_null(False))).drop("_u")
    if baseline_sweep_id:  # the gate's own words where it says more: flaky, excluded, dropped, vanished
        changes = decision.relabel(changes, data_dir, baseline_sweep_id, sweep_id)
    tables["changes"] = changes
    tables.update(ops_tables(data_dir, sweep_id, baseline_sweep_id))
    tables["stack_speed"] = perf.between_stacks(data_dir, sweep_id)  # a sweep of several stacks: beyond noise
    tables["perf"] = perf.perf_table(data_dir, sweep_id)  # every PASS's speed; beyond noise since the baseline
    tables["host_cost"] = host_cost.host_cost_table(data_dir, sweep_id)  # PASS runs that sync or fall back per token
    if baseline_sweep_id:
        tables["perf_changes"] = perf.changes(data_dir, baseline_sweep_id, sweep_id)
    tables["models"] = with_files(data_dir, sweep_id, tables["models"])
    tables.update(_standing(data_dir, sweep_id, sweeps))
    return tables


def _standing(data_dir: Path | str, sweep_id: str, sweeps: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """expectations: the sweep's runs against the expectations its definition named (``analysis.expectations``,
    with its flaky runs apart); streaks: flips and streaks of its models over the sweeps of its name and device
    (``history.model_streaks``), the models that flipped or keep failing."""
    from . import decision, expectations
    from .history import model_streaks

    folder = store.sweep_dir(Path(data_dir), sweep_id)
    expected = (
        expectations.from_meta(store.read_sweep(Path(data_dir), sweep_id).expect)
        if (folder / "sweep.json").is_file()
        else {}
    )
    table = expectations.standing(decision.read_runs(data_dir, sweep_id).runs, expected)
    streaks = model_streaks(store.scan(Path(data_dir), "results"), sweeps).filter(
        (pl.col("last_sweep") == sweep_id) & ((pl.col("flips") > 0) | (pl.col("outcome") != "PASS"))
    )
    return {"expectations": table, "streaks": streaks}


def with_files(data_dir: Path | str, sweep_id: str, models: pl.DataFrame) -> pl.DataFrame:
    """``models`` (``tables.model_rows``) with where each run's files are, relative to the data folder, or null
    where absent: ``record`` (its JSON record, ``store.record_file``; an older sweep's name found by
    ``store.find_record``), ``repro_body`` (its repro body: the data folder's ``repro/<sha>.py``, else the
    sweep's) and ``localised`` (``model-support localise``'s result, its first wrong operator in
    ``localised_operator``: "none" when none is wrong). The report links them from ``reports/``; each folder is
    listed once, not probed per model."""
    data_dir = Path(data_dir)
    folder = store.sweep_dir(data_dir, sweep_id)

    def names(path: Path) -> set[str]:
        return {p.name for p in path.iterdir()} if path.is_dir() else set()

    records, bodies, sweep_bodies = names(folder / "records"), names(store.repro_dir(data_dir)), names(folder / "repro")
    localised = names(folder / store.LOCALISED)
    record_paths: list[str | None] = []
    body_paths: list[str | None] = []
    localised_paths: list[str | None] = []
    operators: list[str | None] = []
    for model_id, variant, sha in models.select("model_id", "variant", "repro_sha256").rows():
        name = f"{store.stem(model_id, variant)}.json"
        localised_paths.append(f"sweeps/{sweep_id}/{store.LOCALISED}/{name}" if name in localised else None)
        operators.append(_localised_operator(folder / store.LOCALISED / name) if name in localised else None)
        if name in records:
            record_paths.append(f"sweeps/{sweep_id}/records/{name}")
        elif records and (found := store.find_record(data_dir, sweep_id, model_id, variant)):
            record_paths.append(found.relative_to(data_dir).as_posix())
        else:
            record_paths.append(None)
        valid = isinstance(sha, str) and store.REPRO_NAME.fullmatch(sha)
        if valid and f"{sha}.py" in bodies:
            body_paths.append(f"{store.REPRO}/{sha}.py")
        elif valid and f"{sha}.py" in sweep_bodies:
            body_paths.append(f"sweeps/{sweep_id}/{store.REPRO}/{sha}.py")
        else:
            body_paths.append(None)
    return models.with_columns(
        pl.Series("record", record_paths, dtype=pl.String),
        pl.Series("repro_body", body_paths, dtype=pl.String),
        pl.Series("localised", localised_paths, dtype=pl.String),
        pl.Series("localised_operator", operators, dtype=pl.String),
    )


def _localised_operator(path: Path) -> str | None:
    """The first wrong operator a stored localisation names ("none" when none is wrong); None if unreadable."""
    try:
        return json.loads(path.read_text()).get("operator") or "none"
    except (OSError, ValueError, AttributeError):
        return None


def _device_time(data_dir: Path | str, sweep_id: str) -> pl.DataFrame:
    """How the sweep's last run used its devices (sweep.json's ``device_time``: held-idle share, utilisation);
    one row, or none for a sweep without it (older sweeps, Ray, a synthetic history)."""
    try:
        used = store.read_sweep(Path(data_dir), sweep_id).device_time
    except (OSError, ValueError):
        return pl.DataFrame()
    return pl.DataFrame([used]) if used else pl.DataFrame()
