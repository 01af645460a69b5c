"""The dataset's commands: report, aggregate, exclude, include, export, list, support, push."""

from __future__ import annotations

import sys

import click

from ..errors import UserError
from .common import data_dir_option, user_errors


@click.command()
@click.argument("sweep_id")
@click.option(
    "--baseline",
    default=None,
    metavar="SWEEP_ID",
    help="Compare against this sweep (default: the previous sweep of the same name and device).",
)
@data_dir_option
@user_errors
def report(sweep_id, baseline, data_dir):
    """Render the HTML failure-mode report of SWEEP_ID (and rebuild the explorer)."""
    from ..workflows import render_report

    render_report(data_dir, sweep_id, baseline, say=click.echo)


@click.command()
@click.argument("sweep_id")
@data_dir_option
@user_errors
def aggregate(sweep_id, data_dir):
    """Compact SWEEP_ID's records into its Parquet files (what aggregate.ipynb does)."""
    from ..record import store

    results, excluded = store.compact(data_dir, sweep_id)
    click.echo(f"{sweep_id}: {results} result rows, {excluded} excluded rows")


@click.command()
@click.argument("sweep_id")
@click.option(
    "--reason", required=True, help="Why the whole sweep is excluded (e.g. a broken stack)."
)
@data_dir_option
@user_errors
def exclude(sweep_id, reason, data_dir):
    """Move a whole sweep to the excluded config (never counted as failure); no row is lost."""
    from ..record import store

    results, excluded = store.set_exclusion(data_dir, sweep_id, reason)
    click.echo(f"{sweep_id}: excluded ({excluded} excluded rows, {results} result rows)")


@click.command()
@click.argument("sweep_id")
@data_dir_option
@user_errors
def include(sweep_id, data_dir):
    """Undo ``exclude``: move a whole sweep back to the results config."""
    from ..record import store

    results, excluded = store.set_exclusion(data_dir, sweep_id, None)
    click.echo(f"{sweep_id}: included ({results} result rows, {excluded} excluded rows)")


@click.command()
@click.argument("sweep_id")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["markdown", "csv", "json", "junit"]),
    default="markdown",
    show_default=True,
    help="JUnit XML for a CI system, Markdown for a README or a pull-request comment, CSV or JSON.",
)
@click.option(
    "--suspect-fails",
    is_flag=True,
    help="JUnit: a suspect PASS is a failing case (else a passing one saying so).",
)
@data_dir_option
@user_errors
def export(sweep_id, fmt, suspect_fails, data_dir):
    """SWEEP_ID's support matrix from the dataset alone: one row per model and variant, its
    verdict, whether a PASS is right, tokens/s, the stack, its record and repro."""
    from ..render.exports import export as export_sweep

    if suspect_fails and fmt != "junit":
        raise UserError(
            "--suspect-fails applies to --format junit (a suspect PASS as a failing case); "
            f"the {fmt} export already says which PASSes are suspect (its check column): drop "
            "--suspect-fails or use --format junit."
        )
    # `> file`: a CI's artifact
    click.echo(export_sweep(data_dir, sweep_id, fmt, suspect_fails), nl=False)


@click.command()
@click.argument("model")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the card as JSON, one object per stack and variant.",
)
@data_dir_option
@user_errors
def support(model, as_json, data_dir):
    """MODEL's support card from the dataset alone (id or unique fragment, as debug takes it):
    per stack (its packages, the device backend as its adapter declares it, and the backend's
    settings) and variant its latest verdict, whether that PASS is right, when last verified, how
    many sweeps agree, and the evidence (also `model_support.support()`)."""
    import json

    from ..analysis.support import model_ids
    from ..analysis.support import support as card
    from ..probe.model_ids import resolve

    cards = card(resolve(model_ids(data_dir), model, f"the dataset in {data_dir}"), data_dir)
    if as_json:
        click.echo(json.dumps(cards, indent=1))
        return
    for c in cards:
        # the backend: as its adapter says
        stack = [f"torch {c['torch']}" if c["torch"] else "", c["backend"] or ""]
        stack += [f"transformers {c['transformers']}" if c["transformers"] else ""]
        # its settings
        stack += [f"{name}={value}" for name, value in c["backend_settings"].items()]
        verdict = f"{c['verdict']}{' (suspect: ' + c['check'] + ')' if c['suspect'] else ''}"
        if c.get("check_measure"):  # which agreement measure judged it (probe.agreement.MEASURES)
            verdict += f" [judged by {c['check_measure']}]"
        click.echo(
            f"{c['device_type']}{' stack ' + c['stack_name'] if c['stack_name'] else ''} "
            f"[{c['variant']}] {', '.join(part for part in stack if part)}: {verdict}, last "
            f"verified {c['last_verified']} in {c['sweep_id']} ({c['agreeing']} of "
            f"{c['sweeps']} sweeps agree)"
            + (f"; repro {c['repro']}" if c["repro"] else "")
            + (f"; {c['failure_signature']}" if c["failure_signature"] else "")
        )


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per sweep.")
@data_dir_option
@user_errors
def list_(as_json, data_dir):
    """The sweeps of the data folder, newest first: name, device, models, verdict counts, whether
    complete. A what-if sweep (operators on the host) shows its own runs' counts, labelled
    what-if, right after the sweep it proves. Any command taking a sweep id also takes `latest`,
    `latest:NAME` (never a what-if sweep) or a unique prefix."""
    import json

    from ..render.terminal import sweep_list_rows, sweep_list_table

    rows = sweep_list_rows(data_dir)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
    elif not rows:
        click.echo(f"No sweeps under {data_dir}/sweeps yet; `make sweep` runs the default one.")
    else:
        from rich.console import Console

        sweep_list_table(rows, Console() if sys.stdout.isatty() else Console(width=160))


@click.command()
@click.argument("repo_id")
@data_dir_option
@click.option(
    "--private/--public",
    default=True,
    show_default=True,
    help="Visibility of a repo (or bucket) the push creates.",
)
@click.option(
    "--logs",
    is_flag=True,
    help="Also publish each sweep's executed notebooks, logs and sweep.json.",
)
@click.option(
    "--logs-bucket",
    default=None,
    metavar="NAMESPACE/NAME",
    help="Publish the logs into this Hub bucket (hf://buckets/NAMESPACE/NAME) instead of the repo; "
    "implies --logs.",
)
@user_errors
def push(repo_id, data_dir, private, logs, logs_bucket):
    """Publish the dataset to the Hub dataset repo REPO_ID: card, results, excluded, the latest
    report (and the raw logs); only what the repo lacks, in one commit (needs network and a write
    token in HF_TOKEN)."""
    from .. import publish

    result = publish.push(
        data_dir,
        repo_id,
        private=private,
        logs=logs,
        logs_bucket=logs_bucket,
        log=lambda line: click.echo(line, err=True),
    )
    click.echo(result.summary())
