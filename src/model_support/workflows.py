"""The workflows the commands run, callable from Python and a notebook: a sweep with what it says
after (its table, summary, report and pending sentence) and the nightly.

Why a room of its own: the command line turns arguments into one of these calls and draws a
progress bar; a notebook or a script calls them with its own ``say`` (where the lines go) and gets
the same lines and the same exit status (0, or 1 when the gate failed or a model is pending)::

    from model_support import workflows
    status = workflows.nightly("params/nightly.yaml", "data")

Nothing here parses a flag or knows a terminal: ``say`` and ``warn`` take one line each (``print``
and stderr by default), ``on_result`` sees each record as the sweep stores it.
"""

from __future__ import annotations

import functools
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import nightly as nightly_mod
from .analysis import expectations, flakes
from .analysis import perf as perf_mod
from .errors import Interrupted, StorageFull, UserError
from .record import store
from .sweep import definition as definition_mod
from .sweep import runner as sweep_runner

Say = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


@dataclass
class SweepOutcome:
    """What a sweep did: the runner's ``summary`` and whether it finished (every model probed,
    the report rendered)."""

    summary: dict
    finished: bool

    @property
    def sweep_id(self) -> str:
        return self.summary["sweep_id"]


def load(
    params_file,
    overrides: Mapping | None = None,
    executor: str | None = None,
    resume: str | None = None,
    *,
    data_dir="data",
):
    """The definition of a new sweep (checked, its expectations too) or, for ``resume``, None
    once the sweep is found: every mistake before anything runs or a progress bar starts."""
    given = dict(overrides) if overrides else None
    definition = (
        definition_mod.load(params_file, overrides=given, executor=executor)
        if params_file
        else None
    )
    if definition is not None:
        expectations.from_meta(definition.expectations)  # its entries checked before anything runs
    if resume:
        store.read_sweep(Path(data_dir), resume)  # an unknown id is refused in one sentence
    return definition


def run(
    definition,
    data_dir,
    *,
    workers=None,
    executor=None,
    prefetch=None,
    resume=None,
    report=True,
    reruns=None,
    on_result=None,
    warn: Say = _stderr,
) -> dict:
    """The sweep itself (``sweep.runner.run``): flakes rerun against the report's baseline,
    stacks that pin other packages in their overlay environments; its summary."""
    data_dir = Path(data_dir)
    return sweep_runner.run(
        definition,
        data_dir,
        workers=workers,
        executor=executor,
        resume=resume,
        on_result=on_result,
        prefetch=prefetch,
        report=report,
        screen=functools.partial(flakes.baseline_for, data_dir),
        reruns_n=reruns,
        interpreters=functools.partial(stack_interpreters, data_dir, warn=warn),
    )


def tell(
    data_dir,
    summary: dict,
    *,
    report=True,
    say: Say = print,
    warn: Say = _stderr,
    debug=False,
    console=None,
) -> bool:
    """What a sweep says after it ran: its verdict table (on ``console``, a rich Console; 160
    columns where none is given), the summary lines, the report (``report_after_sweep``) and the
    pending sentence. True when it finished."""
    from rich.console import Console

    from .render.terminal import verdict_table

    data_dir = Path(data_dir)
    records = store.read_records(data_dir, summary["sweep_id"])
    verdict_table(records, console or Console(width=160))
    say(
        f"sweep {summary['sweep_id']}: {summary['ran']} probed now, {summary['total']} models, "
        f"{summary['wall_s']:.1f} s with {summary['workers']} worker(s) ({summary['executor']})"
    )
    # is a PASS right: the report's words (analysis.suspect_words)
    if summary["verdicts"].get("PASS"):
        from . import analysis

        checks = analysis.pass_checks(store.scan(data_dir), summary["sweep_id"])
        say(
            "suspect passes: "
            f"{analysis.suspect_words(dict(checks.select('check', 'count').rows()))}"
        )
    if summary["excluded_before"]:  # in the excluded config and the report, so said here too
        say(
            f"excluded before running: {len(summary['excluded_before'])} "
            f"({'; '.join(f'{m}: {r}' for m, r in sorted(summary['excluded_before'].items()))})"
        )
    accelerator = any(r.get("device_type") not in (None, "cpu") for r in records)
    # a CPU sweep holds no device: its "devices" are worker slots
    if summary.get("device_time") and accelerator:
        from .sweep.device_time import sentence

        say(sentence(summary["device_time"]))
    say(f"records:  {data_dir / 'sweeps' / summary['sweep_id']}")
    # its runs are kept apart from the stack's verdicts
    if store.what_if_setting(data_dir, summary["sweep_id"]):
        say(f"dataset:  {data_dir / store.WHAT_IF_CONFIG} (what-if runs: no verdict of the stack)")
    else:
        say(
            f"dataset:  {data_dir / 'results'} and {data_dir / 'excluded'} (card: "
            f"{data_dir / 'README.md'})"
        )
    rendered = True
    if report:
        try:
            rendered = report_after_sweep(data_dir, summary, say=say, warn=warn, debug=debug)
        except KeyboardInterrupt:
            raise Interrupted(
                f"Stopped while rendering the report of {summary['sweep_id']}: the records and "
                f"Parquet files are complete; `model-support report {summary['sweep_id']}` "
                "renders it."
            ) from None
    # not probed, not failed: the environment kept them; say so, and how to finish
    if summary["pending"]:
        warn(pending_sentence(summary["sweep_id"], summary["pending"]))
    return not (summary["pending"] or not rendered)


class Tally:
    """The verdicts so far, as a sweep's progress says them: ``PASS=3 FAIL(gen)=1``."""

    def __init__(self):
        self.counts: Counter = Counter()

    def add(self, record) -> str:
        self.counts[record["status"]] += 1
        return " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))

    @staticmethod
    def line(record, done: int, total: int, verdicts: str) -> str:
        """One model's line where no bar is drawn (a log, a notebook)."""
        return f"[{done}/{total}] {record.get('model_id')}: {record['status']}  ({verdicts})"


@contextmanager
def plain_lines(warn: Say = _stderr) -> Iterator[Callable]:
    """``sweep``'s default ``watch``: one line per stored model to ``warn``."""
    tally = Tally()
    yield lambda record, done, total: warn(Tally.line(record, done, total, tally.add(record)))


def sweep(
    params_file=None,
    data_dir="data",
    *,
    workers=None,
    executor=None,
    prefetch=None,
    resume=None,
    report=True,
    overrides: Mapping | None = None,
    reruns=None,
    watch: Callable[[], AbstractContextManager[Callable]] | None = None,
    say: Say = print,
    warn: Say = _stderr,
    debug=False,
    console=None,
) -> SweepOutcome:
    """A sweep of ``params_file`` (or the ``resume`` of one) with what it says after: ``load``,
    ``run``, ``tell``. ``watch``: a context manager, open while the sweep runs, that gives the
    callable each stored record goes to (the command line's progress bar; ``plain_lines`` by
    default)."""
    definition = load(params_file, overrides, executor, resume, data_dir=data_dir)
    with (watch or functools.partial(plain_lines, warn))() as on_result:
        summary = run(
            definition,
            data_dir,
            workers=workers,
            executor=executor,
            prefetch=prefetch,
            resume=resume,
            report=report,
            reruns=reruns,
            on_result=on_result,
            warn=warn,
        )
    finished = tell(
        data_dir, summary, report=report, say=say, warn=warn, debug=debug, console=console
    )
    return SweepOutcome(summary, finished)


def check_nightly(params_file) -> None:
    """A nightly gates the stack: a definition that puts operators on the host (a what-if sweep)
    is refused before anything runs, in one sentence."""
    import yaml

    try:
        raw = yaml.safe_load(Path(params_file).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return  # the sweep's own reading says what is wrong with the file
    if (
        isinstance(raw, dict)
        and isinstance(raw.get("probe"), dict)
        and raw["probe"].get("host_ops")
    ):
        raise UserError(
            f"{params_file} puts operators on the host (probe: host_ops): a what-if sweep is "
            "no verdict of the stack, so a nightly cannot gate it; run it with model-support "
            "sweep, or ops SWEEP --prove."
        )


def nightly(
    params_file,
    data_dir="data",
    *,
    workers=None,
    reruns=None,
    fail_on="regressions,new-failures",
    expect=None,
    perf_threshold=None,
    across="",
    report=True,
    bisect=True,
    find_links=None,
    push_to=None,
    sweep_with: Callable[..., SweepOutcome] | None = None,
    say: Say = print,
    warn: Say = _stderr,
) -> int:
    """The nightly (``model-support nightly``, docs/nightly.md): sweep ``params_file`` (flakes
    rerun), gate it against the last sweep of the same name and device, export, bisect, draft bug
    reports, push (``nightly.after_sweep``). Its exit status: 1 when the gate failed or a model
    is left pending, else 0. Every argument is checked before the sweep starts; ``sweep_with``
    runs the sweep (the command line's, with its progress bar; ``sweep`` by default)."""
    data_dir = Path(data_dir)
    gates = nightly_mod.check_fail_on(fail_on)
    allowed = nightly_mod.check_across(across or "")
    threshold = perf_mod.parse_threshold(perf_threshold) if perf_threshold is not None else None
    if expect is not None and not Path(expect).is_file():
        raise UserError(
            f"--expect {expect} is no file; give an expectations YAML file of MODEL: "
            "{verdict, reason}."
        )
    check_nightly(params_file)
    outcome = (sweep_with or functools.partial(sweep, say=say, warn=warn))(
        params_file, data_dir, workers=workers, report=report, reruns=reruns
    )
    status = nightly_mod.after_sweep(
        data_dir,
        outcome.sweep_id,
        fail_on=gates,
        expect=expect,
        perf_threshold=threshold,
        across=allowed,
        bisect=bisect,
        find_links=find_links,
        push_to=push_to,
        log=say,
    )
    return status or (0 if outcome.finished else 1)


def stack_interpreters(data_dir: Path, meta, warn: Say = _stderr) -> dict[str, str]:
    """{stack: interpreter} of a sweep's stacks that pin packages: the bisect's overlay
    environments (the project's environment with those releases on top; cached under
    $MODEL_SUPPORT_BISECT_CACHE or <data>/bisect-envs, from pip's configured index or
    find-links); one sentence for a release that cannot be installed here."""
    from .bisect.envs import InstallError, Overlays
    from .bisect.forms import cache_dir

    overlays = Overlays(cache_dir(data_dir))
    found = {}
    for name, stack in meta.stacks.items():
        if stack.get("packages"):
            pins = ", ".join(f"{d}=={v}" for d, v in sorted(stack["packages"].items()))
            warn(
                f"stack {name}: an environment with {pins} ({overlays.tool}, from "
                f"{overlays.source})"
            )
            try:
                found[name] = str(overlays.python(stack["packages"]))
            except InstallError as exc:
                raise UserError(f"Stack {name!r} ({pins}) cannot be built here: {exc}") from None
    return found


def pending_sentence(sweep_id: str, pending: dict) -> str:
    """The one sentence a sweep ends with when the environment kept models from being probed:
    downloads (the network, the disk), or the harness (a kernel that never started: the first
    cause, named)."""
    n = len(pending)
    them = "them" if n != 1 else "it"
    harness = [p for p in pending.values() if p.get("problem") == "harness"]
    if harness:
        return (
            f"{n} model{'s' if n != 1 else ''} could not be probed ({harness[0]['reason']}): "
            f"fix that, then run `model-support sweep --resume {sweep_id}` to finish {them}."
        )
    problems = ", ".join(sorted({p.get("problem") or "network" for p in pending.values()}))
    return (
        f"{n} model{'s' if n != 1 else ''} could not be downloaded ({problems}): run "
        f"`model-support sweep --resume {sweep_id}` to finish {them}."
    )


def report_after_sweep(
    data_dir: Path, summary: dict, *, say: Say = print, warn: Say = _stderr, debug=False
) -> bool:
    """The sweep's report, or one sentence why there is none: no model stored yet, or rendering
    failed (the records are safe either way; a full disk is ``render_report``'s StorageFull).
    False when it failed; ``debug`` raises."""
    sweep_id = summary["sweep_id"]
    # a what-if sweep's runs are kept in their own config (write_parquet writes no file without a
    # row)
    what_if_rows = store.parquet_file(data_dir, store.WHAT_IF_CONFIG, sweep_id).exists()
    if not any(summary["rows"]) and not what_if_rows:  # no row of any config: nothing to report on
        warn(f"report:   none (no model of {sweep_id} is stored yet)")
        return True
    try:
        render_report(data_dir, sweep_id, None, say=say)
    except (UserError, StorageFull):
        raise
    except Exception as exc:  # noqa: BLE001 - one sentence; --debug shows the traceback
        if debug:
            raise
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        warn(
            f"Could not render the report of {sweep_id} ({type(exc).__name__}: {first}); the "
            f"records and Parquet files are complete: run `model-support report {sweep_id}` "
            "once that is fixed."
        )
        return False
    return True


def render_report(data_dir: Path, sweep_id: str, baseline: str | None, *, say: Say = print) -> None:
    """The HTML report of ``sweep_id`` against ``baseline`` (default: the previous sweep of the
    same name and device) and the explorer; a full disk is one sentence (StorageFull)."""
    from .render import report

    baseline = baseline or report.previous_sweep(data_dir, sweep_id)
    try:
        html = report.render_report(data_dir, sweep_id, baseline)
    except OSError as exc:
        from .sweep.diskspace import disk_words

        raise StorageFull(
            f"Could not write the report of {sweep_id} "
            f"({disk_words(exc, Path(data_dir).resolve())}): the sweep's records and Parquet "
            f"files are complete; make room, then run `model-support report {sweep_id}`."
        ) from exc
    say(f"report:   {html}" + (f" (baseline {baseline})" if baseline else ""))
    say(f"explorer: {Path(html).parent / 'index.html'}")


class WhatIfSweeps:
    """``ops.prove``'s ``Sweeps``: what-if sweeps of the stack sweep ``meta`` made and run
    through the sweep runner (its workers, executors and resume), on its settings but
    ``host_ops``; a Ray sweep's run where its sweep ran."""

    def __init__(self, data_dir: Path, sweep_id: str, meta, workers=None, executor=None):
        self.data_dir, self.sweep_id, self.meta = Path(data_dir), sweep_id, meta
        self.workers, self.executor = workers, executor

    def create(self, name, entries, probe, description) -> str:
        from .sweep.executors import ray_cluster

        meta = self.meta
        params = definition_mod.SweepParams(
            name=name,
            models=entries,
            excluded={},
            probe=probe,
            timeout_s=meta.timeout_s,
            workers=self.workers or meta.workers,
            executor=self.executor or meta.executor,
            description=description,
            cache=meta.cache,
            prefetch=meta.prefetch,
            reruns=0,
        )
        if params.executor != "ray":  # a Ray sweep's devices are the cluster's, asked when it joins
            definition_mod.check_devices(params)
        definition_mod.check_host_ops(params)
        created = sweep_runner.create(params, self.data_dir, reruns_n=0).sweep_id
        if params.executor == "ray":  # it runs where its sweep ran, as a resume of that sweep would
            ray_cluster.inherit(
                store.sweep_dir(self.data_dir, self.sweep_id),
                store.sweep_dir(self.data_dir, created),
            )
        return created

    def run(self, what_if_id: str) -> None:
        sweep_runner.run(None, self.data_dir, self.workers, self.executor, resume=what_if_id)


def what_if(
    data_dir,
    sweep_id: str,
    *,
    prove=False,
    complete=False,
    workers=None,
    executor=None,
    say: Say = print,
) -> None:
    """``ops --complete`` and ``--prove``: their what-if sweeps (``WhatIfSweeps``) on this
    environment's stack, which must be the sweep's (``ops.prove``); each step said as it ends."""
    from .debug.stack import differences
    from .ops import prove as prove_mod
    from .probe import devices, provenance

    data_dir = Path(data_dir)
    meta = store.read_sweep(data_dir, sweep_id)
    found = differences(meta, provenance.versions(), devices.stack_configuration())
    if found:
        raise UserError(
            "--prove and --complete run on this environment's stack, which is not the one "
            f"sweep {sweep_id} ran on ({'; '.join(found)}): set that stack here and run it "
            "again."
        )
    sweeps = WhatIfSweeps(data_dir, sweep_id, meta, workers, executor)
    with store.SweepLock(store.sweep_dir(data_dir, sweep_id)):  # one proof of a sweep at a time
        if complete:
            prove_mod.complete(data_dir, sweep_id, sweeps, say)
        if prove:
            say(
                f"Proving the plan of {sweep_id}: each step's operators, with the earlier "
                "steps', on the host of its device, over the models the step unlocks."
            )
            prove_mod.prove(data_dir, sweep_id, sweeps, say)
