"""One sweep's tables: verdicts, whose failures they are, exclusions, pass rate by type and size,
failure signatures, tokens, timings, memory and the CPU reference check. Excluded rows are never
counted as a failure: they are only ever counted, separately; an empty frame gives an empty (or
all-zero) table.

A sweep with a matrix has one row per (model, variant): every count here is of rows (runs), so a
model probed in four variants counts four times; ``distinct_models`` says how many models they
are."""

from __future__ import annotations

import polars as pl

from ..record import schema
from .frames import (
    ATTRIBUTION_KINDS,
    MEMORY_METRICS,
    NO_SIGNATURE,
    REFERENCE_OUTCOMES,
    SIZE_BUCKETS,
    TASKS,
    TIMING_METRICS,
    TOKEN_METRICS,
    Frame,
    attribution_col,
    check_measure_col,
    check_note_col,
    describe,
    pass_check_col,
    rate_aggs,
    size_bucket,
    sweep_rows,
    task_col,
    variant_col,
    with_rate,
)

#: The size group of a model that failed before it was loaded (at download or load, no parameters
#: counted): apart from "unknown" (loaded, its count not recorded), whose pass rate it would
#: otherwise drag to 0%.
NOT_LOADED = "failed before loading"
#: The size groups of the report's breakdowns, in order: ``SIZE_BUCKETS``, then ``NOT_LOADED``.
SIZE_GROUPS = (*SIZE_BUCKETS, NOT_LOADED)
#: The stages a failure can stop at before the model's parameters exist.
BEFORE_LOADING = ("download", "load")


def size_group() -> pl.Expr:
    """``size_bucket``, with a failure at download or load that counted no parameters as
    ``NOT_LOADED`` (an Enum of ``SIZE_GROUPS``, so it sorts in size order): its size is unknown
    because it never loaded."""
    not_loaded = (
        pl.col("num_params").is_null()
        & pl.col("status").ne_missing(schema.PASS)
        & pl.col("failure_stage").is_in(list(BEFORE_LOADING)).fill_null(False)
    )
    return (
        pl.when(not_loaded)
        .then(pl.lit(NOT_LOADED))
        .otherwise(size_bucket().cast(pl.String))
        .cast(pl.Enum(SIZE_GROUPS))
        .alias("size_bucket")
    )


# --------------------------------------------------------------------------------------------
# one sweep


def verdict_counts(results: Frame, sweep_id: str) -> pl.DataFrame:
    """status, count, share: the four verdicts always (count 0 when absent), then any other."""
    return verdict_counts_query(results, sweep_id).collect()


def verdict_counts_query(results: Frame, sweep_id: str) -> pl.LazyFrame:
    counts = (
        sweep_rows(results, sweep_id, ["status"])
        .group_by("status")
        .agg(pl.len().cast(pl.Int64).alias("count"))
    )
    base = pl.LazyFrame(
        {"status": list(schema.VERDICTS), "order": list(range(len(schema.VERDICTS)))}
    )
    return (
        base.join(counts, on="status", how="full", coalesce=True)
        .with_columns(pl.col("count").fill_null(0), pl.col("order").fill_null(len(schema.VERDICTS)))
        .with_columns(
            share=pl.when(pl.col("count").sum() > 0).then(pl.col("count") / pl.col("count").sum()),
        )
        .sort(["order", "status"], nulls_last=True)
        .select("status", "count", "share")
    )


def sweep_summary(results: Frame, sweep_id: str, excluded: Frame | None = None) -> pl.DataFrame:
    """One row: sweep_id, models (rows probed), passed, failed, pass_rate, excluded (counted
    apart, never failed), model_failures (failures attributed to the model: it fails the same way
    on the CPU reference) and stack_pass_rate = passed / (models - model_failures): how the stack
    does on what can run at all."""
    return sweep_summary_query(results, sweep_id, excluded).collect()


def sweep_summary_query(results: Frame, sweep_id: str, excluded: Frame | None) -> pl.LazyFrame:
    model_failure = (
        pl.col("status").ne_missing(schema.PASS) & (pl.col("attribution") == "model")
    ).fill_null(False)
    summary = with_rate(
        sweep_rows(results, sweep_id, ["status", "attribution"]).select(
            *rate_aggs(), model_failure.sum().cast(pl.Int64).alias("model_failures")
        )
    )
    if excluded is None:
        n_excluded = pl.LazyFrame({"excluded": [0]}, schema={"excluded": pl.Int64})
    else:
        n_excluded = sweep_rows(excluded, sweep_id, []).select(
            pl.len().cast(pl.Int64).alias("excluded")
        )
    can_run = pl.col("models") - pl.col("model_failures")
    return summary.join(n_excluded, how="cross").select(
        pl.lit(sweep_id).alias("sweep_id"),
        "models",
        "passed",
        "failed",
        "pass_rate",
        "excluded",
        "model_failures",
        pl.when(can_run > 0).then(pl.col("passed") / can_run).alias("stack_pass_rate"),
    )


def attribution_counts(results: Frame, sweep_id: str) -> pl.DataFrame:
    """Whose failures they are: attribution (stack, model, both, unknown: every one of
    ``ATTRIBUTION_KINDS``, count 0 when absent), count (failing rows), share (of the failures)."""
    return attribution_query(results, sweep_id).collect()


def attribution_query(results: Frame, sweep_id: str) -> pl.LazyFrame:
    counts = (
        sweep_rows(results, sweep_id, ["status", "attribution"])
        .filter(pl.col("status").ne_missing(schema.PASS))
        .select(attribution_col())
        .group_by("attribution")
        .agg(pl.len().cast(pl.Int64).alias("count"))
    )
    base = pl.LazyFrame(
        {"attribution": list(ATTRIBUTION_KINDS), "order": list(range(len(ATTRIBUTION_KINDS)))}
    )
    return (
        base.join(counts, on="attribution", how="left")
        .with_columns(pl.col("count").fill_null(0))
        .with_columns(
            share=pl.when(pl.col("count").sum() > 0).then(pl.col("count") / pl.col("count").sum())
        )
        .sort("order")
        .select("attribution", "count", "share")
    )


def excluded_reasons(excluded: Frame, sweep_id: str) -> pl.DataFrame:
    """exclusion_reason, count, example_models (up to 3) for one sweep's excluded rows."""
    return excluded_reasons_query(excluded, sweep_id).collect()


def excluded_reasons_query(excluded: Frame, sweep_id: str) -> pl.LazyFrame:
    return (
        sweep_rows(excluded, sweep_id, ["model_id", "exclusion_reason"])
        .with_columns(pl.col("exclusion_reason").fill_null("(no reason given)"))
        .group_by("exclusion_reason")
        .agg(
            pl.len().cast(pl.Int64).alias("count"),
            pl.col("model_id").sort().head(3).alias("example_models"),
        )
        .sort(["count", "exclusion_reason"], descending=[True, False])
    )


def pass_rate_by_task(results: Frame, sweep_id: str) -> pl.DataFrame:
    """task, models (rows), passed, failed, pass_rate, distinct_models: one row per task the
    sweep probed, in ``TASKS`` order (text-generation first; a null task reads as
    text-generation)."""
    return by_task_query(results, sweep_id).collect()


def by_task_query(results: Frame, sweep_id: str) -> pl.LazyFrame:
    lf = sweep_rows(results, sweep_id, ["task", "model_id", "status"]).with_columns(task_col())
    aggs = [*rate_aggs(), pl.col("model_id").n_unique().cast(pl.Int64).alias("distinct_models")]
    order = pl.col("task").replace_strict(list(TASKS), list(range(len(TASKS))), default=len(TASKS))
    return (
        with_rate(lf.group_by("task").agg(aggs))
        .sort(order, pl.col("task"))
        .select("task", "models", "passed", "failed", "pass_rate", "distinct_models")
    )


def pass_rate_by_model_type(results: Frame, sweep_id: str) -> pl.DataFrame:
    """model_type, models (rows), passed, failed, pass_rate, distinct_models; most common type
    first (null: "unknown")."""
    return by_model_type_query(results, sweep_id).collect()


def by_model_type_query(results: Frame, sweep_id: str) -> pl.LazyFrame:
    lf = sweep_rows(results, sweep_id, ["model_type", "model_id", "status"]).with_columns(
        pl.col("model_type").fill_null("unknown")
    )
    aggs = [*rate_aggs(), pl.col("model_id").n_unique().cast(pl.Int64).alias("distinct_models")]
    return (
        with_rate(lf.group_by("model_type").agg(aggs))
        .sort(["models", "model_type"], descending=[True, False])
        .select("model_type", "models", "passed", "failed", "pass_rate", "distinct_models")
    )


def pass_rate_by_size(results: Frame, sweep_id: str) -> pl.DataFrame:
    """size_bucket (see ``SIZE_GROUPS``: the models that failed before loading apart from the
    ones of unknown size), models, passed, failed, pass_rate; buckets present only."""
    return by_size_query(results, sweep_id).collect()


def by_size_query(results: Frame, sweep_id: str) -> pl.LazyFrame:
    lf = sweep_rows(results, sweep_id, ["num_params", "status", "failure_stage"]).with_columns(
        size_group()
    )
    return with_rate(lf.group_by("size_bucket").agg(rate_aggs())).sort("size_bucket")


def failure_signatures(
    results: Frame, sweep_id: str, baseline_sweep_id: str | None = None
) -> pl.DataFrame:
    """One row per failure signature among the sweep's failures (every status but PASS), the one
    that affects the most models first.

    failure_signature, models (distinct models affected), count (failing rows: model-variant pairs),
    attribution (whose failures: "stack" when all are, else counts like "stack 3, model 1"; see
    ``ATTRIBUTION_KINDS``), task (the one task of all its rows, null when it spans several: one
    table serves every task, a signature says its task), new (not among the baseline's failures;
    null without a baseline), failure_stage and status (the most common), error_type, example_models
    (up to 3, sorted), and a sample error_message and traceback (from the first example model).
    """
    return signatures_query(results, sweep_id, baseline_sweep_id).collect()


def _attribution_text() -> pl.Expr:
    """Per signature (in a group_by over signature and attribution): "stack" or "stack 3, model
    1"."""
    order = pl.col("attribution").replace_strict(
        list(ATTRIBUTION_KINDS), list(range(len(ATTRIBUTION_KINDS))), default=len(ATTRIBUTION_KINDS)
    )
    counted = pl.format("{} {}", pl.col("attribution"), pl.col("n")).sort_by(order).str.join(", ")
    return (
        pl.when(pl.len() > 1)
        .then(counted)
        .otherwise(pl.col("attribution").first())
        .alias("attribution")
    )


def signatures_query(
    results: Frame, sweep_id: str, baseline_sweep_id: str | None = None
) -> pl.LazyFrame:
    cols = [
        "model_id",
        "status",
        "failure_stage",
        "failure_signature",
        "error_type",
        "error_message",
        "traceback",
        "attribution",
        "task",
    ]
    lf = (
        sweep_rows(results, sweep_id, cols)
        .filter(pl.col("status").ne_missing(schema.PASS))
        .with_columns(
            pl.col("failure_signature").fill_null(NO_SIGNATURE), attribution_col(), task_col()
        )
        .sort("model_id")
    )
    whose = (
        lf.group_by("failure_signature", "attribution")
        .agg(pl.len().alias("n"))
        .group_by("failure_signature")
        .agg(_attribution_text())
    )
    if baseline_sweep_id:
        seen = (
            sweep_rows(results, baseline_sweep_id, ["status", "failure_signature"])
            .filter(pl.col("status").ne_missing(schema.PASS))
            .select(pl.col("failure_signature").fill_null(NO_SIGNATURE))
            .unique()
            .with_columns(pl.lit(False).alias("new"))
        )
    else:
        seen = pl.LazyFrame(schema={"failure_signature": pl.String, "new": pl.Boolean})
    new = pl.col("new").fill_null(True) if baseline_sweep_id else pl.col("new")
    return (
        lf.group_by("failure_signature")
        .agg(
            pl.col("model_id").n_unique().cast(pl.Int64).alias("models"),
            pl.len().cast(pl.Int64).alias("count"),
            pl.col("failure_stage").drop_nulls().mode().sort().first().alias("failure_stage"),
            pl.col("status").drop_nulls().mode().sort().first().alias("status"),
            pl.col("error_type").first().alias("error_type"),
            pl.col("model_id").unique(maintain_order=True).head(3).alias("example_models"),
            pl.col("error_message").first().alias("error_message"),
            pl.col("traceback").first().alias("traceback"),
            pl.when(pl.col("task").n_unique() == 1).then(pl.col("task").first()).alias("task"),
        )
        .join(whose, on="failure_signature", how="left")
        .join(seen, on="failure_signature", how="left")
        .with_columns(new.alias("new"))
        .sort(["models", "count", "failure_signature"], descending=[True, True, False])
        .select(
            "failure_signature",
            "models",
            "count",
            "attribution",
            "task",
            "new",
            "failure_stage",
            "status",
            "error_type",
            "example_models",
            "error_message",
            "traceback",
        )
    )


def token_stats(results: Frame, sweep_id: str) -> pl.DataFrame:
    """metric (tokens_in, tokens_out), count of non-null values, mean, median, min, max, total.

    Sweeps that predate these columns give count 0 and null statistics."""
    return token_stats_query(results, sweep_id).collect()


def token_stats_query(results: Frame, sweep_id: str) -> pl.LazyFrame:
    lf = sweep_rows(results, sweep_id, TOKEN_METRICS)
    return describe(lf, TOKEN_METRICS, ("mean", "median", "min", "max", "total"))


def timing_stats(results: Frame, sweep_id: str) -> pl.DataFrame:
    """metric (load_s, first_token_s, decode_tokens_per_s), count, median, p90, max."""
    return timing_stats_query(results, sweep_id).collect()


def timing_stats_query(results: Frame, sweep_id: str) -> pl.LazyFrame:
    return describe(
        sweep_rows(results, sweep_id, TIMING_METRICS), TIMING_METRICS, ("median", "p90", "max")
    )


def timing_histogram(results: Frame, sweep_id: str, bins: int = 20) -> pl.DataFrame:
    """metric, bin (0-based), bin_start, bin_end, count: equal-width bins from each metric's min to
    max, for charting a distribution without shipping every value."""
    return histogram_query(
        sweep_rows(results, sweep_id, TIMING_METRICS), TIMING_METRICS, bins
    ).collect()


def histogram_query(lf: pl.LazyFrame, metrics, bins: int) -> pl.LazyFrame:
    long = (
        lf.select([pl.col(m).cast(pl.Float64) for m in metrics])
        .unpivot(on=list(metrics), variable_name="metric", value_name="value")
        .drop_nulls("value")
        .filter(pl.col("value").is_finite())
    )
    lo = pl.col("value").min().over("metric")
    hi = pl.col("value").max().over("metric")
    width = pl.when(hi > lo).then((hi - lo) / bins).otherwise(pl.lit(1.0))
    return (
        long.with_columns(lo=lo, width=width)
        .with_columns(
            bin=((pl.col("value") - pl.col("lo")) / pl.col("width"))
            .floor()
            .clip(0, bins - 1)
            .cast(pl.Int64)
        )
        .group_by("metric", "bin")
        .agg(pl.len().cast(pl.Int64).alias("count"), pl.col("lo").first(), pl.col("width").first())
        .with_columns(
            bin_start=pl.col("lo") + pl.col("bin") * pl.col("width"),
            bin_end=pl.col("lo") + (pl.col("bin") + 1) * pl.col("width"),
        )
        .select("metric", "bin", "bin_start", "bin_end", "count")
        .sort("metric", "bin")
    )


def memory_stats(results: Frame, sweep_id: str) -> pl.DataFrame:
    """metric (peak_host_mem_mb, peak_device_mem_mb), count, median, p90, max."""
    return memory_stats_query(results, sweep_id).collect()


def memory_stats_query(results: Frame, sweep_id: str) -> pl.LazyFrame:
    return describe(
        sweep_rows(results, sweep_id, MEMORY_METRICS), MEMORY_METRICS, ("median", "p90", "max")
    )


def memory_by_size(results: Frame, sweep_id: str) -> pl.DataFrame:
    """size_bucket (``SIZE_GROUPS``), metric (host/device peak), count, median, p90, max: memory
    against model size."""
    return memory_by_size_query(results, sweep_id).collect()


def memory_by_size_query(results: Frame, sweep_id: str) -> pl.LazyFrame:
    lf = (
        sweep_rows(results, sweep_id, ["num_params", "status", "failure_stage", *MEMORY_METRICS])
        .with_columns(size_group())
        .drop("status", "failure_stage")
    )
    long = lf.unpivot(
        on=list(MEMORY_METRICS), index="size_bucket", variable_name="metric", value_name="value"
    )
    value = pl.col("value").cast(pl.Float64)
    return (
        long.drop_nulls("value")
        .group_by("size_bucket", "metric")
        .agg(
            value.count().cast(pl.Int64).alias("count"),
            value.median().alias("median"),
            value.quantile(0.9, interpolation="linear").alias("p90"),
            value.max().alias("max"),
        )
        .sort("size_bucket", "metric")
    )


def reference_agreement(results: Frame, sweep_id: str) -> pl.DataFrame:
    """outcome (match / mismatch / not run), count, share: the CPU reference check's verdicts."""
    return reference_query(results, sweep_id).collect()


def reference_query(results: Frame, sweep_id: str) -> pl.LazyFrame:
    match = pl.col("reference_match")
    outcome = (
        pl.when(match.is_null())
        .then(pl.lit("not run"))
        .when(match)
        .then(pl.lit("match"))
        .otherwise(pl.lit("mismatch"))
    )
    counts = (
        sweep_rows(results, sweep_id, ["reference_match"])
        .select(outcome.alias("outcome"))
        .group_by("outcome")
        .agg(pl.len().cast(pl.Int64).alias("count"))
    )
    base = pl.LazyFrame(
        {"outcome": list(REFERENCE_OUTCOMES), "order": list(range(len(REFERENCE_OUTCOMES)))}
    )
    return (
        base.join(counts, on="outcome", how="left")
        .with_columns(pl.col("count").fill_null(0))
        .with_columns(
            share=pl.when(pl.col("count").sum() > 0).then(pl.col("count") / pl.col("count").sum())
        )
        .sort("order")
        .select("outcome", "count", "share")
    )


# --------------------------------------------------------------------------------------------
# every model of a sweep

#: What the report's per-model table shows of each run, besides its record and repro
#: (``report_tables``).
MODEL_TABLE_COLUMNS = (
    "model_id",
    "variant",
    "task",
    "num_params",
    "status",
    "attribution",
    "check",
    "check_measure",
    "numerics_step",
    "check_note",
    "failure_stage",
    "failure_signature",
    *TOKEN_METRICS,
    *TIMING_METRICS,
    *MEMORY_METRICS,
    "repro_sha256",
)


def model_rows(results: Frame, sweep_id: str) -> pl.DataFrame:
    """Every run of the sweep, PASS included, one row each (``MODEL_TABLE_COLUMNS``), by model
    and variant: its verdict, whose failure, what a PASS's check says (``check``, the step it
    diverges at, why), its tokens, times and peak memory, and its repro body's hash. The report
    lists them all, sortable."""
    return models_query(results, sweep_id).collect()


def models_query(results: Frame, sweep_id: str) -> pl.LazyFrame:
    read = [
        "model_id",
        "variant",
        "task",
        "num_params",
        "status",
        "attribution",
        "failure_stage",
        "failure_signature",
    ]
    checks = [
        "numerics",
        "numerics_step",
        "numerics_note",
        "numerics_measure",
        "fluent",
        "fluency_note",
    ]
    metrics = [*TOKEN_METRICS, *TIMING_METRICS, *MEMORY_METRICS]
    return (
        sweep_rows(results, sweep_id, [*read, *checks, *metrics, "repro_sha256"])
        .with_columns(
            variant_col(),
            task_col(),
            attribution_col(),
            pass_check_col().alias("check"),
            check_measure_col(),
            check_note_col(),
        )
        .sort("model_id", "variant")
        .select(MODEL_TABLE_COLUMNS)
    )
