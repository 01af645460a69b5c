"""The sweep and the nightly: a sweep with its progress, summary, report and pending sentence
(``workflows.sweep``), and the nightly over it (``workflows.nightly``)."""

from __future__ import annotations

import functools
import os
import signal
import sys
from pathlib import Path

import click

from ..errors import Interrupted, UserError
from . import common
from .common import data_dir_option, user_errors


@click.command()
@click.argument("params_file", type=click.Path(path_type=Path), required=False)
@data_dir_option
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Probes at once (default: params, else one per device).",
)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default=None,
    help="Where probes run (default: params, else local).",
)
@click.option(
    "--prefetch",
    type=click.IntRange(min=0),
    default=None,
    help="Models downloaded ahead per worker (default: params, else 1; 0: no download ahead).",
)
@click.option(
    "--resume",
    "resume",
    default=None,
    metavar="SWEEP_ID",
    help="Finish an interrupted sweep (instead of PARAMS_FILE): run only models without a record; "
    "a complete one is said so and left as it is.",
)
@click.option(
    "--report/--no-report",
    default=True,
    show_default=True,
    help="Render the sweep's HTML report at the end.",
)
@click.option(
    "--device",
    default=None,
    help="Probe on this device instead of the definition's (any device name, auto).",
)
@click.option(
    "-p",
    "--param",
    "overrides",
    multiple=True,
    metavar="NAME=VALUE",
    help="Set a probe parameter over the definition's (repeatable; a YAML value: 32, true, "
    "bfloat16).",
)
@click.option(
    "--reruns",
    type=click.IntRange(min=0),
    default=None,
    help="Rerun a verdict that differs from the baseline's up to N times before it counts "
    "(default: the definition's reruns, else 1; 0: none).",
)
@user_errors
def sweep(
    params_file, data_dir, workers, executor, prefetch, resume, report, device, overrides, reruns
):
    """Run the probe notebook once per model of PARAMS_FILE (YAML) and publish the results."""
    if params_file is None and resume is None:
        raise UserError("Give a sweep definition such as params/smoke.yaml, or --resume SWEEP_ID.")
    if params_file is not None and resume is not None:
        raise UserError(
            f"Give {params_file} (a new sweep) or --resume {resume} (finish that sweep, which "
            "keeps its own definition in sweep.json), not both."
        )
    probe_overrides = _probe_overrides(device, overrides)
    if probe_overrides and resume:
        raise UserError(
            "--device and -p set a new sweep's probe; a resumed sweep keeps its own (sweep.json)."
        )
    if reruns is not None and resume:
        raise UserError(
            "--reruns sets a new sweep's reruns; a resumed sweep keeps its own (sweep.json)."
        )
    if resume and _already_complete(data_dir, resume, report):
        return
    # SIGTERM stops the sweep as Ctrl-C does, in one sentence
    signal.signal(signal.SIGTERM, common.stop_on_sigterm)
    try:
        try:
            outcome = _sweep(
                params_file,
                data_dir,
                workers,
                executor,
                prefetch,
                resume,
                report,
                probe_overrides,
                reruns,
            )
            if not outcome.finished:
                raise SystemExit(1)
        except KeyboardInterrupt:  # before the sweep was written: nothing to finish
            raise Interrupted(
                "The sweep was stopped before it started; nothing was written."
            ) from None
    except Interrupted as exc:
        if common.debug_asked():
            raise
        # Everything is stored and the probes are stopped; a download thread still reading from the
        # Hub (a library's worker thread, which Python joins at exit) must not keep the process
        # alive.
        click.echo(f"Error: {exc}", err=True)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)


def _already_complete(data_dir: Path, sweep_id: str, report: bool) -> bool:
    """``--resume`` of a sweep that finished (every model and variant has its record, its Parquet
    files hold them all and, with ``report``, its report is there): one line saying so, exit
    status 0, nothing rewritten. False when anything is left, a run or what a sweep stopped after
    its last record did not do (its compaction, its report): the resume does it, as before."""
    import pyarrow.parquet as pq

    from ..record import store
    from ..render.report import REPORTS
    from ..sweep import runner

    meta = store.read_sweep(data_dir, sweep_id)
    # a sweep still running is refused, as before
    with store.SweepLock(store.sweep_dir(data_dir, sweep_id)):
        if runner.tasks_to_run(data_dir, meta):
            return False
        stored = sum(1 for _ in store.iter_records(data_dir, sweep_id)) + len(meta.excluded or {})
        files = [
            store.parquet_file(data_dir, c, sweep_id)
            for c in ("results", "excluded", store.WHAT_IF_CONFIG)
        ]
        if sum(pq.read_metadata(f).num_rows for f in files if f.is_file()) != stored:
            return False
        if report and not (Path(data_dir) / REPORTS / f"{sweep_id}.html").is_file():
            return False
        # what a resume promises (docs/dataset.md)
        if moved := store.migrate_names(data_dir, sweep_id):
            click.echo(
                f"Sweep {sweep_id}: {moved} record(s) moved to their one-to-one file names.",
                err=True,
            )
    click.echo(  # the words of a resume's last line (``_sweep``), then why nothing ran
        f"sweep {sweep_id}: 0 probed now, {len(runner.build_tasks(meta))} models: the sweep is "
        "complete (every run has its record), nothing to resume and nothing rewritten; "
        f"`model-support report {sweep_id}` renders its report again."
    )
    return True


def _probe_overrides(device: str | None, given: tuple[str, ...]) -> dict:
    """``--device`` and each ``-p NAME=VALUE`` (the value read as YAML), checked against the
    probe's one declaration: every mistake at once, in one UserError."""
    import yaml

    from ..probe import probe_params

    settings: dict = {}
    malformed = []
    for item in given:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            malformed.append(f"-p {item!r} is not NAME=VALUE (e.g. -p max_new_tokens=32)")
            continue
        try:
            settings[name.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError:
            settings[name.strip()] = raw
    if device is not None:
        settings["device"] = device
    found = malformed + probe_params.problems(settings, "the command line", settable_only=True)
    if found:
        raise UserError(
            found[0] if len(found) == 1 else f"{len(found)} mistakes: " + "; ".join(found)
        )
    return settings


def _sweep(
    params_file,
    data_dir,
    workers,
    executor,
    prefetch,
    resume,
    report,
    probe_overrides=None,
    reruns=None,
):
    """``workflows.sweep`` with a progress bar on a terminal (in a log, nohup or CI, one plain
    line per model, no control codes) and its table 160 columns wide in a log; a
    ``workflows.SweepOutcome``."""
    from contextlib import contextmanager

    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from .. import workflows

    console = Console(stderr=True)
    warn = functools.partial(click.echo, err=True)
    columns = (
        TextColumn("[bold]sweep"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[verdicts]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )

    @contextmanager
    def bar():
        tally = workflows.Tally()
        with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
            task = progress.add_task("sweep", total=None, verdicts="")

            def on_result(record, done, total):
                verdicts = tally.add(record)
                progress.update(task, completed=done, total=total, verdicts=verdicts)
                if not console.is_terminal:
                    warn(workflows.Tally.line(record, done, total, verdicts))

            yield on_result

    return workflows.sweep(
        params_file,
        data_dir,
        workers=workers,
        executor=executor,
        prefetch=prefetch,
        resume=resume,
        report=report,
        overrides=probe_overrides,
        reruns=reruns,
        watch=bar,
        say=click.echo,
        warn=warn,
        debug=common.debug_asked(),
        console=Console() if sys.stdout.isatty() else Console(width=160),
    )


@click.command()
@click.argument("params_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@data_dir_option
@click.option(
    "--workers", type=click.IntRange(min=1), default=None, help="Parallel probes (default: params)."
)
@click.option(
    "--reruns",
    type=click.IntRange(min=0),
    default=None,
    help="Reruns of a changed verdict (default: params).",
)
@click.option(
    "--fail-on",
    default="regressions,new-failures",
    show_default=True,
    help="The gates that fail the night: regressions, new-failures, dropped, perf "
    "(comma-separated).",
)
@click.option(
    "--expect",
    type=click.Path(path_type=Path),
    default=None,
    help="Expected verdicts (YAML) over the definition's.",
)
@click.option(
    "--perf-threshold",
    default=None,
    help="With --fail-on perf: the slowdown that counts (default 5%).",
)
@click.option(
    "--across",
    default=None,
    metavar="LIST",
    help="The settings the night may differ from its baseline in (comma-separated: device, dtype); "
    "without it the gate refuses a baseline whose runs differ in either, or in mode (exit 2).",
)
@click.option(
    "--report/--no-report", default=True, show_default=True, help="Render the sweep's HTML report."
)
@click.option(
    "--bisect/--no-bisect",
    default=True,
    show_default=True,
    help="Bisect each failing model when the stacks differ.",
)
@click.option(
    "--find-links",
    type=click.Path(path_type=Path),
    default=None,
    help="The bisect's releases from this folder of wheels.",
)
@click.option(
    "--push",
    "push_to",
    default=None,
    metavar="REPO_ID",
    help="Push the dataset and logs to this Hub dataset repo.",
)
@user_errors
def nightly(
    params_file,
    data_dir,
    workers,
    reruns,
    fail_on,
    expect,
    perf_threshold,
    across,
    report,
    bisect,
    find_links,
    push_to,
):
    """The nightly: sweep PARAMS_FILE (flakes rerun), gate it against the last sweep of the same
    name and device, export JUnit and Markdown, bisect and draft a bug report per regression
    signature, push; exit 1 on a failed gate (docs/nightly.md)."""
    from .. import workflows

    def sweep_with(params_file, data_dir, **given):
        # once every argument is checked, as a sweep's
        signal.signal(signal.SIGTERM, common.stop_on_sigterm)
        return _sweep(
            params_file,
            data_dir,
            given["workers"],
            None,
            None,
            None,
            given["report"],
            None,
            given["reruns"],
        )

    raise SystemExit(
        workflows.nightly(
            params_file,
            data_dir,
            workers=workers,
            reruns=reruns,
            fail_on=fail_on,
            expect=expect,
            perf_threshold=perf_threshold,
            across=across,
            report=report,
            bisect=bisect,
            find_links=find_links,
            push_to=push_to,
            sweep_with=sweep_with,
            say=click.echo,
            warn=functools.partial(click.echo, err=True),
        )
    )
