"""The nightly, end to end (``model-support nightly DEF``, ``make nightly``): after the sweep (its
flakes already rerun against its baseline, ``sweep.reruns``), against the last sweep of the same
name and device: export JUnit and Markdown beside the report, run the gate (``analysis.gate``:
regressions and new failures, expectations and flakes applied; ``perf`` on request), bisect each
failing model when the two stacks differ (packages or backend settings), draft one bug report per
failure signature (``render.bug_reports``), push when asked, and end with exit status 1 when the
gate failed.

A room of its own above the others: it runs a sweep's aftermath through analysis, bisect, debug,
render and publish, which import nothing of each other's jobs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import polars as pl

from . import fileio
from .analysis import expectations as expected_mod
from .analysis import flakes
from .analysis import gate as gate_mod
from .analysis import perf as perf_mod
from .bisect import stacks as bisect_stacks
from .errors import UserError
from .record import store
from .render import bug_reports, exports


def reports_dir(data_dir: Path, sweep_id: str) -> Path:
    """Where a sweep's drafted bug reports go: ``reports/<sweep>-bugs/``."""
    return data_dir / "reports" / f"{sweep_id}-bugs"


def write_exports(data_dir: Path, sweep_id: str) -> list[Path]:
    """The sweep's JUnit XML and Markdown beside its report (``reports/<sweep>.junit.xml``,
    ``.md``)."""
    written = []
    for fmt, suffix in (("junit", ".junit.xml"), ("markdown", ".md")):
        path = data_dir / "reports" / f"{sweep_id}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        fileio.atomic_write_text(path, exports.export(data_dir, sweep_id, fmt))
        written.append(path)
    return written


def _rows(data_dir: Path, sweep_id: str) -> dict[tuple[str, str], dict]:
    """{(model, variant): the row's error, attribution, repro body, versions and backend} of a
    sweep's results."""
    from .analysis.frames import variant_col

    rows = (
        store.scan(data_dir, "results")
        .filter(pl.col("sweep_id") == sweep_id)
        .with_columns(variant_col())
        .select(
            *(
                "model_id",
                "variant",
                "error_type",
                "error_message",
                "attribution",
                "repro_sha256",
                "versions",
            ),
            # the backend that ran, for the draft's stack line
            *("device_type", "backend_versions"),
        )
        .collect()
    )
    return {(r["model_id"], r["variant"]): r for r in rows.iter_rows(named=True)}


def _bisect(
    data_dir: Path, a: str, b: str, models: list[str], find_links: Path | None, log
) -> tuple[dict, str]:
    """{(model, variant): answer} of a bisect of ``models`` (B against A), and a note when none
    ran."""
    packages = [
        c
        for c in bisect_stacks.sweep_stack_changes(data_dir, a, b)
        if c.name not in bisect_stacks.NOT_SWAPPED
    ]
    settings = bisect_stacks.sweep_setting_changes(data_dir, a, b) or []
    if not packages and not settings:
        return {}, "Not bisected: the two sweeps ran on the same packages and backend settings."
    from .bisect.forms import bisect_sweeps

    answers = bisect_sweeps(data_dir, a, b, models=models, find_links=find_links, log=log)
    return {(x["model_id"], x["variant"]): x for x in answers}, ""


def _localised(data_dir: Path, sweep_id: str, model_id: str, variant: str) -> dict | None:
    """The first wrong operator of a run, where ``model-support localise`` found it already."""
    from .debug import localise

    found = localise.stored(data_dir, sweep_id, model_id, variant)
    return found if found and found.get("operator") else None


def after_sweep(
    data_dir: Path | str,
    sweep_id: str,
    *,
    fail_on: tuple[str, ...] = ("regressions", "new-failures"),
    expect: Path | str | None = None,
    perf_threshold: float | None = None,
    across: tuple[str, ...] = (),
    bisect: bool = True,
    find_links: Path | None = None,
    push_to: str | None = None,
    log: Callable[[str], None] = print,
) -> int:
    """Everything after the sweep; the exit status (1: the gate failed; 2: it refused to compare
    the night with its baseline, their runs differing in a dtype or mode ``across`` does not
    allow: ``decision.refuse_unlike``). A refusal is said as the gate's line and the push still
    runs: the night's verdicts are the night's, whatever the gate could compare them with."""
    data_dir = Path(data_dir)
    meta = store.read_sweep(data_dir, sweep_id)
    for path in write_exports(data_dir, sweep_id):
        log(f"export:   {path}")
    # the one rule: recorded by the sweep, else the last of its name
    baseline = flakes.baseline_id(data_dir, meta)
    status = 0
    result: gate_mod.GateResult | None = None
    if baseline is None:
        log(
            f"No earlier sweep named {meta.name!r} on this device: nothing to gate against "
            "(the next night will)."
        )
    else:
        known = (
            expected_mod.load_expectations(expect)
            if expect
            else expected_mod.from_meta(meta.expect)
        )
        threshold = perf_mod.DEFAULT_THRESHOLD if perf_threshold is None else perf_threshold
        log(f"gate:     {sweep_id} against {baseline} ({', '.join(fail_on)})")
        try:
            result = gate_mod.gate(
                data_dir,
                baseline,
                sweep_id,
                list(fail_on),
                known,
                perf_threshold=threshold,
                across=across,
            )
        except UserError as refused:
            log(f"  gate refused: {refused}")
            status = 2
    if result is not None:
        for line in result.known + result.notes:
            log(f"  {line}")
        for line in result.failing:
            log(f"  {line}")
        log(f"  gate: {result.summary()}")
        if result.failed:
            status = 1
            # a vanished run has no failure to report
            failures = [c for c in result.changes if c["after"]]
            drafts = _draft(
                data_dir, meta.name, baseline, sweep_id, failures, bisect, find_links, log
            )
            for path in drafts:
                log(f"drafted:  {path}")
        else:
            log("  nothing regressed")
    if push_to:
        from .publish.push import push

        push(data_dir, push_to, logs=True, log=log)
    return status


def _draft(data_dir, name, baseline, sweep_id, changes, bisect, find_links, log) -> list[Path]:
    """Bisect the failing models when the stacks differ, then write one drafted report per
    signature."""
    if not changes:
        return []
    answers: dict[tuple[str, str], dict] = {}
    note = "Not bisected (--no-bisect)."
    if bisect:
        answers, note = _bisect(
            data_dir, baseline, sweep_id, sorted({c["model_id"] for c in changes}), find_links, log
        )
    rows = _rows(data_dir, sweep_id)
    device = store.read_sweep(data_dir, sweep_id).probe.get("device", "auto")
    regressions = []
    for c in changes:
        row = rows.get((c["model_id"], c["variant"]), {})
        error = f"{row.get('error_type') or ''}: {row.get('error_message') or ''}".strip(": ")
        regressions.append(
            bug_reports.Regression(
                model_id=c["model_id"],
                variant=c["variant"],
                before=c["before"],
                after=c["after"],
                signature=c["signature"],
                error=error,
                attribution=row.get("attribution"),
                repro_sha256=row.get("repro_sha256"),
                bisect=answers.get((c["model_id"], c["variant"])),
                localised=_localised(data_dir, sweep_id, c["model_id"], c["variant"]),
                versions=dict(row.get("versions") or {}),
                device_type=row.get("device_type"),
                backend_versions=row.get("backend_versions"),
            )
        )
    changed = bisect_stacks.sweep_changes_line(data_dir, baseline, sweep_id)
    folder = reports_dir(data_dir, sweep_id)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    plan = _plan_section(data_dir, sweep_id, regressions)
    for file_name, text in bug_reports.drafts(
        sweep_id, baseline, device, changed, regressions, note
    ):
        fileio.atomic_write_text(folder / file_name, text + plan(file_name))
        written.append(folder / file_name)
    return written


def _plan_section(data_dir: Path, sweep_id: str, regressions: list) -> Callable[[str], str]:
    """The porting plan's word on a draft's models (``render.ops.plan_markdown``: the steps that
    unlock them, a localised wrong operator's among them, "confirmed by running" where
    ``model-support ops --prove`` ran a step with its operators on the host and they PASSed and
    agreed with the reference, and each one's standing), by the draft's file name ("" for none).
    The sweep's own stack and data only: its census, the answers ``model-support localise`` kept
    in its folder and the what-if sweeps its ``proof.json`` names."""
    from .ops import porting_plan, predict, proof, sweep_models
    from .ops.plan import step_proofs
    from .render.ops import plan_markdown

    models = predict(sweep_models(data_dir, sweep_id))
    steps = porting_plan(models)
    proofs = step_proofs(models, steps, proof.read(data_dir, sweep_id).get("unhostable") or {})
    groups: dict[str, list[str]] = {}
    for r in regressions:  # a draft covers one group (``bug_reports.group_key``), named after it
        groups.setdefault(bug_reports.slug(bug_reports.group_key(r)), []).append(
            store.pending_key(r.model_id, r.variant)
        )

    def section(file_name: str) -> str:
        keys = next((k for name, k in groups.items() if file_name.endswith(f"-{name}.md")), [])
        lines = plan_markdown(models, steps, keys, proofs)
        if not lines:
            return ""
        return (
            "\n## In the porting plan (`model-support ops "
            + sweep_id
            + "`)\n\n"
            + "\n".join(lines)
            + "\n"
        )

    return section


def check_across(across: str) -> tuple[str, ...]:
    """``--across`` as a tuple of settings (``gate.check_across``), one sentence for another
    word: checked before the sweep runs, as ``--fail-on`` is."""
    return gate_mod.check_across(across)


def check_fail_on(fail_on: str) -> tuple[str, ...]:
    """``--fail-on`` as a tuple of gates, one sentence for a gate that is none."""
    gates = tuple(g.strip() for g in fail_on.split(",") if g.strip())
    unknown = [g for g in gates if g not in gate_mod.GATES]
    if unknown or not gates:
        raise UserError(
            f"--fail-on {fail_on!r}: give a comma-separated list of {', '.join(gate_mod.GATES)}."
        )
    return gates
