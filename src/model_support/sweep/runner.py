"""Run a sweep: one probe notebook per model, resumable, several at once, locally or on Ray.

The driver writes ``sweep.json`` first, then hands each model without a record to an executor
(``executors``: local or Ray, the same interface and promises) and stores every result as it comes
back (notebook and log, then the record: its presence means done). Killing the driver at any point
loses nothing that was stored and duplicates nothing: ``--resume`` runs exactly the models that have
no record yet; a stop (Ctrl-C, SIGTERM, a full disk) starts no new probe and ends in one sentence
saying how many are stored and how to finish. At the end the records are compacted into the sweep's
Parquet files (the same ``store.compact`` that ``aggregate.ipynb`` calls).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import os
import sys
import time
import typing
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from .. import backend_env, fileio
from ..errors import Interrupted, StorageFull, UserError
from ..probe import devices, probe_params, provenance
from ..probe.hub_fetch import is_local
from ..record import schema, store
from ..record.store import SweepLock  # one writer per sweep; the store's commands take it too
from ..record.sweep_meta import SweepMeta, new_sweep_id
from . import device_time, executors, reruns
from .budget import CacheBudget
from .definition import SweepParams
from .diskspace import check_room, disk_full, disk_words, relative_to_data
from .executors.ray import ExecutorLost, RayExecutor, session
from .executors.ray_cluster import address_to_join, check_ray_address
from .executors.ray_resources import check_ray_device
from .worker import host_checks
from .worker.task import ProbeTask


def build_tasks(meta: SweepMeta) -> list[ProbeTask]:
    """One task per model and variant from the sweep's saved settings (sweep.json is the truth on
    resume), model by model: a model's variants run one after another, on its downloaded files."""
    tasks: list[ProbeTask] = []
    cache = meta.cache or {}
    for model, combo in (
        (m, c) for m in meta.models for c in probe_params.combinations(meta.matrix, meta.stacks)
    ):
        tasks.append(
            {
                "sweep_id": meta.sweep_id,
                "model_id": model.model_id,
                "source": model.source,
                "params": {**meta.probe, **model.overrides, **combo},
                "variant": probe_params.variant({**meta.probe, **model.overrides, **combo}),
                "timeout_s": model.timeout_s or meta.timeout_s,
                "notebook_path": store.notebook_relpath(
                    meta.sweep_id,
                    model.model_id,
                    probe_params.variant({**meta.probe, **model.overrides, **combo}),
                ),
                "scrub": {model.source: model.model_id} if model.source != model.model_id else {},
                "hub": {k: model.hub.get(k) for k in schema.HUB_FIELDS if k in model.hub},
                "planned_bytes": model.hub.get("planned_bytes"),
                "revision_sha": model.hub.get("revision_sha"),
                "cache_dir": cache.get("dir") or "",
                "keep_cache": bool(cache.get("keep", False)),
            }
        )
    return tasks


def tasks_to_run(data_dir: Path, meta: SweepMeta) -> list[ProbeTask]:
    """The (model, variant)s with no record yet: what this run of the sweep probes. Two words,
    two things: a model is *pending* when the environment kept it from being probed
    (``pending.json``: the network, the disk); a model with no record for any reason, pending or
    never reached, is *to run* (the report's "not probed" and "not tested"). A model some of
    whose variants were probed already is downloaded at the commit they were (``revision_sha``),
    wherever the revision asked for points now: one sweep, one commit."""
    probed = {
        r["model_id"]: r["revision_sha"]
        for r in store.iter_records(data_dir, meta.sweep_id)
        if r["revision_sha"]
    }
    return [
        {**t, "revision_sha": probed.get(t["model_id"]) or t.get("revision_sha")}
        for t in build_tasks(meta)
        if store.find_record(data_dir, meta.sweep_id, t["model_id"], t["variant"]) is None
    ]


def create(
    params: SweepParams, data_dir: Path, reruns_n: int | None = None, executor: str | None = None
) -> SweepMeta:
    """Write sweep.json (settings, models, stack, host, the executor it runs on: ``executor``,
    else the definition's) before anything runs; return it."""
    meta = SweepMeta(
        sweep_id=new_sweep_id(params.name),
        name=params.name,
        description=params.description,
        created_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        params_file=params.source,
        executor=executor or params.executor,
        workers=params.workers,
        prefetch=params.prefetch,
        matrix=params.matrix,
        stacks=params.stacks,
        probe=params.probe,
        timeout_s=params.timeout_s,
        models=params.models,
        excluded=params.excluded,
        cache=params.cache,
        versions=provenance.versions(),
        stack=provenance.stack(),
        device_config=devices.stack_configuration(),
        host=provenance.host(),
        expect=params.expectations,
        reruns=params.reruns if reruns_n is None else reruns_n,
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
    screen: Callable[[SweepMeta, str], reruns.Screen | None] | None = None,
    reruns_n: int | None = None,
    interpreters: Callable[[SweepMeta], dict[str, str]] | None = None,
) -> dict:
    """Run (or resume) a sweep to the end; return a summary with the sweep id and verdict counts.

    A store write that fails (a full disk: checked on the disk, ``diskspace.disk_words``) ends
    the sweep at once with ``StorageFull``: one sentence saying what could not be written, what
    is already safe, and the command that finishes the job; nothing partial is left and the
    running probes are stopped. A stop (KeyboardInterrupt: Ctrl-C, or SIGTERM as the CLI turns
    it) or the executor failing ends it with ``Interrupted``, the same kind of sentence. The
    sweep refuses to start when the folder's free space is clearly too small for what it will
    write (``check_room``).

    ``screen`` (``analysis.flakes.baseline_for``, given by the CLI: this room does not read the
    dataset's tables) gives the baseline of a sweep (its meta and its resolved device type): a
    run whose verdict differs from the baseline's is rerun (``reruns``: up to sweep.json's
    ``reruns`` times; ``reruns_n`` sets it for a new sweep) before it is stored, in rounds after
    the first pass.

    ``interpreters`` (the CLI's: the bisect's overlay environments, a room above this one) gives,
    for a sweep whose ``stacks:`` pin packages, each such stack's interpreter: its pass's
    processes run it (``children.PYTHON_VAR``)."""
    data_dir = Path(data_dir).resolve()  # probe kernels run in their own folders
    if (
        params is not None
        and params.stacks
        and any(s.get("packages") for s in params.stacks.values())
    ):
        if (executor or params.executor) == "ray":
            raise UserError(
                "A stack's packages run in a local overlay environment; run this sweep with "
                "--executor local."
            )
    if params is not None and (executor or params.executor) == "ray":  # before the sweep is written
        check_ray_device(params.probe.get("device", "auto"))
        check_ray_address()
    meta = _start(params, data_dir, resume, report, reruns_n, executor)
    # a resumed sweep continues on the executor it was started with: named again (`--resume ID
    # --executor ray`) or not
    continued = resume is not None and executor in (None, meta.executor)
    executor = executor or meta.executor
    device = meta.probe.get("device", "auto")
    address = None
    try:
        # the cluster it joins: RAY_ADDRESS, or the one a resumed sweep ran on, checked there
        if executor == "ray":
            check_ray_device(device)
            address = address_to_join(
                store.sweep_dir(data_dir, meta.sweep_id), meta.sweep_id, continued
            )
            # a new sweep's was, before it
            if resume and address and address == os.environ.get("RAY_ADDRESS"):
                check_ray_address(address)
        return _run(
            meta,
            data_dir,
            executor,
            device,
            workers,
            resume,
            on_result,
            prefetch,
            screen,
            interpreters,
            address,
        )
    except UserError:
        if not resume:
            _forget_refused(data_dir, meta.sweep_id)
        raise


def _forget_refused(data_dir: Path, sweep_id: str) -> None:
    """A new sweep refused before anything of it was stored (a Ray cluster that cannot run it:
    capacity, a node's stack, a request no node can satisfy): its folder removed, so that
    ``list`` shows no work to do."""
    import shutil

    folder = store.sweep_dir(data_dir, sweep_id)
    if not _stored(data_dir, sweep_id) and not store.pending_file(data_dir, sweep_id).exists():
        shutil.rmtree(folder, ignore_errors=True)


def _run(
    meta: SweepMeta,
    data_dir: Path,
    executor: str,
    device: str,
    workers: int | None,
    resume: str | None,
    on_result: Callable[[dict, int, int], None] | None,
    prefetch: int | None,
    screen: Callable[[SweepMeta, str], reruns.Screen | None] | None,
    interpreters: Callable[[SweepMeta], dict[str, str]] | None,
    address: str | None = None,
) -> dict:
    started = time.time()
    total = len(meta.models) * len(probe_params.combinations(meta.matrix, meta.stacks))
    pending: dict[str, dict] = {}
    with (
        SweepLock(store.sweep_dir(data_dir, meta.sweep_id)),
        _stops(data_dir, meta.sweep_id, total),
        session(executor) as joined,
    ):  # one Ray connection for the run's passes and rounds
        if resume:  # a run killed mid-write left its temporary file: this run holds the lock now
            store.remove_torn_runner_writes(data_dir, meta.sweep_id)
        if resume and (moved := store.migrate_names(data_dir, meta.sweep_id)):
            print(
                f"Sweep {meta.sweep_id}: {moved} record(s) moved to their one-to-one file "
                "names (stored before two model ids could no longer share a file).",
                file=sys.stderr,
            )
        screening = _screening(data_dir, meta, screen, device)
        tasks = tasks_to_run(data_dir, meta)
        pythons = _interpreters(meta, interpreters) if tasks else {}
        done = total - len(tasks)
        # one pass per stack, its processes started in its environment
        for stack, group in _by_stack(tasks):
            with _stack_environment(meta, stack, pythons.get(stack)):
                todo = group
                # the pass, then a round of reruns of the verdicts that differ from the baseline's
                while True:
                    runner = _executor(
                        executor, data_dir, meta, todo, workers or meta.workers, prefetch
                    )
                    # the stacks' variables travel with its tasks, to that cluster
                    if isinstance(runner, RayExecutor):
                        runner.stack_names, runner.address, runner.session = (
                            _stack_names(meta),
                            address,
                            joined,
                        )
                    runner.submit(todo)
                    results = runner.results()
                    again: list = []
                    try:
                        settled_before = done + len(group) - len(todo)
                        counts = _store_all(
                            results,
                            data_dir,
                            meta,
                            pending,
                            settled_before,
                            total,
                            on_result,
                            screening,
                            again,
                        )
                    finally:
                        # stops the running probes at once when the sweep ends early
                        results.close()
                    todo = [t for t in group if (t["model_id"], t["variant"]) in set(again)]
                    if not todo:
                        break
            done += len(group)
        used = _device_time(data_dir, meta, started, runner.workers)
    return {
        "sweep_id": meta.sweep_id,
        "data_dir": str(data_dir),
        "executor": executor,
        "workers": runner.workers,
        "ran": len(tasks) - len(pending),
        "total": total,
        "wall_s": time.time() - started,
        # a what-if run's verdict is no verdict of the stack: said as one ("what-if PASS")
        "verdicts": dict(
            Counter(
                f"what-if {r['status']}" if store.is_what_if(r) else r["status"]
                for r in store.iter_records(data_dir, meta.sweep_id)
                if r["status"]
            )
        ),
        "rows": counts,
        "pending": pending,
        "excluded_before": dict(meta.excluded or {}),
        "device_time": used,
    }


def _stack_names(meta: SweepMeta) -> tuple[str, ...]:
    """The variables any ``stacks:`` entry of the sweep sets: a Ray task sets them as the driver
    has them in its stack's pass, and unsets those the pass leaves unset
    (``executors.ray_nodes.carried_environ``)."""
    return tuple(
        sorted(
            {name for s in (meta.stacks or {}).values() for name in ((s or {}).get("env") or {})}
        )
    )


def _by_stack(tasks: list[ProbeTask]) -> list[tuple[str, list[ProbeTask]]]:
    """The tasks in one group per stack (``stack_name``; "" for a sweep of one), in the sweep's
    order; one empty group when nothing is left to run (the pass then only stores what is there)."""
    groups: dict[str, list[ProbeTask]] = {}
    for task in tasks:
        groups.setdefault(task["params"].get("stack_name") or "", []).append(task)
    return list(groups.items()) or [("", [])]


def _interpreters(
    meta: SweepMeta, interpreters: Callable[[SweepMeta], dict[str, str]] | None
) -> dict[str, str]:
    """{stack: interpreter} for the stacks that pin packages; one sentence when nothing can build
    them."""
    if not any((s or {}).get("packages") for s in (meta.stacks or {}).values()):
        return {}
    if interpreters is None:
        raise UserError(
            f"Sweep {meta.sweep_id} pins packages in its stacks: run it with `model-support "
            "sweep`, which builds their environments."
        )
    return interpreters(meta)


@contextlib.contextmanager
def _stack_environment(meta: SweepMeta, stack: str, python: str | None = None) -> Iterator[None]:
    """This process's environment with the stack's variables set (``stacks:`` NAME ``env``;
    ``python``: the interpreter of its overlay environment, for a stack that pins packages) while
    its pass runs: the executor's processes (workers, warm probes, the kernel zygote) start from
    it, so each probe, its recorded stack and backend configuration (``device_config``) and its
    repro script are the stack's. Put back after."""
    import os

    from ..engine.children import PYTHON_VAR

    env = dict((meta.stacks.get(stack) or {}).get("env") or {} if stack else {})
    if python:
        env[PYTHON_VAR] = python
    before = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        backend_env.put_back(before)


def _screening(
    data_dir: Path,
    meta: SweepMeta,
    screen: Callable[[SweepMeta, str], reruns.Screen | None] | None,
    device: str,
) -> reruns.Screen | None:
    """The baseline this run's verdicts are screened against (none without ``screen`` or with
    ``reruns: 0``). The baseline is chosen at the first run whatever ``reruns`` says and kept in
    sweep.json (``baseline``; "" for none): the nightly gates against it, and ``--resume``
    screens against the same one. A what-if sweep (``host_ops``) has none: its runs are no
    verdicts of the stack to screen."""
    # a what-if sweep is no verdict of the stack: no baseline, no flake reruns
    if meta.probe.get("host_ops"):
        meta.baseline = meta.baseline if meta.baseline is not None else ""
        return None
    if screen is None or (meta.baseline is not None and not meta.reruns):
        return None
    found = screen(meta, executors.device_kind(device))
    if meta.baseline is None:
        meta.baseline = found.sweep_id if found else ""
        with _writing():
            meta.write(store.sweep_dir(data_dir, meta.sweep_id))
    return found if meta.reruns else None


def _device_time(data_dir: Path, meta: SweepMeta, started: float, workers: int) -> dict | None:
    """How this run used its devices (``device_time``), kept in sweep.json too."""
    used = device_time.summarise(
        device_time.read_rows(store.sweep_dir(data_dir, meta.sweep_id), started), workers
    )
    if used:
        meta.device_time = used
        meta.write(store.sweep_dir(data_dir, meta.sweep_id))
    return used


def _executor(
    name: str,
    data_dir: Path,
    meta: SweepMeta,
    tasks: list[ProbeTask],
    workers: int | None,
    prefetch: int | None,
) -> executors.Executor:
    """The sweep's executor, with its work folder, its cache budget (only when something is
    downloaded: files are deleted after each probe, within the budget) and how many models each
    worker fetches ahead."""
    work_root = store.sweep_dir(data_dir, meta.sweep_id) / ".work"
    with _writing():
        work_root.mkdir(exist_ok=True)
    budget = None
    if any(not is_local(t["source"]) for t in tasks):
        cache = meta.cache or {}
        budget = CacheBudget(
            cache.get("dir") or None, cache.get("max_gb"), bool(cache.get("keep", False))
        )
    ahead = meta.prefetch if prefetch is None else prefetch
    return executors.make(name, meta.probe.get("device", "auto"), workers, work_root, budget, ahead)


@contextlib.contextmanager
def _stops(data_dir: Path, sweep_id: str, total: int) -> Iterator[None]:
    """How a sweep that ends early says so: a failed store write as ``StorageFull``, a stop or a
    lost executor as ``Interrupted``; each one sentence with what is stored and the command that
    finishes it."""
    try:
        yield
    except _WriteFailed as failed:
        raise _storage_full(failed.error, data_dir, sweep_id, total) from failed.error
    except KeyboardInterrupt:
        raise Interrupted(
            f"The sweep was stopped: {_finish_words(data_dir, sweep_id, total)}."
        ) from None
    except ExecutorLost as exc:
        raise Interrupted(
            f"The sweep ended early ({exc}): {_finish_words(data_dir, sweep_id, total)}."
        ) from exc


def _stored(data_dir: Path, sweep_id: str) -> int:
    return sum(1 for _ in (store.sweep_dir(data_dir, sweep_id) / "records").glob("*.json"))


def _finish_words(data_dir: Path, sweep_id: str, total: int) -> str:
    """``3 of 8 stored; `model-support sweep --resume ID` finishes it``."""
    return (
        f"{_stored(data_dir, sweep_id)} of {total} stored; `model-support sweep --resume "
        f"{sweep_id}` finishes it"
    )


def _start(
    params: SweepParams | None,
    data_dir: Path,
    resume: str | None,
    report: bool,
    reruns_n: int | None = None,
    executor: str | None = None,
) -> SweepMeta:
    """The sweep to run: the one to resume, or a new one written from ``params``; refused (before
    it is written) when the data folder is clearly too small for it."""
    if resume:
        meta = store.read_sweep(data_dir, resume)
        check_room(data_dir, len(tasks_to_run(data_dir, meta)), report)
        return meta
    if params is None:
        raise UserError("Give a sweep definition (params YAML) or --resume SWEEP_ID.")
    check_room(
        data_dir,
        len(params.models) * len(probe_params.combinations(params.matrix, params.stacks)),
        report,
    )
    try:
        return create(params, data_dir, reruns_n, executor)
    except OSError as exc:
        raise StorageFull(
            f"Could not create the sweep in {data_dir} ({disk_words(exc, data_dir)}); make room, "
            "then run the same command again."
        ) from exc


def _storage_full(exc: OSError, data_dir: Path, sweep_id: str, total: int) -> StorageFull:
    """The sentence a failed store write ends the sweep with: what could not be written and why
    (the disk full only when it is: ``disk_words``), what is safe, how to finish."""
    words, full = disk_words(exc, data_dir), disk_full(exc, data_dir)
    return StorageFull(
        f"Could not write {relative_to_data(exc, data_dir)} ({words}): "
        f"{_stored(data_dir, sweep_id)} of {total} models are stored; "
        f"{'make room' if full else 'fix that'}, then run `model-support sweep --resume "
        f"{sweep_id}` to finish."
    )


class _WriteFailed(Exception):
    """Writing the store failed (``error``): the one OSError a sweep turns into ``StorageFull``;
    any other (a Ray connection, fork's ENOMEM, too many open files elsewhere) is not the data
    folder's."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


@contextlib.contextmanager
def _writing() -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise _WriteFailed(exc) from exc


def _store_all(
    results,
    data_dir: Path,
    meta: SweepMeta,
    pending: dict,
    done: int,
    total: int,
    on_result,
    screen: reruns.Screen | None = None,
    again: list | None = None,
) -> tuple:
    """Store each result as it comes back (a failed write ends it: the caller says so), a record
    once its attempts are settled (``reruns.settle``: a run to probe again goes to ``again``);
    then the pending list and the Parquet files. Returns the Parquet row counts."""
    sweep_id = meta.sweep_id
    for result in results:
        with _writing():
            # the data folder is full: every other model would fail the same way
            if result.problem == "disk":
                raise OSError(
                    errno.ENOSPC,
                    result.pending,
                    str(store.sweep_dir(data_dir, sweep_id) / "notebooks"),
                )
            if result.schedule is not None:  # which devices each probe held, when: a log, appended
                fileio.append_line(
                    store.sweep_dir(data_dir, sweep_id) / "schedule.jsonl",
                    {"model_id": result.model_id, "variant": result.variant, **result.schedule},
                )
            if result.record is not None:
                # before a record names one
                store.keep_traces(store.sweep_dir(data_dir, sweep_id), result.traces)
                settled = reruns.settle(
                    data_dir,
                    sweep_id,
                    dict(result.record),
                    result.notebook,
                    result.log,
                    screen,
                    meta.reruns,
                )
                # its verdict differs from the baseline's: probed again, its device phase too
                if settled is None:
                    host_checks.forget(data_dir, sweep_id, result.model_id, result.variant)
                    if again is not None:
                        again.append((result.model_id, result.variant))
                    continue
                final = typing.cast(schema.Record, store.trace_kept(data_dir, settled.record))
                store.store_result(data_dir, sweep_id, final, settled.notebook, settled.log)
                # its kept device phase
                host_checks.forget(data_dir, sweep_id, result.model_id, result.variant)
                reruns.forget(data_dir, sweep_id, result.model_id, result.variant)
                result.record = final
            elif result.excluded is not None:
                store.store_exclusion(
                    data_dir, sweep_id, result.model_id, result.excluded, result.log, result.variant
                )
                reruns.forget(data_dir, sweep_id, result.model_id, result.variant)
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
            # excluded before or by its probe: no verdict
            record = result.record or {"model_id": result.model_id}
            on_result({**record, "status": record.get("status") or "excluded"}, done, total)
    with _writing():
        store.write_pending(data_dir, sweep_id, pending)
        return store.compact(data_dir, sweep_id)
