"""Performance between two sweeps, beyond noise: what the gate (``--fail-on perf``) and the report say.

Why a rule and not a plain percentage: one sweep's timing of a model moves by a few per cent from run to run
(the host's load, the allocator, the clocks), so a change counts only when the median moved by more than the
threshold *and* the two sweeps' repeats do not overlap (every repeat of one beyond every repeat of the other).
Each PASS carries its repeats (``ttft_s_repeats``, ``tpot_s_repeats``, ``perf_tokens_per_s_repeats``: the
record's ``perf`` group, measured in the device phase by ``probe.performance``). Where the census timed the
operators (``ops_device_s``, eager modes on a device whose calls are synchronous), a slowdown names the
operator whose time grew the most.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import polars as pl

from ..errors import UserError
from ..record import schema, store
from .diff import KEY
from .frames import Frame, _sweep_rows, variant_col

#: The metrics compared: name -> (its repeats' column, whether more is better), in the order lines are said.
METRICS = {
    "tpot_s": ("tpot_s_repeats", False),
    "ttft_s": ("ttft_s_repeats", False),
    "perf_tokens_per_s": ("perf_tokens_per_s_repeats", True),
}
#: The gate's default threshold: a median 5% worse (vLLM's TPU performance test uses a stated tolerance too).
DEFAULT_THRESHOLD = 0.05
#: The columns a comparison reads.
COLUMNS = (
    "model_id",
    "variant",
    "status",
    "started_at",
    *METRICS,
    *(r for r, _ in METRICS.values()),
    "ops",
    "ops_device_s",
)
#: The per-model table's columns (the report's performance section), in order.
TABLE_COLUMNS = (
    "model_id",
    "variant",
    "num_params",
    "ttft_s",
    "ttft_spread",
    "tpot_s",
    "tpot_spread",
    "perf_tokens_per_s",
    "perf_first_call_s",
    "perf_peak_device_mem_mb",
    "bandwidth_utilisation",
    "slowest_ops",
    "perf_note",
)


def parse_threshold(text: str | float | None) -> float:
    """``--perf-threshold``: ``5%`` or ``0.05`` (a fraction); one sentence for anything else."""
    if text is None:
        return DEFAULT_THRESHOLD
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < 10:
        raise UserError(f"--perf-threshold {raw!r} is not a threshold; give a percentage such as 5% (or 0.05).")
    return value


def _latest_passes(results: Frame, sweep_id: str, columns) -> pl.LazyFrame:
    """The latest run of each (model, variant) of a sweep, PASS only, with ``columns``."""
    return (
        _sweep_rows(results, sweep_id, list(dict.fromkeys([*COLUMNS, *columns])))
        .with_columns(variant_col())
        .sort("started_at", nulls_last=False)
        .unique(KEY, keep="last", maintain_order=False)
        .filter(pl.col("status") == schema.PASS)
    )


def _spread(values: list[float]) -> float | None:
    """(max - min) / median, as the probe's ``performance.spread``."""
    middle = statistics.median(values) if values else 0.0
    return (max(values) - min(values)) / middle if middle > 0 else None


def _grew_most(before: dict, after: dict) -> str | None:
    """The operator whose time in the generation grew the most from ``before`` to ``after`` (census times), as
    ``aten::rsqrt +0.0123 s``; None without times on both sides."""
    if not before.get("ops_device_s") or not after.get("ops_device_s"):
        return None
    was = dict(zip(before["ops"], before["ops_device_s"]))
    growth = {op: s - was.get(op, 0.0) for op, s in zip(after["ops"], after["ops_device_s"])}
    op = max(growth, key=lambda k: growth[k], default=None)
    return f"{op} +{growth[op]:.4f} s" if op is not None and growth[op] > 0 else None


def changes(data_dir: Path | str, before_id: str, after_id: str, threshold: float = DEFAULT_THRESHOLD) -> pl.DataFrame:
    """Every (model, variant, metric) whose median moved by more than ``threshold`` with the two sweeps' repeat
    ranges apart, slower or faster: model_id, variant, metric, direction (slower / faster), before, after,
    change (relative, signed as the metric moved), spread_before, spread_after, operator (the one whose time grew
    most, for a slowdown where both census were timed). Models that are not a PASS with repeats in both are
    left out."""
    results = store.scan(Path(data_dir), "results")
    before, after = pl.collect_all([_latest_passes(results, before_id, ()), _latest_passes(results, after_id, ())])
    was = {(r["model_id"], r["variant"]): r for r in before.iter_rows(named=True)}
    found = []
    for now in sorted(after.iter_rows(named=True), key=lambda r: (r["model_id"], r["variant"])):
        then = was.get((now["model_id"], now["variant"]))
        if then is None:
            continue
        for metric, (repeats, more_is_better) in METRICS.items():
            a, b, ra, rb = then[metric], now[metric], then[repeats] or [], now[repeats] or []
            if not a or not b or not ra or not rb:
                continue
            change = (b - a) / a
            worse = (-change if more_is_better else change) > threshold and (
                max(rb) < min(ra) if more_is_better else min(rb) > max(ra)
            )
            better = (change if more_is_better else -change) > threshold and (
                min(rb) > max(ra) if more_is_better else max(rb) < min(ra)
            )
            if worse or better:
                found.append(
                    {
                        "model_id": now["model_id"],
                        "variant": now["variant"],
                        "metric": metric,
                        "direction": "slower" if worse else "faster",
                        "before": a,
                        "after": b,
                        "change": change,
                        "spread_before": _spread(ra),
                        "spread_after": _spread(rb),
                        "operator": _grew_most(then, now) if worse else None,
                    }
                )
    schema_ = {
        "model_id": pl.String,
        "variant": pl.String,
        "metric": pl.String,
        "direction": pl.String,
        "before": pl.Float64,
        "after": pl.Float64,
        "change": pl.Float64,
        "spread_before": pl.Float64,
        "spread_after": pl.Float64,
        "operator": pl.String,
    }
    return pl.DataFrame(found, schema=schema_)


def compared(data_dir: Path | str, before_id: str, after_id: str) -> int:
    """How many (model, variant) runs both sweeps timed (a PASS with repeats in each): what the gate compared."""
    results = store.scan(Path(data_dir), "results")
    before, after = pl.collect_all(
        [_latest_passes(results, s, ()).filter(pl.col("tpot_s_repeats").is_not_null()) for s in (before_id, after_id)]
    )
    return before.select(KEY).join(after.select(KEY), on=KEY).height


def regression_line(row: dict) -> str:
    """One line per slowdown: model, metric, before, after, change, spread, and the operator whose time grew."""
    where = f"; grew most: {row['operator']}" if row["operator"] else "; operator time not measured"
    spread = lambda s: f"{s:.1%}" if s is not None else "-"  # noqa: E731
    return (
        f"slower: {row['model_id']} [{row['variant']}]: {row['metric']} {row['before']:.4g} -> {row['after']:.4g} "
        f"({row['change']:+.1%}; spread {spread(row['spread_before'])} -> {spread(row['spread_after'])}){where}"
    )


def perf_table(data_dir: Path | str, sweep_id: str, top: int = 3) -> pl.DataFrame:
    """Every PASS of ``sweep_id`` with its performance figures (``TABLE_COLUMNS``): TTFT, TPOT and tokens/s
    (medians) with their spread, compile (the perf phase's warm-up), peak device memory, bandwidth utilisation,
    the ``top`` slowest operators of its generation, and why a figure is missing (``perf_note``)."""
    results = store.scan(Path(data_dir), "results")
    extra = [c for c in TABLE_COLUMNS if c not in ("slowest_ops", "variant")]
    rows = _latest_passes(results, sweep_id, extra).collect()

    def slowest(ops, seconds) -> str | None:
        if not ops or not seconds:
            return None
        ranked = sorted(zip(seconds, ops), reverse=True)[:top]
        return ", ".join(f"{op} {s * 1e3:.1f} ms" for s, op in ranked if s > 0) or None

    return (
        rows.with_columns(
            pl.struct("ops", "ops_device_s")
            .map_elements(lambda r: slowest(r["ops"], r["ops_device_s"]), return_dtype=pl.String)
            .alias("slowest_ops")
        )
        .select(TABLE_COLUMNS)
        .sort("model_id", "variant")
    )


def gate_lines(data_dir: Path | str, before_id: str, after_id: str, threshold: float) -> tuple[list[str], list[str]]:
    """The perf gate: (one failing line per slowdown beyond noise, notes: how many runs were compared, and the
    speed-ups, which never fail it)."""
    found = changes(data_dir, before_id, after_id, threshold).to_dicts()
    failing = [regression_line(row) for row in found if row["direction"] == "slower"]
    faster = sorted({f"{r['model_id']} [{r['variant']}]" for r in found if r["direction"] == "faster"})
    notes = [
        f"perf: {compared(data_dir, before_id, after_id)} run(s) timed in both sweeps, compared at a {threshold:.0%} "
        "threshold with the repeats' ranges apart"
    ]
    if faster:
        notes.append(f"perf: faster beyond noise: {', '.join(faster)}")
    return failing, notes
