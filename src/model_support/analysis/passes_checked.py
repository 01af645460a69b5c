"""Is a PASS right? One sweep's passes split by what their check says (``frames.PASS_CHECKS``:
the reference's verdict on the logits where it ran, else the fluency judge's on the text), and
the suspect passes, with the step where they diverge. The verdict itself never changes: these are
all PASS."""

from __future__ import annotations

import polars as pl

from ..record import schema
from .frames import (
    PASS_CHECKS,
    SUSPECT_CHECKS,
    Frame,
    check_measure_col,
    check_note_col,
    check_step_col,
    pass_check_col,
    sweep_rows,
    variant_col,
)

#: The columns a record needs for its check.
CHECK_COLUMNS = (
    "status",
    "numerics",
    "numerics_step",
    "numerics_note",
    "numerics_measure",
    "fluent",
    "fluency_score",
    "fluency_note",
)


def pass_checks(results: Frame, sweep_id: str) -> pl.DataFrame:
    """check (every one of ``PASS_CHECKS``, suspect ones first; count 0 when absent), suspect,
    count (passing rows), share (of the passes)."""
    return pass_checks_query(results, sweep_id).collect()


def pass_checks_query(results: Frame, sweep_id: str) -> pl.LazyFrame:
    counts = (
        sweep_rows(results, sweep_id, CHECK_COLUMNS)
        .filter(pl.col("status") == schema.PASS)
        .select(pass_check_col().alias("check"))
        .group_by("check")
        .agg(pl.len().cast(pl.Int64).alias("count"))
    )
    base = pl.LazyFrame({"check": list(PASS_CHECKS), "order": list(range(len(PASS_CHECKS)))})
    return (
        base.join(counts, on="check", how="left")
        .with_columns(
            pl.col("count").fill_null(0),
            pl.col("check").is_in(list(SUSPECT_CHECKS)).alias("suspect"),
        )
        .with_columns(
            share=pl.when(pl.col("count").sum() > 0).then(pl.col("count") / pl.col("count").sum())
        )
        .sort("order")
        .select("check", "suspect", "count", "share")
    )


def suspect_words(checks: dict[str, int]) -> str:
    """The suspect passes in the words the report, the terminal and the explorer share: ``2 (1
    diverge from the reference, 1 not fluent with no reference)``; ``checks`` maps each check
    (``PASS_CHECKS``) to its count."""
    diverge, not_fluent = checks.get(SUSPECT_CHECKS[0], 0), checks.get(SUSPECT_CHECKS[1], 0)
    return (
        f"{diverge + not_fluent:,} ({diverge:,} diverge from the reference, {not_fluent:,} not "
        "fluent with no reference)"
    )


def suspect_passes(results: Frame, sweep_id: str) -> pl.DataFrame:
    """The passes whose check is suspect (``SUSPECT_CHECKS``), diverging ones first: model_id,
    variant, check, measure (what judged it: ``frames.check_measure_col``), step (where the
    device diverges from the reference; null for a judge's verdict), note (why), generated_text,
    fluency_score."""
    return suspect_query(results, sweep_id).collect()


def suspect_query(results: Frame, sweep_id: str) -> pl.LazyFrame:
    order = pl.col("check").replace_strict(
        list(SUSPECT_CHECKS), list(range(len(SUSPECT_CHECKS))), default=None
    )
    return (
        sweep_rows(results, sweep_id, ["model_id", "variant", "generated_text", *CHECK_COLUMNS])
        .with_columns(
            variant_col(),
            pass_check_col().alias("check"),
            check_measure_col().alias("measure"),
            check_step_col().alias("step"),
            check_note_col().alias("note"),
        )
        .filter(pl.col("check").is_in(list(SUSPECT_CHECKS)))
        .sort(order, "model_id", "variant")
        .select(
            "model_id",
            "variant",
            "check",
            "measure",
            "step",
            "note",
            "generated_text",
            "fluency_score",
        )
    )
