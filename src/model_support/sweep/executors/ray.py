"""The Ray executor: each probe a Ray task asking for its devices as Ray resources, with the local
executor's promises kept on the driver (``executors.contract``).

What differs from local, and why:
- Devices: the driver's scheduler hands out ``workers`` devices (by default the cluster's count of
  the device's Ray resource) in ``device_order``, and a granted probe becomes a Ray task asking for
  them (``ray_resources``: ``num_gpus``, ``{"TPU": N}``, N CPUs); Ray picks the node and pins the
  task (it sets the visibility variable). A request that no node of the cluster can satisfy would
  wait in Ray forever: it is refused before anything runs, as the local executor refuses a model
  needing more devices than the sweep has.
- Downloads: the driver's prefetcher downloads ahead within the cache budget, and a task gets the
  snapshot's path (the task makes no budget of its own, so it never deletes files another probe on
  the host still reads). On a cluster of several hosts the cache folder (``cache.dir``) must be one
  they share.
- ``schedule.jsonl``: the devices the driver granted, when, and the node and accelerator ids Ray
  gave.
- Phases: on an accelerator a model is two tasks (``in_phases``), as two processes are under local:
  the device phase, holding its devices, then the host checks, of one CPU, after the driver's grant
  went to the next model. One task for both would hold the devices until it returned, checks
  included.
- Kernels: Ray reuses a worker process for task after task, so a worker's first probe starts a
  zygote (``engine.zygote``) that its next probes' kernels are forked from, as the local executor's
  are from its one zygote per sweep (``_kernels_forked_here``); the zygote dies with the worker.
- A task whose Ray worker or node was lost under it (``WorkerCrashedError``, ``NodeDiedError``, its
  result lost with its node: ``_lost``) has told nothing about its model, as a kernel that never
  started has not under local: it is run once more on a fresh task, then left pending with the cause
  (``--resume`` probes it), never a FAIL row. A rerun that tells says so (``_where_it_ran``): its
  record's ``reran_after``, the first line of its log and its ``schedule.jsonl`` row name why the
  first run told nothing. The model's kernel is a process of its own under the worker, so the worker
  itself dying is not the model (a kernel that dies is the model's row, as under local). Ray's
  memory monitor (``OutOfMemoryError``) kills the most recently started task when the node runs low,
  not the one using the memory: a probe it kills is run again too, and only a rerun killed while no
  other task of the sweep ran is the model's out-of-memory row (FAIL(other), the host's memory);
  else it is left pending saying so. Losing the cluster ends the sweep in one sentence. On a stop
  every outstanding task is cancelled (its process tree killed) before the driver lets go of the
  cluster.
- The stack travels with the task (``carried_environ``, ``stack_here``): a Ray worker inherits its
  node's environment (how ``ray start`` was run there), not the driver's, so each task is handed, in
  its arguments, the driver's values of the variables that make the stack: every registered backend
  adapter's configuration (``config_vars``: ``LIBTPU_INIT_ARGS``, ``TPU_*``, ``XLA_FLAGS``), the
  project's own settings (``MODEL_SUPPORT_*`` but the per-process ones, ``HF_*``, tokens) and the
  names of the sweep's ``stacks:`` env. The task sets them in its worker for its run, unsets each
  such variable the driver does not have (a node's own configuration never decides a verdict), and
  puts the worker's back after. Arguments, not ``runtime_env``: Ray's ``env_vars`` can set a
  variable but never unset one, and a task's arguments reach the task's process before it reads
  anything (its probe's kernel and zygote are started from it). A token travels as its variable
  only: nothing records it.
- Joining (``_connect``, ``ray_cluster``): the address is asked before ``ray.init`` (nothing there,
  no Ray head, a token the driver lacks: one sentence each, with the fix), the driver joins in the
  cluster's authentication mode, and the sweep's folder keeps the address (``ray.json``) for a plain
  ``--resume``. A local Ray is started as one (``address="local"``: never a cluster an admin started
  on this host that Ray would find and join instead).
- Capacity and the nodes, when the driver joins (``_connect``): ``--workers`` above the devices the
  cluster has now (its CPUs on a CPU sweep) is capped to them, saying so; a device no node has is
  refused naming the ``ray start`` option that gives it; every alive node is asked, by a task pinned
  to it (``ray_nodes.node_stack``), for its versions of the stack's packages (python, torch,
  transformers, model_support, the backend's) and a digest of the project's own code
  (``code_digest``: its version is always 0.1.0; ``WHERE``), and a node that differs from the driver
  is refused in one sentence naming it and what differs before any probe runs. A node that joins
  later is checked by the first task Ray gives it (``refused_here``): one that differs runs no probe
  (the model is run again, then left pending naming the node).
- Where it ran: each record names its node (``ray_node``; ``host`` is the node's host name), and
  ``schedule.jsonl`` the node's id and host.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ... import backend_env
from ...engine import zygote
from ...errors import UserError
from ...probe import devices
from ..budget import CacheBudget
from ..worker import host_checks
from ..worker.download import Download
from ..worker.process import (
    Standby,
    TaskResult,
    harness_pending,
    run_task,
    runner_failure,
    with_harness_retries,
)
from ..worker.task import ProbeTask
from .contract import Executor, ExecutorLost, Stopped, devices_needed
from .ray_cluster import RECORD, check_ray_address, put_back_auth, remember, use_auth
from .ray_nodes import (
    Checked,
    capped_words,
    carried_environ,
    check_nodes,
    first_line,
    refused_here,
    stack_here,
)
from .ray_resources import (
    local_auto_device,
    ray_auto_device,
    ray_resources,
    unsatisfiable,
    unsatisfiable_words,
)

#: The loopback address a local Ray binds to: it has no other node, so nothing beyond this host need
#: reach it.
LOOPBACK = "127.0.0.1"
#: ``ray.init``'s arguments for a local Ray (``RAY_ADDRESS`` unset): its processes (GCS, raylet,
#: workers, agents) on the loopback address only, no dashboard, the workers' output kept out of the
#: sweep's terminal.
LOCAL_RAY: dict[str, Any] = {
    "_node_ip_address": LOOPBACK,
    "include_dashboard": False,
    "dashboard_host": LOOPBACK,
    "log_to_driver": False,
}


@contextmanager
def _loopback_only() -> Iterator[None]:
    """While a local Ray starts: keep its loopback ``_node_ip_address``. On Linux Ray replaces a
    loopback node address with the host's reachable one, so that other nodes can join (and its
    processes then listen on every interface); it keeps it where clusters are off
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``, read when Ray is imported: its constant is set here
    for the start). A local Ray of a sweep has no other node."""
    from ray._private import ray_constants

    before = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    if before is None:  # a Ray without the switch: its own default
        yield
        return
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


#: The zygotes this Ray worker process started (``_kernels_forked_here``), kept for the tasks it
#: runs next.
_ZYGOTES: list = []


def _kernels_forked_here() -> None:
    """In a Ray worker: unless a zygote already serves this worker's kernels, start one (it dies
    with the worker) and name it, so that this probe's kernel and those of the next tasks Ray
    gives this worker are forks of it. A task whose environment differs (Ray sets
    ``OMP_NUM_THREADS`` per task from its CPUs) gets a zygote of its own, or a fresh kernel where
    none can serve (``zygote.serve_here``)."""
    if any(started.poll() is not None for started in _ZYGOTES):
        # one ended by itself (a CUDA or ROCm build of torch, where none serves): fresh kernels from
        # now on
        return
    # the autoload off, whatever a backend wrote
    started = zygote.serve_here(backend_env.child_environ())
    if started is not None:
        _ZYGOTES.append(started)


def _probe_on_ray(
    task: ProbeTask,
    got: Download,
    carried: dict[str, str],
    extra: tuple[str, ...],
    checked: Checked | None = None,
) -> TaskResult:
    """The Ray task: the probe with the files the driver downloaded, in the driver's stack
    (``stack_here``), on a node that runs it (``refused_here``); where it ran and what Ray gave
    it, for schedule.jsonl and the record."""
    import ray

    refused = refused_here(checked)
    if refused:
        result = harness_pending(task, refused)
    else:
        with stack_here(carried, extra):
            _kernels_forked_here()
            result = run_task(task, fetched=got)
    context = ray.get_runtime_context()
    given = {name: list(ids) for name, ids in context.get_accelerator_ids().items() if ids}
    where = {"node": context.get_node_id(), "host": socket.gethostname()}
    result.schedule = {**where, **({"ray_devices": given} if given else {})}
    return result


def _checks_on_ray(
    task: ProbeTask,
    state: dict,
    carried: dict[str, str],
    extra: tuple[str, ...],
    checked: Checked | None = None,
) -> TaskResult:
    """The Ray task of a probe's host checks, after its device phase gave its devices back: a
    process pinned to no device (the task asks Ray for a CPU only), on whichever node Ray picks
    that runs it, in the driver's stack; the driver finishes the row."""
    import ray

    refused = refused_here(checked)
    if refused:
        return TaskResult(None, None, f"{refused}\n", pending=refused, problem="harness")
    with stack_here(carried, extra):
        _kernels_forked_here()
        try:
            standby = Standby()
        except OSError as exc:
            return host_checks.no_host_process(exc)
        done = host_checks.run_checks(standby, task, state)
    done.schedule = {"checks_node": ray.get_runtime_context().get_node_id()}
    return done


class Session:
    """One Ray connection for a whole run of a sweep (the runner's): its passes, one per
    ``stacks:`` entry, and its rounds of reruns each make an executor, and each joined the
    cluster (or started a local Ray) and let go again: a new Ray job every time, so new workers
    on every node, each importing the stack and starting its kernels' zygote again. The first
    executor of a session joins; the later ones use that Ray; the session lets go when the run
    ends (``close``)."""

    def __init__(self) -> None:
        self.joined = False
        self.auth_before: str | None = None

    def close(self) -> None:
        """Let go of the Ray this session's first executor joined or started (nothing where none
        did)."""
        if self.joined:
            import ray

            self.joined = False
            ray.shutdown()
            put_back_auth(self.auth_before)


@contextmanager
def session(executor: str) -> Iterator[Session | None]:
    """A ``Session`` for a run of a sweep on ``executor`` ("ray"; None for any other), closed
    when the run ends."""
    if executor != "ray":
        yield None
        return
    joined = Session()
    try:
        yield joined
    finally:
        joined.close()


class RayExecutor(Executor):
    """Probes as Ray tasks (see the module docstring). Joins the cluster at ``address`` (the
    runner's: RAY_ADDRESS, or where a resumed sweep ran; ``ray_cluster.address_to_join``), else
    starts a local Ray on the loopback address only (``LOCAL_RAY``, ``_local_resources``);
    ``workers`` None: the cluster's device count."""

    name = "ray"

    def __init__(
        self,
        device: str,
        workers: int | None,
        budget: CacheBudget | None = None,
        prefetch: int = 1,
        work_root: Path | None = None,
    ):
        super().__init__(device, workers or 0, budget, prefetch)
        self._asked_workers = workers
        self._refs: set = set()
        self._refs_lock = threading.Lock()
        self._started_here = False
        self._remote: Any = None
        self._checks_remote: Any = None
        # where device phases are kept
        self.sweep_dir = work_root.parent if work_root is not None else None
        #: The names of the sweep's ``stacks:`` env (the runner's): they travel with each task too
        #: (``carried_environ``).
        self.stack_names: tuple[str, ...] = ()
        #: The cluster to join (the runner's); None: a local Ray.
        self.address: str | None = os.environ.get("RAY_ADDRESS") or None
        self._auth_before: str | None = None
        #: The run's ``Session`` (the runner's): the Ray this executor joins stays joined for the
        #: run's next ones.
        self.session: Session | None = None
        self._checked: Checked | None = None
        #: Why a probe's first run told nothing, by (model, variant), until its rerun says so
        #: (``_where_it_ran``).
        self._first_runs: dict[tuple[str, str | None], str] = {}

    def _stack(self) -> tuple[dict[str, str], tuple[str, ...]]:
        """What a task carries of the driver's stack now (its pass's ``stacks:`` env set: the
        runner's), and the names of the sweep's ``stacks:`` env (set or unset in the task as on
        the driver)."""
        return carried_environ(self.stack_names), self.stack_names

    def results(self) -> Generator[TaskResult, None, None]:
        import_ray()
        try:
            # in the try: a sweep refused after joining (its nodes, its devices) lets go too
            self._connect()
            yield from super().results()
        finally:
            if self._started_here and self.session is None:
                import ray

                ray.shutdown()
                put_back_auth(self._auth_before)

    def _join(self) -> None:
        """Join the cluster at ``address`` in its authentication mode, or start a local Ray
        (never a cluster Ray finds by itself: ``address="local"``); keep which in the sweep's
        folder (``ray_cluster.remember``)."""
        import ray

        address = self.address
        # one sentence for what ray.init would retry on
        auth = check_ray_address(address) if address else None
        self._auth_before = use_auth(auth)
        try:
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                with _loopback_only():
                    ray.init(address="local", **LOCAL_RAY, **self._local_resources())
        except Exception as exc:  # noqa: BLE001 - whatever Ray raised, the sweep ends in one sentence
            put_back_auth(self._auth_before)
            where = f"the Ray cluster at {address}" if address else "a local Ray"
            raise UserError(
                f"Could not start or join {where} ({first_line(exc)}); start it (`ray start "
                "--head`), fix RAY_ADDRESS, or run with --executor local."
            ) from None
        self._started_here = True
        if self.session is not None:  # the run lets go of it at its end
            self.session.joined, self.session.auth_before = True, self._auth_before
        if address == "auto":  # the cluster Ray found: its head's address, for a resume
            address = ray.get_runtime_context().gcs_address
        remember(self.sweep_dir, address)

    def _connect(self) -> None:
        import ray

        if not ray.is_initialized():
            self._join()
        elif not (self.sweep_dir and (self.sweep_dir / RECORD).exists()):
            # a process already connected (a notebook's, a test's Ray): the sweep ran there, so a
            # resume joins it
            remember(self.sweep_dir, ray.get_runtime_context().gcs_address)
        cluster = ray.cluster_resources()
        if self.device == "auto":
            self.device = ray_auto_device(cluster)
        resource = devices.adapter_for(self.device).ray_resource or "CPU"
        have = int(cluster.get(resource, 0))
        if not self.workers:  # one per device of the cluster (its CPUs on a CPU sweep)
            self.workers = max(1, have)
        # a model needing more than any node has: refused as such, before any cap
        self.start(self.needs())
        # more at once would wait in Ray's queue holding the driver's grants
        if have and self.workers > have:
            print(capped_words(self.workers, have, resource), file=sys.stderr)
            self.workers = have
        self._checked = check_nodes(self.device)
        self._remote = ray.remote(_probe_on_ray)
        self._checks_remote = ray.remote(_checks_on_ray)
        if self.sweep_dir is not None and host_checks.split_phases(self.device):
            # the host checks, as Ray tasks of a CPU
            self.host_threads = host_checks.default_slots(self.workers)

    def _local_resources(self) -> dict:
        """A local Ray's resources: on a CPU sweep ``workers`` CPUs (its devices); on an
        accelerator a CPU for each device's probe and for its host checks, and the devices of an
        adapter whose Ray resource Ray does not find by itself (a custom resource an adapter
        names; Ray finds GPUs and TPU chips). Device ``auto`` is resolved here, before the local
        Ray starts (``local_auto_device``): read from the started Ray, it came too late, and an
        accelerator sweep's local Ray had the one CPU of a CPU sweep (one probe at a time, its
        checks waiting)."""
        if self.device == "auto":
            self.device = local_auto_device()
        if self.device == "cpu":
            return {"num_cpus": self._asked_workers or 1}
        count = devices.facts(self.device).count
        local: dict = {
            "num_cpus": max(os.cpu_count() or 1, 2 * (self._asked_workers or count or 1))
        }
        resource = devices.adapter_for(self.device).ray_resource
        if resource not in (None, "CPU", "GPU", "TPU"):
            local["resources"] = {resource: count}
        return local

    def needs(self) -> list[int]:
        return [devices_needed(task, self.workers) for task in self.tasks]

    def start(self, needs: list[int]) -> None:
        """Refuse a request no node can satisfy (Ray would keep it waiting forever): the
        cluster's own devices, not the driver's, decide (``unsatisfiable_words``)."""
        import ray

        nodes = ray.nodes()
        for task, need in zip(self.tasks, needs):
            wanted = ray_resources(self.device, need)
            if unsatisfiable(wanted, nodes):
                raise UserError(
                    unsatisfiable_words(task["model_id"], self.device, need, wanted, nodes)
                )

    def run_one(
        self, task: ProbeTask, got: Download, ids: tuple[int, ...], retry: bool
    ) -> TaskResult:
        """The probe as a Ray task; a worker lost under it is the harness's
        (``with_harness_retries`` runs it again on a fresh task, then leaves it pending), and so
        is a memory kill, but on a rerun (``retry``) that ran alone, which is the model's (module
        docstring)."""
        started = time.time()

        def died(exc: BaseException, others: int) -> TaskResult:
            if _killed_for_memory(exc) and retry and not others:
                return _out_of_memory(task, got, exc, started)
            return harness_pending(
                task, _lost_words(exc, others), "".join(f"{line}\n" for line in got.log)
            )

        resources = ray_resources(self.device, len(ids))
        result = self._call(
            self._remote, resources, task, died, task, got, *self._stack(), self._checked
        )
        return self._where_it_ran(task, result, retry)

    def _where_it_ran(self, task: ProbeTask, result: TaskResult, retry: bool) -> TaskResult:
        """``result`` saying where it ran: its record's (and its checks' record's) ``ray_node``;
        a rerun (``retry``) after a first run that told nothing (a lost worker or node, a kernel
        that never started) says why in its record's ``reran_after``, its log's first line and
        its schedule row. A first run that told nothing is kept for its rerun."""
        key = (task["model_id"], task.get("variant"))
        if result.problem == "harness":
            if not retry:
                self._first_runs[key] = result.pending or "its first run told nothing"
            return result
        first = self._first_runs.pop(key, None) if retry else None
        node = (result.schedule or {}).get("node")
        for record in (result.record, (result.checks or {}).get("record")):
            if record is not None:
                record["ray_node"] = node
                if first:
                    record["reran_after"] = first
        if first:
            result.log = (
                f"ran again on a fresh Ray task: its first run told nothing ({first})\n{result.log}"
            )
            result.schedule = {**(result.schedule or {}), "reran_after": first}
        return result

    def in_phases(self, task: ProbeTask, got: Download, hold) -> TaskResult | None:
        """A probe of a split sweep: its device phase as a Ray task holding its devices (their
        grant held for it only), then its host checks as a Ray task of a CPU while the devices
        serve the next model; or, when an earlier run of the sweep kept its device phase, its
        checks only (``worker.host_checks``, as local)."""
        if not self.host_threads or self.sweep_dir is None:
            return None

        def device_phase(phased: ProbeTask) -> TaskResult:
            with hold() as grant:
                return self._on_devices(phased, got, grant.ids)

        def host(phase: TaskResult, load_from: str | None) -> TaskResult:
            return self._host_checks(task, phase, load_from)

        return host_checks.two_phases(task, got, self.sweep_dir, device_phase, host)

    def _host_checks(
        self, task: ProbeTask, phase: TaskResult, load_from: str | None = None
    ) -> TaskResult:
        state = host_checks.check_state(phase, load_from)

        # the verdict stands, with a note (as locally)
        def died(exc: BaseException, others: int) -> TaskResult:
            why = f"the Ray worker running the host checks ended: {first_line(exc)}"
            return TaskResult(None, None, f"{why}\n", pending=why)

        # each a fresh task and host process: a kernel that never started
        def attempt(fresh: bool) -> TaskResult:
            resources = {"num_cpus": 1}
            return self._call(
                self._checks_remote,
                resources,
                task,
                died,
                task,
                state,
                *self._stack(),
                self._checked,
            )

        began = time.time()
        done = with_harness_retries(attempt)
        return host_checks.finished(phase, done, state, began, time.time())

    def _call(
        self,
        remote: Any,
        resources: dict,
        task: ProbeTask,
        died: Callable[[BaseException, int], TaskResult],
        *args: Any,
    ) -> TaskResult:
        """``remote(*args)`` as a Ray task asking for ``resources``, its result; ``died(exc,
        others)`` says what a worker lost under it (``_lost``, or killed for memory while
        ``others`` tasks of the sweep ran) means for ``task``. Stopped when the sweep stopped;
        ExecutorLost when the cluster went."""
        import ray

        assert remote is not None
        went: tuple[type[BaseException], ...] = (*_lost(), ray.exceptions.OutOfMemoryError)
        with self._refs_lock:
            if self.stopped.is_set():
                raise Stopped(task["model_id"])
            ref = remote.options(max_retries=0, **resources).remote(*args)
            self._refs.add(ref)
        try:
            return ray.get(ref)
        except ray.exceptions.TaskCancelledError:
            raise Stopped(task["model_id"]) from None
        except went as exc:
            if self.stopped.is_set():
                raise Stopped(task["model_id"]) from None
            with self._refs_lock:
                others = len(self._refs) - 1
            return died(exc, others)
        except ray.exceptions.RayTaskError:
            raise  # run_task raised: a bug of ours, shown as it is
        except ray.exceptions.RayError as exc:
            if self.stopped.is_set():
                raise Stopped(task["model_id"]) from None
            raise ExecutorLost(
                f"the Ray cluster failed while probing {task['model_id']} ({first_line(exc)})"
            ) from exc
        finally:
            with self._refs_lock:
                self._refs.discard(ref)

    def kill_running(self) -> None:
        """Cancel every outstanding task, its process tree with it (``force``)."""
        import ray

        with self._refs_lock:
            refs = list(self._refs)
        for ref in refs:
            try:
                ray.cancel(ref, force=True)
            except (ray.exceptions.RayError, ValueError, TypeError):
                pass  # already finished


def _lost() -> tuple[type[BaseException], ...]:
    """Ray's words for a task whose worker or node went away under it (or its result with its
    node): the harness lost, nothing said about the model. (``LocalRayletDiedError``, the
    driver's own node, is the cluster lost.)"""
    import ray

    errors = ray.exceptions
    return (
        errors.WorkerCrashedError,
        errors.NodeDiedError,
        errors.ActorDiedError,
        errors.ObjectLostError,
    )


def _killed_for_memory(exc: BaseException) -> bool:
    """Whether Ray's memory monitor killed the task (the node ran low on memory), not the worker
    or node dying."""
    import ray

    return isinstance(exc, ray.exceptions.OutOfMemoryError)


def _lost_words(exc: BaseException, others: int) -> str:
    """Why a probe whose Ray worker went under it was not probed, in one line
    (``harness_pending``'s reason)."""
    if not _killed_for_memory(exc):
        return f"the Ray worker running the probe was lost ({first_line(exc)})"
    beside = (
        f" while {others} other task{'s' if others != 1 else ''} of the sweep ran" if others else ""
    )
    return (
        f"Ray's memory monitor killed the probe{beside} (its node ran low on memory, and Ray "
        "kills the most recently started task, not the one using the memory: run fewer "
        f"workers per node) ({first_line(exc)})"
    )


def _out_of_memory(
    task: ProbeTask, got: Download, exc: BaseException, started: float
) -> TaskResult:
    """The model's row when Ray's memory monitor killed its rerun while no other task of the
    sweep ran: the model took the node's host memory, FAIL(other) at stage runner as a kernel
    killed for memory is under local."""
    task = {**task, "facts": {**task.get("hub", {}), **got.fields}}
    message = (
        "Ray's memory monitor killed the probe on its rerun, with no other task of the sweep "
        f"running: the model ran its node out of host memory ({first_line(exc)})"
    )
    log = "".join(f"{line}\n" for line in got.log) + f"{message}\n"
    record = runner_failure(task, "RayOutOfMemory", message, log, started)
    return TaskResult(record, None, log, task["model_id"], task.get("variant"))


def import_ray() -> None:
    """Ray, or the sentence that says how to install it."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise UserError(
            "The ray executor needs Ray; install it with `pip install -e '.[ray]'`."
        ) from None
