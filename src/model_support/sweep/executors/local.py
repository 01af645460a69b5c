"""The local executor: N probes at once on this host's devices, each in its own pinned process.

A probe takes the devices the scheduler grants (``executors.contract``) in a process pinned to them
(the device adapter's ``pinning_env``). Each slot also keeps the process for its next model warming
up (``_Processes``: kernel started, torch and transformers imported) while the current model runs,
only where it has a core to itself: on accelerators (the host is mostly idle while the device
computes) or when there are fewer CPU workers than cores. A CPU sweep that already fills every core
gains nothing from it. Every probe's kernel is forked from one zygote the executor starts for the
sweep (``engine.zygote``: torch and transformers imported once, not once per model). The processes
that run at once share the host's cores for torch's threads (``thread_share``).
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path

from ... import backend_env
from ...engine import zygote
from ...errors import UserError
from ...probe import devices
from ...probe.devices import pinning_env
from ..budget import CacheBudget
from ..worker import host_checks
from ..worker.download import Download
from ..worker.process import Standby, TaskResult, run_task, spawn_failed
from ..worker.task import ProbeTask
from .contract import Executor, Stopped, device_kind

#: The variable torch reads, when it is imported, for its intra-op threads (OpenMP's).
THREADS_VAR = "OMP_NUM_THREADS"


def thread_share(processes: int, environ: Mapping[str, str]) -> dict:
    """The environment that gives each of ``processes`` probe processes running at once on this
    host its share of the cores for torch's intra-op threads; nothing for one process, or where
    the user set the variable. Left alone, every process's torch starts a thread per core, and
    several such processes on the same cores spend their time waiting for each other in OpenMP (2
    workers on 2 cores: a fifth of the CPU spun). Ray sets it for its tasks the same way, and a
    sharded run for its ranks (``sharded.launch``)."""
    if processes <= 1 or THREADS_VAR in environ:
        return {}
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )
    return {THREADS_VAR: str(max(1, cores // processes))}


class _Processes:
    """A local sweep's probe processes: for each device slot, one warming up for its next model
    (``worker.process.Standby``) while models remain to be handed out, and the ones running
    (stopped at once when the sweep ends early)."""

    def __init__(
        self, kind: str, work_root: Path, prewarm: bool, models: int, env: dict | None = None
    ):
        self.kind, self.work_root, self.prewarm = kind, str(work_root), prewarm
        self.env = env or {}  # what every process of the sweep gets (``thread_share``)
        # the devices there are: more workers than devices share them (4 workers on one GPU all see
        # GPU 0)
        self.count = devices.facts(kind).count if kind != "cpu" else 0
        self.left = models  # models not handed out yet: a standby is started only for one of them
        self.warm: dict[int, Standby] = {}
        # warm and pinned to nothing: for gated probes (``take_gated``)
        self.pool: list[Standby] = []
        self.running: set[Standby] = set()
        self.lock = threading.Lock()
        self.stopped = False

    def pin(self, ids: tuple[int, ...]) -> dict:
        """The variables that pin a process to the scheduler's devices ``ids``: its slots, laid
        round robin over the devices there are when the sweep has more workers than devices."""
        if self.count and max(ids) >= self.count:
            ids = tuple(sorted({i % self.count for i in ids}))
        return {**self.env, **pinning_env(self.kind, ids)}

    def skip(self) -> None:
        """A model that needs no process (its download did not give files to probe)."""
        with self.lock:
            self.left -= 1

    def take_gated(self, gate, retry: bool = False) -> Standby:
        """A process for a model whose devices are not granted yet (``worker.device_gate``): a
        warm unpinned one (a fresh one on a ``retry``), pinned at the grant; while models remain,
        the next one starts warming up. OSError as ``take``."""
        with self.lock:
            if self.stopped:
                raise Stopped("the sweep stopped")
            if not retry:
                self.left -= 1
            current = (
                self.pool.pop()
                if self.pool and not retry
                else Standby(self.work_root, self.env, gated=True)
            )
            current.gate = gate
            self.running.add(current)
            if self.prewarm and not retry and self.left > len(self.pool) and not self.stopped:
                try:
                    self.pool.append(Standby(self.work_root, self.env, gated=True))
                except OSError:
                    pass  # no warm process: the next model starts its own
        return current

    def take(self, ids: tuple[int, ...], retry: bool = False) -> Standby:
        """The process for a model on devices ``ids``: the slot's warm one (a fresh one on a
        ``retry``), else a new one pinned to them; and, while models remain, the next one for the
        slot starts warming up. OSError when a process cannot be started (fork's ENOMEM, too many
        open files)."""
        with self.lock:
            if self.stopped:  # the stop came between the grant and here: start nothing
                raise Stopped("the sweep stopped")
            if not retry:
                self.left -= 1
            current = self.warm.pop(ids[0], None) if len(ids) == 1 and not retry else None
            current = current or Standby(self.work_root, self.pin(ids))
            self.running.add(current)
            # a model to come needs one, unless the slot has one already (a retry leaves the slot's
            # warm one warming: replacing it would leave that process running, owned by no one,
            # until the sweep ends)
            if (
                self.prewarm
                and ids[0] not in self.warm
                and self.left > len(self.warm)
                and not self.stopped
            ):
                try:
                    self.warm[ids[0]] = Standby(self.work_root, self.pin(ids))
                except OSError:
                    # no warm process: the next model starts its own (and says so if it cannot)
                    pass
        return current

    def done(self, standby: Standby) -> None:
        with self.lock:
            self.running.discard(standby)

    def stop(self) -> None:
        """Kill what runs and what warms up (the sweep ended early); warm up nothing more."""
        with self.lock:
            self.stopped = True
            for standby in list(self.running) + list(self.warm.values()) + self.pool:
                standby.kill()

    def discard(self) -> None:
        for standby in [*self.warm.values(), *self.pool]:
            standby.discard()


class LocalExecutor(Executor):
    """Probes in processes on this host (see the module docstring); ``work_root`` holds their
    folders."""

    name = "local"

    def __init__(
        self,
        device: str,
        workers: int,
        work_root: Path,
        budget: CacheBudget | None = None,
        prefetch: int = 1,
    ):
        super().__init__(device, workers, budget, prefetch)
        self.kind = device_kind(device)
        self.contiguous = devices.adapter_for(self.kind).aligned_blocks
        self.work_root = work_root
        self._processes: _Processes | None = None
        self._checks: host_checks.HostChecks | None = None
        self._zygote: subprocess.Popen | None = None
        # the host checks after the device phase, in a host process
        if host_checks.split_phases(self.kind):
            self.host_threads = host_checks.default_slots(workers)

    def start(self, needs: list[int]) -> None:
        accelerated = self.kind != "cpu"
        prewarm = (accelerated or self.workers < (os.cpu_count() or 1)) and max(
            needs, default=1
        ) == 1
        # torch's threads: the host's cores shared by the probes and host checks that run at once
        self.env = thread_share(self.workers + self.host_threads, os.environ)
        self._processes = _Processes(self.kind, self.work_root, prewarm, len(self.tasks), self.env)
        there, kind = self._processes.count, self.kind
        if there and self.workers > there and not devices.adapter_for(kind).shared_devices:
            raise UserError(
                f"--workers {self.workers} is more than the {there} {kind} devices here, and a "
                f"{kind} device is one process's at a time: run with --workers {there} or "
                "fewer."
            )
        too_big = self.first_too_big(needs, there) if there else None
        # more workers than devices share them; a model cannot take more devices than there are
        if too_big:
            task, need = too_big
            raise UserError(
                f"{task['model_id']} needs {need} {kind} devices and this machine has {there}."
            )
        # the probes' kernels forked from one warm process (its environment the probe processes',
        # device backend autoload off whatever a backend wrote here: backend_env); after the
        # refusals above: a refused sweep starts nothing
        self._zygote = zygote.serve_here(backend_env.child_environ(self.env))
        if self.host_threads:
            self._checks = host_checks.HostChecks(
                self.host_threads, self.work_root, prewarm, self.env
            )

    def in_phases(self, task: ProbeTask, got: Download, hold) -> TaskResult | None:
        if self._checks is None or self._processes is None:
            return None
        sweep_dir = self.work_root.parent
        return host_checks.in_phases(task, got, hold, self._processes, self._checks, sweep_dir)

    def no_probe(self, task: ProbeTask) -> None:
        assert self._processes is not None
        self._processes.skip()

    def run_one(
        self, task: ProbeTask, got: Download, ids: tuple[int, ...], retry: bool
    ) -> TaskResult:
        assert self._processes is not None
        try:
            standby = self._processes.take(ids, retry=retry)
        except OSError as exc:  # the harness, not the model: nothing was probed
            return spawn_failed(task, exc)
        try:
            result = run_task(task, standby=standby, fetched=got)
        finally:
            self._processes.done(standby)
        return result

    def kill_running(self) -> None:
        if self._processes is not None:
            self._processes.stop()
        if self._checks is not None:
            self._checks.stop()

    def finish(self) -> None:
        if self._processes is not None:
            self._processes.discard()
        if self._checks is not None:
            self._checks.discard()
        zygote.stop(self._zygote)
        self._zygote = None
