"""Sweeps on a real Ray cluster of two nodes on this machine, started as an admin would (``ray
start --head``, then ``ray start --address`` for the second node, each with 1 CPU and one
``pretend`` device), with nothing of the sweep's settings in the nodes' environment (no
``MODEL_SUPPORT_PRETEND``): the driver's stack must travel with each task (issue 57). Before,
every probe ran in its node's environment: ``DeviceUnavailable`` rows (the pretend accelerator
off on the nodes), or the nodes' ``missing_ops`` instead of the driver's.

The module once lost tiny-opt's row in CI (skipped since). The cause, found in that run's Ray
logs: its pytest process had run a sweep on a local Ray before, and Ray 2.60 turns token
authentication on for any process that starts a local Ray (``RAY_AUTH_MODE=token`` written into
its environment, kept after ``ray.shutdown``). That driver joined this cluster, which has
authentication off, and refused every call the nodes made back to it ("Missing authorization
header"): the result it had to fetch from the other node's object store never came
(``OwnerDiedError``), twice, and the model was left pending. Now the driver joins in the
cluster's mode (``ray_cluster.use_auth``) and puts its own back after a local Ray; the sweep
below runs from a driver with ``RAY_AUTH_MODE=token`` on purpose.

One cluster for the module (``cluster``). Its main sweep (``killed_and_resumed``: tiny-llama,
tiny-opt and tiny-gpt2 with ``--workers 5``) runs as a user runs it, ``model-support sweep`` in a
process of its own, SIGKILLed once its first record is stored, then finished with a plain
``model-support sweep --resume ID`` without ``RAY_ADDRESS``. Then a ``stacks:`` sweep, a head
with token authentication for the refusals, and last (it leaves the cluster a node to forget) a
third node with another stack. The module's time is the nodes' starts and seven probes."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from model_support.errors import UserError
from model_support.probe.model_ids import display_name
from model_support.record import store
from model_support.sweep import definition as params
from model_support.sweep import runner as sweep

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

RAY = str(Path(sys.executable).parent / "ray")
CLI = [sys.executable, "-m", "model_support.cli"]
#: The driver's stack: a pretend accelerator without ``aten::rsqrt`` (tiny-llama needs it, tiny-opt
#: does not).
DRIVER_STACK = {"devices": 2, "missing_ops": ["aten::rsqrt"]}
PROBE = {
    "device": "pretend",
    "max_new_tokens": 2,
    "judge": False,
    "perf": "off",
    "reference": "none",
}
MODELS = ["tiny-llama", "tiny-opt", "tiny-gpt2"]
#: A token the driver of the main sweep holds in token mode (the cluster has authentication off).
DRIVERS_TOKEN = "0123456789abcdef" * 4


#: Every port this module handed out: never twice (nodes start at once; a port handed out may not be
#: bound yet).
_HANDED: set[int] = set()


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports, none handed out before: each socket held until all are
    chosen (one at a time, the system handed the same port twice, and ``ray start`` refused "a
    port number ... used by other components")."""
    held = []
    try:
        while len(held) < count:
            candidate = socket.create_server(("127.0.0.1", 0))
            if candidate.getsockname()[1] in _HANDED:
                candidate.close()
                continue
            held.append(candidate)
            _HANDED.add(candidate.getsockname()[1])
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def node_ports() -> list[str]:
    """The ports a node would otherwise take at their defaults (two nodes on one host must not
    share them)."""
    names = (
        "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port",
        "runtime-env-agent-port",
        "metrics-export-port",
    )
    return [
        arg for name, port in zip(names, free_ports(len(names))) for arg in (f"--{name}", str(port))
    ]


def admins_environ(**extra: str) -> dict[str, str]:
    """The environment an admin starts a node with: this shell's, without anything of a sweep's
    settings (no ``MODEL_SUPPORT_*``, no ``RAY_*``), token authentication off unless ``extra``
    says otherwise."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODEL_SUPPORT_", "RAY_"))}
    return {**env, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", **extra}


def ray_start(args: list[str], temp_dir: Path, env: dict[str, str]) -> subprocess.Popen:
    """``ray start ARGS`` with 1 CPU and one pretend device, started (``started`` waits for it)."""
    common = ["--num-cpus", "1", "--resources", json.dumps({"pretend": 1}), "--disable-usage-stats"]
    command = [RAY, "start", *args, "--temp-dir", str(temp_dir), *common, *node_ports()]
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def started(*starts: subprocess.Popen) -> None:
    for start in starts:
        said = start.communicate(timeout=180)[0]
        assert start.returncode == 0, said[-3000:]


def start_head(temp_dir: Path, env: dict[str, str]) -> tuple[str, subprocess.Popen]:
    """A head node (``ray start --head``) on this host's loopback address: its address, and its
    start."""
    port, dashboard, client = free_ports(3)
    args = [
        "--head",
        "--port",
        str(port),
        "--node-ip-address",
        "127.0.0.1",
        "--include-dashboard",
        "false",
    ]
    args += ["--dashboard-port", str(dashboard), "--ray-client-server-port", str(client)]
    return f"127.0.0.1:{port}", ray_start(args, temp_dir, env)


def node_id(temp_dir: Path) -> str:
    """The id of the node started with ``temp_dir``, as its raylet logged it."""
    log = (temp_dir / "session_latest" / "logs" / "raylet.out").read_text()
    return re.search(r"Raylet of id, ([0-9a-f]+) started", log).group(1)


def stop_nodes(temp_dirs: list[Path]) -> None:
    """The nodes' processes ended: those of this module's nodes only (their temp folders on their
    command lines), not every Ray process of the host as ``ray stop`` would (another test's Ray,
    another user's); their folders gone."""
    ours = [
        p
        for p in psutil.process_iter(["cmdline"])
        if any(str(d) in arg for d in temp_dirs for arg in (p.info["cmdline"] or []))
    ]
    for process in ours:
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            pass
    # the module is done with them: no graceful drain to wait for
    _, alive = psutil.wait_procs(ours, timeout=1)
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    for folder in temp_dirs:
        shutil.rmtree(folder, ignore_errors=True)


#: The token of the module's second cluster, a head with token authentication on (``cluster``).
TOKEN = "fedcba9876543210" * 4


@pytest.fixture(scope="module")
def cluster():
    """A head and a second node, each ``--num-cpus 1 --resources '{"pretend": 1}'``, token
    authentication off (a private network's setup); the sweeps join it. Beside it, started at the
    same time as its second node, a head of its own with token authentication on (``TOKEN``), for
    the refusals. Temp folders short (Ray's socket paths) and this module's own."""
    if ray.is_initialized():
        ray.shutdown()
    temp_dirs = [Path(f"/tmp/ray57-{os.getpid()}-{n}") for n in ("head", "node", "odd", "token")]
    try:
        address, head = start_head(temp_dirs[0], admins_environ())
        started(head)
        second = ray_start(["--address", address], temp_dirs[1], admins_environ())
        token_address, token_head = start_head(
            temp_dirs[3], admins_environ(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN)
        )
        started(second, token_head)
        nodes = {node_id(d) for d in temp_dirs[:2]}
        yield {
            "address": address,
            "dirs": temp_dirs,
            "nodes": nodes,
            "token_address": token_address,
        }
    finally:
        if ray.is_initialized():
            ray.shutdown()
        stop_nodes(temp_dirs)


def write_definition(folder: Path, fixture_models: dict, names: list[str], **extra) -> Path:
    models = [
        {"id": fixture_models[n]["path"], "overrides": fixture_models[n]["overrides"]}
        for n in names
    ]
    path = folder / "cluster.yaml"
    path.write_text(yaml.safe_dump({"name": "cluster", "probe": PROBE, "models": models, **extra}))
    return path


def rows(data: Path, sweep_id: str) -> dict[str, dict]:
    return {
        display_name(r["model_id"]) + (f"@{r['stack_name']}" if r["stack_name"] else ""): r
        for r in store.read_records(data, sweep_id)
    }


def explained(data: Path, sweep_id: str) -> str:
    """What a failed assertion shows: the rows' verdicts and errors, and what was left pending
    and why."""
    found = {
        n: (r["status"], r["error_type"], r["error_message"])
        for n, r in rows(data, sweep_id).items()
    }
    pending = store.pending_file(data, sweep_id)
    return f"rows: {found}; pending: {pending.read_text() if pending.exists() else 'none'}"


@pytest.fixture(scope="module")
def killed_and_resumed(cluster, fixture_models, tmp_path_factory):
    """The main sweep, as a user runs it: ``model-support sweep --executor ray --workers 5`` from
    a driver whose stack lacks rsqrt and that has token authentication on
    (``RAY_AUTH_MODE=token``, as Ray 2.60 leaves a process that started a local Ray); SIGKILLed
    once its first record is stored; then ``model-support sweep --resume ID`` with no
    ``RAY_ADDRESS``. Its data folder, sweep id and what each run said."""
    tmp = tmp_path_factory.mktemp("cluster")
    data, definition = tmp / "data", write_definition(tmp, fixture_models, MODELS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env |= {
        "MODEL_SUPPORT_PRETEND": json.dumps(DRIVER_STACK),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": DRIVERS_TOKEN,
    }
    command = [
        *CLI,
        "sweep",
        str(definition),
        "--executor",
        "ray",
        "--workers",
        "5",
        "--data-dir",
        str(data),
    ]
    first = subprocess.Popen(
        [*command, "--no-report"],
        env={**env, "RAY_ADDRESS": cluster["address"]},
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 240
    while (
        not list((data / "sweeps").glob("*/records/*.json"))
        and first.poll() is None
        and time.time() < deadline
    ):
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    said_first = first.communicate(timeout=60)[1]
    assert list((data / "sweeps").glob("*/records/*.json")), (
        f"no record within 240 s: {said_first[-3000:]}"
    )
    found = list((data / "sweeps").glob("*/sweep.json"))
    assert len(found) == 1, said_first[-3000:]
    (sweep_dir,) = found
    sweep_id = sweep_dir.parent.name
    stored_before = len(store.read_records(data, sweep_id))
    resumed = subprocess.run(
        [*CLI, "sweep", "--resume", sweep_id, "--data-dir", str(data), "--no-report"],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    return {
        "data": data,
        "sweep_id": sweep_id,
        "first": said_first,
        "stored_before": stored_before,
        "resumed": resumed,
    }


def test_the_drivers_stack_reaches_every_probe_on_nodes_started_without_it(
    killed_and_resumed, cluster
):
    """The nodes have no ``MODEL_SUPPORT_PRETEND``; the driver's (no rsqrt) reaches each probe,
    on both nodes: the verdicts are the local executor's, each record's backend configuration is
    sweep.json's and names the node it ran on. Before: every row ``FAIL(other)``
    DeviceUnavailable (the pretend accelerator off on the nodes); and from a driver in token
    mode, a row lost (the cause of the CI failure, module docstring)."""
    data, sweep_id = killed_and_resumed["data"], killed_and_resumed["sweep_id"]
    found = rows(data, sweep_id)
    assert {name: r["status"] for name, r in found.items()} == {
        "tiny-llama": "FAIL(gen)",
        "tiny-opt": "PASS",
        "tiny-gpt2": "PASS",
    }, explained(data, sweep_id)
    assert "rsqrt" in found["tiny-llama"]["error_message"]
    assert not any("DeviceUnavailable" in str(r.get("error_type")) for r in found.values())
    meta = json.loads((store.sweep_dir(data, sweep_id) / "sweep.json").read_text())
    assert meta["executor"] == "ray" and meta["device_config"] == {
        "MODEL_SUPPORT_PRETEND": json.dumps(DRIVER_STACK)
    }
    assert {r["backend_config"] for r in found.values()} == {
        json.dumps(meta["device_config"], sort_keys=True)
    }
    assert {r["ray_node"] for r in found.values()} <= cluster["nodes"] and all(
        r["ray_node"] for r in found.values()
    )
    # both nodes ran probes (the killed run's rows of its own are gone with it)
    for folder in cluster["dirs"][:2]:
        ran = "".join(
            p.read_text() for p in (folder / "session_latest" / "logs").glob("worker-*.out")
        )
        assert ":task_name:_probe_on_ray" in ran, folder


def test_workers_beyond_the_clusters_devices_are_capped_to_them(killed_and_resumed):
    """``--workers 5`` on a cluster of 2 pretend devices: 2 probes at once, in both runs
    (schedule.jsonl: the devices the driver granted, when), said in one line. Before: 5 accepted,
    the three probes "started" at once (Ray's queue)."""
    data, sweep_id = killed_and_resumed["data"], killed_and_resumed["sweep_id"]
    assert (
        "The Ray cluster has 2 pretend devices now: running 2 probe(s) at once, not the 5 asked"
        in (killed_and_resumed["first"])
    )
    assert " with 2 worker(s) (ray)" in killed_and_resumed["resumed"].stdout
    lines = (store.sweep_dir(data, sweep_id) / "schedule.jsonl").read_text().splitlines()
    spans = [(e["start"], e["end"]) for e in map(json.loads, lines) if "start" in e]
    assert spans and max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans) <= 2, spans


def test_a_sigkilled_driver_resumed_with_a_plain_resume_continues_on_its_ray_cluster(
    killed_and_resumed, cluster
):
    """The driver SIGKILLed after its first record; ``sweep --resume ID`` with no ``RAY_ADDRESS``
    joins the cluster the sweep ran on (``ray.json``) and finishes it there: one row per model,
    nothing pending. Before: sweep.json said "local" for ``--executor ray``, and a resume without
    RAY_ADDRESS would have started a local Ray."""
    data, sweep_id, resumed = (
        killed_and_resumed["data"],
        killed_and_resumed["sweep_id"],
        killed_and_resumed["resumed"],
    )
    assert 1 <= killed_and_resumed["stored_before"] < len(MODELS), explained(data, sweep_id)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (
        f"Sweep {sweep_id} ran on the Ray cluster at {cluster['address']}: resuming it there."
        in resumed.stderr
    )
    assert sorted(rows(data, sweep_id)) == sorted(MODELS), explained(data, sweep_id)
    assert len(store.read_records(data, sweep_id)) == len(MODELS)
    pending = store.pending_file(data, sweep_id)
    assert not pending.exists() or not json.loads(pending.read_text()), pending.read_text()
    assert (
        json.loads((store.sweep_dir(data, sweep_id) / "ray.json").read_text())["address"]
        == cluster["address"]
    )


def test_a_stacks_sweep_on_the_cluster_gives_each_stack_its_own_verdict(
    cluster, fixture_models, tmp_path, monkeypatch
):
    """A ``stacks:`` sweep (base, no-rsqrt) of tiny-llama on the cluster: each pass's stack
    travels with its tasks, so the verdicts differ per stack as they do locally. Before: both
    stacks PASS (the nodes' environment decided)."""
    monkeypatch.setenv("RAY_ADDRESS", cluster["address"])
    # the driver's own: its device is there
    monkeypatch.setenv("MODEL_SUPPORT_PRETEND", json.dumps({"devices": 2}))
    stacks = {
        "base": {"env": {"MODEL_SUPPORT_PRETEND": json.dumps({"devices": 2})}},
        "no-rsqrt": {"env": {"MODEL_SUPPORT_PRETEND": json.dumps(DRIVER_STACK)}},
    }
    definition = params.load(
        write_definition(tmp_path, fixture_models, ["tiny-llama"], stacks=stacks)
    )
    summary = sweep.run(definition, tmp_path / "data", executor="ray")
    found = rows(tmp_path / "data", summary["sweep_id"])
    assert {n: r["status"] for n, r in found.items()} == {
        "tiny-llama@base": "PASS",
        "tiny-llama@no-rsqrt": "FAIL(gen)",
    }, explained(tmp_path / "data", summary["sweep_id"])
    assert "rsqrt" in found["tiny-llama@no-rsqrt"]["error_message"]


def test_ray_refuses_a_driver_without_the_clusters_token_in_one_sentence(
    cluster, fixture_models, tmp_path, monkeypatch
):
    """A head started with token authentication on (Ray 2.60's default for ``ray start --head``):
    a driver without its token retried 17 s and said "Could not start or join the Ray cluster"
    (the cause, InvalidAuthToken, only in Ray's log lines). Now one sentence at once, naming what
    to set, and nothing left that ``list`` shows as work to do; with a wrong token, or the right
    one but token mode off, the sentence says which; with both, the driver may join."""
    from model_support.sweep.executors.ray_cluster import check_ray_address

    address = cluster["token_address"]
    monkeypatch.setenv("RAY_ADDRESS", address)
    monkeypatch.setenv("MODEL_SUPPORT_PRETEND", json.dumps(DRIVER_STACK))
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    # not ~/.ray/auth_token: none at all
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "no-token"))
    definition = params.load(write_definition(tmp_path, fixture_models, ["tiny-gpt2"]))
    began = time.time()
    with pytest.raises(UserError) as refused:
        sweep.run(definition, tmp_path / "data", executor="ray")
    assert time.time() - began < 5
    assert str(refused.value) == (
        f"The Ray cluster at RAY_ADDRESS={address} has token authentication on and this "
        "driver's token is missing (InvalidAuthToken); set RAY_AUTH_MODE=token and "
        "RAY_AUTH_TOKEN to the head's token (`ray get-auth-token` on the head prints it), or "
        "start the cluster with RAY_AUTH_MODE=disabled on a private network."
    )
    assert not (tmp_path / "data" / "sweeps").exists() or not list(
        (tmp_path / "data" / "sweeps").iterdir()
    )
    monkeypatch.setenv("RAY_AUTH_TOKEN", "0" * 64)
    with pytest.raises(
        UserError, match=r"this driver's token is not the cluster's \(InvalidAuthToken\)"
    ):
        check_ray_address()
    monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
    with pytest.raises(UserError) as refused:
        check_ray_address()
    assert str(refused.value).endswith(
        "has token authentication on and this driver does not use it (RAY_AUTH_MODE=disabled; "
        "its token, from RAY_AUTH_TOKEN, is the cluster's); set RAY_AUTH_MODE=token."
    )
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    assert check_ray_address() == "token"


def test_a_node_started_with_another_stack_is_refused_before_it_probes(
    cluster, fixture_models, tmp_path, monkeypatch
):
    """A third node joins with another transformers (a ``transformers-0.0.1.dist-info`` first on
    its PYTHONPATH: what ``importlib.metadata`` reports) and other project code (a copy of the
    package with one file changed: its version is 0.1.0 all the same). The sweep is refused
    before any probe, in one sentence naming the node, the package and the code; nothing is left
    that ``list`` shows as work to do. Last in the module: the cluster keeps the node."""
    import model_support

    odd = tmp_path / "odd"
    (odd / "transformers-0.0.1.dist-info").mkdir(parents=True)
    (odd / "transformers-0.0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: transformers\nVersion: 0.0.1\n"
    )
    package = Path(model_support.__file__).parent
    shutil.copytree(package, odd / "model_support", ignore=shutil.ignore_patterns("__pycache__"))
    with open(odd / "model_support" / "__init__.py", "a") as changed:
        changed.write("\n# another build of the project, same version\n")
    started(
        ray_start(
            ["--address", cluster["address"]],
            cluster["dirs"][2],
            admins_environ(PYTHONPATH=str(odd)),
        )
    )
    node = node_id(cluster["dirs"][2])
    monkeypatch.setenv("RAY_ADDRESS", cluster["address"])
    monkeypatch.setenv("MODEL_SUPPORT_PRETEND", json.dumps(DRIVER_STACK))
    definition = params.load(write_definition(tmp_path, fixture_models, ["tiny-gpt2"]))
    with pytest.raises(UserError) as refused:
        sweep.run(definition, tmp_path / "data", executor="ray")
    said = str(refused.value)
    from importlib.metadata import version

    assert (
        f"(node {node[:12]}) has transformers 0.0.1 (the driver has "
        f"{version('transformers')}), model_support code " in said
    ), said
    # the two nodes with the driver's stack pass
    assert said.count("the Ray node ") == 1 and "\n" not in said, said
    assert said.endswith(
        "install the driver's versions and code there (or take the node out of the cluster) before "
        "this sweep runs on it."
    )
    assert not (tmp_path / "data" / "sweeps").exists() or not list(
        (tmp_path / "data" / "sweeps").iterdir()
    )
