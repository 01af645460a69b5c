"""The Ray executor keeps the local executor's promises, on a real local Ray (2 CPUs) and real
probes of the tiny fixtures: schedule.jsonl, a request no node can satisfy refused up front, a
worker lost under a probe leaves its model pending (never a verdict), and a stop cancels every
outstanding task."""

from __future__ import annotations

import json
import os
import signal
import socket
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
    """One local Ray for the module, started here: the sweeps join it (and must not shut it
    down). Ray 2.60 turns token authentication on for a process that starts a local Ray
    (RAY_AUTH_MODE=token in its environment, kept after ``ray.shutdown``): put back, as the
    executor puts it back after its own local Ray (``ray_cluster.put_back_auth``), so that no
    later test of this process joins a cluster in a mode it did not choose."""
    from model_support.sweep.executors.ray_cluster import put_back_auth

    before = os.environ.get("RAY_AUTH_MODE")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    put_back_auth(before)


def definition(
    tmp_path: Path, fixture_models: dict, names: list[str], overrides: dict | None = None, **extra
):
    models = [
        {
            "id": fixture_models[n]["path"],
            "overrides": {**fixture_models[n]["overrides"], **(overrides or {}).get(n, {})},
        }
        for n in names
    ]
    path = tmp_path / "ray.yaml"
    body = {
        "name": "ray",
        "probe": {"device": "cpu", "reference": "none"},
        "models": models,
        **extra,
    }
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
    """Run ``target`` on a thread; its result, or the test fails (instead of hanging) after
    ``timeout``."""
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
    summary = sweep.run(
        definition(tmp_path, fixture_models, names), data, workers=2, executor="ray"
    )
    assert summary["executor"] == "ray" and summary["workers"] == 2
    rows = {
        display_name(r["model_id"]): r["status"]
        for r in store.read_records(data, summary["sweep_id"])
    }
    assert rows == {"tiny-gpt2": "PASS", "fail-missing-weights": "FAIL(load)"}
    lines = (store.sweep_dir(data, summary["sweep_id"]) / "schedule.jsonl").read_text().splitlines()
    schedule = {display_name(entry["model_id"]): entry for entry in map(json.loads, lines)}
    assert sorted(schedule) == sorted(names)
    for entry in schedule.values():
        assert len(entry["devices"]) == 1 and set(entry["devices"]) <= {0, 1}
        assert (
            entry["start"] <= entry["end"]
            and entry["node"] == ray.get_runtime_context().get_node_id()
        )


def test_a_ray_workers_probes_fork_their_kernels_from_the_zygote_it_keeps(local_ray, tmp_path):
    """Ray reuses a worker for task after task: its first probe starts a zygote, and the kernels
    of that probe and of the next one it runs are forks of it (not a fresh Python importing torch
    again, as before: a Ray sweep of the smoke fixtures took 1.7x the local one's time)."""

    # nested: Ray ships it by value, not by module
    def kernel_in_a_ray_task(notebook: str, out: str) -> dict:
        """What a Ray task's probe does first (``_kernels_forked_here``), then a real kernel run
        as the probe's is: this worker, the zygote it names, and the kernel's own facts."""
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
        return {
            "worker": os.getpid(),
            "socket": os.environ.get(zygote.ZYGOTE_ENV),
            "zygotes": zygotes,
            **facts,
        }

    notebook = tmp_path / "facts.ipynb"
    code = (
        "import json, os, "
        "sys\nprint(json.dumps({'ppid': os.getppid(), 'torch': 'torch' in sys.modules}))"
    )
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)]), notebook)
    # both CPUs: one worker runs the two in turn
    task = ray.remote(kernel_in_a_ray_task).options(num_cpus=2)
    first = ray.get(task.remote(str(notebook), str(tmp_path / "first.ipynb")))
    second = ray.get(task.remote(str(notebook), str(tmp_path / "second.ipynb")))
    assert first["worker"] == second["worker"] and first["socket"] == second["socket"]
    # the one the first task started (or found), kept: none more
    assert second["zygotes"] == first["zygotes"]
    # both kernels forks of it
    assert first["ppid"] == second["ppid"] and first["ppid"] in first["zygotes"]
    assert first["torch"] and second["torch"]  # torch already imported


def test_a_ray_address_where_nothing_answers_is_refused_in_one_sentence_before_the_sweep_is_written(
    local_ray, fixture_models, tmp_path
):
    """ray.init waited minutes on such an address, retrying, before it failed; the running
    cluster's address (this module's local Ray) answers."""
    import subprocess
    import sys

    from model_support.sweep.executors.ray_cluster import unreachable

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens on it once the block ends
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "r", "models": [fixture_models["tiny-gpt2"]["path"]]}))
    data = tmp_path / "data"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "model_support.cli",
            "sweep",
            str(path),
            "--executor",
            "ray",
            "--data-dir",
            str(data),
        ],
        env={**os.environ, "RAY_ADDRESS": f"127.0.0.1:{port}"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"Error: Could not join the Ray cluster at RAY_ADDRESS=127.0.0.1:{port} (Connection "
        "refused); start it (`ray start --head`), fix RAY_ADDRESS, or run with --executor "
        "local."
    )
    assert not (data / "sweeps").exists()  # nothing written
    assert (
        unreachable(ray.get_runtime_context().gcs_address) is None and unreachable("auto") is None
    )


def test_an_address_where_no_ray_head_answers_is_refused_in_seconds_before_the_sweep_is_written(
    fixture_models, tmp_path, monkeypatch
):
    """An address that accepts TCP but is no Ray head: ray.init retried 22 s on it and said
    "Could not start or join". Asked first (``ray_cluster.check_ray_address``): an HTTP server
    answers gRPC with HTTP/1 (at once), a server that accepts and never speaks is given 5 s; each
    one sentence naming the head's port as the fix, nothing written."""
    import http.server

    from model_support.sweep.executors.ray_cluster import CONNECT_S

    http_server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    # accepts (the kernel's backlog) and never says a word
    silent = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=http_server.serve_forever, daemon=True).start()
    chosen = definition(tmp_path, fixture_models, ["tiny-gpt2"])
    try:
        for server, heard in (
            (http_server.server_address[1], "UNAVAILABLE: "),
            (silent.getsockname()[1], "no Ray"),
        ):
            monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{server}")
            began = time.time()
            with pytest.raises(UserError) as refused:
                sweep.run(chosen, tmp_path / "data", executor="ray")
            took = time.time() - began
            said = str(refused.value)
            assert said.startswith(
                f"RAY_ADDRESS=127.0.0.1:{server} answers, but no Ray cluster's head does there "
                f"({heard}"
            )
            assert (
                said.endswith(
                    "point it at the head's address (the --port of `ray start --head`, 6379 "
                    "by default), or run with --executor local."
                )
                and "\n" not in said
            )
            assert took < CONNECT_S + 5, took  # not ray.init's 22 s of retries
            assert not (tmp_path / "data" / "sweeps").exists()
    finally:
        http_server.shutdown()
        silent.close()


@pytest.mark.parametrize("named", [None, "ray"], ids=["plain", "executor-named-again"])
def test_a_plain_resume_of_a_ray_sweep_joins_where_it_ran_or_is_refused_naming_it(
    fixture_models, tmp_path, monkeypatch, named
):
    """``sweep --resume ID`` of a Ray sweep without RAY_ADDRESS started a local Ray in place of
    the cluster. Now it joins the cluster the sweep ran on (``ray.json``, written when it
    joined); one that no longer answers is refused naming it, and a sweep that never said where
    it ran is refused too (here without any Ray: before anything runs). The two-node module
    resumes a SIGKILLed driver's sweep on its cluster this way. Naming the executor again
    (``--resume ID --executor ray``, ``named``) is the same resume: it once ignored ``ray.json``
    and ran locally."""
    from model_support.sweep.executors.ray_cluster import remember

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    data = tmp_path / "data"
    meta = sweep.create(
        definition(tmp_path, fixture_models, ["tiny-gpt2"]), data.resolve(), executor="ray"
    )
    with pytest.raises(UserError) as refused:
        sweep.run(None, data, executor=named, resume=meta.sweep_id)
    assert str(refused.value) == (
        f"Sweep {meta.sweep_id} runs on Ray, RAY_ADDRESS is not set and the sweep never said "
        "which cluster it ran on; set RAY_ADDRESS to its cluster's address, or resume it with "
        "--executor local."
    )
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens on it once the block ends
    remember(store.sweep_dir(data, meta.sweep_id), f"127.0.0.1:{port}")
    with pytest.raises(UserError) as refused:
        sweep.run(None, data, executor=named, resume=meta.sweep_id)
    assert str(refused.value) == (
        f"Could not join the Ray cluster at 127.0.0.1:{port}, where sweep {meta.sweep_id} ran "
        "(Connection refused); start it, set RAY_ADDRESS to the cluster that runs it now, or "
        "resume it with --executor local."
    )
    # a resume that cannot run keeps the sweep: it has work
    assert store.sweep_dir(data, meta.sweep_id).is_dir()


def test_a_what_if_sweep_of_a_ray_sweep_runs_where_its_sweep_ran(
    fixture_models, tmp_path, monkeypatch
):
    """``ops --prove`` makes a what-if sweep and runs it as a resume: with no ``ray.json`` of its
    own it was refused ("never said which cluster it ran on") even where its sweep ran on a local
    Ray. It inherits its sweep's."""
    from model_support.sweep.executors import ray_cluster

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    data = (tmp_path / "data").resolve()
    parent = sweep.create(definition(tmp_path, fixture_models, ["tiny-gpt2"]), data, executor="ray")
    child = sweep.create(definition(tmp_path, fixture_models, ["tiny-gpt2"]), data, executor="ray")
    ray_cluster.remember(store.sweep_dir(data, parent.sweep_id), None)  # it ran on a local Ray
    ray_cluster.inherit(
        store.sweep_dir(data, parent.sweep_id), store.sweep_dir(data, child.sweep_id)
    )
    assert (
        ray_cluster.address_to_join(store.sweep_dir(data, child.sweep_id), child.sweep_id, True)
        is None
    )
    ray_cluster.remember(store.sweep_dir(data, parent.sweep_id), "10.0.0.7:6379")
    ray_cluster.inherit(
        store.sweep_dir(data, parent.sweep_id), store.sweep_dir(data, child.sweep_id)
    )
    assert ray_cluster.recorded(store.sweep_dir(data, child.sweep_id))["address"] == "10.0.0.7:6379"


def test_a_device_no_node_has_is_refused_naming_the_ray_start_option_that_gives_it(
    local_ray, fixture_models, tmp_path, monkeypatch
):
    """The cluster, not the driver, says which devices there are: this module's Ray has no
    ``pretend`` resource, so a pretend sweep is refused naming ``ray start --resources``, not
    "lower its devices" (it asks for 1)."""
    # the driver's (definition.load checks it)
    monkeypatch.setenv("MODEL_SUPPORT_PRETEND", json.dumps({"devices": 1}))
    chosen = definition(
        tmp_path, fixture_models, ["tiny-gpt2"], probe={"device": "pretend", "reference": "none"}
    )
    with pytest.raises(UserError) as refused:
        in_thread(lambda: sweep.run(chosen, tmp_path / "data", executor="ray"), timeout=120)
    said = str(refused.value)
    assert (
        said.startswith("No node of the Ray cluster has 'pretend', which ")
        and "lower its devices" not in said
    )
    assert "start its nodes with `ray start ... --resources '{\"pretend\": 1}'`" in said, said
    assert not list((tmp_path / "data" / "sweeps").glob("*/sweep.json"))


def test_the_drivers_own_devices_are_not_asked_of_a_sweep_that_runs_on_ray(
    fixture_models, tmp_path, monkeypatch
):
    """A GPU-less driver sweeps a GPU cluster: the definition's device check (the driver's) is
    skipped for Ray, whose cluster is asked instead (the test above). Here the driver's pretend
    accelerator is off (the variable removed: the device the driver lacks), and only the local
    executor's load refuses it."""
    monkeypatch.delenv("MODEL_SUPPORT_PRETEND", raising=False)
    path = tmp_path / "gpu.yaml"
    models = [{"id": fixture_models["tiny-gpt2"]["path"]}]
    path.write_text(
        yaml.safe_dump({"name": "gpu", "probe": {"device": "pretend"}, "models": models})
    )
    with pytest.raises(UserError, match="pretend"):
        params.load(path)
    assert params.load(path, executor="ray").probe["device"] == "pretend"
    path.write_text(
        yaml.safe_dump(
            {"name": "gpu", "probe": {"device": "pretend"}, "models": models, "executor": "ray"}
        )
    )
    assert params.load(path).executor == "ray"


def test_a_request_no_node_can_satisfy_is_refused_before_anything_runs(
    local_ray, fixture_models, tmp_path
):
    """Four devices on a CPU sweep ask Ray for 4 CPUs; the only node has 2: Ray would wait
    forever."""
    chosen = definition(
        tmp_path, fixture_models, ["tiny-gpt2"], overrides={"tiny-gpt2": {"devices": "4"}}
    )
    with pytest.raises(
        UserError, match=r"asks Ray for 4 CPU and no node of the cluster has that much"
    ):
        in_thread(
            lambda: sweep.run(chosen, tmp_path / "data", workers=4, executor="ray"), timeout=120
        )
    # nothing `list` shows as work to do
    assert not list((tmp_path / "data" / "sweeps").glob("*/sweep.json"))


def test_a_node_whose_stack_differs_from_the_drivers_is_refused_before_it_probes(
    local_ray, fixture_models, tmp_path, monkeypatch
):
    """Every alive node says its stack's versions in a task pinned to it before any probe runs;
    one that differs from the driver's is one sentence naming the node and the package, never a
    row, and the refused sweep leaves no sweep.json (``list`` would show it as work to do). The
    driver's transformers is made to differ (the node's, in its Ray worker, is the installed
    one)."""
    from importlib.metadata import version

    from model_support.sweep.executors import ray_nodes

    real = ray_nodes.node_stack
    monkeypatch.setattr(
        ray_nodes, "node_stack", lambda device: {**real(device), "transformers": "0.0.1"}
    )
    data = tmp_path / "data"
    chosen = definition(tmp_path, fixture_models, ["tiny-gpt2"])
    with pytest.raises(UserError) as refused:
        in_thread(lambda: sweep.run(chosen, data, workers=1, executor="ray"), timeout=120)
    node = ray.get_runtime_context().get_node_id()
    assert (
        f"(node {node[:12]}) has transformers {version('transformers')} (the driver has 0.0.1)"
        in str(refused.value)
    )
    assert "\n" not in str(refused.value) and not probes_of(data)
    assert not list((data / "sweeps").glob("*/sweep.json"))


def test_a_node_that_joined_after_the_check_and_differs_runs_no_probe(local_ray, fixture_models):
    """The nodes are checked when the driver joins; a node that joins later is checked by the
    first task Ray gives it: one whose stack differs from the driver's runs no probe (the model
    is the harness's: run again, then pending naming the node), one the driver checked runs it.
    The driver's transformers is made to differ here."""
    from model_support.sweep.executors import ray as ray_executor
    from model_support.sweep.executors import ray_nodes
    from model_support.sweep.worker.download import Download

    def refused_there(checked):  # nested: Ray ships it by value
        from model_support.sweep.executors import ray_nodes as in_the_task

        return in_the_task.refused_here(checked)

    node = ray.get_runtime_context().get_node_id()
    installed = ray_nodes.node_stack("cpu")
    driver = {**installed, "transformers": "0.0.1"}
    source = fixture_models["tiny-gpt2"]["path"]
    task = {
        "sweep_id": "s",
        "model_id": "local:tiny-gpt2",
        "source": source,
        "params": {"device": "cpu"},
    }
    task |= {
        "variant": "eager+dynamic",
        "timeout_s": 60.0,
        "notebook_path": "sweeps/s/notebooks/m.ipynb",
    }
    # the driver checked none: this node joined after
    later = ray_nodes.Checked("cpu", frozenset(), driver)
    probe = ray.remote(ray_executor._probe_on_ray).options(num_cpus=1)
    result = ray.get(probe.remote(task, Download("ready", path=source), {}, (), later))
    assert result.record is None and result.problem == "harness" and result.schedule["node"] == node
    assert result.pending == (
        f"the Ray node {socket.gethostname()} (node {node[:12]}) joined the cluster after the "
        f"sweep checked its nodes and has transformers {installed['transformers']} (the driver "
        "has 0.0.1): install the driver's stack there, or take it out of the cluster"
    )
    checked = ray_nodes.Checked("cpu", frozenset({node}), driver)
    assert ray.get(ray.remote(refused_there).options(num_cpus=0).remote(checked)) is None


def test_a_ray_worker_lost_under_a_probe_leaves_its_model_pending_and_a_rerun_that_tells_says_so(
    local_ray, fixture_models, tmp_path
):
    """A Ray worker killed under its probe (SIGKILL from outside, as a node going away would: Ray
    raises WorkerCrashedError) says nothing about the model: the probe is run once more on a
    fresh task, then left pending with the cause, never a FAIL row; ``--resume`` probes it. It
    was a FAIL(other) ``RayWorkerDied`` row. On the resume the worker is killed once: the rerun's
    record says so (``reran_after``), and where it ran (``ray_node``), as its log's first line
    and its schedule.jsonl row do; a rerun left no trace before."""
    data = tmp_path / "data"
    chosen = definition(
        tmp_path, fixture_models, ["tiny-gpt2"], overrides={"tiny-gpt2": {"judge": False}}
    )
    killed: list[str] = []

    def kill_the_worker_under_each_try(times: int):
        while len(killed) < times:
            fresh = wait_for(
                lambda: [p for p, _task in probes_of(data) if p.cmdline()[-1] not in killed][:1],
                120,
            )
            killed.append(fresh[0].cmdline()[-1])  # the probe's folder: one per try
            fresh[0].parent().send_signal(signal.SIGKILL)  # the Ray worker running it

    killer = threading.Thread(target=kill_the_worker_under_each_try, args=(2,), daemon=True)
    killer.start()
    summary = in_thread(lambda: sweep.run(chosen, data, workers=1, executor="ray"), timeout=240)
    # tried twice, never a FAIL row
    assert len(killed) == 2 and not store.read_records(data, summary["sweep_id"])
    (pending,) = summary["pending"].values()
    assert pending["problem"] == "harness", pending
    assert pending["reason"].startswith(
        "the Ray worker running the probe was lost (WorkerCrashedError: "
    )
    assert pending["reason"].endswith("; tried 2 times")
    # once more
    killer = threading.Thread(target=kill_the_worker_under_each_try, args=(3,), daemon=True)
    killer.start()
    resumed = in_thread(
        lambda: sweep.run(None, data, executor="ray", resume=summary["sweep_id"]), timeout=240
    )
    (record,) = store.read_records(data, summary["sweep_id"])
    assert record["status"] == schema.PASS and not resumed["pending"] and len(killed) == 3
    assert record["reran_after"].startswith(
        "the Ray worker running the probe was lost (WorkerCrashedError: "
    )
    assert record["ray_node"] == ray.get_runtime_context().get_node_id()
    log = (
        store.sweep_dir(data, summary["sweep_id"])
        / "logs"
        / f"{store.stem(record['model_id'], record['variant'])}.log"
    )
    assert log.read_text().startswith(
        f"ran again on a fresh Ray task: its first run told nothing ({record['reran_after']})"
    )
    *_, row = [
        json.loads(line)
        for line in (store.sweep_dir(data, summary["sweep_id"]) / "schedule.jsonl").open()
    ]
    # the resume's row
    assert row["reran_after"] == record["reran_after"] and row["node"] == record["ray_node"]


def test_a_memory_kill_is_the_models_row_only_on_a_rerun_that_ran_alone(monkeypatch):
    """Ray's memory monitor kills the most recently started task when its node runs low, not the
    one using the memory: a probe it kills is the harness's (run again, then pending saying so)
    unless its rerun was killed while no other task of the sweep ran, the model's out-of-memory
    row (FAIL(other), the host's memory). Ray is faked at its boundary only (the remote
    function's ``remote`` and ``ray.get``): whether another task of the sweep runs is what the
    executor itself counts, here another model's probe still in flight on a thread."""
    from model_support.sweep.executors.ray import RayExecutor
    from model_support.sweep.worker.download import Download
    from model_support.sweep.worker.process import TaskResult

    killed = ray.exceptions.OutOfMemoryError(
        "Task was killed due to the node running low on memory.\nMemory on..."
    )
    base = {
        "sweep_id": "s",
        "source": "/m",
        "params": {"device": "cpu"},
        "variant": "eager+dynamic",
    }
    base |= {"timeout_s": 60.0, "notebook_path": "sweeps/s/notebooks/m.ipynb"}
    task, other = {**base, "model_id": "m"}, {**base, "model_id": "other"}
    started, release = threading.Event(), threading.Event()

    def still_running() -> TaskResult:  # the other model's probe: in flight until released
        started.set()
        release.wait(60)
        return TaskResult(None, None, "", "other", pending="done", problem="network")

    def run_out_of_memory() -> TaskResult:
        raise killed

    outcome = {"m": run_out_of_memory, "other": still_running}

    class Reference:
        def __init__(self, model_id: str):
            self.model_id = model_id

    # what ``ray.remote(_probe_on_ray)`` gives: ``.options(**resources).remote(*args)``, a reference
    class Remote:
        def options(self, **resources):
            return self

        def remote(self, probed, *args):
            return Reference(probed["model_id"])

    monkeypatch.setattr(ray, "get", lambda reference, **kwargs: outcome[reference.model_id]())
    executor = RayExecutor("cpu", 2)
    executor._remote = Remote()
    got = Download("ready", path="/m")
    first = executor.run_one(task, got, (0,), retry=False)
    beside = threading.Thread(target=executor.run_one, args=(other, got, (1,), False), daemon=True)
    beside.start()
    assert started.wait(30)
    # the other model's task is still in flight
    crowded = executor.run_one(task, got, (0,), retry=True)
    release.set()
    beside.join(30)
    alone = executor.run_one(task, got, (0,), retry=True)
    assert first.record is None and first.problem == "harness" and crowded.problem == "harness", (
        crowded
    )
    assert (
        "while 1 other task of the sweep ran" in crowded.pending
        and "run fewer workers per node" in crowded.pending
    )
    assert (alone.record["status"], alone.record["failure_stage"]) == (schema.FAIL_OTHER, "runner")
    assert (
        alone.record["error_type"] == "RayOutOfMemory"
        and "out of host memory" in alone.record["error_message"]
    )
    # the first kill's words
    assert alone.record["reran_after"].startswith("Ray's memory monitor killed the probe (")


def test_a_stop_cancels_every_outstanding_ray_task(local_ray, fixture_models, tmp_path):
    data = tmp_path / "data"
    chosen = definition(tmp_path, fixture_models, ["tiny-gpt2", "fail-hang"], timeout_s=300)

    class Stop(Exception):
        pass

    def stop_at_the_first_result(record, done, total):
        raise Stop

    with pytest.raises(Stop):
        in_thread(
            lambda: sweep.run(
                chosen, data, workers=2, executor="ray", on_result=stop_at_the_first_result
            ),
            300,
        )
    # the hanging model's task was cancelled, its probe killed
    wait_for(lambda: not probes_of(data), timeout=30)


def test_a_local_ray_for_device_auto_is_started_for_the_device_auto_finds(monkeypatch):
    """Device ``auto`` is resolved before a local Ray starts: on a host with two (pretend)
    accelerators its Ray gets a CPU for each device's probe and for its host checks, and the two
    devices, as for ``device: pretend``. Resolved once Ray was up, it came too late: the local
    Ray for ``auto`` had started with the one CPU of a CPU sweep."""
    import os

    from model_support.sweep.executors.ray import RayExecutor

    # the facts come from a child process
    monkeypatch.setenv("MODEL_SUPPORT_PRETEND", json.dumps({"devices": 2}))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    auto, named = RayExecutor("auto", None), RayExecutor("pretend", None)
    wanted = {"num_cpus": max(os.cpu_count() or 1, 4), "resources": {"pretend": 2}}
    assert auto._local_resources() == named._local_resources() == wanted
    assert auto.device == "pretend"
    # no accelerator: the CPU's one worker, as for ``device: cpu``
    monkeypatch.delenv("MODEL_SUPPORT_PRETEND")
    assert RayExecutor("auto", None)._local_resources() == {"num_cpus": 1}


def test_a_nodes_own_tpu_variables_are_neither_carried_nor_unset_nor_recorded(monkeypatch):
    """Review: a Ray task unset every TPU_* the driver lacked, the node's own too (what Ray
    writes for a task's chips, a TPU VM's worker id, libtpu's metadata switch), and two hosts'
    records read as two stacks. A node's own (``node_vars``) are left to the node; the stack's
    (LIBTPU_INIT_ARGS here) still follow the driver."""
    from model_support.probe.devices import adapter_for
    from model_support.sweep.executors import ray_nodes

    node = {
        "TPU_WORKER_ID": "3",
        "TPU_SKIP_MDS_QUERY": "1",
        "TPU_HOST_BOUNDS": "1,1,1",
        "TPU_VISIBLE_CHIPS": "2",
    }
    for name, value in {**node, "LIBTPU_INIT_ARGS": "--node-flag"}.items():
        monkeypatch.setenv(name, value)
    wanted = ray_nodes.carried_here({}, ())
    assert not node.keys() & wanted.keys() and wanted["LIBTPU_INIT_ARGS"] is None, wanted
    assert adapter_for("tpu").configuration() == {"LIBTPU_INIT_ARGS": "--node-flag"}
