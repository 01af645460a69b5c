"""A sweep's host checks: what runs after a probe's device phase, once its device is released.

Why a process of its own: on a TPU host a chip is released only when the process that opened it
ends, so the probe process ends with its device phase (``probe.phases``, checks "after") and the CPU
reference, the judge and attribution run here, in a host process that never loads a device backend,
while the device is already probing the next model. The host process executes
``notebooks/checks.ipynb`` from the state the device phase left; its cells (all but the loader) are
appended to the probe's executed notebook, which so still tells the whole story and reruns top to
bottom (the checks then run in the same kernel after its device phase).

Nothing is lost between the phases: before its checks start, the device phase (its state, notebook
and log) is kept in ``sweeps/<id>/phases/`` (``keep``); the record stored, it is dropped
(``forget``). A sweep killed in between resumes that model as its checks only (``saved``), never on
the device again. A check that fails, or a host process that dies or times out, is a note on the
record; the verdict is the device phase's.

Host memory stays bounded: at most ``slots`` checks run at once (each holds one reference model and
the judge); a device phase waiting for a slot waits as a small JSON state, not a model in memory.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import nbformat

from ... import fileio
from ...display import NOTEBOOK_KEY
from ...fileio import atomic_write_json
from ...probe import phases
from ...record import store
from ...redact import redact
from .process import (
    Standby,
    TaskResult,
    open_files_hint,
    run_task,
    spawn_failed,
    with_harness_retries,
)
from .task import ProbeTask

#: ``together`` keeps the host checks in the probe's own process (as before the split; the
#: benchmark's "before"); anything else, or unset, splits them off on accelerators.
SPLIT_VAR = "MODEL_SUPPORT_PHASES"
#: Cells of checks.ipynb that only load the state in a host process: not appended to the probe's
#: notebook.
LOADER_TAGS = {"checks-loader", "parameters", "injected-parameters"}


def split_phases(kind: str) -> bool:
    """Whether a sweep on ``kind`` devices runs its host checks after the device phase, in a host
    process. A CPU sweep's device is the host: splitting would only add a process per model."""
    return kind != "cpu" and os.environ.get(SPLIT_VAR, "split") != "together"


def default_slots(workers: int) -> int:
    """Host checks at once: one per device (each reference uses the cores; more only contend), at
    least 1."""
    return max(1, workers)


def phase_file(sweep_dir: Path, task: ProbeTask) -> Path:
    return sweep_dir / "phases" / f"{store.stem(task['model_id'], task['variant'])}.json"


def keep(sweep_dir: Path, task: ProbeTask, result: TaskResult) -> None:
    """The device phase, kept before its checks start: a kill between the phases loses nothing."""
    notebook = result.notebook.decode() if result.notebook is not None else None
    try:
        # its perf trace, which the record names, kept with it
        store.keep_traces(sweep_dir, result.traces)
        atomic_write_json(
            phase_file(sweep_dir, task),
            {
                "state": result.checks,
                "notebook": notebook,
                "log": result.log,
                "schedule": result.schedule,
            },
        )
    # a full disk: the checks still run; the record's own write says the disk is full
    except OSError:
        pass


def saved(sweep_dir: Path, task: ProbeTask) -> TaskResult | None:
    """A device phase an earlier run of the sweep kept and did not finish: the model resumes as
    its checks."""
    try:
        kept = json.loads(phase_file(sweep_dir, task).read_text())
    except (OSError, ValueError):
        return None
    notebook = kept["notebook"].encode() if kept.get("notebook") is not None else None
    result = TaskResult(
        kept["state"]["record"], notebook, kept["log"], task["model_id"], task["variant"]
    )
    # the hold of the run that was stopped
    result.checks, result.schedule = kept["state"], kept.get("schedule")
    return result


def forget(data_dir: Path, sweep_id: str, model_id: str, variant: str | None) -> None:
    """The model's record is stored: its kept device phase is no longer needed."""
    stem = store.stem(model_id, variant)
    fileio.remove(store.sweep_dir(data_dir, sweep_id) / "phases" / f"{stem}.json")


def append_checks(device: bytes | None, checks: bytes | None) -> bytes | None:
    """The probe's executed notebook with the host checks' cells (and their outputs) appended;
    the record it stores is then the final one (the device phase's is left displayed, untagged)."""
    if device is None:
        return None
    nb = nbformat.reads(device.decode(), as_version=4)
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            output.get("metadata", {}).pop(NOTEBOOK_KEY, None)
    if checks is not None:
        later = nbformat.reads(checks.decode(), as_version=4)
        nb.cells += [
            c for c in later.cells if not LOADER_TAGS & set(c.get("metadata", {}).get("tags", []))
        ]
    return nbformat.writes(nb).encode()


def _unfinished(device: bytes | None, why: str) -> bytes | None:
    """The probe's notebook with one cell saying its checks did not finish (the record says why
    too)."""
    if device is None:
        return None
    nb = nbformat.reads(device.decode(), as_version=4)
    nb.cells.append(
        nbformat.v4.new_markdown_cell(f"## The host checks\nThey did not finish: {why}")
    )
    return nbformat.writes(nb).encode()


def device_times(result: TaskResult) -> dict:
    """For its schedule row: the probe's own device phase (``probe.phases``), seconds, start and
    end, and the seconds of its named parts within (the perf phase, the recompile check)."""
    phase = result.device_phase or {}
    return {
        "device_s": phase.get("device_s"),
        "device_start": phase.get("start"),
        "device_end": phase.get("end"),
        "device_parts": phase.get("parts") or {},
    }


def two_phases(
    task: ProbeTask,
    got,
    sweep_dir: Path,
    device_phase: Callable[[ProbeTask], TaskResult],
    host: Callable[[TaskResult, str | None], TaskResult],
    skipped: Callable[[], None] = lambda: None,
) -> TaskResult:
    """One model of a split sweep, as every executor runs it: ``device_phase`` of the task with
    its checks left for after (``checks="after"``), kept (``keep``) before ``host(phase, None)``
    runs its checks, so a kill between the phases loses nothing; or, when an earlier run of the
    sweep kept its device phase, its checks only (``host(kept, where its files are now)``;
    ``skipped`` says no device phase runs), never the device again."""
    kept = saved(sweep_dir, task)
    # its device phase ran before the sweep was stopped: never again on the device
    if kept is not None:
        skipped()
        return host(kept, got.path or task["source"])
    result = device_phase({**task, "params": {**task["params"], "checks": "after"}})
    if result.checks is None:  # a failure before its checks were stashed, or none to run
        return result
    keep(sweep_dir, task, result)  # the device is free again: the checks, on the host
    return host(result, None)


def in_phases(
    task: ProbeTask, got, hold, processes, checks: HostChecks, sweep_dir: Path
) -> TaskResult:
    """One model of a local split sweep (``two_phases``): its device phase in a gated probe
    process (handed the model now, its devices held from their grant until the process ends),
    then its host checks."""
    times: dict = {}

    @contextmanager
    def held() -> Iterator[dict]:
        with hold() as grant:
            times.update(devices=list(grant.ids), start=time.time())
            try:
                yield processes.pin(grant.ids)
            finally:
                times["end"] = time.time()

    def device_phase(phased: ProbeTask) -> TaskResult:
        def attempt(fresh: bool) -> TaskResult:
            try:
                standby = processes.take_gated(held, retry=fresh)
            except OSError as exc:  # the harness, not the model: nothing was probed
                return spawn_failed(task, exc)
            try:
                return run_task(phased, standby=standby, fetched=got)
            finally:
                processes.done(standby)

        # a kernel that never started: once more on a fresh process
        result = with_harness_retries(attempt)
        result.schedule = {**times, **device_times(result)} if times else None
        return result

    def host(phase: TaskResult, load_from: str | None) -> TaskResult:
        return checks.run(task, phase, load_from=load_from)

    return two_phases(task, got, sweep_dir, device_phase, host, processes.skip)


class HostChecks:
    """Runs the host checks of a sweep's probes, ``slots`` at once, each in a fresh host process
    (one kept warming up, imports done, while checks run: ``Standby``, pinned to no device)."""

    def __init__(self, slots: int, work_root: Path, prewarm: bool = True, env: dict | None = None):
        self.slots = threading.BoundedSemaphore(slots)
        self.work_root, self.prewarm = str(work_root), prewarm
        self.env = env  # what every process of the sweep gets (the executor's thread share)
        self.warm: list[Standby] = []
        self.running: set[Standby] = set()
        self.lock = threading.Lock()
        self.stopped = False
        if prewarm:  # ready by the time the first device phase ends
            self.warm.append(Standby(self.work_root, self.env))

    def _take(self, fresh: bool = False) -> Standby:
        """A host process: the warm one (a new one when ``fresh``: a retry, whose warm one may
        share the cause), and while this is no retry, the next one starts warming up."""
        with self.lock:
            standby = (
                self.warm.pop() if self.warm and not fresh else Standby(self.work_root, self.env)
            )
            if self.prewarm and not fresh and not self.stopped:
                self.warm.append(Standby(self.work_root, self.env))
            self.running.add(standby)
        return standby

    def run(self, task: ProbeTask, result: TaskResult, load_from: str | None = None) -> TaskResult:
        """``result`` (a device phase with checks left) finished: the final record, the notebook
        with the checks appended, the log with theirs; ``schedule`` gains when the checks ran.
        ``load_from``: where the model's files are now (a resumed sweep downloaded them again). A
        host process whose kernel never started (or that could not be started) ran no check:
        tried once more on a fresh one, then the model is left pending (``finished``), its device
        phase kept for ``--resume``, as a device phase's would be."""
        state = check_state(result, load_from)

        def attempt(fresh: bool) -> TaskResult:
            # no process is started once the sweep stops: the kept phase waits for --resume
            if self.stopped:
                return TaskResult(
                    None, None, "", pending="the sweep stopped before they ran", problem="harness"
                )
            try:
                standby = self._take(fresh)
            # no host process (fork's ENOMEM, too many open files): nothing ran
            except OSError as exc:
                return no_host_process(exc)
            try:
                return run_checks(standby, task, state)
            finally:
                with self.lock:
                    self.running.discard(standby)

        with self.slots:
            began = time.time()
            done = with_harness_retries(attempt)
            ended = time.time()
        return finished(result, done, state, began, ended)

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            for standby in list(self.running) + self.warm:
                standby.kill()

    def discard(self) -> None:
        with self.lock:
            warm, self.warm = self.warm, []
        for standby in warm:
            standby.discard()


def check_state(result: TaskResult, load_from: str | None = None) -> dict:
    """What the host checks of ``result`` (a device phase with checks left) start from;
    ``load_from``: where the model's files are now (a resumed sweep downloaded them again)."""
    state = dict(result.checks or {})
    if load_from:
        state["settings"] = {**state["settings"], "load_from": load_from}
    return state


def run_checks(standby: Standby, task: ProbeTask, state: dict) -> TaskResult:
    """The host checks of ``state`` in ``standby``, a process pinned to no device (on this host,
    or on the Ray worker a checks task runs on); its record is the final one."""
    path = standby.work / "checks_state.json"
    path.write_text(json.dumps(state))
    return standby.run({**task, "checks_state": str(path)}, fallback=False)


def no_host_process(exc: OSError) -> TaskResult:
    """The checks' outcome when no host process could be started (fork's ENOMEM, too many open
    files): the harness's, as a probe process that could not be spawned (retried, then pending)."""
    why = f"no host process could be started ({exc.strerror or exc}{open_files_hint()})"
    return TaskResult(None, None, f"{why}\n", pending=why, problem="harness")


def finished(
    result: TaskResult, done: TaskResult, state: dict, began: float, ended: float
) -> TaskResult:
    """The model's final result from its device phase ``result`` and its host checks ``done``
    (run from ``began`` to ``ended``): the checks' record, the notebook with their cells
    appended, the two logs; a checks run that left no record keeps the device phase's verdict
    with a note saying why. Checks that never ran (``done.problem`` "harness": their kernel never
    started, no host process) are no note but the model left pending: a note would be permanent
    (the record stored, ``--resume`` never redoes it) for what told nothing."""
    if result.schedule is not None:
        result.schedule = {
            **result.schedule,
            **(done.schedule or {}),
            "checks_start": began,
            "checks_end": ended,
        }
    if done.problem == "disk":
        return done
    log = result.log + "--- host checks (after the device was released) ---\n" + done.log
    # no check ran (no kernel): pending, and --resume runs them from the kept phase
    if done.problem == "harness":
        why = f"its host checks did not run: {done.pending}"
        # no schedule row: the kept device phase carries its hold to the run that finishes it (one
        # row per hold)
        return TaskResult(
            None, None, log, result.model_id, result.variant, pending=why, problem="harness"
        )
    if done.record is None:  # the host process died or timed out: the verdict stands, with a note
        why = done.pending or redact(
            f"the host process ended without a record ({done.log[-300:].strip()})"
        )
        record = phases.unfinished(state["record"], why)
        final = TaskResult(record, _unfinished(result.notebook, why), log)
    else:
        final = TaskResult(done.record, append_checks(result.notebook, done.notebook), log)
    final.model_id, final.variant, final.schedule = result.model_id, result.variant, result.schedule
    final.device_phase = result.device_phase
    return final
