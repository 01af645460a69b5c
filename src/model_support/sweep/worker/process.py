"""Run one probe notebook in its own process, and turn whatever happened into a record.

``run_task`` is what a sweep worker does for one model, under the local executor and inside a Ray
task alike: start ``python -m model_support.sweep.worker.process`` (papermill executing ``notebooks/probe.ipynb``
over an ipc-transport kernel, so parallel kernels never collide on ports), wait up to the model's
timeout, kill the whole process tree if it hangs, and come back with the record, the executed
notebook and the log. A probe that wrote no record (kernel died, timeout, papermill error) still
yields a FAIL(other) record with what is known: papermill's exception, the kernel's exit signal and
the tail of the log.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from ... import paths
from ...probe import probe_core
from ...probe.checks import NO_WEIGHTS_ATTRIBUTION
from ...probe.hub_fetch import is_local
from ...probe.records import fail, new_record
from ...record import schema
from ...record.schema import Record
from ...redact import redact, redact_record
from ..budget import CacheBudget
from .download import Download, download
from .outputs import read_json, whole_notebook, write_trouble
from .task import ProbeTask

#: Seconds the process gets beyond the model's own timeout (kernel start, imports, notebook I/O).
GRACE_S = 90
LOG_TAIL_CHARS = 3000


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
    pending: str | None = None
    problem: str | None = None
    excluded: str | None = None


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the runner dies, so a killed sweep leaves no orphans."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _kill_tree(proc: subprocess.Popen) -> None:
    import psutil

    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    proc.kill()
    proc.wait()


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


#: Whose failure it is, for the failures the probe could not attribute itself (see ``probe.attribute``).
_ATTRIBUTION_OF_STAGE = {
    "runner": {
        "reference_note": "attribution not run: the probe did not finish (timeout, dead kernel, no record), "
        "so there is no failure to rerun on the reference"
    },
    "download": NO_WEIGHTS_ATTRIBUTION,
}


def runner_failure(
    task: ProbeTask,
    error_type: str,
    message: str,
    log: str,
    started: float,
    status: str = schema.FAIL_OTHER,
    stage: str = "runner",
    traceback: str | None = None,
) -> Record:
    """A record for a probe that could not write its own: FAIL(other) at stage runner (the kernel
    died, a timeout), or what the download stage found (FAIL(load) at stage download). Made where the
    probe makes its own (``records.new_record``), from the same task: its probe task is the one the sweep
    decided (``with_task``), else unknown (the probe decides auto from the config)."""
    tail = log[-LOG_TAIL_CHARS:]
    record = new_record(
        task["model_id"],
        task["params"],
        task["sweep_id"],
        task["notebook_path"],
        task.get("facts"),
        device_type=task["params"].get("device"),
        started_at=time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(started)),
        duration_s=time.time() - started,
        **_ATTRIBUTION_OF_STAGE[stage],
    )
    traceback = traceback or f"(no traceback: the probe wrote no record)\n--- log tail ---\n{tail}"
    fail(record, stage, status, error_type, message, traceback, placed=False)
    return schema.check_record(redact_record(record, task.get("scrub")))


class Standby:
    """A probe process started before its model is known: kernel up, torch and transformers imported.

    Most of a small model's probe is Python start-up, kernel start and importing torch and
    transformers (~10 s on 2 cores, the same for any model). A sweep worker starts the process for
    its next model while the current one runs, so that cost overlaps with useful work; the probe
    itself still runs in its own fresh process and kernel. ``env`` pins it to its device.
    """

    def __init__(self, work_root: str | None = None, env: dict | None = None):
        self.work = Path(tempfile.mkdtemp(prefix="probe-", dir=work_root)).resolve()  # the kernel runs in it
        self._log = open(self.work / "log.txt", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "model_support.sweep.worker.process", str(self.work)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE,
            env={**os.environ, **(env or {})},
        )
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

    def run(self, task: ProbeTask) -> TaskResult:
        """Hand ``task`` over, wait up to its timeout (killing the whole tree past it), collect."""
        started = time.time()
        work = self.work
        try:
            (work / "task.json").write_text(json.dumps(task))
            try:
                self.stdin.write(b"go\n")
                self.stdin.close()
            except BrokenPipeError:
                pass  # the process died while warming up: recorded below from what it left
            timed_out = False
            try:
                self.proc.wait(timeout=task["timeout_s"] + GRACE_S)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_tree(self.proc)
            self._log.close()
            log = (work / "log.txt").read_text(errors="replace")
            notebook = whole_notebook(work / "out.ipynb")
            record = cast("Record | None", read_json(work / "record.json"))
            outcome = read_json(work / "outcome.json") or {}
            trouble = write_trouble(work, outcome, log, record, notebook)
            if trouble:  # the harness could not write: not a verdict, nothing partial kept; --resume retries
                return TaskResult(
                    None,
                    None,
                    redact(log) + f"not probed: {trouble}\n",
                    task["model_id"],
                    pending=trouble,
                    problem="disk",
                )
            if record is None:
                record = _record_from_outcome(task, outcome, self.proc.returncode, timed_out, log, started)
            return TaskResult(record=record, notebook=notebook, log=redact(log))
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def kill(self) -> None:
        """Stop its process tree now (a sweep ending early); ``run`` then returns what is left."""
        if self.proc.poll() is None:
            _kill_tree(self.proc)

    def discard(self) -> None:
        """No model came for it: end it (closing stdin makes it exit) and clean up."""
        try:
            self.stdin.close()
            self.proc.wait(timeout=30)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            _kill_tree(self.proc)
        self._log.close()
        shutil.rmtree(self.work, ignore_errors=True)


def run_task(
    task: ProbeTask, work_root: str | None = None, standby: Standby | None = None, fetched: Download | None = None
) -> TaskResult:
    """Download what the model needs (unless ``fetched`` ahead), then probe it in a child process (a
    warm ``standby`` when given); never raises for a model's failure nor for the Hub's answer.

    ``task`` (``ProbeTask``) gets the Hub's facts (its metadata, then what the download found) for the
    probe to start its record with. Device pinning
    is the standby's (its worker slot's environment) or, under Ray, Ray's own. Files fetched ahead
    are the caller's to remove (the local executor's cache budget); files this call downloads are
    removed here unless the sweep keeps its cache (Ray)."""
    started = time.time()
    try:
        task = with_task(task)
    except probe_core.NotAProbedTask as exc:  # the Hub says it is another task: not probed, nothing downloaded
        return TaskResult(
            None, None, redact(f"excluded: {exc}\n"), task["model_id"], task.get("variant"), excluded=str(exc)
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
                None, None, log, task["model_id"], task.get("variant"), pending=got.reason, problem=got.problem
            )
        if got.kind == "excluded":
            log = redact(head + f"excluded: {got.reason}\n")
            return TaskResult(None, None, log, task["model_id"], task.get("variant"), excluded=got.reason)
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
            return TaskResult(record, None, redact(head + f"{record['status']}: {error}\n"), task["model_id"])
        if got.path and got.path != task["source"]:
            task["snapshot"] = got.path
        result = (standby or Standby(work_root)).run(task)
        result.log, result.model_id, result.variant = redact(head) + result.log, task["model_id"], task.get("variant")
        return result
    finally:
        if own_budget is not None and got.fields.get("revision_sha"):
            own_budget.release(task["source"], got.fields["revision_sha"])


def with_task(task: ProbeTask) -> ProbeTask:
    """``task`` with its probe task decided by the Hub's ``pipeline_tag`` (from ``sweep.json``) when it is auto
    and the tag is known, as the probe decides it (``probe_core.task_of_pipeline_tag``); NotAProbedTask for a
    tag of a task the probe does not run. Without a tag the probe decides from the config."""
    params = task["params"]
    if params.get("task", "auto") != "auto":
        return task
    decided = probe_core.task_of_pipeline_tag((task.get("hub") or {}).get("pipeline_tag"))
    return {**task, "params": {**params, "task": decided}} if decided else task


def _record_from_outcome(task, outcome, returncode, timed_out, log, started) -> Record:
    error = outcome.get("error") or {}
    kernel = _describe_exit(outcome.get("kernel_exit")) if "kernel_exit" in outcome else None
    if timed_out:
        error_type = "ProbeTimeout"
        message = f"the probe process did not finish within the model's timeout of {task['timeout_s']:g} s plus {GRACE_S} s grace and was killed"
    elif error.get("type") == "CellTimeoutError":
        error_type = "ProbeTimeout"
        message = f"timed out after {task['timeout_s']:g} s (the model's timeout); papermill: {error.get('message', '').splitlines()[0] if error.get('message') else ''}"
    elif error.get("type") == "DeadKernelError":
        error_type = "DeadKernelError"
        message = f"the kernel died ({kernel}) while the probe ran: {error.get('message', '').strip()}"
    elif error:
        error_type = error.get("type", "RunnerError")
        message = f"{error.get('message', '').strip()}"
    else:
        error_type = "NoRecord"
        message = f"the probe wrote no record (probe process {_describe_exit(returncode)})"
    return runner_failure(task, error_type, message, log, started)


#: Run in a standby kernel before its model is known: what every probe imports, nothing device-bound
#: (a device backend such as torch_tpu, when one is used, is loaded by its device adapter later).
WARM_UP = """
import os
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
import torch, transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from model_support import probe
"""


def _warm_up(km, cwd: Path) -> None:
    """Start the kernel and import the stack in it (failures here surface later, in the probe)."""
    from jupyter_core.utils import run_sync

    async def warm():
        await km.start_kernel(cwd=str(cwd))
        client = km.client()
        client.start_channels()
        try:
            await client.wait_for_ready(timeout=120)
            await client.execute_interactive(WARM_UP, store_history=False, timeout=300)
        finally:
            client.stop_channels()

    try:
        run_sync(warm)()
    except (RuntimeError, TimeoutError) as exc:
        print(f"warm-up did not finish ({type(exc).__name__}: {exc}); the probe imports on its own", flush=True)


def _execute(work: Path) -> None:
    """The child process: start and warm a kernel, wait for the task on stdin, then papermill over
    that kernel; leaves out.ipynb, record.json, outcome.json."""
    from ...engine.kernels import ipc_kernel

    with ipc_kernel() as km:
        _warm_up(km, work)
        (work / "warm").touch()  # for whoever wants to know the standby is ready (the benchmarks)
        if not sys.stdin.readline():  # stdin closed without a task: this standby is not needed
            return
        _run_notebook(work, km)


def _run_notebook(work: Path, km) -> None:
    from ...engine.notebooks import run_notebook

    task: ProbeTask = json.loads((work / "task.json").read_text())
    record_path = work / "record.json"
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
    outcome: dict = {}
    try:
        run_notebook(
            paths.notebook("probe"), work / "out.ipynb", parameters, timeout=task["timeout_s"], km=km, log_output=True
        )
    except Exception as exc:  # noqa: BLE001 whatever papermill raised is this model's outcome, recorded below
        outcome["error"] = {"type": type(exc).__name__, "message": str(exc)[:4000]}
        outcome["errno"] = getattr(exc, "errno", None)
        if km.exit_status is not None:
            outcome["kernel_exit"] = km.exit_status
    (work / "outcome.json").write_text(json.dumps(outcome))


if __name__ == "__main__":
    # Set here, in the child, rather than with Popen(preexec_fn=...): a preexec_fn runs between fork and
    # exec and can deadlock when the runner has other threads (downloads, logging) holding locks.
    _die_with_parent()
    if os.getppid() == 1:  # the runner died before the line above ran
        sys.exit(1)
    _execute(Path(sys.argv[1]))
