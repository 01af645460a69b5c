"""Models bigger than one chip: the runs that used more than one device, and the pass rate by
parallelism.

A record carries ``devices_used`` (how many devices the probe ran on) and ``parallelism``
("none", "tp", "ep"; null when no plan applied). Older files lack both: a null ``devices_used``
reads as 1 and a null ``parallelism`` as "none" (a sharded run whose model has no plan records
null too: it counts as none)."""

from __future__ import annotations

import polars as pl

from ..record import schema
from .frames import Frame, older_col, rate_aggs, sweep_rows, variant_col

#: Parallelism kinds, in display order (always listed, 0 models when absent); any other value
#: follows.
PARALLELISMS = ("none", "tp", "ep")
PARALLELISM_HELP = {
    "none": "the whole model on each device it used: one device, or several with no tensor or expert "
    "parallel plan (null in older files)",
    "tp": "tensor parallel: every weight cut across the devices (tp_size of them)",
    "ep": "expert parallel: each device holds whole experts (ep_size of them)",
}
BYTES_PER_GB = 1e9
#: The columns the tables of this module read: a run over several devices, and what its ranks said.
MULTI_DEVICE_COLUMNS = ("model_id", "variant", "status", *schema.SHARDED_FIELDS)


def devices_col() -> pl.Expr:
    """``devices_used``, null (an older file) read as 1."""
    return older_col("devices_used").cast(pl.Int64)


def parallelism_col() -> pl.Expr:
    """``parallelism``, null (an older file, no plan) read as "none"."""
    return older_col("parallelism")


def multi_device_runs(results: Frame, sweep_id: str) -> pl.DataFrame:
    """One row per run of the sweep on more than one device, the most devices first: model_id,
    variant, devices_used, parallelism, tp_size, ep_size, memory_estimate_gb (the plan's estimate
    of the weights, in GB to 2 decimals), status, and what the ranks said: ranks_agree (the same
    tokens on every rank), rank_errors (one line per rank that raised), rank_log_tail (the failed
    ranks' stderr: a hang's stacks)."""
    return multi_device_query(results, sweep_id).collect()


def multi_device_query(results: Frame, sweep_id: str) -> pl.LazyFrame:
    return (
        sweep_rows(results, sweep_id, MULTI_DEVICE_COLUMNS)
        .with_columns(variant_col(), devices_col(), parallelism_col())
        .filter(pl.col("devices_used") > 1)
        .with_columns(
            (pl.col("memory_estimate_bytes") / BYTES_PER_GB).round(2).alias("memory_estimate_gb")
        )
        .sort(["devices_used", "model_id", "variant"], descending=[True, False, False])
        .select(
            "model_id",
            "variant",
            "devices_used",
            "parallelism",
            "tp_size",
            "ep_size",
            "memory_estimate_gb",
            "status",
            "ranks_agree",
            "rank_errors",
            "rank_log_tail",
        )
    )


def pass_rate_by_parallelism(results: Frame, sweep_id: str) -> pl.DataFrame:
    """parallelism (none, tp, ep always, 0 models when absent; then any other), models (runs),
    passed, pass_rate (null for no models)."""
    return by_parallelism_query(results, sweep_id).collect()


def by_parallelism_query(results: Frame, sweep_id: str) -> pl.LazyFrame:
    counts = (
        sweep_rows(results, sweep_id, ["parallelism", "status"])
        .with_columns(parallelism_col())
        .group_by("parallelism")
        .agg(rate_aggs())
    )
    base = pl.LazyFrame(
        {"parallelism": list(PARALLELISMS), "order": list(range(len(PARALLELISMS)))}
    )
    return (
        base.join(counts, on="parallelism", how="full", coalesce=True)
        .with_columns(
            pl.col("order").fill_null(len(PARALLELISMS)),
            pl.col("models").fill_null(0),
            pl.col("passed").fill_null(0),
        )
        .with_columns(
            pass_rate=pl.when(pl.col("models") > 0).then(pl.col("passed") / pl.col("models"))
        )
        .sort(["order", "parallelism"])
        .select("parallelism", "models", "passed", "pass_rate")
    )


def uses_devices(multi_device: pl.DataFrame, by_parallelism: pl.DataFrame) -> bool:
    """Whether a sweep's report shows the devices section: a run used more than one device, or
    one has a parallelism other than none."""
    planned = by_parallelism.filter((pl.col("parallelism") != "none") & (pl.col("models") > 0))
    return multi_device.height > 0 or planned.height > 0
