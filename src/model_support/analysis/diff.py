"""A sweep against its baseline: which (model, variant) runs changed outcome, which signatures
appeared.

Runs are matched on (model_id, variant), a null variant (an older file, a sweep without a matrix)
read as ``eager+dynamic``: a model that passes eager and newly fails compiled is one change, for
that variant. A run newly failing is split by whose failure it is (``attribution``): "newly
broken by the stack" (the CPU reference passes: what a porting team acts on, listed first),
"newly failing everywhere" (the reference fails too: the model's or both; usually a transformers
or checkpoint change) and "newly failing" (no attribution recorded). A run that still passes, or
newly passes, but whose check is now suspect (its logits diverge from the reference, or with no
reference its text is not fluent) is "newly suspect"."""

from __future__ import annotations

import polars as pl

from ..record import schema
from .frames import (
    CHANGES,
    DEFAULT_VARIANT,
    GATE_CHANGES,
    NEWLY_BROKEN_BY_STACK,
    NEWLY_FAILING,
    NEWLY_FAILING_EVERYWHERE,
    NEWLY_SUSPECT,
    NO_LONGER_SUSPECT,
    NO_SIGNATURE,
    SIGNATURE_CHANGES,
    SUSPECT_CHECKS,
    Frame,
    attribution_col,
    check_note_col,
    check_step_col,
    pass_check_col,
    sweep_rows,
    variant_col,
)
from .passes_checked import CHECK_COLUMNS

KEY = ["model_id", "variant"]

# --------------------------------------------------------------------------------------------
# a sweep against its baseline


def latest_outcomes(results: Frame, sweep_id: str) -> pl.LazyFrame:
    cols = [
        "model_id",
        "variant",
        "failure_signature",
        "error_message",
        "attribution",
        "started_at",
        "attempts",
        *CHECK_COLUMNS,
    ]
    return (
        sweep_rows(results, sweep_id, cols)
        .with_columns(
            variant_col(),
            attribution_col(),
            pass_check_col().alias("check"),
            check_step_col(),
            check_note_col(),
        )
        .sort("started_at", nulls_last=False)
        .unique(KEY, keep="last", maintain_order=False)
        .select(
            *KEY,
            "status",
            "failure_signature",
            "error_message",
            "attribution",
            "check",
            "check_step",
            "check_note",
            "attempts",
        )
    )


def model_changes(results: Frame, sweep_id: str, baseline_sweep_id: str) -> pl.DataFrame:
    """The (model, variant) runs whose outcome changed from ``baseline_sweep_id`` to ``sweep_id``.

    model_id, variant, change (one of ``CHANGES``), attribution (whose failure the new outcome is:
    stack, model, both or unknown; null for a PASS), attribution_before (whose the baseline's
    failure was: what a "newly passing" run was fixed from), status_before, status_after,
    signature_before, signature_after, error_message (the new one), check_before and check_after
    (what a PASS's check says, ``PASS_CHECKS``), suspect_step and check_note (for "newly suspect":
    the step where the device diverges from the reference, and why). A run that passes now with a
    suspect check and was no suspect PASS before is "newly suspect" (listed second, after what the
    stack newly broke), a suspect PASS that is a clean one now "no longer suspect". Unchanged runs
    are left out; a model excluded in one of the two sweeps shows as added or removed, never as a
    failure.
    """
    return changes_query(results, sweep_id, baseline_sweep_id).collect()


def changes_query(results: Frame, sweep_id: str, baseline_sweep_id: str) -> pl.LazyFrame:
    before = latest_outcomes(results, baseline_sweep_id).select(
        *KEY,
        pl.col("status").alias("status_before"),
        pl.col("failure_signature").alias("signature_before"),
        pl.col("check").alias("check_before"),
        pl.col("attribution").alias("attribution_before"),
    )
    after = latest_outcomes(results, sweep_id).select(
        *KEY,
        pl.col("status").alias("status_after"),
        pl.col("failure_signature").alias("signature_after"),
        "error_message",
        "attribution",
        pl.col("check").alias("check_after"),
        pl.col("check_step").alias("suspect_step"),
        "check_note",
    )
    sb, sa = pl.col("status_before"), pl.col("status_after")
    passed_before, passed_after = sb == schema.PASS, sa == schema.PASS
    suspect_before = pl.col("check_before").is_in(list(SUSPECT_CHECKS)).fill_null(False)
    suspect_after = pl.col("check_after").is_in(list(SUSPECT_CHECKS)).fill_null(False)
    whose = pl.col("attribution")
    newly_failing = (
        pl.when(whose == "stack")
        .then(pl.lit(NEWLY_BROKEN_BY_STACK))
        .when(whose.is_in(["model", "both"]))
        .then(pl.lit(NEWLY_FAILING_EVERYWHERE))
        .otherwise(pl.lit(NEWLY_FAILING))
    )
    change = (
        pl.when(sb.is_null())
        .then(pl.lit("added"))
        .when(sa.is_null())
        .then(pl.lit("removed"))
        .when(passed_before & ~passed_after)
        .then(newly_failing)
        .when(passed_after & suspect_after & ~(passed_before & suspect_before))
        .then(pl.lit(NEWLY_SUSPECT))
        .when(~passed_before & passed_after)
        .then(pl.lit("newly passing"))
        .when(passed_before & suspect_before & passed_after & ~suspect_after)
        .then(pl.lit(NO_LONGER_SUSPECT))
        .when(~passed_before & ~passed_after & (sb != sa))
        .then(pl.lit("status changed"))
        .when(
            ~passed_before
            & ~passed_after
            & pl.col("signature_before").ne_missing(pl.col("signature_after"))
        )
        .then(pl.lit("signature changed"))
        .cast(pl.Enum(CHANGES))
        .alias("change")
    )
    return (
        before.join(after, on=KEY, how="full", coalesce=True)
        .with_columns(change)
        .drop_nulls("change")
        .sort("change", "model_id", pl.col("variant").replace(DEFAULT_VARIANT, ""))
        .select(
            *KEY,
            "change",
            "attribution",
            "attribution_before",
            "status_before",
            "status_after",
            "signature_before",
            "signature_after",
            "error_message",
            "check_before",
            "check_after",
            pl.when(pl.col("change") == NEWLY_SUSPECT)
            .then(pl.col("suspect_step"))
            .alias("suspect_step"),
            pl.when(pl.col("change").is_in([NEWLY_SUSPECT, NO_LONGER_SUSPECT]))
            .then(pl.col("check_note"))
            .alias("check_note"),
        )
    )


def signature_changes(results: Frame, sweep_id: str, baseline_sweep_id: str) -> pl.DataFrame:
    """failure_signature, change (appeared / vanished), count_before, count_after: failure
    signatures seen in only one of the two sweeps, largest first."""
    return signature_changes_query(results, sweep_id, baseline_sweep_id).collect()


def _signature_counts(results: Frame, sweep_id: str, name: str) -> pl.LazyFrame:
    return (
        sweep_rows(results, sweep_id, ["status", "failure_signature"])
        .filter(pl.col("status").ne_missing(schema.PASS))
        .with_columns(pl.col("failure_signature").fill_null(NO_SIGNATURE))
        .group_by("failure_signature")
        .agg(pl.len().cast(pl.Int64).alias(name))
    )


def signature_changes_query(results: Frame, sweep_id: str, baseline_sweep_id: str) -> pl.LazyFrame:
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
    """``model_changes`` output -> {change: number of (model, variant) runs}, every change in
    ``CHANGES``."""
    counts = dict.fromkeys(CHANGES, 0)
    if changes.height:
        for change, n in changes.group_by("change").len().iter_rows():
            counts[str(change)] = n
    return counts


def diff_summary(diff: pl.DataFrame, a: str, b: str) -> str:
    """One line: how many runs changed, by kind (``CHANGES`` order: what the stack newly broke
    first)."""
    counts = change_counts(diff)
    parts = ", ".join(
        f"{n} {change}" for change, n in counts.items() if n or change not in GATE_CHANGES
    )
    return f"{a} -> {b}: {parts}."
