"""Comparing sweeps: diff (and its gate) and bisect."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import UserError
from .common import data_dir_option, user_errors


@click.command()
@click.argument("sweep_a")
@click.argument("sweep_b")
@click.option(
    "--fail-on",
    "fail_on",
    default=None,
    metavar="LIST",
    help="Exit 1 on these (comma-separated): regressions (passed in A, not now; also a run "
    "vanished from B), new-failures (also models new in B), dropped (a run B's definition "
    "left out), perf (TPOT, TTFT or tokens/s worse beyond --perf-threshold and beyond the "
    "repeats' noise). A B with runs still to run fails any of them.",
)
@click.option(
    "--perf-threshold",
    "perf_threshold",
    default=None,
    metavar="PCT",
    help="With --fail-on perf: how much worse a median must be to count (default 5%; it must also "
    "move by more than 4 times the medians' standard error, from the repeats).",
)
@click.option(
    "--expect",
    "expect_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Expected verdicts (YAML: MODEL: {verdict, reason, until}): known failures do not fail "
    "the gate.",
)
@click.option(
    "--across",
    "across",
    default=None,
    metavar="LIST",
    help="With --fail-on: the settings the two sweeps may differ in (comma-separated: device, "
    "dtype); without it the gate refuses sweeps whose runs differ in either; another mode "
    "(the variant names it) always.",
)
@data_dir_option
@user_errors
def diff(sweep_a, sweep_b, data_dir, fail_on, perf_threshold, expect_file, across):
    """What broke and what got fixed between SWEEP_A (before) and SWEEP_B (after); with
    --fail-on, a gate: one line per regression, exit status 1 when there is one (expected
    failures, --expect, do not count). The gate compares like with like: sweeps of another
    device, dtype or mode are refused (exit 2) unless --across names it."""
    from ..analysis import gate as gate_mod
    from ..analysis.perf import parse_threshold
    from ..ops.changes import changes_text, stack_changes
    from ..render.terminal import format_diff

    gates = [g.strip() for g in (fail_on or "").split(",") if g.strip()]
    if perf_threshold is not None and "perf" not in gates:
        raise UserError(
            "--perf-threshold applies to --fail-on perf; add perf to --fail-on or drop it."
        )
    if across is not None and not gates:
        raise UserError("--across applies to --fail-on; add the gates to --fail-on or drop it.")
    allowed = gate_mod.check_across(across or "")
    threshold = parse_threshold(perf_threshold)
    expectations = (
        gate_mod.load_expectations(expect_file)
        if expect_file
        else _recorded_expectations(data_dir, sweep_b)
    )
    result = (
        gate_mod.gate(
            data_dir,
            sweep_a,
            sweep_b,
            gates,
            expectations,
            perf_threshold=threshold,
            across=allowed,
        )
        if gates or expectations
        else None
    )
    click.echo(format_diff(data_dir, sweep_a, sweep_b))
    # from the census (docs/ops.md)
    gained_or_lost = changes_text(stack_changes(data_dir, sweep_a, sweep_b))
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
    """The expectations sweep ``sweep_id``'s definition named (sweep.json's ``expect``), when its
    folder is here."""
    from ..analysis import expectations
    from ..record import store

    if not (store.sweep_dir(data_dir, sweep_id) / "sweep.json").is_file():
        return None
    return expectations.from_meta(store.read_sweep(data_dir, sweep_id).expect) or None


@click.command()
@click.argument("first", required=False)
@click.argument("second", required=False)
@click.option(
    "--model",
    "models",
    multiple=True,
    metavar="MODEL",
    help="Bisect this model (repeatable; default: every model whose verdict differs).",
)
@click.option(
    "--package",
    default=None,
    metavar="NAME",
    help="Single-record form: SWEEP MODEL over NAME's releases.",
)
@click.option(
    "--from",
    "from_version",
    default=None,
    metavar="VERSION",
    help="With --package: the version to start at.",
)
@click.option(
    "--to",
    "to_version",
    default=None,
    metavar="VERSION",
    help="With --package: the end (default: the sweep's).",
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
    help="Where overlay environments are kept (default: $MODEL_SUPPORT_BISECT_CACHE, else "
    "DATA_DIR/bisect-envs).",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=None,
    help="Models bisected at once (default: up to 4).",
)
@click.option(
    "--metric",
    type=click.Choice(["tpot", "ttft", "tokens_per_s"]),
    default=None,
    help="Bisect a slowdown, not a verdict: the rows whose metric got slower beyond "
    "--perf-threshold and noise (the perf gate's rule), each step timed by the repro script "
    "(best with --jobs 1: steps at once share the host).",
)
@click.option(
    "--perf-threshold",
    "perf_threshold",
    default=None,
    metavar="PCT",
    help="With --metric: how much worse a median must be to count as slower (default 5%; beyond "
    "the repeats' noise too, as the gate's rule).",
)
@click.option(
    "--clean",
    is_flag=True,
    help="Remove the cached overlay environments afterwards (alone: only that).",
)
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
    """Which package and release changed a model's verdict between sweeps FIRST (A) and SECOND
    (B); or, with --package NAME --from VERSION, one model's record (FIRST=SWEEP SECOND=MODEL)
    over NAME's releases (docs/bisect.md); with --metric, which slowed it. Answers are stored
    beside B's sweep.json (bisect.json)."""
    import json

    from ..bisect import forms
    from ..bisect.answers import answer_line

    threshold = _bisect_flags(
        first, second, package, from_version, to_version, metric, perf_threshold, clean
    )
    log = None if as_json else (lambda line: click.echo(line, err=True))
    releases = {
        "find_links": find_links,
        "cache": cache_dir,
        "pre": pre,
        "yanked": yanked,
        "log": log,
    }
    answers: list = []
    if first is not None and second is not None and package:
        first = _sweep_id(data_dir, first)  # as users give it (latest, a prefix)
        answers = forms.bisect_record(
            data_dir,
            first,
            second,
            package=package,
            from_version=from_version,
            to_version=to_version,
            **releases,
        )
    elif first is not None and second is not None:
        first, second = _sweep_id(data_dir, first), _sweep_id(data_dir, second)
        answers = forms.bisect_sweeps(
            data_dir,
            first,
            second,
            models=models,
            jobs=jobs,
            metric=_metric_field(metric),
            threshold=threshold,
            **releases,
        )
    if as_json:
        click.echo(json.dumps(answers, indent=1))
    elif first and second:
        for answer in answers:
            click.echo(answer_line(answer))
        if not answers and metric:
            click.echo(
                f"No model's {metric} got slower beyond {threshold:.0%} and noise between "
                f"{first} and {second}."
            )
        elif not answers:
            click.echo(f"No model's verdict differs between {first} and {second}.")
    if clean:
        folder = forms.clean(data_dir, cache_dir)
        click.echo(f"removed the overlay environments in {folder}", err=True)


def _bisect_flags(
    first, second, package, from_version, to_version, metric, perf_threshold, clean
) -> float:
    """bisect's flags checked together, before anything runs (one sentence for the first
    mistake); the perf threshold they give."""
    from ..analysis import perf

    if perf_threshold is not None and metric is None:
        raise UserError(
            "--perf-threshold applies to --metric; add --metric tpot (or ttft, tokens_per_s) "
            "or drop it."
        )
    if metric and package:
        raise UserError(
            "--metric bisects two sweeps (model-support bisect A B --metric tpot), not "
            "--package's form."
        )
    threshold = perf.parse_threshold(perf_threshold)
    if (first is None or second is None) and not clean:
        raise UserError(
            "Give two sweeps (model-support bisect A B), or SWEEP MODEL --package NAME --from "
            "VERSION."
        )
    if first is None or second is None:
        return threshold
    if package and not from_version:
        raise UserError(
            "--package needs --from VERSION (the version whose verdict you expect back)."
        )
    if not package and (from_version or to_version):
        raise UserError("--from and --to go with --package NAME (the single-record form).")
    return threshold


def _sweep_id(data_dir: Path, given: str) -> str:
    """The sweep id ``given`` means (``latest``, ``latest:NAME``, a unique prefix)."""
    from ..record import store

    return store.resolve_sweep_id(data_dir, given)


def _metric_field(metric: str | None) -> str | None:
    """The record's field of a ``--metric`` choice (tpot, ttft, tokens_per_s)."""
    from ..analysis import perf

    return perf.METRIC_NAMES[metric] if metric else None
