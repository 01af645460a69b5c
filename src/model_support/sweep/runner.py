"""Run a sweep: one probe notebook per model, resumable, several at once, locally or on Ray.

The driver writes ``sweep.json`` first, then hands each model without a record to an executor and
stores every result as it comes back (notebook and log, then the record: its presence means done).
Killing the driver at any point loses nothing that was stored and duplicates nothing: ``--resume``
runs exactly the models that have no record yet. At the end the records are compacted into the
sweep's Parquet files (the same ``store.compact`` that ``aggregate.ipynb`` calls).
"""

from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Generator
from pathlib import Path

from ..errors import StorageFull, UserError
from ..probe import devices, probe_params, provenance
from ..probe.devices import pinning_env
from ..probe.hub_fetch import is_local
from ..record import schema, store
from ..record.sweep_meta import SweepMeta, new_sweep_id
from .budget import CacheBudget
from .definition import SweepParams
from .diskspace import check_room, disk_words, relative_to_data
from .scheduler import Devices, DeviceScheduler, device_order, run_on_devices
from .worker.prefetch import Prefetcher
from .worker.process import Standby, TaskResult, run_task
from .worker.task import ProbeTask


def default_workers(device: str) -> int:
    """One worker per device: one process owns a TPU chip; one GPU each; CPU sweeps run one at a time
    unless asked (each probe already uses every core)."""
    return max(1, devices.facts(device).count)


def device_kind(device: str) -> str:
    """The kind of device a sweep's workers are pinned to (``auto`` resolved by the device adapters, in a
    child process: the runner never imports a backend)."""
    return devices.facts(device).type


def devices_needed(task: ProbeTask, devices_here: int) -> int:
    """How many devices ``task``'s probe takes: its ``devices`` setting, or for ``auto`` the fewest that
    hold the model (``sharded.plan_devices``) when the per-device memory is known to the runner (the
    ``device_memory_gb`` override, else what the device adapter reports: an accelerator's memory, or the
    host's shared by the workers on a CPU sweep); 1 when it is not."""
    from ..probe import sharded

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


class SweepLock:
    """One runner per sweep at a time (a second ``--resume`` of a running sweep is refused)."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / ".lock"

    def __enter__(self):
        self.handle = open(self.path, "a+")
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.handle.close()
            raise UserError(
                f"Sweep folder {self.path.parent} is being written by another running sweep; wait for it to finish."
            ) from None
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()


def build_tasks(meta: SweepMeta) -> list[ProbeTask]:
    """One task per model and variant from the sweep's saved settings (sweep.json is the truth on
    resume), model by model: a model's variants run one after another, on its downloaded files."""
    tasks: list[ProbeTask] = []
    cache = meta.cache or {}
    for model, combo in ((m, c) for m in meta.models for c in probe_params.combinations(meta.matrix)):
        tasks.append(
            {
                "sweep_id": meta.sweep_id,
                "model_id": model.model_id,
                "source": model.source,
                "params": {**meta.probe, **model.overrides, **combo},
                "variant": probe_params.variant({**meta.probe, **model.overrides, **combo}),
                "timeout_s": model.timeout_s or meta.timeout_s,
                "notebook_path": store.notebook_relpath(
                    meta.sweep_id, model.model_id, probe_params.variant({**meta.probe, **model.overrides, **combo})
                ),
                "scrub": {model.source: model.model_id} if model.source != model.model_id else {},
                "hub": {k: model.hub.get(k) for k in schema.HUB_FIELDS if k in model.hub},
                "planned_bytes": model.hub.get("planned_bytes"),
                "cache_dir": cache.get("dir") or "",
                "keep_cache": bool(cache.get("keep", False)),
            }
        )
    return tasks


def tasks_to_run(data_dir: Path, meta: SweepMeta) -> list[ProbeTask]:
    """The (model, variant)s with no record yet: what this run of the sweep probes. Two words, two things:
    a model is *pending* when the environment kept it from being probed (``pending.json``: the network,
    the disk); a model with no record for any reason, pending or never reached, is *to run* (the report's
    "not probed" and "not tested")."""
    return [
        t
        for t in build_tasks(meta)
        if not store.record_file(data_dir, meta.sweep_id, t["model_id"], t["variant"]).exists()
    ]


class _Processes:
    """A local sweep's probe processes: for each device slot, one warming up for its next model
    (``worker.process.Standby``) while models remain to be handed out, and the ones running (stopped at
    once when the sweep ends early)."""

    def __init__(self, kind: str, work_root: Path, prewarm: bool, models: int):
        self.kind, self.work_root, self.prewarm = kind, str(work_root), prewarm
        self.left = models  # models not handed out yet: a standby is started only for one of them
        self.warm: dict[int, Standby] = {}
        self.running: set[Standby] = set()
        self.lock = threading.Lock()

    def skip(self) -> None:
        """A model that needs no process (its download did not give files to probe)."""
        with self.lock:
            self.left -= 1

    def take(self, ids: tuple[int, ...]) -> Standby:
        """The process for a model on devices ``ids``: the slot's warm one, else a new one pinned to them;
        and, while models remain, the next one for the slot starts warming up."""
        with self.lock:
            self.left -= 1
            current = self.warm.pop(ids[0], None) if len(ids) == 1 else None
            current = current or Standby(self.work_root, pinning_env(self.kind, ids))
            if self.prewarm and self.left > len(self.warm):  # a model still to come will need a process
                self.warm[ids[0]] = Standby(self.work_root, pinning_env(self.kind, ids))
            self.running.add(current)
        return current

    def done(self, standby: Standby) -> None:
        with self.lock:
            self.running.discard(standby)

    def stop(self) -> None:
        """Kill what runs and what warms up (the sweep ended early)."""
        with self.lock:
            for standby in list(self.running) + list(self.warm.values()):
                standby.kill()

    def discard(self) -> None:
        for standby in self.warm.values():
            standby.discard()


def run_local(
    tasks: list[ProbeTask],
    workers: int,
    device: str,
    work_root: Path,
    budget: CacheBudget | None = None,
    prefetch: int = 1,
) -> Generator[TaskResult, None, None]:
    """N probes at once on ``workers`` devices (a CPU sweep's workers are its virtual devices), scheduled
    by ``scheduler.run_on_devices``: biggest models first, each probe taking the devices it needs
    (``devices_needed``) from the device scheduler (``scheduler.DeviceScheduler``: first come first
    served, smaller models backfilling devices a bigger waiting one cannot use yet, never delaying it)
    and pinned to them.

    Downloads run ahead of the probes (``worker.prefetch.Prefetcher``: ``prefetch`` models ahead per
    worker, within the cache ``budget``), outside the probes' timed stages and before a probe asks for
    its devices. Each slot also keeps the process for its next model warming up (``_Processes``:
    kernel started, torch and transformers imported) while the current model runs, only where it has a
    core to itself: on accelerators (the host is mostly idle while the device computes) or when there
    are fewer CPU workers than cores. A CPU sweep that already fills every core gains nothing from it."""
    kind = device_kind(device)
    accelerated = kind != "cpu"
    needs = [devices_needed(task, workers) for task in tasks]
    order = device_order(range(len(tasks)), needs.__getitem__)  # before the downloads: they follow it
    tasks, needs = [tasks[i] for i in order], [needs[i] for i in order]
    too_big = [(task, need) for task, need in zip(tasks, needs) if need > workers]
    if too_big:
        task, need = too_big[0]
        raise UserError(
            f"{task['model_id']} needs {need} devices and the sweep has {workers}; run it with "
            f"--workers {need} or more (one per device)."
        )
    prewarm = (accelerated or workers < (os.cpu_count() or 1)) and max(needs, default=1) == 1
    processes = _Processes(kind, work_root, prewarm, len(tasks))
    downloads = Prefetcher(tasks, workers * (1 + prefetch), budget, threads=workers)

    def probe(index: int, hold: Devices) -> TaskResult:
        task, got = tasks[index], downloads.wait(index)
        try:
            if got.kind != "ready":  # pending, excluded or no loadable weights: no process, no device
                processes.skip()
                return run_task(task, fetched=got)
            with hold() as grant:
                started = time.time()
                standby = processes.take(grant.ids)
                try:
                    result = run_task(task, standby=standby, fetched=got)
                finally:
                    processes.done(standby)
                result.schedule = {"devices": list(grant.ids), "start": started, "end": time.time()}
                return result
        finally:
            downloads.done(index, got)

    def stop() -> None:  # the sweep ended early: the running probes and the downloads stop now
        processes.stop()
        downloads.close()

    scheduler = DeviceScheduler(workers, contiguous=devices.adapter_for(kind).aligned_blocks)
    try:
        yield from run_on_devices(range(len(tasks)), needs.__getitem__, scheduler, probe, on_stop=stop)
    finally:
        processes.discard()


def check_ray_device(device: str) -> None:
    """Refuse, in one sentence, a device the Ray executor cannot hand out (its adapter names no Ray
    resource): its probes would reserve no device and share whichever they find (out of memory,
    attributed to the model). "auto" is the cluster's (``ray_auto_device``)."""
    if device != "auto" and devices.adapter_for(device).ray_resources(1) is None:
        raise _not_on_ray(device)


def _not_on_ray(device: str) -> UserError:
    held = [name for name, cls in devices.registered().items() if cls.ray_resource]
    return UserError(
        f"The ray executor holds devices as Ray resources, which Ray has for {' and '.join(held)} devices only, "
        f"not for {device!r} devices: run this sweep with --executor local (it pins each probe to its own "
        f"{device} device), or use device {', '.join(['auto', 'cpu', *held[:-1]])} or {held[-1]}."
    )


def ray_auto_device(cluster: dict) -> str:
    """Device "auto" on a Ray cluster (``ray.cluster_resources()``): the first accelerator whose Ray resource
    it has (GPUs, then TPU chips), else the CPU, so each probe reserves the device it will run on."""
    for name, cls in devices.registered().items():
        if cls.ray_resource and cluster.get(cls.ray_resource):
            return name
    return "cpu"


def ray_resources(device: str, need: int = 1) -> dict:
    """What one probe asks of the Ray cluster: its devices as the adapter's Ray resource (one CPU per rank
    on a CPU sweep, where the ranks are processes)."""
    resources = devices.adapter_for(device).ray_resources(need)
    if resources is None:
        raise _not_on_ray(device)
    return resources


def run_ray(tasks: list[ProbeTask], workers: int, device: str) -> Generator[TaskResult, None, None]:
    """The same probes as Ray tasks (one per model); results come back to the driver to be stored.

    Connects to the cluster in RAY_ADDRESS when set, else starts a local Ray with ``workers`` CPUs."""
    try:
        import ray
    except ImportError:
        raise UserError("The ray executor needs Ray; install it with `pip install -e '.[ray]'`.") from None
    started_here = not ray.is_initialized()
    if started_here:
        address = os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        if device == "auto":
            device = ray_auto_device(ray.cluster_resources())
        remote = ray.remote(run_task)
        refs = [
            remote.options(max_retries=0, **ray_resources(device, devices_needed(task, workers))).remote(task)
            for task in tasks
        ]
        while refs:
            done, refs = ray.wait(refs, num_returns=1)
            yield ray.get(done[0])
    finally:
        if started_here:
            ray.shutdown()


def create(params: SweepParams, data_dir: Path) -> SweepMeta:
    """Write sweep.json (settings, models, stack, host) before anything runs; return it."""
    meta = SweepMeta(
        sweep_id=new_sweep_id(params.name),
        name=params.name,
        description=params.description,
        created_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        params_file=params.source,
        executor=params.executor,
        workers=params.workers,
        prefetch=params.prefetch,
        matrix=params.matrix,
        probe=params.probe,
        timeout_s=params.timeout_s,
        models=params.models,
        excluded=params.excluded,
        cache=params.cache,
        versions=provenance.versions(),
        stack=provenance.stack(),
        host=provenance.host(),
    )
    meta.write(store.sweep_dir(data_dir, meta.sweep_id))
    return meta


def run(
    params: SweepParams | None,
    data_dir: Path,
    workers: int | None = None,
    executor: str | None = None,
    resume: str | None = None,
    on_result: Callable[[dict, int, int], None] | None = None,
    prefetch: int | None = None,
    report: bool = False,
) -> dict:
    """Run (or resume) a sweep to the end; return a summary with the sweep id and verdict counts.

    A full data folder (any OSError writing it) ends the sweep at once with ``StorageFull``: one
    sentence saying what could not be written, what is already safe, and the command that finishes
    the job; nothing partial is left and the running probes are stopped. The sweep refuses to start
    when the folder's free space is clearly too small for what it will write (``check_room``)."""
    data_dir = Path(data_dir).resolve()  # probe kernels run in their own folders
    if params is not None and (executor or params.executor) == "ray":  # before the sweep is written
        check_ray_device(params.probe.get("device", "auto"))
    meta = _start(params, data_dir, resume, report)
    executor = executor or meta.executor
    device = meta.probe.get("device", "auto")
    if executor == "ray":
        check_ray_device(device)
    workers = workers or meta.workers or default_workers(device)
    started = time.time()
    total = len(meta.models) * len(probe_params.combinations(meta.matrix))
    pending: dict[str, dict] = {}
    try:
        with SweepLock(store.sweep_dir(data_dir, meta.sweep_id)):
            tasks = tasks_to_run(data_dir, meta)
            if executor == "ray":
                results = run_ray(tasks, workers, device)
            else:
                results = run_local(tasks, workers, device, *_local_setup(data_dir, meta, tasks, prefetch))
            try:
                counts = _store_all(results, data_dir, meta, pending, total - len(tasks), total, on_result)
            finally:
                results.close()  # stops the running probes at once when the sweep ends early
    except OSError as exc:
        raise _storage_full(exc, data_dir, meta.sweep_id, total) from exc
    return {
        "sweep_id": meta.sweep_id,
        "data_dir": str(data_dir),
        "executor": executor,
        "workers": workers,
        "ran": len(tasks) - len(pending),
        "total": total,
        "wall_s": time.time() - started,
        "verdicts": dict(Counter(r["status"] for r in store.iter_records(data_dir, meta.sweep_id) if r["status"])),
        "rows": counts,
        "pending": pending,
        "excluded_before": dict(meta.excluded or {}),
    }


def _start(params: SweepParams | None, data_dir: Path, resume: str | None, report: bool) -> SweepMeta:
    """The sweep to run: the one to resume, or a new one written from ``params``; refused (before it is
    written) when the data folder is clearly too small for it."""
    if resume:
        meta = store.read_sweep(data_dir, resume)
        check_room(data_dir, len(tasks_to_run(data_dir, meta)), report)
        return meta
    if params is None:
        raise UserError("Give a sweep definition (params YAML) or --resume SWEEP_ID.")
    check_room(data_dir, len(params.models) * len(probe_params.combinations(params.matrix)), report)
    try:
        return create(params, data_dir)
    except OSError as exc:
        raise StorageFull(
            f"Could not create the sweep in {data_dir} ({disk_words(exc, data_dir)}); make room, "
            "then run the same command again."
        ) from exc


def _local_setup(data_dir: Path, meta: SweepMeta, tasks: list[ProbeTask], prefetch: int | None) -> tuple:
    """``run_local``'s work folder, cache budget (only when something is downloaded: files are deleted
    after each probe, within the budget) and how many models each worker fetches ahead."""
    work_root = store.sweep_dir(data_dir, meta.sweep_id) / ".work"
    work_root.mkdir(exist_ok=True)
    budget = None
    if any(not is_local(t["source"]) for t in tasks):
        cache = meta.cache or {}
        budget = CacheBudget(cache.get("dir") or None, cache.get("max_gb"), bool(cache.get("keep", False)))
    return work_root, budget, meta.prefetch if prefetch is None else prefetch


def _storage_full(exc: OSError, data_dir: Path, sweep_id: str, total: int) -> StorageFull:
    """The sentence a full data folder ends the sweep with: what could not be written, what is safe."""
    stored = sum(1 for _ in (store.sweep_dir(data_dir, sweep_id) / "records").glob("*.json"))
    return StorageFull(
        f"Could not write {relative_to_data(exc, data_dir)} ({disk_words(exc, data_dir)}): {stored} of {total} "
        f"models are stored; make room, then run `model-support sweep --resume {sweep_id}` to finish."
    )


def _store_all(results, data_dir: Path, meta: SweepMeta, pending: dict, done: int, total: int, on_result) -> tuple:
    """Store each result as it comes back (an OSError ends it: the caller says so); then the pending
    list and the Parquet files. Returns the Parquet row counts."""
    sweep_id = meta.sweep_id
    for result in results:
        if result.problem == "disk":  # the data folder is full: every other model would fail the same way
            raise OSError(errno.ENOSPC, result.pending, str(store.sweep_dir(data_dir, sweep_id) / "notebooks"))
        if result.schedule is not None:  # which devices each probe held, when: a log, appended
            with open(store.sweep_dir(data_dir, sweep_id) / "schedule.jsonl", "a") as handle:
                handle.write(
                    json.dumps({"model_id": result.model_id, "variant": result.variant, **result.schedule}) + "\n"
                )
        if result.record is not None:
            store.store_result(data_dir, sweep_id, result.record, result.notebook, result.log)
        elif result.excluded is not None:
            store.store_exclusion(data_dir, sweep_id, result.model_id, result.excluded, result.log, result.variant)
        else:  # the environment kept it from being probed: no record, --resume retries it
            pending[store.pending_key(result.model_id, result.variant)] = {
                "reason": result.pending,
                "problem": result.problem,
                "at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            }
            store.store_log(data_dir, sweep_id, result.model_id, result.log, result.variant)
            store.write_pending(data_dir, sweep_id, pending)
            continue
        done += 1
        if on_result:
            record = result.record or {"model_id": result.model_id}  # excluded before or by its probe: no verdict
            on_result({**record, "status": record.get("status") or "excluded"}, done, total)
    store.write_pending(data_dir, sweep_id, pending)
    return store.compact(data_dir, sweep_id)
