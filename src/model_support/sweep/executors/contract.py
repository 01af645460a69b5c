"""What every executor does the same way: the interface (``submit``, ``results``, ``stop``) and the
promises behind it, kept in one place so the local and Ray executors cannot drift apart.

Why it exists: a sweep's promises (downloads ahead of the probes within the cache budget, devices
handed out by the scheduler's policy, which devices each probe held in ``schedule.jsonl``, a stop
that starts nothing more, a harness failure never a verdict) used to live in the local executor
only; the Ray executor had none of them. Here the driver keeps them for both: the ``Prefetcher``
downloads in the order the scheduler hands models out (``device_order``: biggest first), a probe
asks the ``DeviceScheduler`` for its devices only once its files are there, and an executor only
says how one probe runs on the devices granted (``Executor.run_one``: a pinned local process, or a
Ray task asking for them as Ray resources).

A probe that tells nothing about its model (its kernel never started, its process could not be
spawned: ``TaskResult.problem == "harness"``) is run once more on a fresh process, then left pending
with that sentence: never a FAIL row.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator

from ...errors import UserError
from ...probe import devices
from ...probe.hub_fetch import is_local
from ..budget import CacheBudget
from ..scheduler import Devices, DeviceScheduler, SchedulerClosed, device_order, run_on_devices
from ..worker.download import Download
from ..worker.host_checks import device_times
from ..worker.prefetch import Prefetcher, PrefetchFailed
from ..worker.process import TaskResult, run_task, with_harness_retries
from ..worker.task import ProbeTask


def device_kind(device: str) -> str:
    """The kind of device a sweep's workers are pinned to (``auto`` resolved by the device
    adapters, in a child process: the runner never imports a backend)."""
    return devices.facts(device).type


def default_workers(device: str) -> int:
    """One worker per device: one process owns a TPU chip; one GPU each; CPU sweeps run one at a
    time unless asked (each probe already uses every core)."""
    return max(1, devices.facts(device).count)


def devices_needed(task: ProbeTask, devices_here: int) -> int:
    """How many devices ``task``'s probe takes: its ``devices`` setting, or for ``auto`` the
    fewest that hold the model (``sharded.plan_devices``) when the per-device memory is known to
    the runner (the ``device_memory_gb`` override, else what the device adapter reports: an
    accelerator's memory, or the host's shared by the workers on a CPU sweep); 1 when it is not."""
    from ...probe import sharded

    params = task["params"]
    wanted = str(params.get("devices", "1"))
    if wanted != "auto":
        return int(wanted)
    memory = int(float(params.get("device_memory_gb") or 0) * 1e9)
    if not memory:
        here = devices.facts(params.get("device", "auto"))
        memory = (here.memory_bytes or 0) // (devices_here if here.type == "cpu" else 1)
    count = task["hub"].get("hub_num_params") or (
        sharded.safetensors_params(task["source"]) if is_local(task["source"]) else None
    )
    if not memory or not count:
        return 1
    try:
        return sharded.plan_devices(count, params.get("dtype", "bfloat16"), memory, devices_here)
    except sharded.DoesNotFit:
        return 1  # the probe itself records why it cannot run


class Stopped(RuntimeError):
    """The sweep stopped before this probe started: nothing is run, nothing is stored for it."""


class ExecutorLost(RuntimeError):
    """The executor itself failed (the Ray cluster went away, the downloads ahead stopped): not
    any model's verdict; the sweep ends in one sentence saying what is stored and how to finish
    it."""


class Executor:
    """Run a sweep's probes: ``submit(tasks)``, then iterate ``results()`` (each ``TaskResult``
    as its probe ends); ``stop()`` (or closing the iterator: the sweep ended early, by Ctrl-C,
    SIGTERM or a full disk) kills the running probes, starts no new one and returns within
    seconds.

    ``workers`` is how many devices the driver hands out at once (a CPU sweep's virtual devices);
    ``budget`` the Hub cache budget the downloads share (None: nothing is downloaded);
    ``prefetch`` how many models each worker downloads ahead. Subclasses say how one probe runs
    (``run_one``) and how the running ones are stopped (``kill_running``)."""

    name = "base"
    #: Aligned blocks of devices only (TPU slices), for the scheduler
    #: (``DeviceScheduler(contiguous=)``).
    contiguous = False
    #: Threads beyond one per device: probes doing host work after their devices' release (host
    #: checks).
    host_threads = 0

    def __init__(
        self, device: str, workers: int, budget: CacheBudget | None = None, prefetch: int = 1
    ):
        self.device, self.workers, self.budget, self.prefetch = device, workers, budget, prefetch
        self.tasks: list[ProbeTask] = []
        self.stopped = threading.Event()
        self._downloads: Prefetcher | None = None
        self._scheduler: DeviceScheduler | None = None

    def submit(self, tasks: list[ProbeTask]) -> None:
        """Queue ``tasks`` (before ``results``, which refuses in one sentence, before any probe
        runs, a task that can never run: more devices than the sweep has, or under Ray than any
        node has)."""
        self.tasks.extend(tasks)

    def first_too_big(self, needs: list[int], capacity: int) -> tuple[ProbeTask, int] | None:
        """The first task (and its need) that needs more than ``capacity`` devices; None when
        none does."""
        return next(
            ((task, need) for task, need in zip(self.tasks, needs) if need > capacity), None
        )

    def refuse_too_big(self, needs: list[int], capacity: int) -> None:
        too_big = self.first_too_big(needs, capacity)
        if too_big:
            task, need = too_big
            raise UserError(
                f"{task['model_id']} needs {need} devices and the sweep has {capacity}; run it "
                f"with --workers {need} or more (one per device)."
            )

    def needs(self) -> list[int]:
        return [devices_needed(task, self.workers) for task in self.tasks]

    def results(self) -> Generator[TaskResult, None, None]:
        """The probes' results as they end (see ``scheduler.run_on_devices``); closing it stops
        the sweep."""
        needs = self.needs()
        # before the downloads: they follow it
        order = device_order(range(len(self.tasks)), needs.__getitem__)
        self.tasks, needs = [self.tasks[i] for i in order], [needs[i] for i in order]
        self.refuse_too_big(needs, self.workers)
        self.start(needs)
        self._downloads = Prefetcher(
            self.tasks, self.workers * (1 + self.prefetch), self.budget, threads=self.workers
        )
        self._scheduler = DeviceScheduler(self.workers, contiguous=self.contiguous)
        try:
            yield from run_on_devices(
                range(len(self.tasks)),
                needs.__getitem__,
                self._scheduler,
                self._probe,
                self.stop,
                threads=self.workers + self.host_threads,
            )
        finally:
            self.stop()
            self.finish()

    def _probe(self, index: int, hold: Devices) -> TaskResult:
        task = self.tasks[index]
        assert self._downloads is not None  # results() made it
        try:
            got = self._downloads.wait(index)
        # no model can come: the sweep ends with that error, not a wait forever
        except PrefetchFailed as exc:
            raise ExecutorLost(str(exc)) from exc
        try:
            if self.stopped.is_set():
                raise Stopped(task["model_id"])
            # pending, excluded or no loadable weights: no process, no device
            if got.kind != "ready":
                self.no_probe(task)
                return run_task(task, fetched=got)
            try:
                # the devices held for the device phase only
                phased = self.in_phases(task, got, hold)
                if phased is not None:
                    return phased
                with hold() as grant:
                    return self._on_devices(task, got, grant.ids)
            except SchedulerClosed:
                raise Stopped(task["model_id"]) from None
        finally:
            self._downloads.done(index, got)

    def _on_devices(self, task: ProbeTask, got: Download, ids: tuple[int, ...]) -> TaskResult:
        """One probe on the devices granted, run again on a fresh process when its kernel never
        started."""

        def attempt(fresh: bool) -> TaskResult:
            if self.stopped.is_set():
                raise Stopped(task["model_id"])
            started = time.time()
            result = self.run_one(task, got, ids, retry=fresh)
            held = {"devices": list(ids), "start": started, "end": time.time()}
            # its device phase too
            result.schedule = {**held, **(result.schedule or {}), **device_times(result)}
            return result

        return with_harness_retries(attempt)

    def stop(self) -> None:
        """Start nothing more and kill what runs (idempotent; called when ``results`` is closed)."""
        self.stopped.set()
        if self._scheduler is not None:
            self._scheduler.close()
        self.kill_running()
        if self._downloads is not None:
            self._downloads.close()

    # -- what an executor says for itself --
    def start(self, needs: list[int]) -> None:
        """Before the first probe (the tasks are in their order, each needing ``needs[i]``
        devices)."""

    def no_probe(self, task: ProbeTask) -> None:
        """``task`` needs no process (its download gave no files to probe)."""

    def run_one(
        self, task: ProbeTask, got: Download, ids: tuple[int, ...], retry: bool
    ) -> TaskResult:
        """Probe ``task`` on devices ``ids`` with its downloaded files ``got``; ``retry``: a
        fresh process."""
        raise NotImplementedError

    def in_phases(self, task: ProbeTask, got: Download, hold: Devices) -> TaskResult | None:
        """Probe ``task`` holding its devices (``hold``) for its device phase only, its host
        checks after the release (``worker.host_checks``); None where this executor runs both in
        the hold (``run_one``)."""
        return None

    def kill_running(self) -> None:
        """Stop the running probes now (the sweep ended early)."""

    def finish(self) -> None:
        """After the last result (or the stop): release what ``start`` took."""
