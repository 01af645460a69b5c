"""What every analysis query shares: the frame helpers, the metric names and the buckets.

Every query takes the ``results`` rows of all sweeps (``store.scan(data_dir, "results")``, a
LazyFrame; a DataFrame is accepted too) and returns a small ``pl.DataFrame``. Queries are lazy and
select only the columns they need, so the same functions serve one sweep of ten models and a
history of a million rows. Columns that older files lack (``schema.LATER_FIELDS``) read as null and
give null statistics, never an error.
"""

from __future__ import annotations

import polars as pl

from ..probe import probe_params
from ..record import schema, store

Frame = pl.LazyFrame | pl.DataFrame


#: Model size buckets by ``num_params``, in display order.
SIZE_BUCKETS = ("<10M", "10M-1B", "1-10B", ">10B", "unknown")
#: Outcomes of the CPU reference check.
REFERENCE_OUTCOMES = ("match", "mismatch", "not run")
#: Stack components the history is broken down by (fields of the ``versions`` struct).
VERSION_COMPONENTS = ("torch", "torch_tpu", "transformers")
TIMING_METRICS = ("load_s", "first_token_s", "decode_tokens_per_s")
MEMORY_METRICS = ("peak_host_mem_mb", "peak_device_mem_mb")
TOKEN_METRICS = ("tokens_in", "tokens_out", "image_tokens")
#: The tasks a probe runs, in display order; a null ``task`` (files before the column) reads as text-generation.
TASKS = (schema.TEXT_GENERATION, schema.IMAGE_TEXT_TO_TEXT)
#: How a (model, variant)'s outcome changed between a baseline sweep and a later one, in display order: what a
#: porting team acts on first. A model newly failing is split by whose failure it is (``attribution``): the
#: stack's (the CPU reference passes), everywhere (the model's, or both: the reference fails too, usually a
#: transformers or checkpoint change), or unknown (no reference rerun: plain "newly failing").
NEWLY_BROKEN_BY_STACK = "newly broken by the stack"
NEWLY_FAILING = "newly failing"
NEWLY_FAILING_EVERYWHERE = "newly failing everywhere"
CHANGES = (
    NEWLY_BROKEN_BY_STACK,
    NEWLY_FAILING,
    NEWLY_FAILING_EVERYWHERE,
    "newly passing",
    "status changed",
    "signature changed",
    "added",
    "removed",
)
#: Whose failure it is, as the report counts it: ``schema.ATTRIBUTIONS`` plus a failure with none recorded.
UNKNOWN_ATTRIBUTION = "unknown"
ATTRIBUTION_KINDS = (*schema.ATTRIBUTIONS, UNKNOWN_ATTRIBUTION)
ATTRIBUTION_KIND_HELP = {
    **schema.ATTRIBUTION_HELP,
    UNKNOWN_ATTRIBUTION: "no reference rerun: switched off, above the size or memory limit, a stage not rerun "
    "(download, runner), or a sweep before attribution",
}
#: A record's variant when it has none (sweeps without a matrix, and files that predate the column).
DEFAULT_VARIANT = schema.DEFAULT_VARIANT
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


def variant_col() -> pl.Expr:
    """``variant``, a null (an older file, a sweep without a matrix) read as ``DEFAULT_VARIANT``."""
    return pl.col("variant").fill_null(DEFAULT_VARIANT).alias("variant")


def task_col() -> pl.Expr:
    """``task``, a null (a file that predates the column: every probe then ran text-generation) read so."""
    return pl.col("task").fill_null(schema.TEXT_GENERATION).alias("task")


def attribution_col() -> pl.Expr:
    """Whose failure a row is (one of ``ATTRIBUTION_KINDS``); null for a PASS."""
    failed = pl.col("status").ne_missing(schema.PASS)
    return (
        pl.when(failed).then(pl.col("attribution").fill_null(UNKNOWN_ATTRIBUTION)).otherwise(None).alias("attribution")
    )


def variant_key(label: str) -> tuple:
    """Sort key of a variant label (``eager+dynamic``, ``compile+static+32t``): mode, cache, then new tokens, in
    ``probe_params`` order, so a grid reads eager before compile and dynamic before static; others last."""
    parts = (label or "").split("+")
    mode = probe_params.MODES.index(parts[0]) if parts[0] in probe_params.MODES else len(probe_params.MODES)
    cache = parts[1] if len(parts) > 1 else ""
    cache_i = probe_params.CACHES.index(cache) if cache in probe_params.CACHES else len(probe_params.CACHES)
    rest = "+".join(parts[2:])
    tokens = int(rest[:-1]) if rest.endswith("t") and rest[:-1].isdigit() else (8 if not rest else 1 << 30)
    return (mode, cache_i, tokens, label or "")


def sort_variants(labels) -> list[str]:
    return sorted({v for v in labels if v is not None}, key=variant_key)


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
