"""Run one probe notebook in its own process, and turn whatever happened into a record.

``run_task`` is what a sweep worker does for one model, under the local executor and inside a Ray
task alike: start ``python -m model_support.sweep.worker.process`` (papermill executing
``notebooks/probe.ipynb`` over an ipc-transport kernel, so parallel kernels never collide on ports),
wait for its kernel to be up (the harness's time, on a clock of its own), then up to the model's
timeout, kill the whole process tree if it hangs, and come back with the record, the executed
notebook and the log. A probe that wrote no record (kernel died, timeout, papermill error) still
yields a FAIL(other) record with what is known: papermill's exception, the kernel's exit signal and
the tail of the log. A probe whose kernel never started (or was not up within ``start_limit``), or
whose process could not be spawned, has told nothing about its model: it comes back pending (problem
``harness``) with the sentence naming the cause, never as a record.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from ... import backend_env, paths
from ...engine import children
from ...probe import phases, probe_core
from ...probe.checks import started_path
from ...probe.hub_fetch import is_local
from ...probe.instruments import flight_recorder
from ...record import schema, store
from ...record.schema import Record
from ...redact import redact
from ..budget import CacheBudget
from . import device_gate
from .deaths import describe_exit, last_words, runner_failure
from .download import Download, download
from .outputs import read_json, whole_notebook, write_trouble
from .task import ProbeTask

#: Seconds the process gets beyond the model's own timeout (papermill's start, notebook I/O, the
#: record).
GRACE_S = 90
#: Seconds a probe's kernel gets to answer after it is started (``MODEL_SUPPORT_KERNEL_START_S``).
KERNEL_START_S = 120.0
#: Seconds the warm-up's imports (torch, transformers) get in a started kernel; past them the probe
#: imports its own.
WARM_UP_S = 300.0


@dataclass
class TaskResult:
    """What comes back to the sweep's driver for one model: everything it stores. No record when the
    environment kept the model from being probed: ``pending`` (the network or the disk failed, with
    ``problem`` "network" or "disk": ``--resume`` retries it) or ``excluded`` (no access, not on the
    Hub: an excluded row with that reason)."""

    record: Record | None
    notebook: bytes | None
    log: str
    model_id: str = ""
    variant: str | None = None
    schedule: dict | None = None  # the devices it held and when (local executor)
    # the host checks its device phase left (``probe.phases``: checks "after")
    checks: dict | None = None
    device_phase: dict | None = None  # its device phase's seconds, start and end (``probe.phases``)
    pending: str | None = None
    # "network", "disk" or "harness" (the kernel never started, no process)
    problem: str | None = None
    excluded: str | None = None
    # the perf phase's profiler traces, name -> gzipped bytes (``store``)
    traces: dict[str, bytes] | None = None


def open_files_hint() -> str:
    """``; the open-files limit here is 60 (ulimit -n)`` when that limit is low enough to be the
    cause."""
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return f"; the open-files limit here is {soft} (`ulimit -n`)" if 0 < soft < 256 else ""


def _out_of_files(log: str, record: Record | None) -> str | None:
    """Why a probe ended, when it is this host's low open-files limit (EMFILE: the kernel's
    sockets, or the load opening files), not the model: then even its record says nothing about
    the model."""
    said = log if record is None else f"{record.get('error_type')}: {record.get('error_message')}"
    if "Too many open files" in said and open_files_hint():
        return "the probe ran out of open files"
    return None


def harness_pending(task: ProbeTask, reason: str, log: str = "") -> TaskResult:
    """Nothing was probed (the kernel never started, the process could not be spawned): pending with
    ``reason``, for ``--resume``; never a record."""
    return TaskResult(
        None,
        None,
        redact(log) + f"not probed: {reason}\n",
        task["model_id"],
        task.get("variant"),
        pending=reason,
        problem="harness",
    )


#: Runs of one probe whose kernel never started (or whose process could not be spawned) before it is
#: left pending.
HARNESS_ATTEMPTS = 2


def with_harness_retries(
    probe: Callable[[bool], TaskResult], attempts: int = HARNESS_ATTEMPTS
) -> TaskResult:
    """``probe(fresh)`` until it tells something about its model, at most ``attempts`` times
    (``fresh``: on a new process, not a warm one); a probe whose kernel never started every time
    is left pending saying so. Every way of running a probe (a device slot's, a gated device
    phase's) keeps this promise through here."""
    for attempt in range(attempts):
        result = probe(attempt > 0)
        if result.problem != "harness":
            return result
    result.pending = f"{result.pending}; tried {attempts} times"
    return result


def spawn_failed(task: ProbeTask, exc: OSError) -> TaskResult:
    """The probe's process could not be started (fork's ENOMEM, too many open files)."""
    return harness_pending(
        task, f"the probe process could not be started ({exc.strerror or exc}{open_files_hint()})"
    )


def kernel_start_s() -> float:
    """Seconds a probe's kernel gets to answer after it is started
    (``MODEL_SUPPORT_KERNEL_START_S``)."""
    return float(os.environ.get("MODEL_SUPPORT_KERNEL_START_S", KERNEL_START_S))


def start_limit() -> float:
    """Seconds a probe process gets, once handed its model, to have its kernel up and the stack
    imported: the harness's start, on a clock of its own, so that a slow start (a loaded host, a
    slow file system, a backend's import) never eats the model's timeout. The start's own steps
    have limits (``_warm_up``): a process past this one is stuck outside them, and its model is
    not probed (``harness_pending``)."""
    return kernel_start_s() + WARM_UP_S + GRACE_S


#: The kernel's own stderr (what the process writes on fd 2: a device runtime's last words as it
#: aborts).
KERNEL_STDERR = "kernel.stderr"
#: ipykernel would otherwise pipe fd 2 into the notebook through a thread: lost when the process
#: aborts.
KERNEL_ARGUMENTS = ["--IPKernelApp.capture_fd_output=False"]


class Standby:
    """A probe process started before its model is known: kernel up, torch and transformers
    imported.

    Most of a small model's probe is Python start-up, kernel start and importing torch and
    transformers (~10 s on 2 cores, the same for any model). A sweep worker starts the process for
    its next model while the current one runs, so that cost overlaps with useful work; the probe
    itself still runs in its own fresh process and kernel. ``env`` pins it to its device.
    """

    #: A gated standby (``worker.device_gate``): its task is handed over before the grant;
    #: ``gate()`` holds the devices (a context manager yielding their pinning variables) from the
    #: grant until the process ends.
    gate = None

    def __init__(self, work_root: str | None = None, env: dict | None = None, gated: bool = False):
        # the kernel runs in it
        self.work = Path(tempfile.mkdtemp(prefix="probe-", dir=work_root)).resolve()
        env = {**(env or {}), **(device_gate.gated_env(self.work) if gated else {})}
        # the probe's device-phase timings
        env[phases.DEVICE_ENV] = str(self.work / phases.DEVICE_FILE)
        # outlives a dead kernel
        env[flight_recorder.FLIGHT_VAR] = str(self.work / flight_recorder.FLIGHT_FILE)
        try:
            self._log = open(self.work / "log.txt", "wb")
            # its own session: a Ctrl-C at the terminal reaches the runner only, which stops the
            # probes itself
            self.proc = subprocess.Popen(
                [
                    children.interpreter(),
                    "-m",
                    "model_support.sweep.worker.process",
                    str(self.work),
                ],
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.PIPE,
                env=backend_env.child_environ(env),
                start_new_session=True,
            )
        except OSError:  # no process (fork's ENOMEM, too many open files): the caller says so
            shutil.rmtree(self.work, ignore_errors=True)
            raise
        assert self.proc.stdin is not None  # stdin=PIPE
        self.stdin = self.proc.stdin

    def wait_warm(self, timeout: float = 300) -> bool:
        """Block until the kernel is up and the stack imported (or the process ended)."""
        deadline = time.time() + timeout
        while time.time() < deadline and self.proc.poll() is None:
            if (self.work / "warm").exists():
                return True
            time.sleep(0.05)
        return False

    def up_within(self, limit: float) -> bool:
        """Whether the kernel got up and the stack imported (or the process ended: what it left
        says why) within ``limit`` seconds from now."""
        deadline = time.time() + limit
        while not (self.work / "warm").exists() and self.proc.poll() is None:
            if time.time() > deadline:
                return False
            time.sleep(0.05)
        return True

    def _await(self, timeout_s: float) -> tuple[bool, str | None]:
        """Wait for the probe handed over: its kernel's start first, on the harness's clock
        (``start_limit``), then the model's ``timeout_s`` plus ``GRACE_S`` from there, killing
        the whole tree past either. (Whether the model timed out, why its kernel never got up.)"""
        limit = start_limit()
        if not self.up_within(limit):
            children.kill_tree(self.proc)
            return False, f"the probe's kernel was not up within {limit:g} s"
        with device_gate.held(self):  # a gated process: its devices, from their grant until it ends
            try:
                self.proc.wait(timeout=timeout_s + GRACE_S)
            except subprocess.TimeoutExpired:
                children.kill_tree(self.proc)
                return True, None
        return False, None

    def run(self, task: ProbeTask, fallback: bool = True) -> TaskResult:
        """Hand ``task`` over, wait up to its timeout once its kernel is up (``_await``),
        collect; a probe that wrote no record gets the runner's (``fallback``; a host-checks
        process's caller says it instead)."""
        started = time.time()
        work = self.work
        try:
            (work / "task.json").write_text(json.dumps({**task, "gated": self.gate is not None}))
            try:
                self.stdin.write(b"go\n")
                self.stdin.close()
            except BrokenPipeError:
                pass  # the process died while warming up: recorded below from what it left
            timed_out, never_up = self._await(task["timeout_s"])
            self._log.close()
            log = (work / "log.txt").read_text(errors="replace")
            said = _read_text(work / KERNEL_STDERR)
            if said.strip():
                log += f"--- the kernel's own stderr ---\n{said}"
            notebook = whole_notebook(work / "out.ipynb")
            record = cast("Record | None", read_json(work / "record.json"))
            outcome = read_json(work / "outcome.json") or {}
            harness = outcome.get("harness") or _out_of_files(log, record) or never_up
            if harness and not timed_out:  # nothing told about the model
                return harness_pending(task, harness + open_files_hint(), log)
            trouble = write_trouble(work, outcome, log, record, notebook)
            # the harness could not write: not a verdict, nothing partial kept; --resume retries
            if trouble:
                return TaskResult(
                    None,
                    None,
                    redact(log) + f"not probed: {trouble}\n",
                    task["model_id"],
                    pending=trouble,
                    problem="disk",
                )
            if record is None and fallback:
                left = read_json(started_path(work / "record.json"))
                died = outcome.get("error", {}).get("type") == "DeadKernelError"
                crash = flight_recorder.crash_fields(
                    work, died, task["params"].get("mode"), outcome.get("kernel_exit")
                )
                record = _record_from_outcome(
                    task,
                    outcome,
                    self.proc.returncode,
                    timed_out,
                    log,
                    started,
                    left,
                    last_words(said),
                    crash,
                )
            checks, phase = (
                read_json(work / phases.STATE_FILE),
                read_json(work / phases.DEVICE_FILE),
            )
            result = TaskResult(
                record, notebook, redact(log), checks=checks if record else None, device_phase=phase
            )
            # read before the work folder goes
            result.traces = store.traces_in(work) if record else None
            return result
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def kill(self) -> None:
        """Stop its process tree now (a sweep ending early); ``run`` then returns what is left."""
        if self.proc.poll() is None:
            children.kill_tree(self.proc)

    def discard(self) -> None:
        """No model came for it: end it (closing stdin makes it exit) and clean up."""
        try:
            self.stdin.close()
            self.proc.wait(timeout=30)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            children.kill_tree(self.proc)
        self._log.close()
        shutil.rmtree(self.work, ignore_errors=True)


def run_task(
    task: ProbeTask,
    work_root: str | None = None,
    standby: Standby | None = None,
    fetched: Download | None = None,
) -> TaskResult:
    """Download what the model needs (unless ``fetched`` ahead), then probe it in a child process
    (a warm ``standby`` when given); never raises for a model's failure nor for the Hub's answer.

    ``task`` (``ProbeTask``) gets the Hub's facts (its metadata, then what the download found)
    for the probe to start its record with. Device pinning is the standby's (its worker slot's
    environment) or, under Ray, Ray's own. Files fetched ahead are the caller's to remove (the
    local executor's cache budget); files this call downloads are removed here unless the sweep
    keeps its cache (Ray)."""
    started = time.time()
    try:
        task = with_task(task)
    # the Hub says it is another task: not probed, nothing downloaded
    except probe_core.NotAProbedTask as exc:
        return TaskResult(
            None,
            None,
            redact(f"excluded: {exc}\n"),
            task["model_id"],
            task.get("variant"),
            excluded=str(exc),
        )
    own_budget = None
    if fetched is None and not task.get("keep_cache", False) and not is_local(task["source"]):
        own_budget = CacheBudget(task.get("cache_dir") or None)  # records what was cached before
    got = fetched or download(task)
    head = "".join(f"{line}\n" for line in got.log)
    try:
        if got.kind == "pending":
            log = redact(head + f"not probed: {got.reason}\n")
            return TaskResult(
                None,
                None,
                log,
                task["model_id"],
                task.get("variant"),
                pending=got.reason,
                problem=got.problem,
            )
        if got.kind == "excluded":
            log = redact(head + f"excluded: {got.reason}\n")
            return TaskResult(
                None, None, log, task["model_id"], task.get("variant"), excluded=got.reason
            )
        task = {**task, "facts": {**task.get("hub", {}), **got.fields}}
        if got.kind == "failed":
            error = got.error
            record = runner_failure(
                task,
                type(error).__name__,
                str(error),
                head,
                started,
                status=schema.FAIL_LOAD,
                stage="download",
                traceback=f"{type(error).__name__}: {error}",
            )
            return TaskResult(
                record, None, redact(head + f"{record['status']}: {error}\n"), task["model_id"]
            )
        if got.path and got.path != task["source"]:
            task["snapshot"] = got.path
        try:
            standby = standby or Standby(work_root)
        except OSError as exc:  # no process for the probe: the harness, not the model
            return spawn_failed(task, exc)
        result = standby.run(task)
        result.log, result.model_id, result.variant = (
            redact(head) + result.log,
            task["model_id"],
            task.get("variant"),
        )
        return result
    finally:
        if own_budget is not None and got.fields.get("revision_sha"):
            own_budget.release(task["source"], got.fields["revision_sha"])


def with_task(task: ProbeTask) -> ProbeTask:
    """``task`` with its probe task decided by the Hub's ``pipeline_tag`` (from ``sweep.json``)
    when it is auto and the tag is known, as the probe decides it
    (``probe_core.task_of_pipeline_tag``); NotAProbedTask for a tag of a task the probe does not
    run. Without a tag the probe decides from the config."""
    params = task["params"]
    if params.get("task", "auto") != "auto":
        return task
    decided = probe_core.task_of_pipeline_tag((task.get("hub") or {}).get("pipeline_tag"))
    return {**task, "params": {**params, "task": decided}} if decided else task


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _record_from_outcome(
    task, outcome, returncode, timed_out, log, started, left=None, said=None, crash=None
) -> Record:
    """The stand-in record of a probe that wrote none; ``left``: what it wrote before it ran
    (``checks.write_started``), ``said``: the last line its kernel wrote (``last_words``),
    ``crash``: the operator its kernel died in, by the flight recorder
    (``flight_recorder.crash_fields``)."""
    crash = crash or {}
    error = outcome.get("error") or {}
    kernel = describe_exit(outcome.get("kernel_exit")) if "kernel_exit" in outcome else None
    if timed_out:
        error_type = "ProbeTimeout"
        message = (
            f"the probe process did not finish within the model's timeout of {task['timeout_s']:g} "
            f"s plus {GRACE_S} s grace (counted once its kernel was up) and was killed"
        )
    elif error.get("type") == "CellTimeoutError":
        error_type = "ProbeTimeout"
        message = (
            f"timed out after {task['timeout_s']:g} s (the model's timeout); papermill: "
            f"{error.get('message', '').splitlines()[0] if error.get('message') else ''}"
        )
    elif error.get("type") == "DeadKernelError":
        error_type = "DeadKernelError"
        # the runtime's own last words (the operator, when it named one): two aborts, two signatures
        if said:
            message = f"the kernel died ({kernel}); it last said: {said}"
        else:
            message = (
                f"the kernel died ({kernel}) while the probe ran: "
                f"{error.get('message', '').strip()}"
            )
        # the recorder names what the runtime did not
        if crash.get("crash_operator") and flight_recorder.silent(said):
            message += f"; it died in {crash['crash_operator']} (flight recorder)"
    elif error:
        error_type = error.get("type", "RunnerError")
        message = f"{error.get('message', '').strip()}"
    else:
        error_type = "NoRecord"
        message = f"the probe wrote no record (probe process {describe_exit(returncode)})"
    return schema.fill(runner_failure(task, error_type, message, log, started, left=left), crash)


#: Run in a standby kernel before its model is known: what every probe imports, nothing device-bound
#: (a device backend such as torch_tpu, when one is used, is loaded by its device adapter later).
WARM_UP = """
import model_support  # before torch: the package decides that torch autoloads no backend (backend_env)
import torch, transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from model_support import probe
from model_support.probe import checks, phases, run
"""


class KernelNeverStarted(Exception):
    """The kernel did not answer after it was started: nothing can run in it (the harness, not
    the model)."""


def _warm_up(km, cwd: Path, stderr=None) -> None:
    """Start the kernel (its fd 2 into ``stderr``) and import the stack in it (an import failure
    here surfaces later, in the probe); KernelNeverStarted when the kernel never answers
    (``MODEL_SUPPORT_KERNEL_START_S``)."""
    from jupyter_core.utils import run_sync

    start_s = kernel_start_s()

    async def warm():
        client = None
        try:
            await km.start_kernel(cwd=str(cwd), stderr=stderr, extra_arguments=KERNEL_ARGUMENTS)
            client = km.client()
            client.start_channels()
            await client.wait_for_ready(timeout=start_s)
        except (RuntimeError, TimeoutError, OSError) as exc:
            raise KernelNeverStarted(f"the probe's kernel never started: {exc}") from exc
        try:
            await client.execute_interactive(WARM_UP, store_history=False, timeout=WARM_UP_S)
        finally:
            client.stop_channels()

    try:
        run_sync(warm)()
    except (RuntimeError, TimeoutError) as exc:
        print(
            f"warm-up did not finish ({type(exc).__name__}: {exc}); the probe imports on its own",
            flush=True,
        )


def _execute(work: Path) -> None:
    """The child process: start and warm a kernel, wait for the task on stdin, then papermill over
    that kernel; leaves out.ipynb, record.json, outcome.json."""
    from ...engine.kernels import ipc_kernel

    with ipc_kernel() as km, open(work / KERNEL_STDERR, "wb") as stderr:
        try:
            _warm_up(km, work, stderr)
        except KernelNeverStarted as exc:
            print(exc, flush=True)
            (work / "warm").touch()
            if sys.stdin.readline():  # a task came: say why it was not probed
                (work / "outcome.json").write_text(json.dumps({"harness": str(exc)}))
            return
        import papermill  # noqa: F401 imported while warming up, not once the model's devices are held

        (work / "warm").touch()  # for whoever wants to know the standby is ready (the benchmarks)
        if not sys.stdin.readline():  # stdin closed without a task: this standby is not needed
            return
        _run_notebook(work, km)


def _run_notebook(work: Path, km) -> None:
    from ...engine.notebooks import run_notebook

    task: ProbeTask = json.loads((work / "task.json").read_text())
    record_path = work / "record.json"
    # its model known, its devices not yet: wait for them (worker.device_gate)
    if task.get("gated"):
        device_gate.await_grant(work, task)
    notebook = paths.notebook("probe")
    parameters = {
        **task["params"],
        "model_id": task["source"],
        "snapshot": task.get("snapshot", ""),
        "sweep_id": task["sweep_id"],
        "record_path": str(record_path),
        "notebook_path": task["notebook_path"],
        "timeout_s": task["timeout_s"],
        "hub_facts": task.get("facts", {}),
    }
    # a host process: the checks a device phase left (``worker.host_checks``)
    if task.get("checks_state"):
        notebook, parameters = (
            paths.notebook("checks"),
            {"checks_state": task["checks_state"], "record_path": str(record_path)},
        )
    outcome: dict = {}
    began = time.time()
    try:
        run_notebook(
            notebook,
            work / "out.ipynb",
            parameters,
            timeout=task["timeout_s"],
            km=km,
            log_output=True,
        )
    except Exception as exc:  # noqa: BLE001 whatever papermill raised is this model's outcome, recorded below
        outcome["error"] = {"type": type(exc).__name__, "message": str(exc)[:4000]}
        outcome["errno"] = getattr(exc, "errno", None)
        # papermill could not reach the kernel: nothing ran
        if str(exc).startswith("Kernel didn't respond"):
            outcome["harness"] = f"the probe's kernel never started: {exc}"
        if km.exit_status is not None:
            outcome["kernel_exit"] = km.exit_status
        # a silent abort: rerun once synchronously, devices still held
        if type(exc).__name__ == "DeadKernelError":
            left_s = task["timeout_s"] - (time.time() - began)
            said = last_words(_read_text(work / KERNEL_STDERR))
            flight_recorder.rerun_silent_crash(
                work, started_path(record_path), km.exit_status, said, left_s
            )
        # its zygote ended and took the kernel with it (``engine.zygote``): pending, retried
        if km.harness_lost:
            outcome["harness"] = "the probe's kernel was lost with the zygote that forked it"
    (work / "outcome.json").write_text(json.dumps(outcome))


if __name__ == "__main__":
    # Set here, in the child, rather than with Popen(preexec_fn=...): a preexec_fn runs between fork
    # and exec and can deadlock when the runner has other threads (downloads, logging) holding
    # locks.
    children.die_with_parent()
    if os.getppid() == 1:  # the runner died before the line above ran
        sys.exit(1)
    import logging

    # the probe's log: what its cells print, as papermill's log_output passes it on (its INFO
    # lines), and warnings
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
    logging.getLogger("papermill").setLevel(logging.INFO)
    _execute(Path(sys.argv[1]))
    sys.stdout.flush()
    # its files are written and closed: no interpreter teardown while its devices are held
    os._exit(0)
