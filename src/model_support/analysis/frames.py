"""What every analysis query shares: the frame helpers, the metric names and the buckets.

Every query takes the ``results`` rows of all sweeps (``store.scan(data_dir, "results")``, a
LazyFrame; a DataFrame is accepted too) and returns a small ``pl.DataFrame``. Queries are lazy and
select only the columns they need, so the same functions serve one sweep of ten models and a
history of a million rows. Columns that older files lack (``schema.LATER_FIELDS``) read as null and
give null statistics, never an error.
"""

from __future__ import annotations

import polars as pl

from .. import schema, store

Frame = pl.LazyFrame | pl.DataFrame


#: Model size buckets by ``num_params``, in display order.
SIZE_BUCKETS = ("<10M", "10M-1B", "1-10B", ">10B", "unknown")
#: Outcomes of the CPU reference check.
REFERENCE_OUTCOMES = ("match", "mismatch", "not run")
#: Stack components the history is broken down by (fields of the ``versions`` struct).
VERSION_COMPONENTS = ("torch", "torch_tpu", "transformers")
TIMING_METRICS = ("load_s", "first_token_s", "decode_tokens_per_s")
MEMORY_METRICS = ("peak_host_mem_mb", "peak_device_mem_mb")
TOKEN_METRICS = ("tokens_in", "tokens_out")
#: How a model's outcome changed between a baseline sweep and a later one, in display order.
CHANGES = ("newly failing", "newly passing", "status changed", "signature changed", "added", "removed")
SIGNATURE_CHANGES = ("appeared", "vanished")
#: Shown for a failure that has no signature (a record written before signatures existed).
NO_SIGNATURE = "(no signature)"

_DTYPES = store.polars_schema()


# --------------------------------------------------------------------------------------------
# helpers


def _lazy(frame: Frame) -> pl.LazyFrame:
    return frame.lazy() if isinstance(frame, pl.DataFrame) else frame


def _with_columns(frame: Frame, columns) -> pl.LazyFrame:
    """``frame`` restricted to ``columns``; a column the frame lacks is added as typed nulls."""
    lf = _lazy(frame)
    have = set(lf.collect_schema().names())
    exprs = [pl.col(c) if c in have else pl.lit(None, dtype=_DTYPES[c]).alias(c) for c in columns]
    return lf.select(exprs)


def _sweep_rows(frame: Frame, sweep_id: str, columns) -> pl.LazyFrame:
    cols = list(dict.fromkeys(["sweep_id", *columns]))
    return _with_columns(frame, cols).filter(pl.col("sweep_id") == sweep_id)


def _passed() -> pl.Expr:
    return (pl.col("status") == schema.PASS).fill_null(False)


def _rate_aggs() -> list[pl.Expr]:
    return [
        pl.len().cast(pl.Int64).alias("models"),
        _passed().sum().cast(pl.Int64).alias("passed"),
    ]


def _with_rate(lf: pl.LazyFrame) -> pl.LazyFrame:
    return lf.with_columns(
        failed=pl.col("models") - pl.col("passed"),
        pass_rate=pl.when(pl.col("models") > 0).then(pl.col("passed") / pl.col("models")),
    )


def size_bucket(column: str = "num_params") -> pl.Expr:
    """``num_params`` -> one of ``SIZE_BUCKETS`` (an Enum, so it sorts in size order)."""
    n = pl.col(column)
    return (
        pl.when(n.is_null())
        .then(pl.lit("unknown"))
        .when(n < 10_000_000)
        .then(pl.lit("<10M"))
        .when(n < 1_000_000_000)
        .then(pl.lit("10M-1B"))
        .when(n < 10_000_000_000)
        .then(pl.lit("1-10B"))
        .otherwise(pl.lit(">10B"))
        .cast(pl.Enum(SIZE_BUCKETS))
        .alias("size_bucket")
    )


def _describe(lf: pl.LazyFrame, metrics, stats) -> pl.LazyFrame:
    """One row per metric: ``count`` (non-null values) and each of ``stats`` as Float64."""
    funcs = {
        "mean": lambda c: c.mean(),
        "median": lambda c: c.median(),
        "p90": lambda c: c.quantile(0.9, interpolation="linear"),
        "min": lambda c: c.min(),
        "max": lambda c: c.max(),
        "total": lambda c: pl.when(c.count() > 0).then(c.sum()),
    }
    parts = []
    for metric in metrics:
        col = pl.col(metric).cast(pl.Float64)
        parts.append(
            lf.select(
                pl.lit(metric).alias("metric"),
                col.count().cast(pl.Int64).alias("count"),
                *[funcs[s](col).cast(pl.Float64).alias(s) for s in stats],
            )
        )
    return pl.concat(parts, how="vertical")


def version(component: str) -> pl.Expr:
    return pl.col("versions").struct.field(component)
