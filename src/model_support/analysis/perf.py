"""Performance between two sweeps, beyond noise: what the gate (``--fail-on perf``) and the report
say.

Why a rule and not a plain percentage: one sweep's timing of a model moves by a few per cent from
run to run (the host's load, the allocator, the clocks), so a change counts only when two like runs'
medians moved by more than the threshold *and* beyond the noise of both sweeps' repeats: the rule is
``analysis.decision``'s (``perf_change``, ``compare_repeats``), the one decision every reader
shares. Each PASS carries its repeats (``ttft_s_repeats``, ``tpot_s_repeats``,
``perf_tokens_per_s_repeats``: the record's ``perf`` group, measured in the device phase by
``probe.performance``); a tokens/s derived from TTFT and TPOT (repeats of one token) is not judged,
those two are (``judged``). Where the census timed the operators (``ops_device_s``, eager modes on a
device whose calls are synchronous), a slowdown names the operator whose time grew the most.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ..errors import UserError
from ..probe import probe_params
from ..record import schema, store
from . import decision
from .diff import KEY
from .frames import Frame, sweep_rows, variant_col

#: The metrics compared: name -> (its repeats' column, whether more is better), in the order lines
#: are said.
METRICS = {
    "tpot_s": ("tpot_s_repeats", False),
    "ttft_s": ("ttft_s_repeats", False),
    "perf_tokens_per_s": ("perf_tokens_per_s_repeats", True),
}
#: ``bisect --metric``'s words for the metrics (the record's names, as the repro script prints them,
#: beside).
METRIC_NAMES = {"tpot": "tpot_s", "ttft": "ttft_s", "tokens_per_s": "perf_tokens_per_s"}
#: The gate's default threshold: a median 5% worse (vLLM's TPU performance test uses a stated
#: tolerance too).
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
    "perf_note",
    *(f for f in decision.LIKE if f != "perf_clock"),
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
    "perf_repeats_run",
    "perf_stop",
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
        raise UserError(
            f"--perf-threshold {raw!r} is not a threshold; give a percentage such as 5% (or 0.05)."
        )
    return value


def _latest_passes(results: Frame, sweep_id: str, columns) -> pl.LazyFrame:
    """The latest run of each (model, variant) of a sweep, PASS only, with ``columns``."""
    return (
        sweep_rows(results, sweep_id, list(dict.fromkeys([*COLUMNS, *columns])))
        .with_columns(variant_col())
        .sort("started_at", nulls_last=False)
        .unique(KEY, keep="last", maintain_order=False)
        .filter(pl.col("status") == schema.PASS)
        .with_columns(clock_col())
    )


def clock_col() -> pl.Expr:
    """Which clock timed a run's repeats, read from its ``perf_note`` (the probe names it there):
    ``device`` (the backend's own timeline), ``host`` (the host's wall clock after a sync), or
    null where not said."""
    note = pl.col("perf_note")
    return (
        pl.when(note.str.contains("device's own clock", literal=True))
        .then(pl.lit("device"))
        .when(note.str.contains("host's wall clock", literal=True))
        .then(pl.lit("host"))
        .otherwise(None)
        .alias("perf_clock")
    )


def direction(
    ra: list[float], rb: list[float], more_is_better: bool, threshold: float
) -> str | None:
    """ "slower" or "faster" when the repeats ``rb`` moved from ``ra`` beyond the threshold and
    beyond noise (``decision.compare_repeats``: the gate's rule), else None: the label of each
    step of ``bisect --metric``."""
    moved = decision.compare_repeats(ra, rb, more_is_better, threshold).kind
    return moved if moved in (decision.SLOWER, decision.FASTER) else None


def derived_tokens_per_s(row: dict) -> bool:
    """Whether a row's tokens/s was derived, not measured: its repeats were of one token
    (``perf_tokens_out`` 1), so each repeat's tokens/s is the verdict's length over a warm TTFT
    plus the verdict's TPOT *median* for every token after it
    (``probe.performance.tokens_per_s``; before the verdict's steps gave TPOT, one token's
    tokens/s was 1 / TTFT, TTFT again). A repeat of one token times no step of its own, so a row
    says so by its length alone, in older files too."""
    return row.get("perf_tokens_out") == 1


def judged(metric: str, then: dict, now: dict) -> bool:
    """Whether the gate judges ``metric`` between two like rows: every metric, but tokens/s where
    it was derived (``derived_tokens_per_s``).

    Why not judged, rather than judged through TPOT's uncertainty: a derived tokens/s is a
    function of TTFT and TPOT, which the gate judges each against its own repeats' noise; its own
    repeats share one TPOT median, so their spread carries none of TPOT's noise, and judged on
    it, noise alone read as slower 2.4% of the time at 5% step noise and 11.1% at 8% (TPOT alone
    0.1%; tests/test_perf_noise.py). Carrying TPOT's noise into it would only say again what TTFT
    and TPOT say: the generation's time is TTFT plus the steps, and a sum of two times each worse
    by at most the threshold is worse by at most the threshold, so tokens/s cannot get slower
    beyond the threshold unless TTFT or TPOT does. A measured tokens/s (repeats that decode)
    carries its own noise and is judged."""
    return metric != "perf_tokens_per_s" or not (
        derived_tokens_per_s(then) or derived_tokens_per_s(now)
    )


def compare_runs(
    then: dict, now: dict, threshold: float, ignore: tuple[str, ...] = ()
) -> tuple[str, list, str]:
    """Two PASS rows of one (model, variant) (``_latest_passes``): (kind, the metrics'
    ``MetricChange``s, why). Not comparable when either was not timed or they are unlike
    (``decision.unlike``, less the fields in ``ignore``: the stack, between the stacks of one
    sweep); slower when a metric got slower beyond noise, faster when one got faster and none
    slower, not comparable when a metric could not be compared, within noise otherwise. A metric
    the gate does not judge (``judged``: a derived tokens/s) is left out of the metrics."""
    timed = [bool(r.get("tpot_s_repeats")) for r in (then, now)]
    if not all(timed):
        where = " or ".join(s for s, t in zip(("A", "B"), timed) if not t)
        note = (now if not timed[1] else then).get("perf_note") or "no repeats"
        return decision.NOT_COMPARABLE, [], f"not timed in {where} ({note})"
    differs = decision.unlike(then, now, ignore)
    if differs:
        return decision.NOT_COMPARABLE, [], "; ".join(differs)
    found = [
        decision.compare_repeats(
            then[repeats] or [], now[repeats] or [], more_is_better, threshold, metric
        )
        for metric, (repeats, more_is_better) in METRICS.items()
        if judged(metric, then, now)
    ]
    # one reason once, not once per metric
    why = "; ".join(dict.fromkeys(m.why for m in found if m.why))
    kinds = {m.kind for m in found}
    # a metric that could not be compared (one repeat: no noise to judge by) is never read as within
    # noise: the run is then not comparable unless another metric moved beyond noise
    for kind in (decision.SLOWER, decision.FASTER, decision.NOT_COMPARABLE, decision.WITHIN_NOISE):
        if kind in kinds:
            return kind, found, why
    return decision.NOT_COMPARABLE, found, why


def _grew_most(before: dict, after: dict) -> str | None:
    """The operator whose time in the generation grew the most from ``before`` to ``after``
    (census times), as ``aten::rsqrt +0.0123 s``; None without times on both sides, or with times
    read on different clocks (``ops_time_source``: the host's around each call, or the device's
    own), which no difference compares."""
    if not before.get("ops_device_s") or not after.get("ops_device_s"):
        return None
    if before.get("ops_time_source") != after.get("ops_time_source"):
        return None
    was = dict(zip(before["ops"], before["ops_device_s"]))
    growth = {op: s - was.get(op, 0.0) for op, s in zip(after["ops"], after["ops_device_s"])}
    op = max(growth, key=lambda k: growth[k], default=None)
    return f"{op} +{growth[op]:.4f} s" if op is not None and growth[op] > 0 else None


def run_changes(
    data_dir: Path | str, before_id: str, after_id: str, threshold: float = DEFAULT_THRESHOLD
) -> list[dict]:
    """Every (model, variant) that is a PASS in both sweeps and timed in at least one, decided
    (``compare_runs``): model_id, variant, kind (``decision.PERF_KINDS``), metrics
    (``MetricChange``s), why, then and now (the rows)."""
    results = store.scan(Path(data_dir), "results")
    before, after = pl.collect_all(
        [_latest_passes(results, before_id, ()), _latest_passes(results, after_id, ())]
    )
    was = {(r["model_id"], r["variant"]): r for r in before.iter_rows(named=True)}
    found = []
    for now in sorted(after.iter_rows(named=True), key=lambda r: (r["model_id"], r["variant"])):
        then = was.get((now["model_id"], now["variant"]))
        if then is None or not (then.get("tpot_s_repeats") or now.get("tpot_s_repeats")):
            continue
        kind, metrics, why = compare_runs(then, now, threshold)
        found.append(
            {
                "model_id": now["model_id"],
                "variant": now["variant"],
                "kind": kind,
                "metrics": metrics,
            }
            | {"why": why, "then": then, "now": now}
        )
    return found


#: ``changes``' columns.
CHANGE_SCHEMA = {
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


def changes(
    data_dir: Path | str, before_id: str, after_id: str, threshold: float = DEFAULT_THRESHOLD
) -> pl.DataFrame:
    """Every (model, variant, metric) of two like runs whose median moved beyond the threshold
    and the noise, slower or faster (``run_changes``): model_id, variant, metric, direction
    (slower / faster), before, after, change (relative, signed as the metric moved),
    spread_before, spread_after, operator (the one whose time grew most, for a slowdown where
    both census were timed)."""
    found = []
    for run in run_changes(data_dir, before_id, after_id, threshold):
        for m in run["metrics"]:
            if m.kind not in (decision.SLOWER, decision.FASTER):
                continue
            repeats = METRICS[m.metric][0]
            found.append(
                {
                    "model_id": run["model_id"],
                    "variant": run["variant"],
                    "metric": m.metric,
                    "direction": m.kind,
                    "before": m.before,
                    "after": m.after,
                    "change": m.change,
                    "spread_before": decision.spread(run["then"][repeats] or []),
                    "spread_after": decision.spread(run["now"][repeats] or []),
                    "operator": _grew_most(run["then"], run["now"])
                    if m.kind == decision.SLOWER
                    else None,
                }
            )
    return pl.DataFrame(found, schema=CHANGE_SCHEMA)


def slower(
    data_dir: Path | str, before_id: str, after_id: str, metric: str, threshold: float
) -> list[dict]:
    """The (model, variant) rows whose ``metric`` (a ``METRICS`` name) got slower beyond noise
    from ``before_id`` to ``after_id`` (``changes``' rows): what ``bisect --metric`` bisects when
    no model is named."""
    found = changes(data_dir, before_id, after_id, threshold)
    return found.filter((pl.col("metric") == metric) & (pl.col("direction") == "slower")).to_dicts()


def regression_line(run: dict) -> str:
    """One line per slower run, its slower metrics listed: before, after, change, spread, and the
    operator whose time grew most."""
    grew = _grew_most(run["then"], run["now"])
    where = f"; grew most: {grew}" if grew else "; operator time not measured"
    spread = lambda s: f"{s:.1%}" if s is not None else "-"  # noqa: E731
    parts = []
    for m in run["metrics"]:
        if m.kind == decision.SLOWER:
            repeats = METRICS[m.metric][0]
            parts.append(
                f"{m.metric} {m.before:.4g} -> {m.after:.4g} ({m.change:+.1%}; spread "
                f"{spread(decision.spread(run['then'][repeats]))} -> "
                f"{spread(decision.spread(run['now'][repeats]))})"
            )
    return f"slower: {run['model_id']} [{run['variant']}]: " + ", ".join(parts) + where


def between_stacks(
    data_dir: Path | str, sweep_id: str, threshold: float = DEFAULT_THRESHOLD
) -> pl.DataFrame:
    """In a sweep of several stacks (``stacks:``): each run whose TPOT, TTFT or tokens/s on a
    stack moved beyond noise (``direction``: the gate's rule) against the same model and variant
    on the sweep's first stack (the definition's order): model_id, variant (without its stack),
    stack, reference (the first stack), metric, direction, before, after, change. Empty for a
    sweep of one stack."""
    names: list[str] = []
    try:
        names = list(store.read_sweep(Path(data_dir), sweep_id).stacks or {})
    except UserError:  # a dataset without its sweeps/ folder: the stacks in name order
        pass
    rows = _latest_passes(
        store.scan(Path(data_dir), "results"), sweep_id, ("stack_name",)
    ).collect()
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
            _, metrics, _ = compare_runs(on[first], on[stack], threshold, ignore=("stack_name",))
            for m in metrics:
                if m.kind in (decision.SLOWER, decision.FASTER):
                    found.append(
                        {
                            "model_id": model_id,
                            "variant": base,
                            "stack": stack,
                            "reference": first,
                            "metric": m.metric,
                        }
                        | {
                            "direction": m.kind,
                            "before": m.before,
                            "after": m.after,
                            "change": m.change,
                        }
                    )
    columns = ("model_id", "variant", "stack", "reference", "metric", "direction")
    schema_ = {
        **dict.fromkeys(columns, pl.String),
        **dict.fromkeys(("before", "after", "change"), pl.Float64),
    }
    return pl.DataFrame(found, schema=schema_)


def perf_table(data_dir: Path | str, sweep_id: str, top: int = 3) -> pl.DataFrame:
    """Every PASS of ``sweep_id`` with its performance figures (``TABLE_COLUMNS``): TTFT, TPOT
    and tokens/s (medians) with their spread, compile (the perf phase's warm-up), peak device
    memory, bandwidth utilisation, the ``top`` slowest operators of its generation, and why a
    figure is missing (``perf_note``)."""
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


def gate_lines(
    data_dir: Path | str, before_id: str, after_id: str, threshold: float
) -> tuple[list[str], list[str]]:
    """The perf gate: (failing lines: one per slower run, its metrics listed, and one when
    nothing could be compared, since a gate that compared nothing has said nothing; notes: how
    many runs were compared, the runs not comparable and why, those within noise only because of
    the noise, and the speed-ups, which never fail it)."""
    runs = run_changes(data_dir, before_id, after_id, threshold)
    compared = [r for r in runs if r["kind"] != decision.NOT_COMPARABLE]
    failing = [regression_line(r) for r in runs if r["kind"] == decision.SLOWER]
    # timed in A and a PASS in B that was not timed (its perf phase broke, or was turned off): the
    # speed vanished
    untimed = [
        r
        for r in runs
        if r["kind"] == decision.NOT_COMPARABLE and r["why"].startswith("not timed in B")
    ]
    failing += [
        f"perf: not timed: {r['model_id']} [{r['variant']}]: timed in {before_id}, {r['why']}"
        for r in untimed
    ]
    if not compared:
        reasons = sorted({r["why"] for r in runs if r not in untimed})
        hint = (
            "; ".join(reasons[:3])
            if reasons
            else "the perf phase runs on an accelerator, or with -p perf=on"
        )
        failing.append(
            f"perf: nothing compared: no run is a PASS timed alike in both {before_id} and "
            f"{after_id} ({hint})"
        )
    derived = sum(not judged("perf_tokens_per_s", r["then"], r["now"]) for r in compared)
    notes = [
        f"perf: {len(compared)} run(s) timed alike in both sweeps, compared at a "
        f"{threshold:.0%} threshold and {decision.NOISE_SIGMAS:g} times the medians' standard "
        "error"
        + (
            f" (tokens/s not judged in {derived} of them: derived from TTFT and TPOT, repeats "
            "of one token)"
            if derived
            else ""
        )
    ]
    notes += [
        f"perf: not comparable: {r['model_id']} [{r['variant']}]: {r['why']}"
        for r in runs
        if r["kind"] == decision.NOT_COMPARABLE and r not in untimed
    ]
    notes += [
        f"perf: within noise: {r['model_id']} [{r['variant']}]: {r['why']}"
        for r in runs
        if r["kind"] == decision.WITHIN_NOISE and r["why"]
    ]
    faster = [f"{r['model_id']} [{r['variant']}]" for r in runs if r["kind"] == decision.FASTER]
    if faster:
        notes.append(f"perf: faster beyond noise: {', '.join(faster)}")
    return failing, notes
