"""Execution modes: a sweep whose matrix crosses its models with variants (eager or compile, dynamic
or static KV cache, new-token counts) has one row per (model, variant). These tables compare the
variants: the model x variant grid of verdicts, the models that pass eager and fail compiled,
compile accounting (compile_s, graphs, graph breaks, recompilations), speed and agreement with
eager, per variant.

A null ``variant`` (files that predate it, sweeps without a matrix) reads as ``eager+dynamic``.
"""

from __future__ import annotations

import polars as pl

from ..probe import probe_compile
from ..record import schema
from .frames import Frame, attribution_col, sort_variants, sweep_rows, variant_col

#: The columns the tables of this module read.
MODE_COLUMNS = (
    "model_id",
    "variant",
    "mode",
    "status",
    "failure_stage",
    "failure_signature",
    "attribution",
    *schema.COMPILE_FIELDS,
    "first_token_s",
    "decode_tokens_per_s",
)


def _rows(results: Frame, sweep_id: str) -> pl.LazyFrame:
    return sweep_rows(results, sweep_id, MODE_COLUMNS).with_columns(
        variant_col(),
        pl.col("mode")
        .fill_null(pl.col("variant").fill_null("eager").str.split("+").list.first())
        .alias("mode"),
    )


def sweep_variants(results: Frame, sweep_id: str) -> list[str]:
    """The sweep's variants, eager before compile, dynamic before static
    (``frames.variant_key``)."""
    return sort_variants(_variants_q(results, sweep_id).collect()["variant"].to_list())


def _variants_q(results: Frame, sweep_id: str) -> pl.LazyFrame:
    return _rows(results, sweep_id).select("variant").unique()


#: Grid cells with no verdict: the (model, variant) is in the sweep's ``excluded`` config; ``n/a``
#: when this stack does not offer the variant's mode (TorchTPU's fused eager off a TPU),
#: ``excluded`` otherwise.
NOT_AVAILABLE_CELL, EXCLUDED_CELL = "n/a", "excluded"


def verdict_grid(results: Frame, sweep_id: str, excluded: Frame | None = None) -> pl.DataFrame:
    """model_id, then one column per variant (in ``sweep_variants`` order) holding its verdict
    (null: not run in that variant; ``NOT_AVAILABLE_CELL`` or ``EXCLUDED_CELL`` for the
    ``excluded`` rows given). Models whose verdict differs between variants come first, then by
    name."""
    return grid_from_long(grid_long_query(results, sweep_id, excluded).collect())


def grid_long_query(results: Frame, sweep_id: str, excluded: Frame | None = None) -> pl.LazyFrame:
    rows = _rows(results, sweep_id).select("model_id", "variant", "status")
    if excluded is not None:
        reason = pl.col("exclusion_reason").fill_null("")
        cell = pl.when(reason.str.starts_with(probe_compile.NOT_AVAILABLE)).then(
            pl.lit(NOT_AVAILABLE_CELL)
        )
        no_verdict = sweep_rows(
            excluded, sweep_id, ["model_id", "variant", "exclusion_reason"]
        ).select("model_id", variant_col(), cell.otherwise(pl.lit(EXCLUDED_CELL)).alias("status"))
        rows = pl.concat([rows, no_verdict], how="vertical_relaxed")
    verdicts = pl.col("status").filter(pl.col("status").is_in(schema.VERDICTS))
    return rows.unique(["model_id", "variant"], keep="last").with_columns(
        mixed=verdicts.n_unique().over("model_id") > 1
    )


def grid_from_long(long: pl.DataFrame) -> pl.DataFrame:
    """``grid_long_query``'s rows (model_id, variant, status, mixed) -> the grid of
    ``verdict_grid``."""
    variants = sort_variants(long["variant"].to_list())
    if not long.height:
        return pl.DataFrame(schema={"model_id": pl.String})
    order = (
        long.group_by("model_id")
        .agg(pl.col("mixed").first())
        .sort(["mixed", "model_id"], descending=[True, False])
    )
    wide = long.pivot(on="variant", index="model_id", values="status", aggregate_function="first")
    for v in variants:
        if v not in wide.columns:
            wide = wide.with_columns(pl.lit(None, dtype=pl.String).alias(v))
    return (
        order.select("model_id")
        .join(wide, on="model_id", how="left", maintain_order="left")
        .select("model_id", *variants)
    )


def eager_pass_compile_fail(results: Frame, sweep_id: str) -> pl.DataFrame:
    """The models that pass in an eager variant and fail in a compile one: one row per failing
    compile variant: model_id, variant, status, failure_stage, failure_signature, attribution,
    eager_passes (the eager variants it passes in)."""
    return eager_pass_compile_fail_query(results, sweep_id).collect()


def eager_pass_compile_fail_query(results: Frame, sweep_id: str) -> pl.LazyFrame:
    rows = _rows(results, sweep_id)
    passed = pl.col("status") == schema.PASS
    eager = (
        rows.filter((pl.col("mode") == "eager") & passed)
        .group_by("model_id")
        .agg(pl.col("variant").unique().sort().alias("eager_passes"))
    )
    return (
        rows.filter((pl.col("mode") == "compile") & pl.col("status").ne_missing(schema.PASS))
        .with_columns(attribution_col())
        .join(eager, on="model_id", how="inner")
        .sort("model_id", "variant")
        .select(
            "model_id",
            "variant",
            "status",
            "failure_stage",
            "failure_signature",
            "attribution",
            "eager_passes",
        )
    )


def variant_stats(results: Frame, sweep_id: str) -> pl.DataFrame:
    """One row per variant (in ``sweep_variants`` order): runs, passed, pass_rate; compile
    accounting over its runs that compiled (compiled: runs with a compile_s; compile_s_median,
    compile_s_max, graphs_median, graph_breaks (total), runs_with_breaks, recompilations
    (total)); speed (first_token_s_median, decode_tokens_per_s_median); and agreement with eager
    (matches_eager_yes, matches_eager_no, matches_eager_unknown: runs whose greedy tokens match
    the eager run's, differ, or were not compared)."""
    return order_variants(variant_stats_query(results, sweep_id).collect())


def order_variants(df: pl.DataFrame) -> pl.DataFrame:
    order = {v: k for k, v in enumerate(sort_variants(df["variant"].to_list()))}
    return df.sort(
        pl.col("variant").replace_strict(order, default=len(order), return_dtype=pl.Int64)
    )


def variant_stats_query(results: Frame, sweep_id: str) -> pl.LazyFrame:
    passed = (pl.col("status") == schema.PASS).fill_null(False)
    me = pl.col("matches_eager")
    return (
        _rows(results, sweep_id)
        .group_by("variant")
        .agg(
            pl.len().cast(pl.Int64).alias("runs"),
            passed.sum().cast(pl.Int64).alias("passed"),
            pl.col("compile_s").count().cast(pl.Int64).alias("compiled"),
            pl.col("compile_s").median().alias("compile_s_median"),
            pl.col("compile_s").max().alias("compile_s_max"),
            pl.col("graphs").cast(pl.Float64).median().alias("graphs_median"),
            pl.when(pl.col("graph_breaks").count() > 0)
            .then(pl.col("graph_breaks").sum())
            .alias("graph_breaks"),
            (pl.col("graph_breaks") > 0)
            .fill_null(False)
            .sum()
            .cast(pl.Int64)
            .alias("runs_with_breaks"),
            pl.when(pl.col("recompilations").count() > 0)
            .then(pl.col("recompilations").sum())
            .alias("recompilations"),
            pl.col("first_token_s").median().alias("first_token_s_median"),
            pl.col("decode_tokens_per_s").median().alias("decode_tokens_per_s_median"),
            me.fill_null(False).sum().cast(pl.Int64).alias("matches_eager_yes"),
            (~me).fill_null(False).sum().cast(pl.Int64).alias("matches_eager_no"),
            me.is_null().sum().cast(pl.Int64).alias("matches_eager_unknown"),
        )
        .with_columns(pass_rate=pl.when(pl.col("runs") > 0).then(pl.col("passed") / pl.col("runs")))
        .select(
            "variant",
            "runs",
            "passed",
            "pass_rate",
            "compiled",
            "compile_s_median",
            "compile_s_max",
            "graphs_median",
            "graph_breaks",
            "runs_with_breaks",
            "recompilations",
            "first_token_s_median",
            "decode_tokens_per_s_median",
            "matches_eager_yes",
            "matches_eager_no",
            "matches_eager_unknown",
        )
    )


def recompile_flags_query(results: Frame, sweep_id: str) -> pl.LazyFrame:
    """model_id, variant, recompile_flag, recompiles_dynamic, recompile_guard: the compiled runs
    that recompile per prompt length or per token with automatic dynamic shapes on
    (``probe.instruments.recompiles``)."""
    return (
        _rows(results, sweep_id)
        .filter(pl.col("recompile_flag").is_not_null())
        .select("model_id", "variant", "recompile_flag", "recompiles_dynamic", "recompile_guard")
        .sort("model_id", "variant")
    )


def graph_break_reasons(results: Frame, sweep_id: str, top: int = 20) -> pl.DataFrame:
    """reason, runs (that hit it), variants, example_models (up to 3): torch.compile's graph-break
    reasons across the sweep, most common first, at most ``top``."""
    return break_reasons_query(results, sweep_id, top).collect()


def break_reasons_query(results: Frame, sweep_id: str, top: int = 20) -> pl.LazyFrame:
    return (
        _rows(results, sweep_id)
        .select("model_id", "variant", pl.col("graph_break_reasons").alias("reason"))
        .explode("reason")
        .drop_nulls("reason")
        .unique(["model_id", "variant", "reason"])
        .sort("model_id")
        .group_by("reason")
        .agg(
            pl.len().cast(pl.Int64).alias("runs"),
            pl.col("variant").unique().sort().alias("variants"),
            pl.col("model_id").unique(maintain_order=True).head(3).alias("example_models"),
        )
        .sort(["runs", "reason"], descending=[True, False])
        .head(top)
    )
