"""``model-support``: each command is a few lines over a library call (as sqlite-utils does).

Bad input ends in one sentence on stderr and exit status 2, never a bare stack trace.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import click

from .params import SweepConfigError

DATA_HELP = "Data folder (sweeps, Parquet dataset, reports)."


def fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """Sweep Hugging Face models over an accelerator stack (TPU, CUDA, CPU) and report what runs."""


@main.command()
@click.argument("params_file", type=click.Path(path_type=Path), required=False)
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path("data"), show_default=True, help=DATA_HELP)
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Probes at once (default: params, else one per device).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default=None, help="Where probes run (default: params, else local).")
@click.option("--resume", "resume", default=None, metavar="SWEEP_ID", help="Finish an interrupted sweep: run only models without a record.")
@click.option("--report/--no-report", default=True, show_default=True, help="Render the sweep's HTML report at the end.")
def sweep(params_file, data_dir, workers, executor, resume, report):
    """Run the probe notebook once per model of PARAMS_FILE (YAML) and publish the results."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from . import params as params_mod
    from . import sweep as sweep_mod

    if params_file is None and resume is None:
        fail("give a sweep definition such as params/smoke.yaml, or --resume SWEEP_ID")
    try:
        params = params_mod.load(params_file) if params_file else None
    except SweepConfigError as exc:
        fail(str(exc))
    console = Console(stderr=True)
    counts: Counter = Counter()
    with Progress(
        TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[verdicts]}"),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console,
    ) as progress:
        bar = progress.add_task("sweep", total=None, verdicts="")

        def on_result(record, done, total):
            counts[record["status"]] += 1
            progress.update(bar, completed=done, total=total,
                            verdicts=" ".join(f"{k}={v}" for k, v in sorted(counts.items())))
            progress.console.log(f"{record['status']:<12} {short_model_name(record['model_id'])}  ({record['duration_s'] or 0:.1f} s)")

        try:
            summary = sweep_mod.run(params, data_dir, workers=workers, executor=executor, resume=resume, on_result=on_result)
        except (SweepConfigError, ValueError) as exc:
            fail(str(exc))
    from . import store

    print_verdict_table(store.read_records(data_dir, summary["sweep_id"]), console)
    click.echo(f"sweep {summary['sweep_id']}: {summary['ran']} probed now, {summary['total']} models, "
               f"{summary['wall_s']:.1f} s with {summary['workers']} worker(s) ({summary['executor']})")
    click.echo(f"records:  {data_dir / 'sweeps' / summary['sweep_id']}")
    click.echo(f"dataset:  {data_dir / 'results'} and {data_dir / 'excluded'} (card: {data_dir / 'README.md'})")
    if report:
        _render(data_dir, summary["sweep_id"], None)


def short_model_name(model_id: str) -> str:
    """A local folder shows as its name; a Hub id as it is."""
    return Path(model_id).name if model_id.startswith("/") else model_id


def print_verdict_table(records: list[dict], console) -> None:
    from rich.table import Table

    from .sweep import verdict_order

    table = Table(title="verdicts")
    for column in ("model", "verdict", "stage", "tokens in/out", "signature"):
        table.add_column(column, overflow="fold")
    for r in sorted(records, key=lambda r: (verdict_order(r["status"]), r["model_id"])):
        table.add_row(short_model_name(r["model_id"]), r["status"], r["failure_stage"] or "", f"{r['tokens_in']}/{r['tokens_out']}",
                      (r["failure_signature"] or "")[:80])
    console.print(table)
    summary = Counter(r["status"] for r in records)
    console.print("  ".join(f"{k}: {summary.get(k, 0)}" for k in ("PASS", "FAIL(load)", "FAIL(gen)", "FAIL(other)")))


def _render(data_dir: Path, sweep_id: str, baseline: str | None) -> None:
    from . import report

    try:
        baseline = baseline or report.previous_sweep(data_dir, sweep_id)
        html = report.render_report(data_dir, sweep_id, baseline)
    except ValueError as exc:
        fail(str(exc))
    click.echo(f"report:   {html}" + (f" (baseline {baseline})" if baseline else ""))
    click.echo(f"explorer: {Path(html).parent / 'index.html'}")


@main.command()
@click.argument("sweep_id")
@click.option("--baseline", default=None, metavar="SWEEP_ID", help="Compare against this sweep (default: the previous one).")
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path("data"), show_default=True, help=DATA_HELP)
def report(sweep_id, baseline, data_dir):
    """Render the HTML failure-mode report of SWEEP_ID (and rebuild the explorer)."""
    _render(data_dir, sweep_id, baseline)


@main.command()
@click.argument("sweep_a")
@click.argument("sweep_b")
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path("data"), show_default=True, help=DATA_HELP)
def diff(sweep_a, sweep_b, data_dir):
    """What broke and what got fixed between SWEEP_A (before) and SWEEP_B (after)."""
    from . import report

    try:
        click.echo(report.format_diff(data_dir, sweep_a, sweep_b))
    except ValueError as exc:
        fail(str(exc))


@main.command()
@click.argument("sweep_id")
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path("data"), show_default=True, help=DATA_HELP)
def aggregate(sweep_id, data_dir):
    """Compact SWEEP_ID's records into its Parquet files (what aggregate.ipynb does)."""
    from . import store

    try:
        results, excluded = store.compact(data_dir, sweep_id)
    except ValueError as exc:
        fail(str(exc))
    click.echo(f"{sweep_id}: {results} result rows, {excluded} excluded rows")


@main.command()
@click.argument("sweep_id")
@click.option("--reason", required=True, help="Why the whole sweep is excluded (e.g. a broken stack).")
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path("data"), show_default=True, help=DATA_HELP)
def exclude(sweep_id, reason, data_dir):
    """Move a whole sweep to the excluded config (never counted as failure); no row is lost."""
    from . import store

    try:
        results, excluded = store.set_exclusion(data_dir, sweep_id, reason)
    except ValueError as exc:
        fail(str(exc))
    click.echo(f"{sweep_id}: excluded ({excluded} excluded rows, {results} result rows)")


@main.command()
@click.argument("sweep_id")
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path("data"), show_default=True, help=DATA_HELP)
def include(sweep_id, data_dir):
    """Undo ``exclude``: move a whole sweep back to the results config."""
    from . import store

    try:
        results, excluded = store.set_exclusion(data_dir, sweep_id, None)
    except ValueError as exc:
        fail(str(exc))
    click.echo(f"{sweep_id}: included ({results} result rows, {excluded} excluded rows)")


@main.command()
@click.argument("sweep_id")
@click.argument("model")
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path("data"), show_default=True, help=DATA_HELP)
@click.option("-p", "--parameter", "parameters", type=(str, str), multiple=True, metavar="NAME VALUE",
              help="Override a debug notebook parameter (e.g. -p device cpu, -p tolerance 0.5).")
def debug(sweep_id, model, data_dir, parameters):
    """Execute notebooks/debug.ipynb for MODEL (id or unique fragment) with SWEEP_ID's settings.

    Prints the executed notebook's path: open it in JupyterLab (make lab) to see where the model
    breaks (first failing module, generation step) and where it diverges from the CPU reference.
    """
    import papermill

    from . import debug as debug_mod

    overrides = {name: yaml_value(value) for name, value in parameters}
    try:
        path = debug_mod.run_debug_notebook(data_dir, sweep_id, model, parameters=overrides)
    except ValueError as exc:
        fail(str(exc))
    except papermill.PapermillExecutionError as exc:
        meta_path = debug_mod.debug_notebook_path(data_dir, sweep_id, debug_mod.resolve_model(
            debug_mod.store.read_sweep(data_dir, sweep_id), model)["model_id"])
        click.echo(f"debug notebook stopped at a cell error ({exc.ename}): {meta_path}")
        sys.exit(1)
    click.echo(f"debug notebook: {path}")
    click.echo(debug_mod.summary_text(debug_mod.debug_result_from_notebook(path)))


def yaml_value(text: str):
    """A -p value as YAML reads it (0.5 -> float, true -> bool), as papermill's own -y does."""
    import yaml

    return yaml.safe_load(text)


@main.command()
@click.argument("repo_id")
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path("data"), show_default=True, help=DATA_HELP)
@click.option("--private/--public", default=True, show_default=True)
def push(repo_id, data_dir, private):
    """Upload the dataset (card, results, excluded) to the Hub as a dataset repo (needs network and a token)."""
    from . import publish

    try:
        url = publish.push(data_dir, repo_id, private=private)
    except publish.PushError as exc:
        fail(str(exc))
    click.echo(f"pushed: {url}")


if __name__ == "__main__":
    main()
