"""The report's tables: small Polars queries over the dataset, each giving a small DataFrame.

Every function takes the ``results`` rows of all sweeps (``store.scan(data_dir, "results")``, a
LazyFrame; a DataFrame is accepted too) and returns a ``pl.DataFrame`` of a few rows. Queries are
lazy and select only the columns they need, so the same functions serve one sweep of ten models
and a history of a million rows. Excluded rows (``store.scan(data_dir, "excluded")``) are never
counted as a failure: they are only ever counted, separately. Columns that older files lack
(``schema.LATER_FIELDS``) read as null and give null statistics, never an error; an empty frame
gives an empty (or all-zero) table.

``report_tables`` builds everything the report notebook shows in two passes: one
``pl.collect_all`` reads the sweep's own rows (and its baseline's) and a small per-sweep summary of
every row (``sweep_stats``), a second one derives all the tables from those in memory.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path

import polars as pl

from . import schema, store

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

_SWEEP_TIME = re.compile(r"^(?P<name>.+)-(?P<time>\d{8}T\d{6}Z?)$")
_SWEEP_TIME_SUFFIX = r"-\d{8}T\d{6}Z?$"
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


# --------------------------------------------------------------------------------------------
# sweeps


def _parse_time(value) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        parsed = value
    else:
        text = str(value).strip()
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            try:
                parsed = datetime.strptime(text, "%Y%m%dT%H%M%SZ")
            except ValueError:
                return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)


def sweep_name(sweep_id: str) -> str:
    """``smoke-20261202T113000Z`` -> ``smoke`` (the id itself when it has no time suffix)."""
    match = _SWEEP_TIME.match(sweep_id)
    return match["name"] if match else sweep_id


def sweep_stats(results: Frame) -> pl.LazyFrame:
    """The one pass over every row that the across-sweep tables need: row counts by sweep_id,
    status, device_type, host and the torch, torch_tpu and transformers versions (columns ``n``
    and ``first_started_at``). A few hundred rows for a million records."""
    lf = _with_columns(results, ["sweep_id", "status", "device_type", "host", "started_at", "versions"])
    return lf.group_by(
        "sweep_id", "status", "device_type", "host", *[_version(c).alias(c) for c in VERSION_COMPONENTS]
    ).agg(pl.len().cast(pl.Int64).alias("n"), pl.col("started_at").min().alias("first_started_at"))


def _most_common(stats: pl.DataFrame | pl.LazyFrame, column: str) -> pl.LazyFrame:
    """sweep_id -> the non-null value of ``column`` covering the most rows (ties: smallest value)."""
    return (
        _lazy(stats)
        .drop_nulls(column)
        .group_by("sweep_id", column)
        .agg(pl.col("n").sum())
        .sort(["sweep_id", "n", column], descending=[False, True, False])
        .group_by("sweep_id", maintain_order=True)
        .agg(pl.col(column).first())
    )


def sweep_index(data_dir: Path | str, stats: pl.DataFrame | None = None) -> pl.DataFrame:
    """Every known sweep, oldest first.

    A sweep is known by its ``sweeps/<id>/sweep.json`` or by rows in either config. Columns:
    sweep_id, name, created_at (UTC; from sweep.json, else the sweep's earliest ``started_at``),
    models (results rows), excluded (excluded rows), device_type, host, params_file. ``stats``
    (``sweep_stats`` of the results, collected) saves a pass over the rows when already at hand.
    """
    data_dir = Path(data_dir)
    meta: dict[str, dict] = {}
    for path in sorted((data_dir / "sweeps").glob("*/sweep.json")):
        with open(path, encoding="utf-8") as handle:
            info = json.load(handle)
        meta[str(info.get("sweep_id") or path.parent.name)] = info
    if stats is None:
        stats = sweep_stats(store.scan(data_dir, "results")).collect()
    rows = (
        stats.lazy()
        .group_by("sweep_id")
        .agg(pl.col("n").sum().alias("models"), pl.col("first_started_at").min())
        .join(_most_common(stats, "device_type"), on="sweep_id", how="left")
        .join(_most_common(stats, "host"), on="sweep_id", how="left")
    )
    excluded = (
        store.scan(data_dir, "excluded")
        .group_by("sweep_id")
        .agg(pl.len().cast(pl.Int64).alias("excluded"), pl.col("started_at").min().alias("excluded_started_at"))
    )
    rows, excluded = pl.collect_all([rows, excluded])
    by_rows = {r["sweep_id"]: r for r in rows.iter_rows(named=True)}
    by_excl = {r["sweep_id"]: r for r in excluded.iter_rows(named=True)}

    records = []
    for sweep_id in sorted((set(meta) | set(by_rows) | set(by_excl)) - {None}):
        info = meta.get(sweep_id, {})
        row = by_rows.get(sweep_id, {})
        excl = by_excl.get(sweep_id, {})
        created = _parse_time(info.get("created_at"))
        if created is None:
            created = _parse_time(row.get("first_started_at") or excl.get("excluded_started_at"))
        settings = info.get("settings") or {}
        records.append(
            {
                "sweep_id": sweep_id,
                "name": info.get("name") or sweep_name(sweep_id),
                "created_at": created,
                "models": row.get("models") or 0,
                "excluded": excl.get("excluded") or 0,
                "device_type": row.get("device_type") or settings.get("device"),
                "host": info.get("host") or row.get("host"),
                "params_file": info.get("params_file"),
            }
        )
    frame = pl.DataFrame(
        records,
        schema={
            "sweep_id": pl.String,
            "name": pl.String,
            "created_at": pl.Datetime("us", "UTC"),
            "models": pl.Int64,
            "excluded": pl.Int64,
            "device_type": pl.String,
            "host": pl.String,
            "params_file": pl.String,
        },
        orient="row",
    )
    return frame.sort(["created_at", "sweep_id"], nulls_last=True)


def require_sweep(sweeps: pl.DataFrame, sweep_id: str) -> str:
    """``sweep_id`` if ``sweeps`` (a ``sweep_index``) knows it; else a one-sentence ValueError."""
    known = sweeps["sweep_id"].to_list()
    if sweep_id not in known:
        listing = ", ".join(known) if known else "none"
        raise ValueError(f"Unknown sweep id {sweep_id!r}; the known sweep ids are: {listing}.")
    return sweep_id


def previous_sweep_id(sweeps: pl.DataFrame, sweep_id: str) -> str | None:
    """The latest sweep created before ``sweep_id`` that has results rows (a wholly excluded sweep,
    e.g. a broken stack, is no baseline); None when there is none."""
    require_sweep(sweeps, sweep_id)
    ids = sweeps["sweep_id"].to_list()
    models = sweeps["models"].to_list()
    position = ids.index(sweep_id)
    for index in range(position - 1, -1, -1):
        if models[index]:
            return ids[index]
    return None


# --------------------------------------------------------------------------------------------
# one sweep


def verdict_counts(results: Frame, sweep_id: str) -> pl.DataFrame:
    """status, count, share: the four verdicts always (count 0 when absent), then any other."""
    return _verdict_counts_q(results, sweep_id).collect()


def _verdict_counts_q(results: Frame, sweep_id: str) -> pl.LazyFrame:
    counts = _sweep_rows(results, sweep_id, ["status"]).group_by("status").agg(pl.len().cast(pl.Int64).alias("count"))
    base = pl.LazyFrame({"status": list(schema.VERDICTS), "order": list(range(len(schema.VERDICTS)))})
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
    """One row: sweep_id, models, passed, failed, pass_rate, excluded (counted apart, never failed)."""
    return _sweep_summary_q(results, sweep_id, excluded).collect()


def _sweep_summary_q(results: Frame, sweep_id: str, excluded: Frame | None) -> pl.LazyFrame:
    summary = _with_rate(_sweep_rows(results, sweep_id, ["status"]).select(_rate_aggs()))
    if excluded is None:
        n_excluded = pl.LazyFrame({"excluded": [0]}, schema={"excluded": pl.Int64})
    else:
        n_excluded = _sweep_rows(excluded, sweep_id, []).select(pl.len().cast(pl.Int64).alias("excluded"))
    return summary.join(n_excluded, how="cross").select(
        pl.lit(sweep_id).alias("sweep_id"), "models", "passed", "failed", "pass_rate", "excluded"
    )


def excluded_reasons(excluded: Frame, sweep_id: str) -> pl.DataFrame:
    """exclusion_reason, count, example_models (up to 3) for one sweep's excluded rows."""
    return _excluded_reasons_q(excluded, sweep_id).collect()


def _excluded_reasons_q(excluded: Frame, sweep_id: str) -> pl.LazyFrame:
    return (
        _sweep_rows(excluded, sweep_id, ["model_id", "exclusion_reason"])
        .with_columns(pl.col("exclusion_reason").fill_null("(no reason given)"))
        .group_by("exclusion_reason")
        .agg(pl.len().cast(pl.Int64).alias("count"), pl.col("model_id").sort().head(3).alias("example_models"))
        .sort(["count", "exclusion_reason"], descending=[True, False])
    )


def pass_rate_by_model_type(results: Frame, sweep_id: str) -> pl.DataFrame:
    """model_type, models, passed, failed, pass_rate; most common type first (null: "unknown")."""
    return _by_model_type_q(results, sweep_id).collect()


def _by_model_type_q(results: Frame, sweep_id: str) -> pl.LazyFrame:
    lf = _sweep_rows(results, sweep_id, ["model_type", "status"]).with_columns(pl.col("model_type").fill_null("unknown"))
    return _with_rate(lf.group_by("model_type").agg(_rate_aggs())).sort(
        ["models", "model_type"], descending=[True, False]
    )


def pass_rate_by_size(results: Frame, sweep_id: str) -> pl.DataFrame:
    """size_bucket (see ``SIZE_BUCKETS``), models, passed, failed, pass_rate; buckets present only."""
    return _by_size_q(results, sweep_id).collect()


def _by_size_q(results: Frame, sweep_id: str) -> pl.LazyFrame:
    lf = _sweep_rows(results, sweep_id, ["num_params", "status"]).with_columns(size_bucket())
    return _with_rate(lf.group_by("size_bucket").agg(_rate_aggs())).sort("size_bucket")


def failure_signatures(results: Frame, sweep_id: str) -> pl.DataFrame:
    """One row per failure signature among the sweep's failures (every status but PASS).

    failure_signature, count, failure_stage and status (the most common), error_type,
    example_models (up to 3, sorted), and a sample error_message and traceback (from the first
    example model). Most frequent first.
    """
    return _signatures_q(results, sweep_id).collect()


def _signatures_q(results: Frame, sweep_id: str) -> pl.LazyFrame:
    cols = ["model_id", "status", "failure_stage", "failure_signature", "error_type", "error_message", "traceback"]
    lf = (
        _sweep_rows(results, sweep_id, cols)
        .filter(pl.col("status").ne_missing(schema.PASS))
        .with_columns(pl.col("failure_signature").fill_null(NO_SIGNATURE))
        .sort("model_id")
    )
    return (
        lf.group_by("failure_signature")
        .agg(
            pl.len().cast(pl.Int64).alias("count"),
            pl.col("failure_stage").drop_nulls().mode().sort().first().alias("failure_stage"),
            pl.col("status").drop_nulls().mode().sort().first().alias("status"),
            pl.col("error_type").first().alias("error_type"),
            pl.col("model_id").head(3).alias("example_models"),
            pl.col("error_message").first().alias("error_message"),
            pl.col("traceback").first().alias("traceback"),
        )
        .sort(["count", "failure_signature"], descending=[True, False])
    )


def token_stats(results: Frame, sweep_id: str) -> pl.DataFrame:
    """metric (tokens_in, tokens_out), count of non-null values, mean, median, min, max, total.

    Sweeps that predate these columns give count 0 and null statistics."""
    return _token_stats_q(results, sweep_id).collect()


def _token_stats_q(results: Frame, sweep_id: str) -> pl.LazyFrame:
    lf = _sweep_rows(results, sweep_id, TOKEN_METRICS)
    return _describe(lf, TOKEN_METRICS, ("mean", "median", "min", "max", "total"))


def timing_stats(results: Frame, sweep_id: str) -> pl.DataFrame:
    """metric (load_s, first_token_s, decode_tokens_per_s), count, median, p90, max."""
    return _timing_stats_q(results, sweep_id).collect()


def _timing_stats_q(results: Frame, sweep_id: str) -> pl.LazyFrame:
    return _describe(_sweep_rows(results, sweep_id, TIMING_METRICS), TIMING_METRICS, ("median", "p90", "max"))


def timing_histogram(results: Frame, sweep_id: str, bins: int = 20) -> pl.DataFrame:
    """metric, bin (0-based), bin_start, bin_end, count: equal-width bins from each metric's min to
    max, for charting a distribution without shipping every value."""
    return _histogram_q(_sweep_rows(results, sweep_id, TIMING_METRICS), TIMING_METRICS, bins).collect()


def _histogram_q(lf: pl.LazyFrame, metrics, bins: int) -> pl.LazyFrame:
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
        .with_columns(bin=((pl.col("value") - pl.col("lo")) / pl.col("width")).floor().clip(0, bins - 1).cast(pl.Int64))
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
    return _memory_stats_q(results, sweep_id).collect()


def _memory_stats_q(results: Frame, sweep_id: str) -> pl.LazyFrame:
    return _describe(_sweep_rows(results, sweep_id, MEMORY_METRICS), MEMORY_METRICS, ("median", "p90", "max"))


def memory_by_size(results: Frame, sweep_id: str) -> pl.DataFrame:
    """size_bucket, metric (host/device peak), count, median, p90, max: memory against model size."""
    return _memory_by_size_q(results, sweep_id).collect()


def _memory_by_size_q(results: Frame, sweep_id: str) -> pl.LazyFrame:
    lf = _sweep_rows(results, sweep_id, ["num_params", *MEMORY_METRICS]).with_columns(size_bucket())
    long = lf.unpivot(on=list(MEMORY_METRICS), index="size_bucket", variable_name="metric", value_name="value")
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
    return _reference_q(results, sweep_id).collect()


def _reference_q(results: Frame, sweep_id: str) -> pl.LazyFrame:
    match = pl.col("reference_match")
    outcome = pl.when(match.is_null()).then(pl.lit("not run")).when(match).then(pl.lit("match")).otherwise(pl.lit("mismatch"))
    counts = (
        _sweep_rows(results, sweep_id, ["reference_match"])
        .select(outcome.alias("outcome"))
        .group_by("outcome")
        .agg(pl.len().cast(pl.Int64).alias("count"))
    )
    base = pl.LazyFrame({"outcome": list(REFERENCE_OUTCOMES), "order": list(range(len(REFERENCE_OUTCOMES)))})
    return (
        base.join(counts, on="outcome", how="left")
        .with_columns(pl.col("count").fill_null(0))
        .with_columns(share=pl.when(pl.col("count").sum() > 0).then(pl.col("count") / pl.col("count").sum()))
        .sort("order")
        .select("outcome", "count", "share")
    )


# --------------------------------------------------------------------------------------------
# a sweep against its baseline


def _outcomes(results: Frame, sweep_id: str) -> pl.LazyFrame:
    return (
        _sweep_rows(results, sweep_id, ["model_id", "status", "failure_signature", "error_message", "started_at"])
        .sort("started_at", nulls_last=False)
        .unique("model_id", keep="last", maintain_order=False)
        .select("model_id", "status", "failure_signature", "error_message")
    )


def model_changes(results: Frame, sweep_id: str, baseline_sweep_id: str) -> pl.DataFrame:
    """The models whose outcome changed from ``baseline_sweep_id`` to ``sweep_id``.

    model_id, change (one of ``CHANGES``), status_before, status_after, signature_before,
    signature_after, error_message (the new one). Unchanged models are left out; a model excluded
    in one of the two sweeps shows as added or removed, never as a failure.
    """
    return _changes_q(results, sweep_id, baseline_sweep_id).collect()


def _changes_q(results: Frame, sweep_id: str, baseline_sweep_id: str) -> pl.LazyFrame:
    before = _outcomes(results, baseline_sweep_id).select(
        "model_id", pl.col("status").alias("status_before"), pl.col("failure_signature").alias("signature_before")
    )
    after = _outcomes(results, sweep_id).select(
        "model_id",
        pl.col("status").alias("status_after"),
        pl.col("failure_signature").alias("signature_after"),
        "error_message",
    )
    sb, sa = pl.col("status_before"), pl.col("status_after")
    passed_before, passed_after = sb == schema.PASS, sa == schema.PASS
    change = (
        pl.when(sb.is_null())
        .then(pl.lit("added"))
        .when(sa.is_null())
        .then(pl.lit("removed"))
        .when(passed_before & ~passed_after)
        .then(pl.lit("newly failing"))
        .when(~passed_before & passed_after)
        .then(pl.lit("newly passing"))
        .when(~passed_before & ~passed_after & (sb != sa))
        .then(pl.lit("status changed"))
        .when(~passed_before & ~passed_after & pl.col("signature_before").ne_missing(pl.col("signature_after")))
        .then(pl.lit("signature changed"))
        .cast(pl.Enum(CHANGES))
        .alias("change")
    )
    return (
        before.join(after, on="model_id", how="full", coalesce=True)
        .with_columns(change)
        .drop_nulls("change")
        .sort("change", "model_id")
        .select("model_id", "change", "status_before", "status_after", "signature_before", "signature_after", "error_message")
    )


def signature_changes(results: Frame, sweep_id: str, baseline_sweep_id: str) -> pl.DataFrame:
    """failure_signature, change (appeared / vanished), count_before, count_after: failure
    signatures seen in only one of the two sweeps, largest first."""
    return _signature_changes_q(results, sweep_id, baseline_sweep_id).collect()


def _signature_counts(results: Frame, sweep_id: str, name: str) -> pl.LazyFrame:
    return (
        _sweep_rows(results, sweep_id, ["status", "failure_signature"])
        .filter(pl.col("status").ne_missing(schema.PASS))
        .with_columns(pl.col("failure_signature").fill_null(NO_SIGNATURE))
        .group_by("failure_signature")
        .agg(pl.len().cast(pl.Int64).alias(name))
    )


def _signature_changes_q(results: Frame, sweep_id: str, baseline_sweep_id: str) -> pl.LazyFrame:
    before = _signature_counts(results, baseline_sweep_id, "count_before")
    after = _signature_counts(results, sweep_id, "count_after")
    return (
        before.join(after, on="failure_signature", how="full", coalesce=True)
        .with_columns(pl.col("count_before").fill_null(0), pl.col("count_after").fill_null(0))
        .with_columns(
            change=pl.when(pl.col("count_before") == 0)
            .then(pl.lit("appeared"))
            .when(pl.col("count_after") == 0)
            .then(pl.lit("vanished"))
            .cast(pl.Enum(SIGNATURE_CHANGES))
        )
        .drop_nulls("change")
        .with_columns(size=pl.max_horizontal("count_before", "count_after"))
        .sort(["change", "size", "failure_signature"], descending=[False, True, False])
        .select("failure_signature", "change", "count_before", "count_after")
    )


def change_counts(changes: pl.DataFrame) -> dict[str, int]:
    """``model_changes`` output -> {change: number of models}, every change in ``CHANGES``."""
    counts = dict.fromkeys(CHANGES, 0)
    if changes.height:
        for change, n in changes.group_by("change").len().iter_rows():
            counts[str(change)] = n
    return counts


# --------------------------------------------------------------------------------------------
# across sweeps


def _version(component: str) -> pl.Expr:
    return pl.col("versions").struct.field(component)


def pass_rate_history(
    results: Frame, sweeps: pl.DataFrame | None = None, excluded: Frame | None = None
) -> pl.DataFrame:
    """One row per sweep, oldest first: sweep_id, name, created_at, models, passed, failed,
    pass_rate, excluded, device_type, and the sweep's (most common) torch, torch_tpu and
    transformers versions, so that a regression shows up as a step at a version change.

    ``sweeps`` (a ``sweep_index``) gives names and creation times; without it the order is each
    sweep's earliest ``started_at``.
    """
    return _history_q(sweep_stats(results).collect(), sweeps, excluded).collect()


def _history_q(stats: pl.DataFrame, sweeps: pl.DataFrame | None, excluded: Frame | None) -> pl.LazyFrame:
    per_sweep = stats.lazy().group_by("sweep_id").agg(
        pl.col("n").sum().alias("models"),
        pl.col("n").filter(pl.col("status") == schema.PASS).sum().alias("passed"),
        pl.col("first_started_at").min(),
    )
    for column in ("device_type", *VERSION_COMPONENTS):
        per_sweep = per_sweep.join(_most_common(stats, column), on="sweep_id", how="left")
    if excluded is not None:
        n_excluded = _with_columns(excluded, ["sweep_id"]).group_by("sweep_id").agg(pl.len().cast(pl.Int64).alias("excluded"))
    else:
        n_excluded = pl.LazyFrame(schema={"sweep_id": pl.String, "excluded": pl.Int64})
    if sweeps is None:
        order = per_sweep.select(
            "sweep_id",
            pl.col("sweep_id").str.replace(_SWEEP_TIME_SUFFIX, "").alias("name"),
            pl.col("first_started_at").str.to_datetime(time_zone="UTC", strict=False, time_unit="us").alias("created_at"),
        )
    else:
        order = sweeps.lazy().select("sweep_id", "name", "created_at")
    return (
        order.join(per_sweep.drop("first_started_at"), on="sweep_id", how="left")
        .join(n_excluded, on="sweep_id", how="left")
        .with_columns(pl.col("models").fill_null(0), pl.col("passed").fill_null(0), pl.col("excluded").fill_null(0))
        .pipe(_with_rate)
        .sort(["created_at", "sweep_id"], nulls_last=True)
        .select(
            "sweep_id", "name", "created_at", "models", "passed", "failed", "pass_rate", "excluded",
            "device_type", *VERSION_COMPONENTS,
        )
    )


def pass_rate_by_version(results: Frame, component: str, sweeps: pl.DataFrame | None = None) -> pl.DataFrame:
    """Pass rate per version of one stack ``component`` (torch, torch_tpu or transformers):
    component, version ("none" where not installed, e.g. torch_tpu on a CUDA sweep), sweeps,
    models, passed, failed, pass_rate, first_sweep; in order of first appearance."""
    return _by_version_q(sweep_stats(results).collect(), component, sweeps).collect()


def _by_version_q(stats: pl.DataFrame, component: str, sweeps: pl.DataFrame | None) -> pl.LazyFrame:
    if component not in VERSION_COMPONENTS:
        raise ValueError(f"{component!r} is not one of the stack components {', '.join(VERSION_COMPONENTS)}")
    lf = stats.lazy().with_columns(pl.col(component).fill_null("none").alias("version"))
    if sweeps is not None:
        rank = sweeps.lazy().with_row_index("sweep_rank").select("sweep_id", pl.col("sweep_rank").cast(pl.Int64))
        lf = lf.join(rank, on="sweep_id", how="left")
    else:
        lf = lf.with_columns(pl.lit(None, dtype=pl.Int64).alias("sweep_rank"))
    return (
        lf.group_by("version")
        .agg(
            pl.col("sweep_id").n_unique().cast(pl.Int64).alias("sweeps"),
            pl.col("n").sum().alias("models"),
            pl.col("n").filter(pl.col("status") == schema.PASS).sum().alias("passed"),
            pl.col("sweep_id").sort_by(["sweep_rank", "first_started_at"], nulls_last=True).first().alias("first_sweep"),
            pl.col("sweep_rank").min().alias("_rank"),
            pl.col("first_started_at").min().alias("_started"),
        )
        .pipe(_with_rate)
        .sort(["_rank", "_started", "version"], nulls_last=True)
        .select(pl.lit(component).alias("component"), "version", "sweeps", "models", "passed", "failed", "pass_rate", "first_sweep")
    )


# --------------------------------------------------------------------------------------------
# everything the report shows

#: Columns the per-sweep tables read.
SWEEP_COLUMNS = (
    "sweep_id", "model_id", "model_type", "num_params", "status", "failure_stage", "error_type",
    "error_message", "traceback", "failure_signature", "started_at", "device_type",
    *TOKEN_METRICS, *TIMING_METRICS, *MEMORY_METRICS, "reference_match",
)


def report_tables(data_dir: Path | str, sweep_id: str, baseline_sweep_id: str | None = None) -> dict[str, pl.DataFrame]:
    """Every table of one sweep's report, by name.

    The sweep's (and the baseline's) rows are read once; the per-sweep tables then run on them in
    memory, and the history tables over all sweeps, in one ``pl.collect_all``. Unknown ids raise
    ``ValueError`` (see ``require_sweep``). Keys: sweeps, summary, verdicts, excluded, by_model_type,
    by_size, signatures, tokens, timings, timing_histogram, memory, memory_by_size, reference,
    changes, signature_changes, history, and by_version (the three components stacked).
    """
    results = store.scan(data_dir, "results")
    excluded = store.scan(data_dir, "excluded")
    wanted = [sweep_id] + ([baseline_sweep_id] if baseline_sweep_id else [])
    stats, rows = pl.collect_all(
        [sweep_stats(results), results.select(SWEEP_COLUMNS).filter(pl.col("sweep_id").is_in(wanted))]
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
    return tables
