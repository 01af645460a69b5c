"""The report's performance section: every PASS's speed on its device, and what moved since the
baseline.

From ``analysis.perf``: one row per PASS (TTFT, TPOT and tokens/s as medians of the perf phase's
repeats with their spread, the warm-up with compilation, peak device memory, bandwidth utilisation,
the slowest operators of its generation, and the note that says why a figure is missing), then the
runs slower or faster than the baseline beyond noise (like runs whose median moved by more than 5%
and by more than the repeats' noise, the rule of ``model-support diff --fail-on perf``,
``analysis.decision``), their figures as the terminal says them.
"""

from __future__ import annotations

import html

import polars as pl

from .charts import chart_html, speed_chart
from .html import table_html


def _ms(value: float | None, spread: float | None = None) -> str | None:
    if value is None:
        return None
    return f"{value * 1e3:.2f} ms" + (f" ±{spread / 2:.1%}" if spread is not None else "")


def _moved(table: pl.DataFrame) -> pl.DataFrame:
    """The slower or faster runs as the gate's lines say them: the change and spreads as signed
    percentages, the medians in ms (times) or tokens/s (rates), never raw ratios."""

    def figure(metric: str, value: float | None) -> str | None:
        if value is None:
            return None
        return f"{value:.1f} tokens/s" if metric == "perf_tokens_per_s" else f"{value * 1e3:.2f} ms"

    pct = lambda v, sign="": None if v is None else f"{v:{sign}.1%}"  # noqa: E731
    return pl.DataFrame(
        [
            {
                "model_id": r["model_id"],
                "variant": r["variant"],
                "metric": r["metric"],
                "before": figure(r["metric"], r["before"]),
                "after": figure(r["metric"], r["after"]),
                "change": pct(r["change"], "+"),
                "spread before": pct(r["spread_before"]),
                "spread after": pct(r["spread_after"]),
                "operator that grew most": r["operator"],
            }
            for r in table.iter_rows(named=True)
        ],
        schema=dict.fromkeys(
            (
                "model_id",
                "variant",
                "metric",
                "before",
                "after",
                "change",
                "spread before",
                "spread after",
            )
            + ("operator that grew most",),
            pl.String,
        ),
    )


def _shown(table: pl.DataFrame) -> pl.DataFrame:
    """The per-PASS table as read: times in ms with half their spread, rates as percentages."""
    rows = []
    for r in table.iter_rows(named=True):
        util = r["bandwidth_utilisation"]
        rows.append(
            {
                "model_id": r["model_id"],
                "variant": r["variant"],
                "num_params": r["num_params"],
                "TTFT": _ms(r["ttft_s"], r["ttft_spread"]),
                "TPOT": _ms(r["tpot_s"], r["tpot_spread"]),
                "tokens/s": r["perf_tokens_per_s"],
                "first call, compile included (s, host clock)": r["perf_first_call_s"],
                "repeats (why they stopped)": f"{r['perf_repeats_run']} ({r['perf_stop']})"
                if r.get("perf_repeats_run") is not None
                else None,
                "peak device MiB": r["perf_peak_device_mem_mb"],
                "bandwidth utilisation": f"{util:.2%}" if util is not None else None,
                "slowest operators": r["slowest_ops"],
                "note": r["perf_note"],
            }
        )
    return pl.DataFrame(rows, infer_schema_length=None)


def perf_html(tables: dict[str, pl.DataFrame]) -> str:
    """The section's body; "" for a sweep without a PASS (nothing to time)."""
    table = tables.get("perf")
    if table is None or table.is_empty():
        return ""
    parts = [table_html(_shown(table), max_rows=500)]
    # nothing timed (perf off): no empty chart
    if table.drop_nulls(["num_params", "perf_tokens_per_s"]).height:
        parts.append(chart_html(speed_chart(table), "speed"))
    moved = tables.get("perf_changes")
    if moved is not None:
        for direction in ("slower", "faster"):
            some = moved.filter(pl.col("direction") == direction)
            parts.append(
                f"<h3>{html.escape(direction.capitalize())} than the baseline, beyond noise</h3>"
            )
            parts.append(
                table_html(
                    _moved(some),
                    empty=f"No run is {direction} than the baseline beyond noise.",
                )
            )
    return "".join(parts)
