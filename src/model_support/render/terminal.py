"""What the CLI prints: the sweep diff and the verdict table, as rich terminal tables."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import polars as pl
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import analysis
from ..bisect import results as bisect_results
from ..bisect import stacks
from ..errors import UserError
from ..probe.model_ids import display_name
from ..probe.signatures import shorten
from ..record import schema, store

# --------------------------------------------------------------------------------------------
# the diff of two sweeps (model-support diff A B)


def diff_table(data_dir: Path | str, a: str, b: str, devices: dict | None = None) -> pl.DataFrame:
    """Models whose outcome changed from sweep ``a`` (the baseline) to sweep ``b``: see
    ``analysis.model_changes``. Unknown ids raise a one-sentence UserError. ``devices``, when
    given, is filled with each sweep's device type."""
    sweeps = analysis.sweep_index(Path(data_dir), cache_dir=Path(data_dir) / analysis.SWEEP_CACHE)
    analysis.require_sweep(sweeps, a)
    analysis.require_sweep(sweeps, b)
    if devices is not None:
        devices.update(
            sweeps.filter(pl.col("sweep_id").is_in([a, b]))
            .select("sweep_id", "device_type")
            .iter_rows()
        )
    from ..analysis import decision

    return decision.relabel(
        analysis.model_changes(store.scan(Path(data_dir), "results"), b, a), data_dir, a, b
    )


def _on(device: str | None) -> str:
    return f" (on {device})" if device else ""


def format_diff(
    diff: pl.DataFrame | Path | str,
    a: str,
    b: str,
    *,
    max_per_change: int = 15,
    width: int = 140,
    changed_by: dict | None = None,
    packages: str = "",
) -> str:
    """``diff_table``'s output as a terminal table, in ``analysis.CHANGES`` order: newly broken
    by the stack first (what a porting team acts on), newly suspect (a PASS whose logits now
    diverge from the reference, or with no reference whose text is not fluent: the step and why
    in the last column), then newly failing (no attribution), newly failing everywhere (the CPU
    reference fails too), newly passing, no longer suspect, status and signature changes, added
    and removed, at most ``max_per_change`` runs of each, then a one-line summary. A variant
    column only when some run is not ``eager+dynamic``; the title ("B against A, the baseline
    (given first)") names each sweep's device when read from a folder; an earlier signature is
    followed by whose failure it was (``[stack]``: what a fix of the stack mended).

    Under the title, the packages whose versions differ between the two sweeps (``packages``); a
    run a bisect named the release of (``changed_by``: {(model_id, variant): "transformers
    5.25.0"}, from B's bisect.json) says "changed by transformers 5.25.0" in a column of its own.

    ``diff`` is a ``diff_table`` result, or a data folder to compute it from (``model-support
    diff`` passes the folder; the packages and the bisect answers are then read from it too)."""
    devices: dict = {}
    if not isinstance(diff, pl.DataFrame):
        folder = Path(diff)
        diff = diff_table(folder, a, b, devices)
        packages = packages or stacks.sweep_changes_line(folder, a, b)
        changed_by = bisect_results.changed_by(folder, b, a) if changed_by is None else changed_by
    changed_by = changed_by or {}
    with_variant = (
        "variant" in diff.columns and diff["variant"].ne_missing(analysis.DEFAULT_VARIANT).any()
    )
    with_cause = bool(changed_by)
    headers = [
        "model",
        *(["variant"] if with_variant else []),
        "change",
        "before",
        "after",
        "signature now (was)",
    ]
    headers += ["changed by"] if with_cause else []
    rows, left_out = [], []
    for change in analysis.CHANGES:
        part = diff.filter(pl.col("change") == change)
        for r in part.head(max_per_change).iter_rows(named=True):
            rows.append(_diff_row(r, change, with_variant, changed_by if with_cause else None))
        if part.height > max_per_change:
            left_out.append(f"{part.height - max_per_change} more {change}")
    more = (
        f"... and {', '.join(left_out)} (`model-support report {b} --baseline {a}` lists them all)"
        if left_out
        else ""
    )
    summary = analysis.diff_summary(diff, a, b)
    # `diff A B` reads "B against A": said which is which, so the order typed is not read backwards
    title = f"{b}{_on(devices.get(b))} against {a}{_on(devices.get(a))}, the baseline (given first)"
    buffer = io.StringIO()
    console = Console(
        file=buffer, width=width, color_system=None, force_terminal=False, highlight=False
    )
    if packages:
        console.print(packages, soft_wrap=True)
    if rows:
        table = Table(*headers, title=title)
        for row in rows:
            table.add_row(*[escape(c) for c in row])
        console.print(table)
    else:
        console.print(f"{title}: no model changed.")
    if more:
        console.print(more, soft_wrap=True)
    console.print(summary, soft_wrap=True)
    return buffer.getvalue()


def _diff_row(r: dict, change: str, with_variant: bool, changed_by: dict | None) -> list[str]:
    """One run's row of ``format_diff``: model, variant (``with_variant``), change, verdicts, the
    signature now (was, and whose), and what a bisect said changed it (``changed_by``, when
    given)."""
    now, was = r["signature_after"], r["signature_before"]
    # newly suspect (or no longer): what the check says now, not a signature
    if r.get("check_note"):
        now = f"{r['check_after']}: {r['check_note']}" if r.get("check_after") else r["check_note"]
    sig = now or ""
    if was and was != now:
        whose = f" [{r['attribution_before']}]" if r.get("attribution_before") else ""
        sig = f"{sig} (was: {was}{whose})" if sig else f"(was: {was}{whose})"
    variant = [r["variant"] or analysis.DEFAULT_VARIANT] if with_variant else []
    said = []
    if changed_by is not None:
        cause = changed_by.get((r["model_id"], r["variant"] or analysis.DEFAULT_VARIANT))
        said = [f"changed by {cause}" if cause else ""]
    row = [r["model_id"], *variant, change, r["status_before"] or "-", r["status_after"] or "-"]
    return [*row, sig, *said]


def _count(value) -> str:
    """A count as the table shows it: "-" where none was recorded (a probe that stopped before
    generating)."""
    return "-" if value is None else str(value)


def verdict_table(records: list[dict], console) -> None:
    """The sweep's verdicts, one row per model (per model and variant for a sweep with a matrix;
    failures grouped by verdict), then the counts."""
    order = {status: i for i, status in enumerate(schema.VERDICTS)}
    with_variant = any(
        (r.get("variant") or analysis.DEFAULT_VARIANT) != analysis.DEFAULT_VARIANT for r in records
    )
    table = Table(title="verdicts")
    columns = ("model", "variant", "verdict", "stage", "whose", "tokens in/out", "signature")
    for column in columns if with_variant else [c for c in columns if c != "variant"]:
        table.add_column(column, overflow="fold")
    key = analysis.variant_key
    for r in sorted(
        records,
        key=lambda r: (
            order.get(r["status"], len(order)),
            r["model_id"],
            key(r.get("variant") or "eager+dynamic"),
        ),
    ):
        variant = [r.get("variant") or analysis.DEFAULT_VARIANT] if with_variant else []
        # no verdict: gated, gone, or a mode this stack does not offer
        if r.get("exclusion_reason"):
            table.add_row(
                display_name(r["model_id"]),
                *variant,
                "excluded",
                "",
                "",
                "",
                shorten(r["exclusion_reason"], 80),
            )
            continue
        whose = (
            (r.get("attribution") or analysis.UNKNOWN_ATTRIBUTION)
            if r["status"] != schema.PASS
            else ""
        )
        table.add_row(
            display_name(r["model_id"]),
            *variant,
            _verdict(r),
            r["failure_stage"] or "",
            whose,
            f"{_count(r['tokens_in'])}/{_count(r['tokens_out'])}",
            shorten(r["failure_signature"] or "", 80),
        )
    console.print(table)
    summary = Counter(_verdict(r) if not r.get("exclusion_reason") else "excluded" for r in records)
    what_if = any(store.is_what_if(r) for r in records)
    verdicts = tuple(f"{WHAT_IF} {v}" for v in schema.VERDICTS) if what_if else schema.VERDICTS
    shown = (*verdicts, "excluded") if summary.get("excluded") else verdicts
    console.print("  ".join(f"{k}: {summary.get(k, 0)}" for k in shown))


#: A what-if run's verdict is no verdict of the stack (operators ran on the host): said as one,
#: "what-if PASS".
WHAT_IF = "what-if"


def _verdict(record: dict) -> str:
    """A run's verdict as the terminal says it: a what-if run's marked so (as the sweep's summary
    counts it)."""
    return f"{WHAT_IF} {record['status']}" if store.is_what_if(record) else record["status"]


def sweep_list_rows(data_dir: Path | str) -> list[dict]:
    """Every sweep of the data folder, newest first: id, name, device, models (x variants),
    verdict counts from its records, excluded, and its state (complete, N to run, or running
    now).

    A what-if sweep (its definition puts operators on the host: ``store.what_if_setting``) has no
    verdict of the stack: its verdict counts are 0 and its own runs' are kept apart, in
    ``what_if`` ({"host_ops", "proves": the stack's sweep it was run for where known
    (``ops.proof.proven_sweeps``), else null, and a count per verdict}, a key only a what-if
    sweep's row has), its state saying so; it is listed right after the sweep it proves (newest
    first among them), else at its own time."""
    from ..ops.proof import proven_sweeps
    from ..probe import probe_params
    from ..record.sweep_meta import parse_sweep_id

    rows, bases = [], {}
    data_dir = Path(data_dir)
    for sweep_id in reversed(store.list_sweeps(data_dir)):
        meta = store.read_sweep(data_dir, sweep_id)
        records = store.read_records(data_dir, sweep_id)
        host_ops = meta.probe.get("host_ops") or None
        # a what-if run (operators on the host) is no verdict of the stack: counted apart; in a
        # what-if sweep every run is one (a stand-in written before stand-ins carried host_ops too)
        hosted = [
            r
            for r in records
            if not r.get("exclusion_reason") and (host_ops or store.is_what_if(r))
        ]
        counts = Counter(
            "excluded" if r.get("exclusion_reason") else r["status"]
            for r in records
            if r.get("exclusion_reason") or not (host_ops or store.is_what_if(r))
        )
        devices = Counter(r["device_type"] for r in records if r.get("device_type"))
        expected = len(meta.models) * len(probe_params.combinations(meta.matrix, meta.stacks))
        try:
            with store.writing(data_dir, sweep_id):
                running = False
        except UserError:
            running = True
        left = expected - len(records)
        bases[sweep_id] = "running" if running else ("complete" if left <= 0 else f"{left} to run")
        row = {
            "sweep_id": sweep_id,
            "name": meta.name or parse_sweep_id(sweep_id).name,
            "device": devices.most_common(1)[0][0] if devices else meta.probe.get("device", "auto"),
            "models": expected,
            **{v: counts.get(v, 0) for v in schema.VERDICTS},
            "excluded": counts.get("excluded", 0) + len(meta.excluded or {}),
            "state": bases[sweep_id]
            + (f", {WHAT_IF}: {len(hosted)} run(s) with operators on the host" if hosted else ""),
        }
        if host_ops:
            own = Counter(r["status"] for r in hosted)
            row["what_if"] = {
                "host_ops": host_ops,
                "proves": None,
                **{v: own.get(v, 0) for v in schema.VERDICTS},
            }
        rows.append(row)
    proves = proven_sweeps(data_dir, [r["sweep_id"] for r in rows if "what_if" in r])
    for r in rows:
        if "what_if" in r:
            r["what_if"]["proves"] = proves.get(r["sweep_id"])
            runs = sum(r["what_if"][v] for v in schema.VERDICTS)
            hosted = r["what_if"]["host_ops"]
            r["state"] = (
                f"{bases[r['sweep_id']]}, {WHAT_IF}: {runs} run(s) with {hosted} on the host"
            )
    return _beside_what_they_prove(rows)


def _beside_what_they_prove(rows: list[dict]) -> list[dict]:
    """``rows`` (newest first) with each what-if sweep that proves a listed sweep moved right
    after that sweep (newest first among them); any other where it was."""
    anchors = _stack_sweeps(rows)
    ordered = []
    for r in rows:
        if _proves(r) not in anchors:
            ordered.append(r)
            ordered += [w for w in rows if _proves(w) == r["sweep_id"]]
    return ordered


def _proves(row: dict) -> str | None:
    """The sweep a ``sweep_list_rows`` row's what-if sweep proves (None: a sweep of the stack, or
    not known)."""
    return (row.get("what_if") or {}).get("proves")


def _stack_sweeps(rows: list[dict]) -> set[str]:
    """The listed sweeps of the stack: those a what-if sweep is listed beside."""
    return {r["sweep_id"] for r in rows if "what_if" not in r}


def sweep_list_table(rows: list[dict], console) -> None:
    """``sweep_list_rows`` as a terminal table: a what-if sweep's row shows its own runs' verdict
    counts, each labelled what-if, right after the sweep it proves (its name marked ``↳``); its
    state says what it put on the host; a line under the table says what that means."""
    anchors = _stack_sweeps(rows)
    what_ifs = [r for r in rows if "what_if" in r]
    caption = (
        f"{WHAT_IF}: a sweep run with operators on the host (ops SWEEP --prove, or host_ops): "
        "its own runs, no verdict of the stack; ↳ right after the sweep it proves"
        if what_ifs
        else None
    )
    table = Table(title="sweeps, newest first", caption=caption)
    table.add_column("sweep", no_wrap=True)  # whole, to copy: the state folds first
    for column in ("name", "device", "models", *schema.VERDICTS, "excluded", "state"):
        table.add_column(column, overflow="fold")
    for r in rows:
        what_if = r.get("what_if")
        table.add_row(
            r["sweep_id"],
            f"↳ {r['name']}" if _proves(r) in anchors else r["name"],
            str(r["device"]),
            str(r["models"]),
            *(f"{WHAT_IF} {what_if[v]}" if what_if else str(r[v]) for v in schema.VERDICTS),
            str(r["excluded"]),
            escape(r["state"]),
        )
    console.print(table)
