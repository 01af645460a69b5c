"""The report sections a porting team acts on, in the order the report leads with them: whose
failures they are (the stack's, the models', both, unknown), whether the passes are right
(suspect passes first), the failure modes ranked by models affected (with their attribution, the
ones new since the baseline flagged), and the changes since the baseline (what the stack newly
broke first, then newly suspect)."""

from __future__ import annotations

import html
from pathlib import Path

import polars as pl

from .. import analysis
from ..bisect import results as bisect_results
from ..bisect import stacks
from ..errors import UserError
from ..record import store
from .html import table_html


def _multi(tables: dict[str, pl.DataFrame]) -> bool:
    """Whether the sweep ran more than one variant (a matrix): counts are then of runs."""
    return tables["variant_stats"].height > 1


def _runs_note(tables: dict[str, pl.DataFrame]) -> str:
    if not _multi(tables):
        return ""
    n = tables["variant_stats"].height
    return (
        f'<p class="ms-note">This sweep ran {n} variants per model: every count below is of runs (model-variant '
        "pairs), not of models; <i>models</i> counts distinct models.</p>"
    )


def whose_html(tables: dict[str, pl.DataFrame]) -> str:
    """One sentence with the split and both pass rates, then the split as a table with each
    term's meaning."""
    counts = dict(tables["attribution"].select("attribution", "count").rows())
    total = sum(counts.values())
    summary = tables["summary"].row(0, named=True)

    def rate(value) -> str:
        return f"{100 * value:.1f}%" if value is not None else "-"

    lead = (
        f'<p class="ms-lead"><b>{total:,} failure{"s" if total != 1 else ""}: {counts.get("stack", 0):,} the '
        f"stack's</b> (the CPU reference passes: what to fix), {counts.get('model', 0):,} the models' (they fail the "
        f"same way on the reference), {counts.get('both', 0):,} both, {counts.get('unknown', 0):,} unknown (no "
        f"reference rerun). Pass rate {rate(summary['pass_rate'])}; on the stack "
        f"{rate(summary['stack_pass_rate'])} (failures that are the model's own left out).</p>"
    )
    if not total:
        return lead
    table = tables["attribution"].with_columns(
        pl.col("attribution")
        .replace_strict(analysis.ATTRIBUTION_KIND_HELP, default=None)
        .alias("meaning")
    )
    return lead + _runs_note(tables) + table_html(table.rename({"count": "failures"}))


SUSPECT_COLUMNS = {
    "model_id": "model",
    "variant": "variant",
    "check": "check",
    "measure": "judged by",
    "step": "diverges at step",
    "note": "why",
    "generated_text": "generated text",
}


def checks_html(tables: dict[str, pl.DataFrame], max_rows: int = 300) -> str:
    """Is a PASS right? One sentence with the split of the passes, the suspect passes first (with
    the step where the device diverges from the reference), then the split as a table with what
    each kind guarantees."""
    checks = tables["pass_checks"]
    counts = dict(checks.select("check", "count").rows())
    passes = sum(counts.values())
    suspect = tables["suspect_passes"]
    lead = (
        f'<p class="ms-lead"><b>{passes:,} pass{"es" if passes != 1 else ""}: {suspect.height:,} suspect</b> '
        f"({counts.get(analysis.DIVERGES, 0):,} diverge from the reference, {counts.get(analysis.NOT_FLUENT, 0):,} "
        f"with no reference are not fluent), {counts.get(analysis.AGREES, 0):,} agree with the reference, "
        f"{counts.get(analysis.TIES, 0):,} agree within ties, {counts.get(analysis.FLUENT, 0):,} with no reference "
        f"are fluent, {counts.get(analysis.UNCHECKED, 0):,} unchecked. The verdict stays PASS in every case.</p>"
    )
    if not passes:
        return lead
    columns = [c for c in SUSPECT_COLUMNS if c != "variant" or _multi(tables)]
    listed = (
        table_html(
            suspect.select(columns).rename({c: SUSPECT_COLUMNS[c] for c in columns}),
            max_rows=max_rows,
        )
        if suspect.height
        else '<p class="ms-note">No suspect pass.</p>'
    )
    split = checks.with_columns(
        pl.col("check").replace_strict(analysis.PASS_CHECK_HELP, default=None).alias("meaning")
    ).drop("suspect")
    return (
        lead
        + _runs_note(tables)
        + "<h3>Suspect passes</h3>"
        + listed
        + "<h3>All passes</h3>"
        + table_html(split)
    )


SIGNATURE_COLUMNS = {
    "failure_signature": "failure signature",
    "new": "new",
    "models": "models",
    "count": "runs",
    "attribution": "whose",
    "task": "task",
    "failure_stage": "stage",
    "status": "verdict",
    "example_models": "example models",
    "error_message": "error_message",
    "traceback": "traceback",
}


def signatures_html(
    tables: dict[str, pl.DataFrame], baseline_sweep_id: str | None, max_rows: int = 200
) -> str:
    """The failure modes, the one affecting the most models first: whose failures they are
    ("stack 3, model 1" when mixed), "new" for a signature the baseline did not have, and, in a
    sweep of more than one task, the task of a signature that only one task has (one table for
    every task)."""
    sigs = tables["signatures"]
    if not sigs.height:
        return '<p class="ms-note">No failures.</p>'
    columns = [c for c in SIGNATURE_COLUMNS if c in sigs.columns]
    if not baseline_sweep_id:
        columns.remove("new")
    if not _multi(tables):
        columns.remove("count")
    if "by_task" not in tables or tables["by_task"].height < 2:
        columns.remove("task")
    else:
        sigs = sigs.with_columns(pl.col("task").fill_null("all"))
    shown = sigs.with_columns(
        pl.when(pl.col("new")).then(pl.lit("new")).otherwise(pl.lit("")).alias("new")
    )
    note = ""
    if baseline_sweep_id:
        n_new = int(sigs["new"].fill_null(False).sum())
        note = (
            f'<p class="ms-note">{n_new:,} of {sigs.height:,} signatures are new since the '
            "baseline.</p>"
        )
    return note + table_html(
        shown.select(columns).rename({c: SIGNATURE_COLUMNS[c] for c in columns}), max_rows=max_rows
    )


def add_bisect(
    tables: dict[str, pl.DataFrame], data_dir, sweep_id: str, baseline_sweep_id: str | None
) -> None:
    """What the diff says of the stack, read from the data folder: ``tables["packages"]`` (one
    row: the packages whose versions differ between the two sweeps, from their sweep.json) and a
    ``changed_by`` column on ``tables["changes"]`` ("tinyswitch 2.0" where a bisect named the
    release: sweep_id's bisect.json); ``tables["settings"]`` (one row: this sweep's backend
    configuration, shown beside its stack)."""
    try:
        settings = stacks.sweep_settings(store.read_sweep(Path(data_dir), sweep_id))
    except UserError:  # a report rendered from Parquet alone: no sweep.json
        settings = None
    if settings:
        tables["settings"] = pl.DataFrame(
            {"settings": ["; ".join(f"{k}={v!r}" for k, v in sorted(settings.items()))]}
        )
    if not baseline_sweep_id:
        return
    tables["packages"] = pl.DataFrame(
        {"packages": [stacks.sweep_changes_line(data_dir, baseline_sweep_id, sweep_id)]}
    )
    found = bisect_results.changed_by(data_dir, sweep_id, baseline_sweep_id)
    said = [
        found.get((m, v or analysis.DEFAULT_VARIANT))
        for m, v in tables["changes"].select("model_id", "variant").rows()
    ]
    tables["changes"] = tables["changes"].with_columns(
        pl.Series("changed_by", said, dtype=pl.String)
    )


def packages_line(tables: dict[str, pl.DataFrame]) -> str:
    """The packages whose versions differ from the baseline's ("" when unknown: ``add_bisect``
    not run)."""
    packages = tables.get("packages")
    return packages["packages"][0] if packages is not None and packages.height else ""


CHANGE_COLUMNS = {
    "model_id": "model",
    "variant": "variant",
    "changed_by": "changed by",
    "attribution": "whose",
    "attribution_before": "whose, before",
    "status_before": "before",
    "status_after": "after",
    "signature_after": "signature now",
    "signature_before": "signature before",
    "check_after": "check now",
    "suspect_step": "diverges at step",
    "check_note": "why",
    "error_message": "error_message",
}


def changes_html(
    tables: dict[str, pl.DataFrame],
    sweep_id: str,
    baseline_sweep_id: str | None,
    max_rows: int = 300,
) -> str:
    """The diff against the baseline: the one-line summary, then one list per kind of change in
    ``analysis.CHANGES`` order (newly broken by the stack first), then the signatures that
    appeared or vanished."""
    if not baseline_sweep_id:
        return '<p class="ms-note">No baseline sweep: nothing to compare with.</p>'
    changes = tables["changes"]
    line = analysis.diff_summary(changes, baseline_sweep_id, sweep_id)
    left_out = sum(
        t["baseline_status"].is_not_null().sum() for t in (tables["pending"], tables["not_tested"])
    )
    parts = [f'<p class="ms-diff-summary"><b>{html.escape(line)}</b></p>']
    if packages_line(tables):
        parts.append(f'<p class="ms-packages">{html.escape(packages_line(tables))}.</p>')
    if left_out:
        parts.append(
            f'<p class="ms-note">{left_out:,} model{"s" if left_out != 1 else ""} of the baseline not probed in this '
            "sweep (pending or not tested) are left out of the diff.</p>"
        )
    parts.append(_runs_note(tables))
    columns = [
        c for c in CHANGE_COLUMNS if c in changes.columns and (c != "variant" or _multi(tables))
    ]
    for change in analysis.CHANGES:
        part = changes.filter(pl.col("change") == change)
        if not part.height:
            continue
        slug = change.replace(" ", "-")
        parts.append(
            f'<h4 class="ms-change" id="change-{slug}">{html.escape(change)} ({part.height:,})</h4>'
        )
        keep = [
            c for c in columns if c in ("model_id", "variant") or part[c].null_count() < part.height
        ]
        parts.append(
            table_html(
                part.select(keep).rename({c: CHANGE_COLUMNS[c] for c in keep}), max_rows=max_rows
            )
        )
    if not changes.height:
        parts.append('<p class="ms-note">No model changed.</p>')
    parts.append("<h4>Failure signatures that appeared or vanished</h4>")
    parts.append(
        table_html(tables["signature_changes"], empty="No signature appeared or vanished.")
    )
    return "".join(parts)


DEVICE_COLUMNS = {
    "model_id": "model",
    "variant": "variant",
    "devices_used": "devices",
    "parallelism": "parallelism",
    "tp_size": "tp_size",
    "ep_size": "ep_size",
    "memory_estimate_gb": "memory estimate (GB)",
    "status": "verdict",
    "ranks_agree": "ranks agree",
    "rank_errors": "rank errors",
    "rank_log_tail": "rank log tail",
}


def devices_html(tables: dict[str, pl.DataFrame], max_rows: int = 300) -> str:
    """Models bigger than one chip: the whole section (heading included), or "" when every run
    used one device with no parallelism (older files read so): the runs on more than one device,
    and the pass rate by parallelism (none / tp / ep)."""
    multi, by_kind = tables["multi_device"], tables["by_parallelism"]
    if not analysis.uses_devices(multi, by_kind):
        return ""
    # what the ranks said: shown where any run says it
    said = ("ranks_agree", "rank_errors", "rank_log_tail")
    columns = [
        c
        for c in DEVICE_COLUMNS
        if (c != "variant" or _multi(tables))
        and (c not in said or multi[c].null_count() < multi.height)
    ]
    n_models = multi["model_id"].n_unique()
    kinds = by_kind.with_columns(
        pl.col("parallelism")
        .replace_strict(analysis.PARALLELISM_HELP, default=None)
        .alias("meaning")
    )
    return "".join(
        [
            '<h2 id="devices-and-parallelism">Devices and parallelism</h2>',
            f'<p class="ms-note">{n_models:,} model{"s" if n_models != 1 else ""} ran on more than one device: '
            "tensor parallel (tp), expert parallel (ep), or none when the model has no plan. The memory estimate "
            "is the plan's estimate of the weights; older records read as one device, no parallelism. Ranks agree "
            "when every rank generated the same tokens; a failed run keeps each rank's error and the end of the "
            "failed ranks' logs (a hang's stacks).</p>",
            _runs_note(tables),
            table_html(
                multi.select(columns).rename({c: DEVICE_COLUMNS[c] for c in columns}),
                max_rows=max_rows,
                empty="No run used more than one device.",
            ),
            "<h3>Pass rate by parallelism</h3>",
            table_html(kinds),
        ]
    )
