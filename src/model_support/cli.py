"""``model-support``: each command is a few lines over a library call (as sqlite-utils does).

Bad input (any ``UserError``: a params file, a flag, an unknown sweep) ends in one sentence on stderr
and exit status 2, never a bare stack trace. ``--data-dir`` is one shared option, also read from
``$MODEL_SUPPORT_DATA_DIR``.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from pathlib import Path

import click

from .errors import Interrupted, StorageFull, UserError
from .paths import DATA_DIR_VAR

#: The commands that create the data folder when it is missing (a new sweep writes one); every other command, and
#: ``sweep --resume``, reads one.
CREATES_DATA_DIR = ("sweep", "nightly")


def _data_dir_words(ctx, data_dir: Path) -> str:
    """The data folder as the user gave it: ``--data-dir X``, ``$MODEL_SUPPORT_DATA_DIR (X)`` or the default."""
    from click.core import ParameterSource

    source = ctx.get_parameter_source("data_dir")
    if source == ParameterSource.ENVIRONMENT:
        return f"${DATA_DIR_VAR} ({data_dir})"
    if source == ParameterSource.DEFAULT:
        return f"the default data folder {data_dir} (in {Path.cwd()})"
    return f"--data-dir {data_dir}"


def _require_data_dir(kwargs: dict) -> None:
    """A data folder that does not exist, refused by every command that reads one (all but a new sweep:
    ``CREATES_DATA_DIR``) in one sentence naming where it came from, before the command runs; a command naming a
    sweep says that sweep does not exist, and why."""
    data_dir = kwargs.get("data_dir")
    ctx = click.get_current_context()
    if data_dir is None or Path(data_dir).exists():
        return
    if ctx.command.name in CREATES_DATA_DIR and not kwargs.get("resume"):
        return
    if ctx.command.name == "bisect" and kwargs.get("clean"):  # empties the environment cache: reads no data folder
        return
    named = _data_dir_words(ctx, Path(data_dir))
    sweep = next((kwargs[name] for name in SWEEP_ARGUMENTS if kwargs.get(name)), None)
    if sweep and (sweep == "latest" or sweep.startswith("latest:")):  # what the command was asked for, first
        named = f"There is no {sweep!r} sweep, since {named}"
    elif sweep:
        named = f"Sweep {sweep!r} does not exist, since {named}"
    raise UserError(
        f"{named} does not exist: give the data folder a sweep wrote (the one holding sweeps/), or run "
        "`model-support sweep` first, which creates it."
    )


def _finish_interrupted(ctx, param, data_dir: Path) -> Path:
    """Every command reading or writing the data folder first refuses one that is a file, then finishes a change of
    its dataset that a stopped process left half-done (``store.finish_interrupted``), one line each; a missing one is
    ``_require_data_dir``'s (it needs to know the command's arguments)."""
    from .record import store

    if data_dir is not None and not ctx.resilient_parsing and Path(data_dir).exists() and not Path(data_dir).is_dir():
        raise click.UsageError(
            f"{_data_dir_words(ctx, Path(data_dir))} is a file, not a folder: give the data folder, the one holding "
            "sweeps/ (e.g. --data-dir data).",
            ctx,
        )
    if data_dir is not None and (Path(data_dir) / "sweeps").is_dir() and store.interrupted(data_dir):
        try:
            for line in store.finish_interrupted(data_dir):
                click.echo(line, err=True)
        except (UserError, OSError) as exc:
            click.echo(f"Could not finish an interrupted change in {data_dir}: {exc}", err=True)
    return data_dir


def data_dir_option(command):
    """The shared ``--data-dir`` option."""
    return click.option(
        "--data-dir",
        type=click.Path(path_type=Path),
        envvar=DATA_DIR_VAR,
        default=Path("data"),
        show_default=True,
        show_envvar=True,
        callback=_finish_interrupted,
        help="Data folder (sweeps, Parquet dataset, reports).",
    )(command)


#: The arguments that name a sweep: each may be given as ``latest``, ``latest:NAME`` or a unique prefix.
SWEEP_ARGUMENTS = ("sweep_id", "sweep_a", "sweep_b", "resume", "baseline")


def _resolve_sweep_ids(kwargs: dict) -> None:
    """Each sweep argument as the id it means (``store.resolve_sweep_id``), in place."""
    if "data_dir" not in kwargs:
        return
    from .record import store

    for name in SWEEP_ARGUMENTS:
        if kwargs.get(name):
            kwargs[name] = store.resolve_sweep_id(kwargs["data_dir"], kwargs[name])


def user_errors(command):
    """A UserError becomes click's usage error (one sentence, exit status 2); a StorageFull (the data
    folder could not be written) or an Interrupted (a sweep stopped early) one sentence with exit status 1.
    ``--debug`` shows the traceback."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            _require_data_dir(kwargs)
            _resolve_sweep_ids(kwargs)
            return command(*args, **kwargs)
        except (UserError, StorageFull, Interrupted) as exc:
            if click.get_current_context().find_root().params.get("debug"):
                raise
            if isinstance(exc, (StorageFull, Interrupted)):
                raise click.ClickException(str(exc)) from None
            raise click.UsageError(str(exc)) from None

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show the traceback behind an error, not only its sentence.")
def main(debug):
    """Sweep Hugging Face models over an accelerator stack (TPU, CUDA, CPU) and report what runs."""


@main.command()
@click.argument("params_file", type=click.Path(path_type=Path), required=False)
@data_dir_option
@click.option(
    "--workers", type=click.IntRange(min=1), default=None, help="Probes at once (default: params, else one per device)."
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
    help="Finish an interrupted sweep (instead of PARAMS_FILE): run only models without a record; a complete one is "
    "said so and left as it is.",
)
@click.option(
    "--report/--no-report", default=True, show_default=True, help="Render the sweep's HTML report at the end."
)
@click.option(
    "--device", default=None, help="Probe on this device instead of the definition's (any device name, auto)."
)
@click.option(
    "-p",
    "--param",
    "overrides",
    multiple=True,
    metavar="NAME=VALUE",
    help="Set a probe parameter over the definition's (repeatable; a YAML value: 32, true, bfloat16).",
)
@click.option(
    "--reruns",
    type=click.IntRange(min=0),
    default=None,
    help="Rerun a verdict that differs from the baseline's up to N times before it counts (default: the "
    "definition's reruns, else 1; 0: none).",
)
@user_errors
def sweep(params_file, data_dir, workers, executor, prefetch, resume, report, device, overrides, reruns):
    """Run the probe notebook once per model of PARAMS_FILE (YAML) and publish the results."""
    if params_file is None and resume is None:
        raise UserError("Give a sweep definition such as params/smoke.yaml, or --resume SWEEP_ID.")
    if params_file is not None and resume is not None:
        raise UserError(
            f"Give {params_file} (a new sweep) or --resume {resume} (finish that sweep, which keeps its own definition "
            "in sweep.json), not both."
        )
    probe_overrides = _probe_overrides(device, overrides)
    if probe_overrides and resume:
        raise UserError("--device and -p set a new sweep's probe; a resumed sweep keeps its own (sweep.json).")
    if reruns is not None and resume:
        raise UserError("--reruns sets a new sweep's reruns; a resumed sweep keeps its own (sweep.json).")
    if resume and _already_complete(data_dir, resume, report):
        return
    signal.signal(signal.SIGTERM, _stop_on_sigterm)  # SIGTERM stops the sweep as Ctrl-C does, in one sentence
    try:
        try:
            outcome = _sweep(
                params_file, data_dir, workers, executor, prefetch, resume, report, probe_overrides, reruns
            )
            if not outcome.finished:
                raise SystemExit(1)
        except KeyboardInterrupt:  # before the sweep was written: nothing to finish
            raise Interrupted("The sweep was stopped before it started; nothing was written.") from None
    except Interrupted as exc:
        if click.get_current_context().find_root().params.get("debug"):
            raise
        # Everything is stored and the probes are stopped; a download thread still reading from the Hub
        # (a library's worker thread, which Python joins at exit) must not keep the process alive.
        click.echo(f"Error: {exc}", err=True)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)


def _already_complete(data_dir: Path, sweep_id: str, report: bool) -> bool:
    """``--resume`` of a sweep that finished (every model and variant has its record, its Parquet files hold them all
    and, with ``report``, its report is there): one line saying so, exit status 0, nothing rewritten. False when
    anything is left, a run or what a sweep stopped after its last record did not do (its compaction, its report):
    the resume does it, as before."""
    import pyarrow.parquet as pq

    from .record import store
    from .render.report import REPORTS
    from .sweep import runner

    meta = store.read_sweep(data_dir, sweep_id)
    with store.SweepLock(store.sweep_dir(data_dir, sweep_id)):  # a sweep still running is refused, as before
        if runner.tasks_to_run(data_dir, meta):
            return False
        stored = sum(1 for _ in store.iter_records(data_dir, sweep_id)) + len(meta.excluded or {})
        files = [store.parquet_file(data_dir, c, sweep_id) for c in ("results", "excluded", store.WHAT_IF_CONFIG)]
        if sum(pq.read_metadata(f).num_rows for f in files if f.is_file()) != stored:
            return False
        if report and not (Path(data_dir) / REPORTS / f"{sweep_id}.html").is_file():
            return False
        if moved := store.migrate_names(data_dir, sweep_id):  # what a resume promises (docs/dataset.md)
            click.echo(f"Sweep {sweep_id}: {moved} record(s) moved to their one-to-one file names.", err=True)
    click.echo(  # the words of a resume's last line (``_sweep``), then why nothing ran
        f"sweep {sweep_id}: 0 probed now, {len(runner.build_tasks(meta))} models: the sweep is complete (every run has "
        f"its record), nothing to resume and nothing rewritten; `model-support report {sweep_id}` renders its report "
        "again."
    )
    return True


def _probe_overrides(device: str | None, given: tuple[str, ...]) -> dict:
    """``--device`` and each ``-p NAME=VALUE`` (the value read as YAML), checked against the probe's one
    declaration: every mistake at once, in one UserError."""
    import yaml

    from .probe import probe_params

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
        raise UserError(found[0] if len(found) == 1 else f"{len(found)} mistakes: " + "; ".join(found))
    return settings


def _stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt


def _sweep(params_file, data_dir, workers, executor, prefetch, resume, report, probe_overrides=None, reruns=None):
    """``workflows.sweep`` with a progress bar on a terminal (in a log, nohup or CI, one plain line per model, no
    control codes) and its table 160 columns wide in a log; a ``workflows.SweepOutcome``."""
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

    from . import workflows

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
        debug=bool(click.get_current_context().find_root().params.get("debug")),
        console=Console() if sys.stdout.isatty() else Console(width=160),
    )


@main.command()
@click.argument("params_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@data_dir_option
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Parallel probes (default: params).")
@click.option(
    "--reruns", type=click.IntRange(min=0), default=None, help="Reruns of a changed verdict (default: params)."
)
@click.option(
    "--fail-on",
    default="regressions,new-failures",
    show_default=True,
    help="The gates that fail the night: regressions, new-failures, dropped, perf (comma-separated).",
)
@click.option(
    "--expect", type=click.Path(path_type=Path), default=None, help="Expected verdicts (YAML) over the definition's."
)
@click.option("--perf-threshold", default=None, help="With --fail-on perf: the slowdown that counts (default 5%).")
@click.option(
    "--across",
    default=None,
    metavar="LIST",
    help="The settings the night may differ from its baseline in (comma-separated: device, dtype); without it "
    "the gate refuses a baseline whose runs differ in either, or in mode (exit 2).",
)
@click.option("--report/--no-report", default=True, show_default=True, help="Render the sweep's HTML report.")
@click.option(
    "--bisect/--no-bisect", default=True, show_default=True, help="Bisect each failing model when the stacks differ."
)
@click.option(
    "--find-links",
    type=click.Path(path_type=Path),
    default=None,
    help="The bisect's releases from this folder of wheels.",
)
@click.option(
    "--push", "push_to", default=None, metavar="REPO_ID", help="Push the dataset and logs to this Hub dataset repo."
)
@user_errors
def nightly(
    params_file, data_dir, workers, reruns, fail_on, expect, perf_threshold, across, report, bisect, find_links, push_to
):
    """The nightly: sweep PARAMS_FILE (flakes rerun), gate it against the last sweep of the same name and device,
    export JUnit and Markdown, bisect and draft a bug report per regression signature, push; exit 1 on a failed
    gate (docs/nightly.md)."""
    from . import workflows

    def sweep_with(params_file, data_dir, **given):
        signal.signal(signal.SIGTERM, _stop_on_sigterm)  # once every argument is checked, as a sweep's
        return _sweep(params_file, data_dir, given["workers"], None, None, None, given["report"], None, given["reruns"])

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


@main.command()
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
    from .workflows import render_report

    render_report(data_dir, sweep_id, baseline, say=click.echo)


@main.command()
@click.argument("sweep_a")
@click.argument("sweep_b")
@click.option(
    "--fail-on",
    "fail_on",
    default=None,
    metavar="LIST",
    help="Exit 1 on these (comma-separated): regressions (passed in A, not now; also a run vanished from B), "
    "new-failures (also models new in B), dropped (a run B's definition left out), perf (TPOT, TTFT or tokens/s "
    "worse beyond --perf-threshold and beyond the repeats' noise). A B with runs still to run fails any of them.",
)
@click.option(
    "--perf-threshold",
    "perf_threshold",
    default=None,
    metavar="PCT",
    help="With --fail-on perf: how much worse a median must be to count (default 5%; it must also move by more than "
    "4 times the medians' standard error, from the repeats).",
)
@click.option(
    "--expect",
    "expect_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Expected verdicts (YAML: MODEL: {verdict, reason, until}): known failures do not fail the gate.",
)
@click.option(
    "--across",
    "across",
    default=None,
    metavar="LIST",
    help="With --fail-on: the settings the two sweeps may differ in (comma-separated: device, dtype); without it "
    "the gate refuses sweeps whose runs differ in either; another mode (the variant names it) always.",
)
@data_dir_option
@user_errors
def diff(sweep_a, sweep_b, data_dir, fail_on, perf_threshold, expect_file, across):
    """What broke and what got fixed between SWEEP_A (before) and SWEEP_B (after); with --fail-on, a gate: one
    line per regression, exit status 1 when there is one (expected failures, --expect, do not count). The gate
    compares like with like: sweeps of another device, dtype or mode are refused (exit 2) unless --across names it."""
    from .analysis import gate as gate_mod
    from .analysis.perf import parse_threshold
    from .ops.changes import changes_text, stack_changes
    from .render.terminal import format_diff

    gates = [g.strip() for g in (fail_on or "").split(",") if g.strip()]
    if perf_threshold is not None and "perf" not in gates:
        raise UserError("--perf-threshold applies to --fail-on perf; add perf to --fail-on or drop it.")
    if across is not None and not gates:
        raise UserError("--across applies to --fail-on; add the gates to --fail-on or drop it.")
    allowed = gate_mod.check_across(across or "")
    threshold = parse_threshold(perf_threshold)
    expectations = gate_mod.load_expectations(expect_file) if expect_file else _recorded_expectations(data_dir, sweep_b)
    result = (
        gate_mod.gate(data_dir, sweep_a, sweep_b, gates, expectations, perf_threshold=threshold, across=allowed)
        if gates or expectations
        else None
    )
    click.echo(format_diff(data_dir, sweep_a, sweep_b))
    gained_or_lost = changes_text(stack_changes(data_dir, sweep_a, sweep_b))  # from the census (docs/ops.md)
    if gained_or_lost:
        click.echo(gained_or_lost)
    if result is None:
        return
    for line in result.known:
        click.echo(f"known failure: {line}")
    for line in result.notes:
        click.echo(line)
    for line in result.failing:
        click.echo(line)
    if gates:
        click.echo(f"gate ({', '.join(gates)}): {result.summary()}")
    if result.failed:
        raise SystemExit(1)


def _recorded_expectations(data_dir: Path, sweep_id: str) -> dict | None:
    """The expectations sweep ``sweep_id``'s definition named (sweep.json's ``expect``), when its folder is here."""
    from .analysis import expectations
    from .record import store

    if not (store.sweep_dir(data_dir, sweep_id) / "sweep.json").is_file():
        return None
    return expectations.from_meta(store.read_sweep(data_dir, sweep_id).expect) or None


@main.command()
@click.argument("sweep_id")
@click.option(
    "--on",
    "on",
    default=None,
    metavar="DEVICE",
    help="Predict on this machine's DEVICE stack (cpu, cuda, tpu, ...) instead of the sweep's own.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan and the predictions as JSON.")
@click.option(
    "--prove",
    is_flag=True,
    help="Run each step's operators (cumulatively) on the host over the models it unlocks (what-if sweeps), and "
    "say whether running confirms it.",
)
@click.option(
    "--complete",
    is_flag=True,
    help="First run the models a missing operator stopped with every missing operator on the host "
    "(host_ops: missing), so their census lists everything the stack lacks.",
)
@click.option(
    "--workers", type=click.IntRange(min=1), default=None, help="What-if probes at once (default: the sweep's)."
)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default=None,
    help="Where what-if probes run (default: the sweep's).",
)
@data_dir_option
@user_errors
def ops(sweep_id, on, as_json, prove, complete, workers, executor, data_dir):
    """The operators SWEEP_ID's models need: each model's verdict predicted from the census alone (no model
    runs), and the porting plan (missing operators, the one that unlocks the most models first); with --prove,
    each step run with its operators on the host (docs/ops.md). A what-if sweep has no plan of its own: one sentence
    says what it is and where its answers are (--json: that sentence in an object), exit status 0."""
    import json

    from . import analysis
    from . import ops as ops_mod
    from .ops.plan import plan_json, step_proofs
    from .ops.prove import last_proof, what_if_words
    from .record import store
    from .render.ops import ops_text

    sweeps = analysis.sweep_index(Path(data_dir), cache_dir=Path(data_dir) / analysis.SWEEP_CACHE)
    analysis.require_sweep(sweeps, sweep_id)  # an unknown sweep: one sentence, with the known ones
    host_ops = store.what_if_setting(Path(data_dir), sweep_id)
    if host_ops:  # no plan of its own: what it is and where its answers are, said (a refusal only of --prove)
        said = what_if_words(Path(data_dir), sweep_id, host_ops)
        if prove or complete:
            raise UserError(f"{said['said'].rstrip('.')}; --prove and --complete run a plan of the stack's sweep.")
        click.echo(json.dumps(said, indent=1) if as_json else said["said"])
        return
    if (prove or complete) and on:
        raise UserError("--prove and --complete run the sweep's own stack; --on predicts another one: use one of them.")
    if prove or complete:  # each step said as it ends (on stderr with --json: it prints JSON alone)
        from .workflows import what_if

        what_if(
            data_dir,
            sweep_id,
            prove=prove,
            complete=complete,
            workers=workers,
            executor=executor,
            say=functools.partial(click.echo, err=as_json),
        )
    models = ops_mod.sweep_models(data_dir, sweep_id)
    coverage = ops_mod.stack_coverage(on, ops_mod.coverage.census_ops(models)) if on else None
    ops_mod.predict(models, coverage)
    steps = ops_mod.porting_plan(models)
    proofs = None if on else step_proofs(models, steps, ops_mod.proof.read(data_dir, sweep_id).get("unhostable") or {})
    configured = None
    if on:  # the stack predicted for is the backend as configured here: part of the answer
        from .probe.devices.registry import adapter_class

        configured = adapter_class(on).configuration()
    proven = [] if on else last_proof(data_dir, sweep_id, models, steps)
    if as_json:
        answer = {**plan_json(models, steps, proofs), "on": on, "configuration": configured, "proof": proven}
        click.echo(json.dumps(answer, indent=1))
    else:
        click.echo(ops_text(models, steps, on, proofs=proofs, proven=proven))
        if on:
            said = "; ".join(f"{k}={v!r}" for k, v in configured.items()) if configured else "none set"
            click.echo(f"predicted for {on} as this environment configures its backend: {said}")


@main.command()
@click.argument("sweep_id")
@data_dir_option
@user_errors
def aggregate(sweep_id, data_dir):
    """Compact SWEEP_ID's records into its Parquet files (what aggregate.ipynb does)."""
    from .record import store

    results, excluded = store.compact(data_dir, sweep_id)
    click.echo(f"{sweep_id}: {results} result rows, {excluded} excluded rows")


@main.command()
@click.argument("sweep_id")
@click.option("--reason", required=True, help="Why the whole sweep is excluded (e.g. a broken stack).")
@data_dir_option
@user_errors
def exclude(sweep_id, reason, data_dir):
    """Move a whole sweep to the excluded config (never counted as failure); no row is lost."""
    from .record import store

    results, excluded = store.set_exclusion(data_dir, sweep_id, reason)
    click.echo(f"{sweep_id}: excluded ({excluded} excluded rows, {results} result rows)")


@main.command()
@click.argument("sweep_id")
@data_dir_option
@user_errors
def include(sweep_id, data_dir):
    """Undo ``exclude``: move a whole sweep back to the results config."""
    from .record import store

    results, excluded = store.set_exclusion(data_dir, sweep_id, None)
    click.echo(f"{sweep_id}: included ({results} result rows, {excluded} excluded rows)")


@main.command()
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
    "--suspect-fails", is_flag=True, help="JUnit: a suspect PASS is a failing case (else a passing one saying so)."
)
@data_dir_option
@user_errors
def export(sweep_id, fmt, suspect_fails, data_dir):
    """SWEEP_ID's support matrix from the dataset alone: one row per model and variant, its verdict, whether a
    PASS is right, tokens/s, the stack, its record and repro."""
    from .render.exports import export as export_sweep

    if suspect_fails and fmt != "junit":
        raise UserError(
            f"--suspect-fails applies to --format junit (a suspect PASS as a failing case); the {fmt} export already "
            "says which PASSes are suspect (its check column): drop --suspect-fails or use --format junit."
        )
    click.echo(export_sweep(data_dir, sweep_id, fmt, suspect_fails), nl=False)  # `> file`: a CI's artifact


@main.command()
@click.argument("model")
@click.option("--json", "as_json", is_flag=True, help="Print the card as JSON, one object per stack and variant.")
@data_dir_option
@user_errors
def support(model, as_json, data_dir):
    """MODEL's support card from the dataset alone (id or unique fragment, as debug takes it): per stack (its packages,
    the device backend as its adapter declares it, and the backend's settings) and variant its latest verdict, whether
    that PASS is right, when last verified, how many sweeps agree, and the evidence (also `model_support.support()`)."""
    import json

    from .analysis.support import model_ids
    from .analysis.support import support as card
    from .probe.model_ids import resolve

    cards = card(resolve(model_ids(data_dir), model, f"the dataset in {data_dir}"), data_dir)
    if as_json:
        click.echo(json.dumps(cards, indent=1))
        return
    for c in cards:
        stack = [f"torch {c['torch']}" if c["torch"] else "", c["backend"] or ""]  # the backend: as its adapter says
        stack += [f"transformers {c['transformers']}" if c["transformers"] else ""]
        stack += [f"{name}={value}" for name, value in c["backend_settings"].items()]  # its settings
        verdict = f"{c['verdict']}{' (suspect: ' + c['check'] + ')' if c['suspect'] else ''}"
        if c.get("check_measure"):  # which agreement measure judged it (probe.agreement.MEASURES)
            verdict += f" [judged by {c['check_measure']}]"
        click.echo(
            f"{c['device_type']}{' stack ' + c['stack_name'] if c['stack_name'] else ''} [{c['variant']}] "
            f"{', '.join(part for part in stack if part)}: {verdict}, last verified {c['last_verified']} in "
            f"{c['sweep_id']} ({c['agreeing']} of {c['sweeps']} sweeps agree)"
            + (f"; repro {c['repro']}" if c["repro"] else "")
            + (f"; {c['failure_signature']}" if c["failure_signature"] else "")
        )


@main.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per sweep.")
@data_dir_option
@user_errors
def list_(as_json, data_dir):
    """The sweeps of the data folder, newest first: name, device, models, verdict counts, whether complete. A what-if
    sweep (operators on the host) shows its own runs' counts, labelled what-if, right after the sweep it proves.
    Any command taking a sweep id also takes `latest`, `latest:NAME` (never a what-if sweep) or a unique prefix."""
    import json

    from .render.terminal import sweep_list_rows, sweep_list_table

    rows = sweep_list_rows(data_dir)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
    elif not rows:
        click.echo(f"No sweeps under {data_dir}/sweeps yet; `make sweep` runs the default one.")
    else:
        from rich.console import Console

        sweep_list_table(rows, Console() if sys.stdout.isatty() else Console(width=160))


def sweep_model(data_dir: Path, sweep_id: str, model: str) -> str:
    """The model id of sweep ``sweep_id`` that MODEL names (``model_ids.resolve``: an exact name wins over
    fragments), for debug, repro and localise; one sentence when it names none or several."""
    from .probe.model_ids import resolve
    from .record import store

    if not (store.sweep_dir(data_dir, sweep_id) / "sweep.json").exists():  # a dataset pulled without sweeps/
        ids = store.model_ids_of_rows(data_dir, sweep_id)
        if ids:
            return resolve(ids, model, f"sweep {sweep_id}")
    meta = store.read_sweep(data_dir, sweep_id)
    return resolve([entry.model_id for entry in meta.models], model, f"sweep {meta.sweep_id}")


def sweep_model_arguments(variant_help: str):
    """SWEEP_ID MODEL, --data-dir and --variant: a command about one row of a sweep (debug, repro)."""

    def apply(command):
        for decorate in reversed(
            (
                click.argument("sweep_id"),
                click.argument("model"),
                data_dir_option,
                click.option("--variant", default=None, metavar="VARIANT", help=variant_help),
            )
        ):
            command = decorate(command)
        return command

    return apply


@main.command()
@sweep_model_arguments("Debug in a variant's settings (e.g. compile+static): mode, cache and token count.")
@click.option(
    "-p",
    "--parameter",
    "parameters",
    type=(str, str),
    multiple=True,
    metavar="NAME VALUE",
    help="Override a debug notebook parameter (e.g. -p device cpu, -p tolerance 0.5, -p host_ops aten::rsqrt).",
)
@user_errors
def debug(sweep_id, model, data_dir, variant, parameters):
    """Execute notebooks/debug.ipynb for MODEL (id or unique fragment) with SWEEP_ID's settings.

    Prints the executed notebook's path: open it in JupyterLab (make lab) to see where the model
    breaks (first failing module, generation step) and where it diverges from the CPU reference.
    A what-if sweep's host_ops (operators on the host's CPU kernels) hold in the notebook too, and are said.
    """
    import papermill
    import yaml

    from . import debug as debug_mod

    # 0.5 -> float, as papermill's -y; an empty value stays empty (-p host_ops '': the stack as it is)
    overrides = {name: yaml.safe_load(value) if value.strip() else value for name, value in parameters}
    model = sweep_model(data_dir, sweep_id, model)  # an exact name wins over fragments
    run = debug_mod.prepare_debug(data_dir, sweep_id, model, parameters=overrides, variant=variant)
    if run.stack_note:  # the notebook runs on the stack here: say so before it runs
        click.echo(run.stack_note)
    if run.host_note:  # a what-if run (host_ops), or a what-if sweep's model debugged without its operators on the host
        click.echo(run.host_note)
    try:
        path = debug_mod.execute_debug(run)
    except papermill.PapermillExecutionError as exc:
        said = next((line.strip() for line in str(exc.evalue).splitlines() if line.strip()), "")
        click.echo(f"debug notebook stopped at a cell error: {exc.ename}" + (f": {said}" if said else ""))
        click.echo(f"debug notebook: {run.out}")
        raise SystemExit(1) from None
    click.echo(f"debug notebook: {path}")
    result = debug_mod.debug_result_from_notebook(path)
    click.echo(debug_mod.summary_text(result))
    if debug_mod.hosting.sentence(result):  # the conclusion above is a what-if run's: said where it is read
        click.echo(f"host ops:   {debug_mod.hosting.sentence(result)}")
    if run.stack_note:  # the conclusion above is this stack's: said again where it is read
        click.echo(f"stack:      this environment's, not the one sweep {sweep_id} ran on (see the first line)")


@main.command()
@sweep_model_arguments("The row of a variant of the sweep's matrix (e.g. compile+static).")
@user_errors
def repro(sweep_id, model, data_dir, variant):
    """Print the standalone script that reproduces MODEL's probe (id or unique fragment) in SWEEP_ID.

    It runs with plain python (`model-support repro S M > run.py; python run.py`), imports nothing of
    this package, and prints the probe's verdict and token ids as one JSON line.
    """
    from .probe import probe_params
    from .probe import repro as repro_mod

    if variant is not None:
        variant = probe_params.variant(probe_params.parse_variant(variant))
    model_id = sweep_model(data_dir, sweep_id, model)
    click.echo(repro_mod.script_for(data_dir, sweep_id, model_id, variant), nl=False)


@main.command()
@sweep_model_arguments("Localise the row of a variant of the sweep's matrix (a compiled one runs eagerly).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (operator null when none is wrong).")
@user_errors
def localise(sweep_id, model, data_dir, variant, as_json):
    """Name the first aten operator whose output on SWEEP_ID's device is wrong for MODEL (id or unique fragment).

    The run is replayed on the device (this environment's stack): the prompt's forward, then the record's own
    tokens one decode step at a time through the KV cache, up to where the run first went wrong (or the long
    text's first disagreement); each operator is replayed on the CPU from the device's own inputs, and the first
    wrong one is stored beside the record (sweeps/<id>/localised/) with a one-operator script that exits 1 while
    the stack gets it wrong. Then the run goes again with it on the host, judged as `ops --prove` judges:
    confirmed when its output then matches the CPU reference, else the next wrong operator joins it (up to 3).
    """
    import json

    from .debug import localise as localise_mod

    result = localise_mod.localise(data_dir, sweep_id, sweep_model(data_dir, sweep_id, model), variant)
    if as_json:
        click.echo(json.dumps(result))
        return
    for line in localise_mod.answer_lines(result):
        click.echo(line)


@main.command()
@click.argument("text", required=False)
@click.option("--prompt", default="", help="The prompt TEXT answers (the judge scores TEXT given it).")
@click.option(
    "--jsonl",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    metavar="FILE",
    help='Score every line {"prompt": ..., "text": ...} of FILE instead of TEXT.',
)
@click.option(
    "--judge-model",
    default="",
    metavar="MODEL",
    help="Folder or Hub id of the judge (default: data/models/SmolLM2-135M-Instruct when built, else its Hub id).",
)
@user_errors
def judge(text, prompt, jsonl, judge_model):
    """Score TEXT (or each line of --jsonl FILE) for fluency with the probe's judge: one JSON line each, with
    fluent, fluency_score (mean log-probability per token, nats), repeated (share of repeated tokens) and note.
    The judge model loads once."""
    import json

    from .probe import judge as judge_mod

    if (text is None) == (jsonl is None):
        raise UserError("Give either TEXT or --jsonl FILE, not both (model-support judge --prompt P TEXT).")
    if jsonl is not None and prompt:
        raise UserError('--prompt goes with TEXT; in --jsonl FILE each line carries its own "prompt".')
    items = judge_mod.read_jsonl(jsonl) if jsonl is not None else [{"prompt": prompt, "text": text}]
    scorer = judge_mod.load_for_command(judge_model)
    for item in items:
        found = scorer.score(item.get("prompt", ""), item["text"])
        click.echo(json.dumps({key: found[key] for key in judge_mod.SCORE_KEYS}))


@main.command()
@click.argument("first", required=False)
@click.argument("second", required=False)
@click.option(
    "--model",
    "models",
    multiple=True,
    metavar="MODEL",
    help="Bisect this model (repeatable; default: every model whose verdict differs).",
)
@click.option("--package", default=None, metavar="NAME", help="Single-record form: SWEEP MODEL over NAME's releases.")
@click.option(
    "--from", "from_version", default=None, metavar="VERSION", help="With --package: the version to start at."
)
@click.option(
    "--to", "to_version", default=None, metavar="VERSION", help="With --package: the end (default: the sweep's)."
)
@click.option(
    "--find-links",
    type=click.Path(path_type=Path),
    default=None,
    metavar="DIR",
    help="Take releases from this folder of wheels (nightlies, a vendor's builds), not the index.",
)
@click.option("--pre", is_flag=True, help="Include pre-releases.")
@click.option("--yanked", is_flag=True, help="Include yanked releases.")
@click.option(
    "--cache-dir",
    type=click.Path(path_type=Path),
    default=None,
    metavar="DIR",
    help="Where overlay environments are kept (default: $MODEL_SUPPORT_BISECT_CACHE, else DATA_DIR/bisect-envs).",
)
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="Models bisected at once (default: up to 4).")
@click.option(
    "--metric",
    type=click.Choice(["tpot", "ttft", "tokens_per_s"]),
    default=None,
    help="Bisect a slowdown, not a verdict: the rows whose metric got slower beyond --perf-threshold and noise "
    "(the perf gate's rule), each step timed by the repro script (best with --jobs 1: steps at once share the host).",
)
@click.option(
    "--perf-threshold",
    "perf_threshold",
    default=None,
    metavar="PCT",
    help="With --metric: how much worse a median must be to count as slower (default 5%; beyond the repeats' noise "
    "too, as the gate's rule).",
)
@click.option("--clean", is_flag=True, help="Remove the cached overlay environments afterwards (alone: only that).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per model.")
@data_dir_option
@user_errors
def bisect(
    first,
    second,
    models,
    package,
    from_version,
    to_version,
    find_links,
    pre,
    yanked,
    cache_dir,
    jobs,
    metric,
    perf_threshold,
    clean,
    as_json,
    data_dir,
):
    """Which package and release changed a model's verdict between sweeps FIRST (A) and SECOND (B); or, with
    --package NAME --from VERSION, one model's record (FIRST=SWEEP SECOND=MODEL) over NAME's releases
    (docs/bisect.md); with --metric, which slowed it. Answers are stored beside B's sweep.json (bisect.json)."""
    import json

    from .analysis import perf
    from .bisect import run as bisect_run
    from .bisect.search import answer_line
    from .record import store

    log = None if as_json else (lambda line: click.echo(line, err=True))
    answers: list = []
    if perf_threshold is not None and metric is None:
        raise UserError("--perf-threshold applies to --metric; add --metric tpot (or ttft, tokens_per_s) or drop it.")
    if metric and package:
        raise UserError("--metric bisects two sweeps (model-support bisect A B --metric tpot), not --package's form.")
    threshold = perf.parse_threshold(perf_threshold)
    if first is None or second is None:
        if not clean:
            raise UserError("Give two sweeps (model-support bisect A B), or SWEEP MODEL --package NAME --from VERSION.")
    elif package:
        if not from_version:
            raise UserError("--package needs --from VERSION (the version whose verdict you expect back).")
        first = store.resolve_sweep_id(data_dir, first)  # as users give it (latest, a prefix)
        answers = bisect_run.bisect_record(
            data_dir,
            first,
            second,
            package=package,
            from_version=from_version,
            to_version=to_version,
            find_links=find_links,
            cache=cache_dir,
            pre=pre,
            yanked=yanked,
            log=log,
        )
    else:
        if from_version or to_version:
            raise UserError("--from and --to go with --package NAME (the single-record form).")
        first, second = store.resolve_sweep_id(data_dir, first), store.resolve_sweep_id(data_dir, second)
        answers = bisect_run.bisect_sweeps(
            data_dir,
            first,
            second,
            models=models,
            find_links=find_links,
            cache=cache_dir,
            pre=pre,
            yanked=yanked,
            jobs=jobs,
            log=log,
            metric=perf.METRIC_NAMES[metric] if metric else None,
            threshold=threshold,
        )
    if as_json:
        click.echo(json.dumps(answers, indent=1))
    elif first and second:
        for answer in answers:
            click.echo(answer_line(answer))
        if not answers and metric:
            click.echo(f"No model's {metric} got slower beyond {threshold:.0%} and noise between {first} and {second}.")
        elif not answers:
            click.echo(f"No model's verdict differs between {first} and {second}.")
    if clean:
        folder = bisect_run.clean(data_dir, cache_dir)
        click.echo(f"removed the overlay environments in {folder}", err=True)


@main.command()
@click.argument("repo_id")
@data_dir_option
@click.option(
    "--private/--public", default=True, show_default=True, help="Visibility of a repo (or bucket) the push creates."
)
@click.option("--logs", is_flag=True, help="Also publish each sweep's executed notebooks, logs and sweep.json.")
@click.option(
    "--logs-bucket",
    default=None,
    metavar="NAMESPACE/NAME",
    help="Publish the logs into this Hub bucket (hf://buckets/NAMESPACE/NAME) instead of the repo; implies --logs.",
)
@user_errors
def push(repo_id, data_dir, private, logs, logs_bucket):
    """Publish the dataset to the Hub dataset repo REPO_ID: card, results, excluded, the latest report (and the
    raw logs); only what the repo lacks, in one commit (needs network and a write token in HF_TOKEN)."""
    from . import publish

    result = publish.push(
        data_dir,
        repo_id,
        private=private,
        logs=logs,
        logs_bucket=logs_bucket,
        log=lambda line: click.echo(line, err=True),
    )
    click.echo(result.summary())


if __name__ == "__main__":
    main()
