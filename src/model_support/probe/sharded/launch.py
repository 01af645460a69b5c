"""``run_sharded`` and the processes it starts: the launcher (its own session) that runs torch's
elastic agent, which starts one rank per device; the device's launch environment, set up in the
probe process before the launcher starts (``launch_environment``); the timeout, the stacks of
ranks that hang, and the killing of every process of the run before ``run_sharded`` returns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from ... import backend_env
from ...engine import children
from ...fileio import atomic_write_json
from .. import devices, probe_core
from ..reproduce import launch_ranks
from .device_plan import NoParallelPlan, no_plan_sentence, plan_run
from .protocol import RANK_DEFAULTS, SHUTDOWN_GRACE_S, STACKS_SIGNAL
from .rank_results import LaunchFailed, empty_result, fail_result, merge_outcome


def run_sharded(
    settings: dict, world_size: int, device_type: str = "cpu", timeout_s: float = 300
) -> dict:
    """The probe's stages over ``world_size`` devices, one rank process per device; rank 0's
    result.

    ``settings``: the probe's (``load_from`` or ``model_id``, revision, dtype, prompt,
    max_new_tokens, chat_template, trust_remote_code, seed, cache; see ``RANK_DEFAULTS``), plus
    ``parallelism`` ("auto", "tp", "ep") and ``ep_dense`` ("auto", "tp", "fsdp"). Eager mode
    only.

    Returns run_stages' keys (``exception``: the rank's exception rebuilt, class name and
    message, its traceback as ``__cause__``; also as strings in ``error_type``,
    ``error_message``, ``traceback``), plus ``failed_rank``, ``devices_used``, ``parallelism``,
    ``tp_size``, ``ep_size``, ``fsdp_size``, ``distributed_config``, ``memory_estimate_bytes``
    (the whole model, with the margin), ``load_s_per_rank``, ``generate_s_per_rank``,
    ``peak_device_mem_mb`` (max over ranks; null on CPU), ``local_param_bytes_per_rank``,
    ``ranks_agree`` and ``wall_s``. ``load_s`` is the slowest rank's (the model is ready when
    every shard is), the generation timings are rank 0's.

    A rank that crashes, is killed or does not finish within ``timeout_s`` (the whole run: start,
    load and generation) is ``FAIL(other)`` naming the rank and why; a model with no parallel
    plan asked to run on several devices is ``FAIL(other)`` with one sentence and no rank
    started. Every process of the run is gone when this returns."""
    started = time.perf_counter()
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(
            f"world_size must be a whole number of devices, at least 1, not {world_size!r}."
        )
    unknown = sorted(set(settings) - set(RANK_DEFAULTS) - {"model_id", "load_from"})
    full = {**RANK_DEFAULTS, **{k: v for k, v in settings.items() if k in RANK_DEFAULTS}}
    full["model"] = settings.get("load_from") or settings.get("model_id")
    if not full["model"]:
        raise ValueError(
            "settings must name the model: 'load_from' (a folder or Hub id) or 'model_id'."
        )
    if full["mode"] != "eager":
        raise ValueError(f"run_sharded runs the probe eagerly only, not mode={full['mode']!r}.")
    result = empty_result(world_size, device_type)
    result["ignored_settings"] = unknown or None
    try:
        kind, kwargs = plan_run(full, world_size, result)
    except Exception as exc:  # noqa: BLE001 the config did not load: the load stage's failure, no rank started
        fail_result(result, probe_core.classify("load", exc), "load", exc)
        result["wall_s"] = time.perf_counter() - started
        return result
    if world_size > 1 and kind is None:
        model_class = (result["parallelism_details"] or {}).get("model_class")
        fail_result(
            result,
            probe_core.FAIL_OTHER,
            "load",
            NoParallelPlan(no_plan_sentence(model_class, world_size)),
        )
        result["wall_s"] = time.perf_counter() - started
        return result
    dense = (result["parallelism_details"] or {}).get("dense") if kind == "ep" else None
    try:
        launch = launch_environment(device_type, world_size)
    # the device cannot launch these ranks: none started
    except (ValueError, devices.DeviceUnavailable) as exc:
        refused = LaunchFailed(f"{world_size} {device_type} ranks cannot be launched here: {exc}")
        fail_result(result, probe_core.FAIL_OTHER, "runner", refused)
        result["wall_s"] = time.perf_counter() - started
        return result
    run_dir = Path(tempfile.mkdtemp(prefix="sharded-"))
    job = {
        "settings": full,
        "world_size": world_size,
        "device_type": device_type,
        "distributed_config": kwargs,
        # FSDP2 refuses inference tensors
        "no_grad": kind == "ep" and dense == "fsdp" and world_size > 1,
        "timeout_s": timeout_s,
        "run_id": f"probe-{uuid.uuid4().hex[:8]}",
        "launch_env": launch,
    }
    atomic_write_json(run_dir / "job.json", job)
    try:
        left = timeout_s - (time.perf_counter() - started)  # planning (the config read) counts too
        outcome = _launch_and_wait(run_dir, job, max(left, 0.0), result)
        merge_outcome(result, run_dir, world_size, outcome)
    finally:
        import shutil

        shutil.rmtree(run_dir, ignore_errors=True)
    result["wall_s"] = time.perf_counter() - started
    return result


def _import_root() -> str:
    """The folder this package was imported from (``src`` in a checkout, ``site-packages``
    installed): what the ranks need first on ``PYTHONPATH`` to import the same code."""
    import model_support

    return str(Path(model_support.__file__).resolve().parents[1])


def rank_threads(world_size: int, environ: Mapping[str, str] = os.environ) -> int:
    """Each CPU rank's intra-op threads: the probe's (``OMP_NUM_THREADS`` where set, as a sweep
    sets each probe's share of the cores, else every core) split among its ``world_size`` ranks,
    at least one. Left as they were, two ranks of a probe that had the host's two cores would
    each take both."""
    own = environ.get("OMP_NUM_THREADS", "").strip()
    probes = int(own) if own.isdigit() and int(own) > 0 else os.cpu_count() or 1
    return max(1, probes // world_size)


def launch_environment(device_type: str, world_size: int) -> dict[str, str]:
    """What the device's backend needs set in the parent of ``world_size`` ranks before they
    start, the same for every rank (the adapter's ``launch_env``: torch_tpu's own
    ``set_tpu_launch_env``, whose runtime refuses a rank without it), computed here in the probe
    process and inherited by the launcher and its ranks; {} for a device that needs none.
    ValueError or ``DeviceUnavailable`` (one sentence) where the device cannot launch them."""
    launch = getattr(devices.adapter_for(device_type), "launch_env", None)
    return dict(launch(world_size)) if launch is not None else {}


def _child_env(device_type: str, world_size: int, launch: dict[str, str] | None = None) -> dict:
    # torch_tpu is imported explicitly by TPU ranks after they pinned their chip; nothing else loads
    # it.
    env = backend_env.child_environ()
    env.update(launch or {})  # the device's launch environment: the launcher's ranks inherit it
    src = _import_root()
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if device_type == "cpu":
        env["OMP_NUM_THREADS"] = str(rank_threads(world_size))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _launch_and_wait(run_dir: Path, job: dict, timeout_s: float, result: dict) -> dict:
    """Start the launcher (own session), wait up to ``timeout_s``, then make sure no process of
    the run is left."""
    log = open(run_dir / "launcher.log", "wb")  # noqa: SIM115 closed below
    launcher = subprocess.Popen(
        [sys.executable, "-m", "model_support.probe.sharded", "--launch", str(run_dir)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=_child_env(job["device_type"], job["world_size"], job.get("launch_env")),
        start_new_session=True,
    )
    result["launcher_pid"] = launcher.pid
    timed_out = False
    try:
        launcher.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _dump_stacks(run_dir)
    finally:
        _stop_everything(launcher, run_dir, result)
        log.close()
    try:
        outcome = json.loads((run_dir / "launch.json").read_text())
    except (OSError, ValueError):
        outcome = {}
    outcome["timed_out"] = timed_out
    outcome["launcher_exit"] = launcher.returncode
    return outcome


def _rank_pids(run_dir: Path) -> dict[int, int]:
    pids = {}
    for path in run_dir.glob("rank*.pid"):
        try:
            pids[int(path.stem.removeprefix("rank"))] = int(path.read_text())
        except (OSError, ValueError):
            pass
    return pids


def _dump_stacks(run_dir: Path, wait_s: float = 1.0) -> None:
    """Ask every rank still running for its Python stacks (faulthandler, into its stderr log), so a
    hang says where each rank was waiting."""
    for pid in _rank_pids(run_dir).values():
        try:
            os.kill(pid, STACKS_SIGNAL)
        except OSError:
            pass
    time.sleep(wait_s)


def _stop_everything(launcher: subprocess.Popen, run_dir: Path, result: dict) -> None:
    """Kill the launcher, the agent's rank processes and whatever they started; wait until all
    are gone.

    The ranks run in sessions of their own (the agent starts them so), so killing the launcher's
    process group is not enough: the process tree is listed first, rank pid files catch any rank
    that was already re-parented, and each rank's own process group is killed too
    (``children.kill_tree``)."""
    import psutil

    ranks = []
    pids = _rank_pids(run_dir)
    result["rank_pids"] = [pids[rank] for rank in sorted(pids)]
    for pid in pids.values():
        try:
            proc = psutil.Process(pid)
            if str(run_dir) in " ".join(proc.cmdline()):  # that rank, not a recycled pid
                ranks.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    children.kill_tree(launcher, also=ranks)


# --- the launcher process
# ------------------------------------------------------------------------------


def launch_main(run_dir: Path) -> int:
    """One elastic agent, ``world_size`` rank processes on this host; their failures into
    launch.json."""
    children.die_with_parent()
    job = json.loads((run_dir / "job.json").read_text())
    outcome: dict = {"failures": {}}
    try:
        entry = ["-m", "model_support.probe.sharded", "--rank", str(run_dir)]
        outcome["failures"] = launch_ranks(
            job["world_size"], job["run_id"], entry, str(run_dir / "logs"), SHUTDOWN_GRACE_S
        )
    except Exception as exc:  # noqa: BLE001 written down for run_sharded to report
        outcome["launcher_error"] = f"{type(exc).__name__}: {exc}"
    atomic_write_json(run_dir / "launch.json", outcome)
    return 0
