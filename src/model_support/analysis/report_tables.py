"""Everything one sweep's report shows, in two passes over the data.

One ``pl.collect_all`` reads the sweep's own rows (and its baseline's) and a small per-sweep summary
of every row (``history.sweep_stats``); a second one derives all the tables from those in memory.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ..record import store
from . import decision, host_cost_rows, perf
from .diff import KEY, changes_query, signature_changes_query
from .frames import (
    MEMORY_METRICS,
    TIMING_METRICS,
    TOKEN_METRICS,
    VERSION_COMPONENTS,
    sweep_rows,
    variant_col,
)
from .history import (
    SWEEP_CACHE,
    by_version_query,
    history_query,
    require_sweep,
    sweep_index,
    sweep_stats,
)
from .modes import (
    MODE_COLUMNS,
    break_reasons_query,
    eager_pass_compile_fail_query,
    grid_from_long,
    grid_long_query,
    order_variants,
    recompile_flags_query,
    variant_stats_query,
)
from .ops_tables import OPS_TABLES, ops_tables
from .parallel import MULTI_DEVICE_COLUMNS, by_parallelism_query, multi_device_query
from .passes_checked import CHECK_COLUMNS, pass_checks_query, suspect_query
from .tables import (
    attribution_query,
    by_model_type_query,
    by_size_query,
    by_task_query,
    excluded_reasons_query,
    histogram_query,
    memory_by_size_query,
    memory_stats_query,
    models_query,
    reference_query,
    signatures_query,
    sweep_summary_query,
    timing_stats_query,
    token_stats_query,
    verdict_counts_query,
)
from .unprobed_models import unprobed

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


@dataclass(frozen=True)
class SweepRows:
    """What the report's lazy queries read: the sweep's (and its baseline's) rows, read once, its
    excluded rows, the per-sweep summary of every row and the sweep index."""

    rows: pl.LazyFrame
    sweep_id: str
    baseline: str | None
    excluded: pl.LazyFrame
    stats: pl.DataFrame
    sweeps: pl.DataFrame


#: Each table one lazy query makes from the sweep's rows, declared once: name -> (what it holds, its
#: query). All run in one ``pl.collect_all``; ``LATER`` are the tables made after, from these or
#: from other files.
QUERIES: dict[str, tuple[str, Callable[[SweepRows], pl.LazyFrame]]] = {
    "summary": (
        "the verdict counts, model_failures and stack_pass_rate",
        lambda r: sweep_summary_query(r.rows, r.sweep_id, r.excluded),
    ),
    "attribution": (
        "whose failures: the stack's, the model's",
        lambda r: attribution_query(r.rows, r.sweep_id),
    ),
    "verdicts": ("the count of each verdict", lambda r: verdict_counts_query(r.rows, r.sweep_id)),
    "excluded": (
        "the excluded runs by reason",
        lambda r: excluded_reasons_query(r.excluded, r.sweep_id),
    ),
    "by_task": ("the pass rate per task", lambda r: by_task_query(r.rows, r.sweep_id)),
    "by_model_type": (
        "the pass rate per model type",
        lambda r: by_model_type_query(r.rows, r.sweep_id),
    ),
    "by_size": ("the pass rate per size bucket", lambda r: by_size_query(r.rows, r.sweep_id)),
    "signatures": (
        "the failure signatures, with attribution, task and whether new since the baseline",
        lambda r: signatures_query(r.rows, r.sweep_id, r.baseline),
    ),
    "tokens": ("tokens in and out", lambda r: token_stats_query(r.rows, r.sweep_id)),
    "timings": ("the stages' seconds", lambda r: timing_stats_query(r.rows, r.sweep_id)),
    "timing_histogram": (
        "the stages' seconds, binned",
        lambda r: histogram_query(
            sweep_rows(r.rows, r.sweep_id, TIMING_METRICS), TIMING_METRICS, 20
        ),
    ),
    "memory": ("peak memory", lambda r: memory_stats_query(r.rows, r.sweep_id)),
    "memory_by_size": (
        "peak memory per size bucket",
        lambda r: memory_by_size_query(r.rows, r.sweep_id),
    ),
    "reference": (
        "agreement with the CPU reference",
        lambda r: reference_query(r.rows, r.sweep_id),
    ),
    "pass_checks": (
        "is a PASS right: the passes by what their check says (``analysis.passes_checked``)",
        lambda r: pass_checks_query(r.rows, r.sweep_id),
    ),
    "suspect_passes": (
        "the passes their check doubts",
        lambda r: suspect_query(r.rows, r.sweep_id),
    ),
    "history": ("every sweep's pass rate", lambda r: history_query(r.stats, r.sweeps, r.excluded)),
    "by_version": (
        "the pass rate per version of each stack component, stacked",
        lambda r: pl.concat([by_version_query(r.stats, c, r.sweeps) for c in VERSION_COMPONENTS]),
    ),
    "changes": (
        "per model and variant, against the baseline (runs listed but not probed left out, "
        "the gate's words)",
        lambda r: changes_query(r.rows, r.sweep_id, r.baseline or r.sweep_id),
    ),
    "signature_changes": (
        "failure signatures that came or went since the baseline",
        lambda r: signature_changes_query(r.rows, r.sweep_id, r.baseline or r.sweep_id),
    ),
    "variant_stats": (
        "one row per variant (``analysis.modes``; more than one: a matrix sweep)",
        lambda r: variant_stats_query(r.rows, r.sweep_id),
    ),
    "verdict_grid": (
        "model x variant verdicts",
        lambda r: grid_long_query(r.rows, r.sweep_id, r.excluded),
    ),
    "eager_pass_compile_fail": (
        "the models that pass eager and fail compiled",
        lambda r: eager_pass_compile_fail_query(r.rows, r.sweep_id),
    ),
    "graph_break_reasons": (
        "compiled runs' graph breaks",
        lambda r: break_reasons_query(r.rows, r.sweep_id),
    ),
    "recompile_flags": (
        "compiled runs that recompile",
        lambda r: recompile_flags_query(r.rows, r.sweep_id),
    ),
    "multi_device": (
        "the runs on more than one device (``analysis.parallel``)",
        lambda r: multi_device_query(r.rows, r.sweep_id),
    ),
    "by_parallelism": (
        "the pass rate by none / tp / ep",
        lambda r: by_parallelism_query(r.rows, r.sweep_id),
    ),
    "models": (
        "every run, PASS included, with its record's and repro body's paths (``with_files``)",
        lambda r: models_query(r.rows, r.sweep_id),
    ),
}

#: The tables made after ``QUERIES``, declared here by name with what they hold.
LATER = {
    "sweeps": "the sweep index (``history.sweep_index``)",
    "what_if": "a what-if sweep's one row, its host_ops (its runs are read from the what_if config)",
    "device_time": "how the sweep's last run used its devices (sweep.json's device_time)",
    "pending": "runs listed without a row: model_id, variant, problem, last_error, at, baseline_status",
    "not_tested": "models listed but not tested: model_id, variant, listed_by, baseline_status",
    **dict.fromkeys(OPS_TABLES, "the operators (``ops_tables``: each one's docstring)"),
    "stack_speed": "a sweep of several stacks: their speeds, beyond noise (``perf.between_stacks``)",
    "perf": "every PASS's speed; beyond noise since the baseline (``perf.perf_table``)",
    "host_cost": "PASS runs that sync or fall back per token (``host_cost_rows``)",
    "perf_changes": "speed changes since the baseline, beyond noise",
    "expectations": "the runs against the expectations the sweep's definition named",
    "streaks": "flips and streaks of the sweep's models over the sweeps of its name and device",
}


def report_tables(
    data_dir: Path | str, sweep_id: str, baseline_sweep_id: str | None = None
) -> dict[str, pl.DataFrame]:
    """Every table of one sweep's report, by name (``QUERIES`` and ``LATER`` say what each
    holds).

    The sweep's (and the baseline's) rows are read once; ``QUERIES`` then run on them in memory,
    with the history tables over all sweeps, in one ``pl.collect_all``. Unknown ids raise
    ``ValueError`` (``require_sweep``). The runs listed without a row are no failures: they are
    left out of ``changes`` (where they would read as "removed")."""
    read, excluded_keys, host_ops = _read(data_dir, sweep_id, baseline_sweep_id)
    names = list(QUERIES)
    tables = dict(zip(names, pl.collect_all([QUERIES[name][1](read) for name in names])))
    tables["sweeps"] = read.sweeps
    if host_ops:
        tables["what_if"] = pl.DataFrame({"host_ops": [host_ops]})
    tables["device_time"] = _device_time(data_dir, sweep_id)
    tables["variant_stats"] = order_variants(tables["variant_stats"])
    tables["verdict_grid"] = grid_from_long(tables["verdict_grid"])
    tables.update(_unprobed(data_dir, read, excluded_keys))
    unprobed_keys = pl.concat([tables["pending"].select(KEY), tables["not_tested"].select(KEY)])
    unprobed_keys = unprobed_keys.with_columns(pl.lit(True).alias("_u"))
    changes = tables["changes"].join(
        unprobed_keys.unique(KEY), on=KEY, how="left", maintain_order="left"
    )
    changes = changes.filter(
        ~((pl.col("change") == "removed") & pl.col("_u").fill_null(False))
    ).drop("_u")
    # the gate's own words where it says more: flaky, excluded, dropped, vanished
    if baseline_sweep_id:
        changes = decision.relabel(changes, data_dir, baseline_sweep_id, sweep_id)
    tables["changes"] = changes
    tables.update(ops_tables(data_dir, sweep_id, baseline_sweep_id))
    tables["stack_speed"] = perf.between_stacks(data_dir, sweep_id)
    tables["perf"] = perf.perf_table(data_dir, sweep_id)
    tables["host_cost"] = host_cost_rows.host_cost_table(data_dir, sweep_id)
    if baseline_sweep_id:
        tables["perf_changes"] = perf.changes(data_dir, baseline_sweep_id, sweep_id)
    tables["models"] = with_files(data_dir, sweep_id, tables["models"])
    tables.update(_standing(data_dir, sweep_id, read.sweeps))
    return tables


def _read(
    data_dir: Path | str, sweep_id: str, baseline: str | None
) -> tuple[SweepRows, pl.DataFrame, str | None]:
    """One read of what ``QUERIES`` need (a what-if sweep's runs from the what_if config, where
    they are kept apart from the stack's), the excluded runs' keys, and a what-if sweep's
    host_ops (None for a stack's)."""
    results = store.scan(Path(data_dir), "results")
    excluded = store.scan(Path(data_dir), "excluded")
    wanted = [sweep_id] + ([baseline] if baseline else [])
    # a what-if sweep: no verdict of the stack, said
    host_ops = store.what_if_setting(Path(data_dir), sweep_id)
    # where its runs are kept
    own = store.scan(Path(data_dir), store.WHAT_IF_CONFIG) if host_ops else results
    stats, read, excluded_keys = pl.collect_all(
        [
            sweep_stats(results),
            own.select(SWEEP_COLUMNS).filter(pl.col("sweep_id").is_in(wanted)),
            excluded.filter(pl.col("sweep_id") == sweep_id).select("model_id", "variant"),
        ]
    )
    sweeps = sweep_index(data_dir, stats, cache_dir=Path(data_dir) / SWEEP_CACHE)
    require_sweep(sweeps, sweep_id)
    if baseline:
        require_sweep(sweeps, baseline)
    return (
        SweepRows(read.lazy(), sweep_id, baseline, excluded, stats, sweeps),
        excluded_keys,
        host_ops,
    )


def _unprobed(
    data_dir: Path | str, read: SweepRows, excluded_keys: pl.DataFrame
) -> dict[str, pl.DataFrame]:
    """``pending`` and ``not_tested`` (``unprobed_models.unprobed``), each with its baseline's
    verdict."""
    rows, sweep_id, baseline_sweep_id = read.rows, read.sweep_id, read.baseline
    probed = rows.filter(pl.col("sweep_id") == sweep_id).select(*KEY).collect()
    pending, not_tested = unprobed(
        data_dir, sweep_id, pl.concat([probed, excluded_keys], how="vertical_relaxed")
    )
    baseline = (
        rows.filter(pl.col("sweep_id") == baseline_sweep_id)
        .select("model_id", variant_col(), pl.col("status").alias("baseline_status"))
        .unique(KEY)
        .collect()
        if baseline_sweep_id
        else pl.DataFrame(
            schema={"model_id": pl.String, "variant": pl.String, "baseline_status": pl.String}
        )
    )
    return {
        "pending": pending.join(baseline, on=KEY, how="left", maintain_order="left"),
        "not_tested": not_tested.join(baseline, on=KEY, how="left", maintain_order="left"),
    }


def _standing(data_dir: Path | str, sweep_id: str, sweeps: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """expectations: the sweep's runs against the expectations its definition named
    (``analysis.expectations``, with its flaky runs apart); streaks: flips and streaks of its
    models over the sweeps of its name and device (``history.model_streaks``), the models that
    flipped or keep failing."""
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
    """``models`` (``tables.model_rows``) with where each run's files are, relative to the data
    folder, or null where absent: ``record`` (its JSON record, ``store.record_file``; an older
    sweep's name found by ``store.find_record``), ``repro_body`` (its repro body: the data
    folder's ``repro/<sha>.py``, else the sweep's) and ``localised`` (``model-support
    localise``'s result, its first wrong operator in ``localised_operator``: "none" when none is
    wrong). The report links them from ``reports/``; each folder is listed once, not probed per
    model."""
    data_dir = Path(data_dir)
    folder = store.sweep_dir(data_dir, sweep_id)

    def names(path: Path) -> set[str]:
        return {p.name for p in path.iterdir()} if path.is_dir() else set()

    records, bodies, sweep_bodies = (
        names(folder / "records"),
        names(store.repro_dir(data_dir)),
        names(folder / "repro"),
    )
    localised = names(folder / store.LOCALISED)
    record_paths: list[str | None] = []
    body_paths: list[str | None] = []
    localised_paths: list[str | None] = []
    operators: list[str | None] = []
    for model_id, variant, sha in models.select("model_id", "variant", "repro_sha256").rows():
        name = f"{store.stem(model_id, variant)}.json"
        localised_paths.append(
            f"sweeps/{sweep_id}/{store.LOCALISED}/{name}" if name in localised else None
        )
        operators.append(
            _localised_operator(folder / store.LOCALISED / name) if name in localised else None
        )
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
    """The first wrong operator a stored localisation names ("none" when none is wrong); None if
    unreadable."""
    try:
        return json.loads(path.read_text()).get("operator") or "none"
    except (OSError, ValueError, AttributeError):
        return None


def _device_time(data_dir: Path | str, sweep_id: str) -> pl.DataFrame:
    """How the sweep's last run used its devices (sweep.json's ``device_time``: held-idle share,
    utilisation); one row, or none for a sweep without it (older sweeps, Ray, a synthetic
    history)."""
    try:
        used = store.read_sweep(Path(data_dir), sweep_id).device_time
    except (OSError, ValueError):
        return pl.DataFrame()
    return pl.DataFrame([used]) if used else pl.DataFrame()
