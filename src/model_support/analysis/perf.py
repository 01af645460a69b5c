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
from ..probe import probe_params
from ..record import schema, store
from .diff import KEY
from .frames import Frame, _sweep_rows, variant_col

#: The metrics compared: name -> (its repeats' column, whether more is better), in the order lines are said.
METRICS = {
    "tpot_s": ("tpot_s_repeats", False),
    "ttft_s": ("ttft_s_repeats", False),
    "perf_tokens_per_s": ("perf_tokens_per_s_repeats", True),
}
#: ``bisect --metric``'s words for the metrics (the record's names, as the repro script prints them, beside).
METRIC_NAMES = {"tpot": "tpot_s", "ttft": "ttft_s", "tokens_per_s": "perf_tokens_per_s"}
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
    "ops_time_source",
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


def direction(
    a: float, b: float, ra: list[float], rb: list[float], more_is_better: bool, threshold: float
) -> str | None:
    """ "slower" or "faster" when the median moved from ``a`` to ``b`` by more than ``threshold`` (relative) with
    the repeats ``ra`` and ``rb`` apart (every one of one side beyond every one of the other), else None (noise):
    the gate's rule, and the label of each step of ``bisect --metric``."""
    change = (b - a) / a
    up, apart_up, apart_down = change > threshold, min(rb) > max(ra), max(rb) < min(ra)
    down = -change > threshold
    if (down and apart_down) if more_is_better else (up and apart_up):
        return "slower"
    if (up and apart_up) if more_is_better else (down and apart_down):
        return "faster"
    return None


def _grew_most(before: dict, after: dict) -> str | None:
    """The operator whose time in the generation grew the most from ``before`` to ``after`` (census times), as
    ``aten::rsqrt +0.0123 s``; None without times on both sides, or with times read on different clocks
    (``ops_time_source``: the host's around each call, or the device's own), which no difference compares."""
    if not before.get("ops_device_s") or not after.get("ops_device_s"):
        return None
    if before.get("ops_time_source") != after.get("ops_time_source"):
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
            moved = direction(a, b, ra, rb, more_is_better, threshold)
            worse = moved == "slower"
            if moved:
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


def slower(data_dir: Path | str, before_id: str, after_id: str, metric: str, threshold: float) -> list[dict]:
    """The (model, variant) rows whose ``metric`` (a ``METRICS`` name) got slower beyond noise from ``before_id``
    to ``after_id`` (``changes``' rows): what ``bisect --metric`` bisects when no model is named."""
    found = changes(data_dir, before_id, after_id, threshold)
    return found.filter((pl.col("metric") == metric) & (pl.col("direction") == "slower")).to_dicts()


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


def between_stacks(data_dir: Path | str, sweep_id: str, threshold: float = DEFAULT_THRESHOLD) -> pl.DataFrame:
    """In a sweep of several stacks (``stacks:``): each run whose TPOT, TTFT or tokens/s on a stack moved beyond
    noise (``direction``: the gate's rule) against the same model and variant on the sweep's first stack (the
    definition's order): model_id, variant (without its stack), stack, reference (the first stack), metric,
    direction, before, after, change. Empty for a sweep of one stack."""
    names: list[str] = []
    try:
        names = list(store.read_sweep(Path(data_dir), sweep_id).stacks or {})
    except UserError:  # a dataset without its sweeps/ folder: the stacks in name order
        pass
    rows = _latest_passes(store.scan(Path(data_dir), "results"), sweep_id, ("stack_name",)).collect()
    runs: dict[tuple[str, str], dict[str, dict]] = {}
    for r in rows.iter_rows(named=True):
        if r["stack_name"]:
            base = r["variant"].partition(probe_params.STACK_MARK)[0]
            runs.setdefault((r["model_id"], base), {})[r["stack_name"]] = r
    order = names or sorted({s for on in runs.values() for s in on})
    found = []
    for (model_id, base), on in sorted(runs.items()):
        first = next(s for s in order if s in on)
        for stack in (s for s in order if s in on and s != first):
            then, now = on[first], on[stack]
            for metric, (repeats, more_is_better) in METRICS.items():
                a, b, ra, rb = then[metric], now[metric], then[repeats] or [], now[repeats] or []
                moved = direction(a, b, ra, rb, more_is_better, threshold) if a and b and ra and rb else None
                if moved:
                    found.append(
                        {"model_id": model_id, "variant": base, "stack": stack, "reference": first, "metric": metric}
                        | {"direction": moved, "before": a, "after": b, "change": (b - a) / a}
                    )
    columns = ("model_id", "variant", "stack", "reference", "metric", "direction")
    schema_ = {**dict.fromkeys(columns, pl.String), **dict.fromkeys(("before", "after", "change"), pl.Float64)}
    return pl.DataFrame(found, schema=schema_)


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
