"""The Ray executor keeps the local executor's promises, on a real local Ray (2 CPUs) and real probes of
the tiny fixtures: schedule.jsonl, a request no node can satisfy refused up front, a worker lost under a probe
leaves its model pending (never a verdict), and a stop cancels every outstanding task."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import nbformat
import psutil
import pytest
import yaml

from model_support.errors import UserError
from model_support.probe.model_ids import display_name
from model_support.record import schema, store
from model_support.sweep import definition as params
from model_support.sweep import runner as sweep

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module, started here: the sweeps join it (and must not shut it down)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def definition(tmp_path: Path, fixture_models: dict, names: list[str], overrides: dict | None = None, **extra):
    models = [
        {
            "id": fixture_models[n]["path"],
            "overrides": {**fixture_models[n]["overrides"], **(overrides or {}).get(n, {})},
        }
        for n in names
    ]
    path = tmp_path / "ray.yaml"
    body = {"name": "ray", "probe": {"device": "cpu", "reference": "none"}, "models": models, **extra}
    path.write_text(yaml.safe_dump(body))
    return params.load(path)


def sweep_id_in(data_dir: Path) -> str | None:
    found = list((data_dir / "sweeps").glob("*/sweep.json"))
    return found[0].parent.name if found else None


def probes_of(data_dir: Path) -> list[tuple[psutil.Process, dict]]:
    """This sweep's probe processes, with the task each was handed (its task.json)."""
    sweep_id, found = sweep_id_in(data_dir), []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "model_support.sweep.worker.process" not in cmdline:
            continue
        try:
            task = json.loads((Path(cmdline[-1]) / "task.json").read_text())
        except (OSError, ValueError):
            continue
        if task["sweep_id"] == sweep_id:
            found.append((process, task))
    return found


def wait_for(condition, timeout: float = 240.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def in_thread(target, timeout: float):
    """Run ``target`` on a thread; its result, or the test fails (instead of hanging) after ``timeout``."""
    out: dict = {}

    def run():
        try:
            out["value"] = target()
        except BaseException as error:  # noqa: BLE001 - re-raised in the test thread
            out["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"the sweep did not end within {timeout} s"
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_a_ray_sweep_logs_its_schedule_as_a_local_one_does(local_ray, fixture_models, tmp_path):
    names = ["tiny-gpt2", "fail-missing-weights"]
    data = tmp_path / "data"
    summary = sweep.run(definition(tmp_path, fixture_models, names), data, workers=2, executor="ray")
    assert summary["executor"] == "ray" and summary["workers"] == 2
    rows = {display_name(r["model_id"]): r["status"] for r in store.read_records(data, summary["sweep_id"])}
    assert rows == {"tiny-gpt2": "PASS", "fail-missing-weights": "FAIL(load)"}
    lines = (store.sweep_dir(data, summary["sweep_id"]) / "schedule.jsonl").read_text().splitlines()
    schedule = {display_name(entry["model_id"]): entry for entry in map(json.loads, lines)}
    assert sorted(schedule) == sorted(names)
    for entry in schedule.values():
        assert len(entry["devices"]) == 1 and set(entry["devices"]) <= {0, 1}
        assert entry["start"] <= entry["end"] and entry["node"] == ray.get_runtime_context().get_node_id()


def test_a_ray_workers_probes_fork_their_kernels_from_the_zygote_it_keeps(local_ray, tmp_path):
    """Ray reuses a worker for task after task: its first probe starts a zygote, and the kernels of that probe and
    of the next one it runs are forks of it (not a fresh Python importing torch again, as before: a Ray sweep of
    the smoke fixtures took 1.7x the local one's time)."""

    def kernel_in_a_ray_task(notebook: str, out: str) -> dict:  # nested: Ray ships it by value, not by module
        """What a Ray task's probe does first (``_kernels_forked_here``), then a real kernel run as the probe's is:
        this worker, the zygote it names, and the kernel's own facts."""
        import json
        import os

        import nbformat

        from model_support.engine import zygote
        from model_support.engine.notebooks import run_notebook
        from model_support.sweep.executors import ray as ray_executor

        ray_executor._kernels_forked_here()
        run_notebook(notebook, out, {})
        facts = json.loads(nbformat.read(out, as_version=4).cells[0].outputs[0]["text"])
        zygotes = [z.pid for z in ray_executor._ZYGOTES if z.poll() is None]
        return {"worker": os.getpid(), "socket": os.environ.get(zygote.ZYGOTE_ENV), "zygotes": zygotes, **facts}

    notebook = tmp_path / "facts.ipynb"
    code = "import json, os, sys\nprint(json.dumps({'ppid': os.getppid(), 'torch': 'torch' in sys.modules}))"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)]), notebook)
    task = ray.remote(kernel_in_a_ray_task).options(num_cpus=2)  # both CPUs: one worker runs the two in turn
    first = ray.get(task.remote(str(notebook), str(tmp_path / "first.ipynb")))
    second = ray.get(task.remote(str(notebook), str(tmp_path / "second.ipynb")))
    assert first["worker"] == second["worker"] and first["socket"] == second["socket"]
    assert second["zygotes"] == first["zygotes"]  # the one the first task started (or found), kept: none more
    assert first["ppid"] == second["ppid"] and first["ppid"] in first["zygotes"]  # both kernels forks of it
    assert first["torch"] and second["torch"]  # torch already imported


def test_a_ray_address_where_nothing_answers_is_refused_in_one_sentence_before_the_sweep_is_written(
    local_ray, fixture_models, tmp_path
):
    """ray.init waited minutes on such an address, retrying, before it failed; the running cluster's address
    (this module's local Ray) answers."""
    import os
    import socket
    import subprocess
    import sys

    from model_support.sweep.executors.ray import unreachable

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens on it once the block ends
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "r", "models": [fixture_models["tiny-gpt2"]["path"]]}))
    data = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, "-m", "model_support.cli", "sweep", str(path), "--executor", "ray", "--data-dir", str(data)],
        env={**os.environ, "RAY_ADDRESS": f"127.0.0.1:{port}"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"Error: Could not join the Ray cluster at RAY_ADDRESS=127.0.0.1:{port} (Connection refused); start it "
        "(`ray start --head`), fix RAY_ADDRESS, or run with --executor local."
    )
    assert not (data / "sweeps").exists()  # nothing written
    assert unreachable(ray.get_runtime_context().gcs_address) is None and unreachable("auto") is None


def test_a_request_no_node_can_satisfy_is_refused_before_anything_runs(local_ray, fixture_models, tmp_path):
    """Four devices on a CPU sweep ask Ray for 4 CPUs; the only node has 2: Ray would wait forever."""
    chosen = definition(tmp_path, fixture_models, ["tiny-gpt2"], overrides={"tiny-gpt2": {"devices": "4"}})
    with pytest.raises(UserError, match=r"asks Ray for 4 CPU and no node of the cluster has that much"):
        in_thread(lambda: sweep.run(chosen, tmp_path / "data", workers=4, executor="ray"), timeout=120)
    assert not list((tmp_path / "data" / "sweeps").glob("*/sweep.json"))  # nothing `list` shows as work to do


def test_a_node_whose_stack_differs_from_the_drivers_is_refused_before_it_probes(
    local_ray, fixture_models, tmp_path, monkeypatch
):
    """Every alive node says its stack's versions in a task pinned to it before any probe runs; one that differs from
    the driver's is one sentence naming the node and the package, never a row, and the refused sweep leaves no
    sweep.json (``list`` would show it as work to do). The driver's transformers is made to differ (the node's, in
    its Ray worker, is the installed one)."""
    from importlib.metadata import version

    from model_support.sweep.executors import ray as ray_executor

    real = ray_executor.node_stack
    monkeypatch.setattr(ray_executor, "node_stack", lambda device: {**real(device), "transformers": "0.0.1"})
    data = tmp_path / "data"
    chosen = definition(tmp_path, fixture_models, ["tiny-gpt2"])
    with pytest.raises(UserError) as refused:
        in_thread(lambda: sweep.run(chosen, data, workers=1, executor="ray"), timeout=120)
    node = ray.get_runtime_context().get_node_id()
    assert f"(node {node[:12]}) has transformers {version('transformers')} (the driver has 0.0.1)" in str(refused.value)
    assert "\n" not in str(refused.value) and not probes_of(data)
    assert not list((data / "sweeps").glob("*/sweep.json"))


def test_a_ray_worker_lost_under_a_probe_leaves_its_model_pending_and_resume_probes_it(
    local_ray, fixture_models, tmp_path
):
    """A Ray worker killed under its probe (SIGKILL from outside, as a node going away would: Ray raises
    WorkerCrashedError) says nothing about the model: the probe is run once more on a fresh task, then left
    pending with the cause, never a FAIL row; ``--resume`` probes it. It was a FAIL(other) ``RayWorkerDied`` row."""
    data = tmp_path / "data"
    chosen = definition(tmp_path, fixture_models, ["tiny-gpt2"], overrides={"tiny-gpt2": {"judge": False}})
    killed: list[str] = []

    def kill_the_worker_under_each_try():
        while len(killed) < 2:
            fresh = wait_for(lambda: [p for p, _task in probes_of(data) if p.cmdline()[-1] not in killed][:1], 120)
            killed.append(fresh[0].cmdline()[-1])  # the probe's folder: one per try
            fresh[0].parent().send_signal(signal.SIGKILL)  # the Ray worker running it

    killer = threading.Thread(target=kill_the_worker_under_each_try, daemon=True)
    killer.start()
    summary = in_thread(lambda: sweep.run(chosen, data, workers=1, executor="ray"), timeout=240)
    assert len(killed) == 2 and not store.read_records(data, summary["sweep_id"])  # tried twice, never a FAIL row
    (pending,) = summary["pending"].values()
    assert pending["problem"] == "harness", pending
    assert pending["reason"].startswith("the Ray worker running the probe was lost (WorkerCrashedError: ")
    assert pending["reason"].endswith("; tried 2 times")
    resumed = in_thread(lambda: sweep.run(None, data, executor="ray", resume=summary["sweep_id"]), timeout=240)
    (record,) = store.read_records(data, summary["sweep_id"])
    assert record["status"] == schema.PASS and not resumed["pending"]


def test_a_memory_kill_is_the_models_row_only_on_a_rerun_that_ran_alone(monkeypatch):
    """Ray's memory monitor kills the most recently started task when its node runs low, not the one using the
    memory: a probe it kills is the harness's (run again, then pending saying so) unless its rerun was killed
    while no other task of the sweep ran, the model's out-of-memory row (FAIL(other), the host's memory)."""
    from model_support.sweep.executors.ray import RayExecutor
    from model_support.sweep.worker.download import Download

    killed = ray.exceptions.OutOfMemoryError("Task was killed due to the node running low on memory.\nMemory on...")
    task = {"sweep_id": "s", "model_id": "m", "source": "/m", "params": {"device": "cpu"}, "variant": "eager+dynamic"}
    task |= {"timeout_s": 60.0, "notebook_path": "sweeps/s/notebooks/m.ipynb"}
    executor = RayExecutor("cpu", 2)

    def outcome(others: int, retry: bool):
        monkeypatch.setattr(RayExecutor, "_call", lambda self, remote, resources, t, died, *args: died(killed, others))
        return executor.run_one(task, Download("ready", path="/m"), (0,), retry=retry)

    first, crowded, alone = outcome(0, False), outcome(1, True), outcome(0, True)
    assert first.record is None and first.problem == "harness" and crowded.problem == "harness"
    assert "while 1 other task of the sweep ran" in crowded.pending and "run fewer workers per node" in crowded.pending
    assert (alone.record["status"], alone.record["failure_stage"]) == (schema.FAIL_OTHER, "runner")
    assert alone.record["error_type"] == "RayOutOfMemory" and "out of host memory" in alone.record["error_message"]


def test_a_stop_cancels_every_outstanding_ray_task(local_ray, fixture_models, tmp_path):
    data = tmp_path / "data"
    chosen = definition(tmp_path, fixture_models, ["tiny-gpt2", "fail-hang"], timeout_s=300)

    class Stop(Exception):
        pass

    def stop_at_the_first_result(record, done, total):
        raise Stop

    with pytest.raises(Stop):
        in_thread(lambda: sweep.run(chosen, data, workers=2, executor="ray", on_result=stop_at_the_first_result), 300)
    wait_for(lambda: not probes_of(data), timeout=30)  # the hanging model's task was cancelled, its probe killed


def test_a_local_ray_for_device_auto_is_started_for_the_device_auto_finds(monkeypatch):
    """Device ``auto`` is resolved before a local Ray starts: on a host with two (pretend) accelerators its Ray gets
    a CPU for each device's probe and for its host checks, and the two devices, as for ``device: pretend``. Resolved
    once Ray was up, it came too late: the local Ray for ``auto`` had started with the one CPU of a CPU sweep."""
    import os

    from model_support.sweep.executors.ray import RayExecutor

    monkeypatch.setenv("MODEL_SUPPORT_PRETEND", json.dumps({"devices": 2}))  # the facts come from a child process
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    auto, named = RayExecutor("auto", None), RayExecutor("pretend", None)
    wanted = {"num_cpus": max(os.cpu_count() or 1, 4), "resources": {"pretend": 2}}
    assert auto._local_resources() == named._local_resources() == wanted
    assert auto.device == "pretend"
    monkeypatch.delenv("MODEL_SUPPORT_PRETEND")  # no accelerator: the CPU's one worker, as for ``device: cpu``
    assert RayExecutor("auto", None)._local_resources() == {"num_cpus": 1}


def test_a_nodes_own_tpu_variables_are_neither_carried_nor_unset_nor_recorded(monkeypatch):
    """Review: a Ray task unset every TPU_* the driver lacked, the node's own too (what Ray writes for a task's chips,
    a TPU VM's worker id, libtpu's metadata switch), and two hosts' records read as two stacks. A node's own
    (``node_vars``) are left to the node; the stack's (LIBTPU_INIT_ARGS here) still follow the driver."""
    from model_support.probe.devices import adapter_for
    from model_support.sweep.executors import ray as ray_executor

    node = {"TPU_WORKER_ID": "3", "TPU_SKIP_MDS_QUERY": "1", "TPU_HOST_BOUNDS": "1,1,1", "TPU_VISIBLE_CHIPS": "2"}
    for name, value in {**node, "LIBTPU_INIT_ARGS": "--node-flag"}.items():
        monkeypatch.setenv(name, value)
    wanted = ray_executor._carried_here({}, ())
    assert not node.keys() & wanted.keys() and wanted["LIBTPU_INIT_ARGS"] is None, wanted
    assert adapter_for("tpu").configuration() == {"LIBTPU_INIT_ARGS": "--node-flag"}
