"""Sweeping the Hub, offline: the fixtures served as Hub repos by ``hub_server``, faults on demand.

Each test runs the real ``model-support sweep`` command in a subprocess whose ``HF_ENDPOINT`` points
at a local server speaking the Hub's protocol (or at a closed port), with its own Hugging Face
cache. The rule under test: a verdict describes the model on the stack; the network, the disk,
access rights and a missing token never become one (they are retried, excluded with a reason, or
left pending for ``--resume``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import polars as pl
import pytest
import yaml
from hub_server import HubServer, closed_port

from model_support.record import store

pytestmark = pytest.mark.slow
CLI = [sys.executable, "-m", "model_support.cli"]
TINY = ("tiny-llama", "tiny-gpt2", "tiny-opt", "tiny-qwen2", "tiny-mistral", "tiny-gemma")


def gguf_only(folder: Path) -> Path:
    """A repo with a config and a .gguf file only: nothing transformers loads as safetensors or
    .bin."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "model-q4.gguf").write_bytes(b"GGUF" + bytes(20_000))
    return folder


@pytest.fixture(scope="module")
def hub(fixture_models, tmp_path_factory):
    """The tiny fixtures as Hub repos ``fixtures/<name>``, plus a gated copy and a gguf-only
    repo."""
    extra = tmp_path_factory.mktemp("repos")
    server = HubServer()
    for name in TINY:
        server.add_repo(f"fixtures/{name}", fixture_models[name]["path"])
    for name in ("flaky-503", "flaky-429", "cut-once", "cut-always"):
        server.add_repo(f"fixtures/{name}", fixture_models["tiny-llama"]["path"])
    server.add_repo("fixtures/gated", fixture_models["tiny-llama"]["path"], gated=True)
    server.add_repo("fixtures/gguf-only", gguf_only(extra / "gguf"))
    with server:
        yield server


def sweep_cli(args, endpoint: str, cache: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "HF_ENDPOINT": endpoint,
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_CACHE": str(cache),
        "MODEL_SUPPORT_HUB_BACKOFF_S": "0.05",
    }
    env.pop("HF_TOKEN", None)
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=900, env=env, cwd=cwd
    )


def definition(tmp_path: Path, models, cache: Path, max_gb: float | None = None) -> Path:
    path = tmp_path / "hub.yaml"
    body = {
        "name": "hub",
        "probe": {"device": "cpu", "reference": "none"},
        "models": list(models),
        "cache": {"dir": str(cache), **({"max_gb": max_gb} if max_gb else {})},
        "timeout_s": 300,
    }
    path.write_text(yaml.safe_dump(body))
    return path


def records(data_dir: Path) -> dict[str, dict]:
    return {
        json.loads(p.read_text())["model_id"]: json.loads(p.read_text())
        for p in (data_dir / "sweeps").glob("*/records/*.json")
    }


def sweep_id_of(data_dir: Path) -> str:
    return next((data_dir / "sweeps").glob("*/sweep.json")).parent.name


def test_an_unreachable_hub_leaves_models_pending_and_resume_finishes_them(hub, tmp_path):
    cache, data = tmp_path / "cache", tmp_path / "data"
    params = definition(tmp_path, ["fixtures/tiny-llama", "fixtures/tiny-gpt2"], cache)
    down = sweep_cli(
        ["sweep", str(params), "--data-dir", str(data), "--no-report"],
        f"http://127.0.0.1:{closed_port()}",
        cache,
        tmp_path,
    )
    sweep_id = sweep_id_of(data)
    assert down.returncode == 1, down.stderr[-2000:]
    assert down.stderr.strip().splitlines()[-1] == (
        "2 models could not be downloaded (network): run `model-support sweep --resume "
        f"{sweep_id}` to finish them."
    )
    assert "Traceback" not in down.stderr
    assert records(data) == {}  # no row: not a failure, not excluded, pending
    assert store.scan(data).collect().height == 0
    pending = json.loads((store.sweep_dir(data, sweep_id) / "pending.json").read_text())
    assert sorted(pending) == ["fixtures/tiny-gpt2", "fixtures/tiny-llama"]
    assert "could not be reached" in pending["fixtures/tiny-llama"]["reason"]

    up = sweep_cli(
        ["sweep", "--resume", sweep_id, "--data-dir", str(data), "--no-report"],
        hub.url,
        cache,
        tmp_path,
    )
    assert up.returncode == 0, up.stderr[-3000:]
    assert "2 probed now" in up.stdout
    done = records(data)
    assert {m: r["status"] for m, r in done.items()} == {
        "fixtures/tiny-llama": "PASS",
        "fixtures/tiny-gpt2": "PASS",
    }
    assert done["fixtures/tiny-llama"]["revision_sha"] == hub.sha("fixtures/tiny-llama")
    assert (
        done["fixtures/tiny-llama"]["download_bytes"] > 0
        and done["fixtures/tiny-llama"]["download_s"] > 0
    )
    # Hub metadata on the record
    assert done["fixtures/tiny-llama"]["pipeline_tag"] == "text-generation"
    assert not (store.sweep_dir(data, sweep_id) / "pending.json").exists()


def test_hub_faults_are_retried_excluded_or_pending_never_a_failure(hub, tmp_path):
    hub.faults.clear()
    hub.faults.fail(503, times=2, repo="fixtures/flaky-503", path="config.json", method="GET")
    hub.faults.fail(
        429, times=1, repo="fixtures/flaky-429", path="config.json", method="GET", retry_after=1
    )
    hub.faults.cut(after_bytes=1000, times=1, repo="fixtures/cut-once", path="model.safetensors")
    hub.faults.cut(
        after_bytes=1000, times=None, repo="fixtures/cut-always", path="model.safetensors"
    )
    cache, data = tmp_path / "cache", tmp_path / "data"
    models = [
        "fixtures/flaky-503",
        "fixtures/flaky-429",
        "fixtures/cut-once",
        "fixtures/cut-always",
        "fixtures/gated",
        "fixtures/gguf-only",
    ]
    run = sweep_cli(
        ["sweep", str(definition(tmp_path, models, cache)), "--data-dir", str(data), "--no-report"],
        hub.url,
        cache,
        tmp_path,
    )
    hub.faults.clear()
    sweep_id = sweep_id_of(data)
    assert run.returncode == 1, run.stderr[-3000:]
    assert run.stderr.strip().splitlines()[-1] == (
        "1 model could not be downloaded (network): run `model-support sweep --resume "
        f"{sweep_id}` to finish it."
    )
    done = records(data)
    results = store.scan(data).collect()
    assert dict(results.select("model_id", "status").iter_rows()) == {
        "fixtures/flaky-503": "PASS",
        "fixtures/flaky-429": "PASS",
        "fixtures/cut-once": "PASS",
        "fixtures/gguf-only": "FAIL(load)",
    }
    gguf = done["fixtures/gguf-only"]
    assert (
        gguf["failure_stage"] == "download"
        and "no weights transformers can load" in gguf["error_message"]
    )
    assert "only .gguf" in gguf["error_message"]
    excluded = store.scan(data, "excluded").collect()
    assert excluded.select("model_id", "exclusion_reason").rows() == [
        (
            "fixtures/gated",
            "no access: gated repo (accept its licence on the Hub, then set HF_TOKEN).",
        )
    ]
    assert "fixtures/cut-always" not in done  # pending, never a row
    logs = store.sweep_dir(data, sweep_id) / "logs"
    assert "retry 2/5" in (logs / "fixtures__flaky-503.log").read_text()
    assert "503" in (logs / "fixtures__flaky-503.log").read_text()
    assert "429" in (logs / "fixtures__flaky-429.log").read_text()
    assert "resume" in (logs / "fixtures__cut-once.log").read_text().lower()


def test_the_cache_stays_within_its_budget_and_is_emptied(
    hub, tmp_path, fixture_models, monkeypatch
):
    """Six repos, a budget below their sum but above each: never over budget; nothing left but
    what was there."""
    import huggingface_hub

    from model_support.probe import hub_fetch

    # conftest sets it for the others
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    hub.faults.clear()
    cache, data = tmp_path / "cache", tmp_path / "data"
    before = hub_fetch.fetch(
        "fixtures/tiny-gemma", cache_dir=cache, endpoint=hub.url, log=lambda _: None
    )
    sizes = [
        sum(
            f.stat().st_size
            for f in Path(fixture_models[n]["path"]).iterdir()
            if f.is_file() and not f.name.startswith(".")
        )
        for n in TINY
    ]
    budget = 2.5 * max(sizes)
    assert budget < sum(sizes)
    preexisting = _cache_bytes(cache)
    peak = [0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _cache_bytes(cache) - preexisting)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        run = sweep_cli(
            [
                "sweep",
                str(
                    definition(
                        tmp_path,
                        [f"fixtures/{n}" for n in TINY],
                        cache,
                        budget / 1e9,
                    )
                ),
                "--data-dir",
                str(data),
                "--no-report",
                "--workers",
                "2",
            ],
            hub.url,
            cache,
            tmp_path,
        )
    finally:
        stop.set()
        sampler.join()
    assert run.returncode == 0, run.stderr[-3000:]
    assert {r["status"] for r in records(data).values()} == {"PASS"} and len(records(data)) == len(
        TINY
    )
    assert 0 < peak[0] <= budget, (peak[0], budget)
    assert _cache_bytes(cache) == preexisting  # the sweep's downloads are gone ...
    # ... and what was there before is still there
    assert Path(before["path"], "config.json").is_file()
    repos = {p.name for p in cache.iterdir() if p.name.startswith("models--")}
    assert repos <= {"models--fixtures--tiny-gemma"} | {f"models--fixtures--{n}" for n in TINY}
    for name in TINY[:-1]:
        assert not list((cache / f"models--fixtures--{name}").glob("blobs/*")), name


def _cache_bytes(cache: Path) -> int:
    """Bytes of the regular files under ``cache`` right now; files deleted while it walks are
    skipped (the sampler runs while the sweep deletes what it downloaded)."""
    total = 0
    for root, _dirs, names in os.walk(cache):  # os.walk ignores folders that vanish under it
        for name in names:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if not os.path.islink(os.path.join(root, name)):
                total += st.st_size
    return total


def test_download_time_is_its_own_stage_and_load_time_stays_local(hub, tmp_path, fixture_models):
    hub.faults.clear()
    size = sum(
        f.stat().st_size
        for f in Path(fixture_models["tiny-llama"]["path"]).iterdir()
        if f.is_file()
    )
    # about 8 s to download: far above loading the 1 MB model even on a loaded machine (3.2 s seen
    # under CI's load)
    hub.faults.throttle(size // 8, repo="fixtures/tiny-llama")
    cache, data = tmp_path / "cache", tmp_path / "data"
    models = ["fixtures/tiny-llama", fixture_models["tiny-llama"]["path"]]
    run = sweep_cli(
        [
            "sweep",
            str(definition(tmp_path, models, cache)),
            "--data-dir",
            str(data),
            "--no-report",
            "--workers",
            "1",
        ],
        hub.url,
        cache,
        tmp_path,
    )
    hub.faults.clear()
    assert run.returncode == 0, run.stderr[-3000:]
    done = records(data)
    remote, local = done["fixtures/tiny-llama"], done["local:tiny-llama"]
    assert remote["download_s"] >= 6.0, remote["download_s"]
    # a local folder skips the stage
    assert local["download_s"] is None and local["revision_sha"] is None
    # the throttled download (about 8 s) is not in load_s: were it, load would exceed the download
    # itself
    assert 0 < remote["load_s"] < remote["download_s"], (remote["load_s"], remote["download_s"])
    assert remote["output_token_ids"] == local["output_token_ids"]
    frame = store.scan(data).collect()
    assert (
        frame.filter(pl.col("model_id") == "fixtures/tiny-llama")["download_bytes"].item()
        >= size * 0.9
    )
    shutil.rmtree(cache, ignore_errors=True)


def test_one_papermill_probe_of_a_hub_model_and_its_repro_script(hub, tmp_path):
    """The headline command on a Hub id downloads, probes, records; the repro script downloads
    the same way."""
    hub.faults.clear()
    cache = tmp_path / "cache"
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_HUB_CACHE": str(cache)}
    env.pop("HF_TOKEN", None)
    record_path = tmp_path / "r.json"
    papermill = os.path.join(os.path.dirname(sys.executable), "papermill")
    run = subprocess.run(
        [
            papermill,
            str(store_notebook()),
            str(tmp_path / "out.ipynb"),
            "-p",
            "model_id",
            "fixtures/tiny-gpt2",
            "-p",
            "device",
            "cpu",
            "-p",
            "reference",
            "none",
            "-p",
            "record_path",
            str(record_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    record = json.loads(record_path.read_text())
    assert (record["status"], record["model_id"]) == ("PASS", "fixtures/tiny-gpt2")
    assert record["revision_sha"] == hub.sha("fixtures/tiny-gpt2") and record["download_bytes"] > 0
    assert record["library_name"] == "transformers" and record["load_s"] > 0
    # rebuilt after the download: still the device adapter's compile backend (it once fell back to
    # none)
    assert "'compile_backend': 'inductor'" in record["repro_script"]
    script = tmp_path / "repro.py"
    script.write_text(record["repro_script"])
    repro = subprocess.run(
        [sys.executable, "-I", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    assert repro.returncode == 0, repro.stderr[-3000:]
    assert (
        json.loads(repro.stdout.strip().splitlines()[-1])["output_token_ids"]
        == record["output_token_ids"]
    )

    down = subprocess.run(
        [
            papermill,
            str(store_notebook()),
            str(tmp_path / "down.ipynb"),
            "-p",
            "model_id",
            "fixtures/tiny-gpt2",
            "-p",
            "device",
            "cpu",
            "-p",
            "record_path",
            str(tmp_path / "d.json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={
            **env,
            "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}",
            "HF_HUB_CACHE": str(tmp_path / "empty"),
            "MODEL_SUPPORT_HUB_BACKOFF_S": "0.05",
        },
    )
    assert (
        down.returncode != 0
        and "ModelUnavailable: model_id 'fixtures/tiny-gpt2' could not be fetched" in down.stderr
    )  # no record
    assert not (tmp_path / "d.json").exists()


def store_notebook() -> Path:
    from model_support import paths

    return paths.notebook("probe")


def test_the_hub_facts_are_later_fields_that_older_files_lack():
    from model_support.probe.records import FACT_FIELDS
    from model_support.record import schema

    assert set(FACT_FIELDS) <= set(schema.LATER_FIELDS)
    assert "download" in schema.STAGES


def test_under_ray_the_downloads_run_ahead_within_the_budget_and_the_cache_is_emptied(
    hub, tmp_path, fixture_models
):
    """The Ray executor keeps the local one's promises: the driver downloads within the cache
    budget (a budget below the models' sum), each Ray task probes the snapshot it was handed, the
    sweep's downloads are deleted after their probes, and schedule.jsonl says which devices each
    probe held."""
    pytest.importorskip("ray")
    hub.faults.clear()
    names = TINY[:3]
    cache, data = tmp_path / "cache", tmp_path / "data"
    sizes = [
        sum(f.stat().st_size for f in Path(fixture_models[n]["path"]).iterdir() if f.is_file())
        for n in names
    ]
    budget = 1.5 * max(sizes)
    assert budget < sum(sizes)
    params = definition(tmp_path, [f"fixtures/{n}" for n in names], cache, budget / 1e9)
    run = sweep_cli(
        [
            "sweep",
            str(params),
            "--data-dir",
            str(data),
            "--no-report",
            "--executor",
            "ray",
            "--workers",
            "2",
        ],
        hub.url,
        cache,
        tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    done = records(data)
    assert {r["status"] for r in done.values()} == {"PASS"} and len(done) == len(names)
    assert all(r["download_bytes"] > 0 for r in done.values())  # downloaded by the driver, ahead
    # every download deleted after its probe (what is left is huggingface_hub's refs)
    for name in names:
        assert not list((cache / f"models--fixtures--{name}").glob("blobs/*")), name
    assert _cache_bytes(cache) < 1000
    schedule = [
        json.loads(line)
        for line in (store.sweep_dir(data, sweep_id_of(data)) / "schedule.jsonl").open()
    ]
    assert sorted(entry["model_id"] for entry in schedule) == sorted(done)
    assert all(len(entry["devices"]) == 1 and "node" in entry for entry in schedule)


def test_a_stop_during_a_download_ends_the_sweep_in_seconds(hub, tmp_path):
    """The prefetcher's close waits for no download in flight: a sweep stopped while a model
    downloads at 1 KB/s (about a thousand seconds for its weights) ends within seconds, in one
    sentence."""
    import signal

    hub.faults.clear()
    hub.faults.throttle(1000, repo="fixtures/tiny-opt")
    cache, data = tmp_path / "cache", tmp_path / "data"
    params = definition(tmp_path, ["fixtures/tiny-opt"], cache)
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_HUB_CACHE": str(cache)}
    env.pop("HF_TOKEN", None)
    runner = subprocess.Popen(
        [*CLI, "sweep", str(params), "--data-dir", str(data), "--no-report"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        deadline = time.time() + 120
        while (
            not list(cache.glob("models--fixtures--tiny-opt/blobs/*.incomplete"))
            and time.time() < deadline
        ):
            time.sleep(0.2)
        assert list(cache.glob("models--fixtures--tiny-opt/blobs/*.incomplete")), (
            "the download never started"
        )
        runner.send_signal(signal.SIGINT)
        out, err = runner.communicate(timeout=30)
    finally:
        runner.kill()
        hub.faults.clear()
    assert runner.returncode == 1 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("Error: The sweep was stopped: 0 of 1 stored;")
