"""Sweeps: Parquet with one row per model, timeouts and kernel death, Ray, resume after SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import yaml

from model_support.errors import UserError
from model_support.probe.model_ids import display_name
from model_support.record import schema, store
from model_support.sweep import definition as params
from model_support.sweep import runner as sweep

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "model_support.cli"]


def test_smoke_sweep_publishes_one_row_per_fixture(smoke_sweep, fixture_models):
    data_dir = Path(smoke_sweep["data_dir"])
    meta = store.read_sweep(data_dir, smoke_sweep["sweep_id"])
    assert meta.versions["torch"] and meta.probe["device"] == "cpu" and meta.version == 3
    # the whole stack: every installed distribution, and each row points at it by its hash
    assert meta.stack["torch"] == meta.versions["torch"] and "polars" in meta.stack
    rows = store.scan(data_dir).collect()
    names = sorted(display_name(m) for m in rows["model_id"].to_list())
    # every fixture, once; one whose processor needs a package missing here is an excluded row
    # instead
    verdicts = {
        n: e["expect"]["status"] for n, e in fixture_models.items() if not e["expect"]["excluded"]
    }
    assert names == sorted(verdicts)
    assert {
        display_name(m): s for m, s in rows.select("model_id", "status").iter_rows()
    } == verdicts
    assert rows["sweep_id"].unique().to_list() == [smoke_sweep["sweep_id"]]
    # t5 is refused before running (an encoder-decoder): the summary the CLI prints names it
    assert smoke_sweep["excluded_before"] == {
        "google-t5/t5-small": meta.excluded["google-t5/t5-small"]
    }
    assert meta.excluded["google-t5/t5-small"].startswith("encoder-decoder")


def test_datasets_loads_the_real_sweep(smoke_sweep, fixture_models):
    import datasets

    # a fixture whose processor needs a package missing here is probed, but is an excluded row (no
    # verdict)
    missing = {
        f"local:{n}": e["expect"]["excluded"]
        for n, e in fixture_models.items()
        if e["expect"]["excluded"]
    }
    results = datasets.load_dataset(smoke_sweep["data_dir"], "results", split="train")
    assert results.num_rows == smoke_sweep["total"] - len(missing)
    assert set(results["status"]) <= set(schema.VERDICTS)
    excluded = datasets.load_dataset(smoke_sweep["data_dir"], "excluded", split="train")
    reasons = dict(zip(excluded["model_id"], excluded["exclusion_reason"]))
    # before running
    assert (
        reasons.pop("google-t5/t5-small") == "encoder-decoder, not a causal text-generation model"
    )
    # the environment lacks what their processors need: no verdict
    assert sorted(reasons) == sorted(missing)
    assert all(f"needs {packages[0]}" in reasons[m] for m, packages in missing.items())
    assert set(excluded["status"]) == {None}  # never a verdict


def test_a_hanging_model_is_stopped_at_its_timeout(smoke_sweep, fixture_models):
    record = smoke_sweep["by_name"]["fail-hang"]
    assert (record["status"], record["failure_stage"], record["error_type"]) == (
        schema.FAIL_OTHER,
        "runner",
        "ProbeTimeout",
    )
    timeout = fixture_models["fail-hang"]["timeout_s"]
    assert f"{timeout:g} s" in record["error_message"]
    assert record["duration_s"] < timeout + 60


def test_a_kernel_that_kills_itself_still_yields_a_record(smoke_sweep):
    record = smoke_sweep["by_name"]["fail-kernel-death"]
    assert (record["status"], record["failure_stage"], record["error_type"]) == (
        schema.FAIL_OTHER,
        "runner",
        "DeadKernelError",
    )
    assert "SIGKILL" in record["error_message"]
    assert "log tail" in record["traceback"]


def small_params(tmp_path: Path, fixture_models: dict, names: list[str], **extra) -> Path:
    models = [fixture_models[n]["path"] for n in names]
    path = tmp_path / "small.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "small",
                "probe": {"device": "cpu", "reference": "none"},
                "models": models,
                **extra,
            }
        )
    )
    return path


def test_ray_executor_matches_local_row_for_row(smoke_sweep, fixture_models, tmp_path):
    pytest.importorskip("ray")
    names = ["tiny-llama", "tiny-eos-early", "fail-missing-weights"]
    definition = params.load(small_params(tmp_path, fixture_models, names))
    definition.probe["reference"] = "cpu"  # same settings as the smoke sweep
    summary = sweep.run(definition, tmp_path / "data", workers=2, executor="ray")
    assert summary["executor"] == "ray"
    ray_rows = {
        display_name(r["model_id"]): r
        for r in store.read_records(tmp_path / "data", summary["sweep_id"])
    }
    assert sorted(ray_rows) == sorted(names)
    for name in names:
        local = smoke_sweep["by_name"][name]
        for key in ("status", "failure_stage", "tokens_in", "tokens_out", "output_token_ids"):
            assert ray_rows[name][key] == local[key], (name, key)
    # stored exactly as with the local executor: notebooks, logs, records, Parquet
    folder = store.sweep_dir(tmp_path / "data", summary["sweep_id"])
    assert len(list((folder / "notebooks").glob("*.ipynb"))) == len(names)
    assert store.scan(tmp_path / "data").collect().height == len(names)


def wait_for(condition, timeout=240.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def the_sweep_dir(data_dir: Path) -> Path | None:
    found = list((data_dir / "sweeps").glob("*/sweep.json"))
    return found[0].parent if found else None


def records_in(data_dir: Path) -> int:
    folder = the_sweep_dir(data_dir)
    return len(list((folder / "records").glob("*.json"))) if folder else 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "kill_point", ["after-sweep-json", "after-first-record", "after-last-record"]
)
def test_resume_after_sigkill_loses_and_duplicates_nothing(fixture_models, tmp_path, kill_point):
    names = ["fail-missing-weights", "tiny-gpt2"]
    params_file = small_params(tmp_path, fixture_models, names)
    data_dir = tmp_path / "data"
    runner = subprocess.Popen(
        [
            *CLI,
            "sweep",
            str(params_file),
            "--data-dir",
            str(data_dir),
            "--workers",
            "1",
            "--no-report",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    condition = {
        "after-sweep-json": lambda: the_sweep_dir(data_dir) is not None,
        "after-first-record": lambda: records_in(data_dir) >= 1,
        "after-last-record": lambda: records_in(data_dir) >= len(names),
    }[kill_point]
    wait_for(condition)
    runner.send_signal(signal.SIGKILL)
    runner.wait()
    sweep_id = the_sweep_dir(data_dir).name
    done_before = records_in(data_dir)
    resumed = subprocess.run(
        [*CLI, "sweep", "--resume", sweep_id, "--data-dir", str(data_dir), "--no-report"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{len(names) - done_before} probed now" in resumed.stdout
    rows = store.scan(data_dir).collect()
    assert sorted(display_name(m) for m in rows["model_id"].to_list()) == sorted(names)
    assert rows.filter(pl.col("status").is_null()).height == 0
    leftovers = [p for p in store.sweep_dir(data_dir, sweep_id).rglob("*.tmp")]
    assert not leftovers
    # no orphaned probe processes of the killed runner survive
    import psutil

    orphans = [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(data_dir) in " ".join(p.info["cmdline"] or [])
    ]
    assert not orphans


@pytest.mark.slow
def test_two_sweeps_into_one_data_dir_at_once(fixture_models, tmp_path):
    data_dir = tmp_path / "data"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = small_params(tmp_path / "a", fixture_models, ["tiny-opt"])
    second = small_params(tmp_path / "b", fixture_models, ["fail-unknown-model-type"])
    # a relative --data-dir, as `make sweep` passes it: probe kernels run in their own folders
    runs = [
        subprocess.Popen(
            [*CLI, "sweep", str(p), "--data-dir", "data", "--workers", "1", "--no-report"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        for p in (first, second)
    ]
    for run in runs:
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0, err[-3000:]
    rows = store.scan(data_dir).collect()
    assert rows.height == 2 and rows["sweep_id"].n_unique() == 2
    assert sorted(rows["status"].to_list()) == ["FAIL(load)", "PASS"]
    card = (data_dir / "README.md").read_text()
    assert all(sweep_id in card for sweep_id in rows["sweep_id"].unique().to_list())


def test_a_second_runner_on_the_same_sweep_is_refused(tmp_path):
    folder = tmp_path / "sweeps" / "s"
    with sweep.SweepLock(folder):
        with pytest.raises(UserError, match="another running sweep"):
            with sweep.SweepLock(folder):
                pass


def test_cli_refuses_bad_params_with_one_sentence(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodels: [a]\nprobe: {max_new_tokenz: 3}\n")
    run = subprocess.run(
        [*CLI, "sweep", str(bad), "--data-dir", str(tmp_path)], capture_output=True, text=True
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    error = run.stderr.strip().splitlines()[-1]
    assert error.startswith("Error: ") and "'max_new_tokenz'" in error
    assert not (tmp_path / "sweeps").exists()  # validated before anything ran


def test_every_cli_command_has_help():
    from click.testing import CliRunner

    from model_support.cli import main

    readme = (REPO / "README.md").read_text()
    for name, command in main.commands.items():
        assert command.help, name
        result = CliRunner().invoke(main, [name, "--help"])
        assert result.exit_code == 0 and "Usage" in result.output
        assert f"model-support {name}" in readme, f"README does not document `model-support {name}`"


def test_smoke_params_list_every_fixture_with_its_overrides(fixture_models, monkeypatch):
    monkeypatch.chdir(REPO)
    definition = params.load(REPO / "params" / "smoke.yaml")
    listed = {display_name(m.model_id): m for m in definition.models}
    assert sorted(listed) == sorted(fixture_models)
    for name, entry in fixture_models.items():
        assert listed[name].overrides == entry["overrides"], name
        assert listed[name].timeout_s == entry.get("timeout_s"), name


def test_push_offline_says_so_in_one_sentence(smoke_sweep):
    run = subprocess.run(
        [*CLI, "push", "someone/model-support-sweeps", "--data-dir", smoke_sweep["data_dir"]],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=120,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    error = run.stderr.strip().splitlines()[-1]  # click's usage banner, then the one sentence
    assert error.startswith("Error: Could not push") and "needs network access" in error


def test_aggregate_notebook_gives_the_same_bytes_as_the_cli(smoke_sweep, tmp_path):
    from helpers import run_notebook

    data_dir = Path(smoke_sweep["data_dir"])
    path = store.parquet_file(data_dir, "results", smoke_sweep["sweep_id"])
    before = path.read_bytes()
    run_notebook(
        "aggregate.ipynb",
        tmp_path / "aggregate.ipynb",
        sweep_id=smoke_sweep["sweep_id"],
        data_dir=str(data_dir),
    )
    assert path.read_bytes() == before


@pytest.mark.parametrize("device", ["cpu", "pretend"], ids=["cpu", "gated-device-phase"])
def test_a_kernel_that_never_starts_leaves_the_model_pending_not_failed(
    fixture_models, tmp_path, device
):
    """With too few open files the probe's kernel never answers: that says nothing about the
    model, so no FAIL row, no report traceback; it is retried, then left pending with the cause
    and --resume. On an accelerator the probe runs its device phase in a gated process
    (``worker.host_checks``): retried the same."""
    params_file = small_params(tmp_path, fixture_models, ["tiny-gpt2"])
    pretend = {}
    if device != "cpu":
        body = yaml.safe_load(params_file.read_text())
        params_file.write_text(
            yaml.safe_dump({**body, "probe": {**body["probe"], "device": device}})
        )
        pretend = {"MODEL_SUPPORT_PRETEND": "{}"}
    data_dir = tmp_path / "data"
    command = " ".join(
        [*CLI, "sweep", str(params_file), "--data-dir", str(data_dir), "--workers", "1"]
    )
    run = subprocess.run(
        ["bash", "-c", f"ulimit -n 60; exec {command}"],
        capture_output=True,
        text=True,
        timeout=600,
        # fresh kernels: one forked from the zygote (engine.zygote) opens too few files to hit the
        # limit, and passes
        env={
            **os.environ,
            "MODEL_SUPPORT_KERNEL_START_S": "10",
            "MODEL_SUPPORT_KERNEL_ZYGOTE": "off",
            **pretend,
        },
    )
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    sweep_id = the_sweep_dir(data_dir).name
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("1 model could not be probed (the probe"), last
    assert (
        "the open-files limit here is 60" in last
        and f"model-support sweep --resume {sweep_id}" in last
    )
    assert records_in(data_dir) == 0  # never a FAIL row
    pending = store.read_pending(data_dir, sweep_id)
    assert [p["problem"] for p in pending.values()] == ["harness"]
    assert "tried 2 times" in next(iter(pending.values()))["reason"]


def test_the_kernels_start_is_not_on_the_models_clock(fixture_models, tmp_path, monkeypatch):
    """A kernel that takes 15 s to start (an IPython startup file that sleeps: the kernel's own
    start path), a model timeout of 10 s and a grace of 2 s: the model's clock starts once the
    kernel is up and the stack imported, so it PASSes. It was a ProbeTimeout FAIL(other): the
    process got timeout + grace from the hand-over, its start included (the grace is 90 s, less
    than a kernel gets to start; a loaded host, a slow file system, a backend's import can take
    longer)."""
    from model_support.sweep.worker import process

    startup = tmp_path / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-slow.py").write_text("import time\ntime.sleep(15)\n")
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setattr(process, "GRACE_S", 2)
    path = tmp_path / "slow.yaml"
    # the verdict's stages only
    probe = {"device": "cpu", "reference": "none", "judge": False, "perf": False}
    body = {
        "name": "slow",
        "probe": probe,
        "models": [fixture_models["tiny-gpt2"]["path"]],
        "timeout_s": 10,
    }
    path.write_text(yaml.safe_dump(body))
    summary = sweep.run(params.load(path), tmp_path / "data", workers=1)
    (record,) = store.read_records(tmp_path / "data", summary["sweep_id"])
    assert record["status"] == schema.PASS, record["error_message"]


def test_a_prefetcher_that_fails_ends_the_sweep_in_seconds_with_its_error(
    fixture_models, tmp_path, monkeypatch
):
    """The prefetcher's feeder thread hands each model its download (``worker.prefetch``); one
    that raised (here the first thing it calls, as a thread that cannot be started would) left
    every probe waiting for its model, and the sweep with it, forever. Now the sweep ends at
    once, in one sentence with the error."""
    import threading
    from types import SimpleNamespace

    from model_support.errors import Interrupted
    from model_support.sweep.worker import prefetch

    def cannot(source: str) -> bool:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(prefetch, "hub_fetch", SimpleNamespace(is_local=cannot))
    # no process to warm: the sweep ends before any probe
    monkeypatch.setenv("MODEL_SUPPORT_KERNEL_ZYGOTE", "off")
    definition = params.load(small_params(tmp_path, fixture_models, ["tiny-gpt2", "tiny-llama"]))
    ended: list = []

    def run() -> None:
        try:
            sweep.run(definition, tmp_path / "data", workers=1)
        except Exception as error:  # noqa: BLE001 - checked below
            ended.append(error)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(30)  # it ends in a fraction of a second
    assert not runner.is_alive(), "the sweep waited for its downloads forever"
    sweep_id = the_sweep_dir(tmp_path / "data").name
    assert [type(error) for error in ended] == [Interrupted]
    assert str(ended[0]) == (
        "The sweep ended early (the downloads ahead of the probes stopped: RuntimeError: "
        f"can't start new thread): 0 of 2 stored; `model-support sweep --resume {sweep_id}` "
        "finishes it."
    )


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stopped_sweep_starts_no_probe_ends_in_seconds_and_says_how_to_finish(
    fixture_models, tmp_path, stop
):
    """A two-device model runs while a hanging one waits for a device: the stop kills the first,
    and the device it gives back must not start the waiting one (it would hang to its 600 s
    timeout)."""
    path = tmp_path / "stop.yaml"
    models = [
        {"id": fixture_models["sharded-llama"]["path"], "overrides": {"devices": "2"}},
        {"id": fixture_models["fail-hang"]["path"], "overrides": {"trust_remote_code": True}},
    ]
    body = {
        "name": "stop",
        "probe": {"device": "cpu", "reference": "none"},
        "models": models,
        "timeout_s": 600,
    }
    path.write_text(yaml.safe_dump(body))
    data_dir = tmp_path / "data"
    runner = subprocess.Popen(
        [*CLI, "sweep", str(path), "--data-dir", str(data_dir), "--workers", "2", "--no-report"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    import psutil

    def probes():
        return [
            p
            for p in psutil.process_iter(["cmdline"])
            if str(data_dir) in " ".join(p.info["cmdline"] or [])
        ]

    try:
        wait_for(lambda: probes())
        time.sleep(3)
        runner.send_signal(stop)
        out, err = runner.communicate(timeout=60)  # within seconds, not the waiting model's timeout
    finally:
        runner.kill()
    sweep_id = the_sweep_dir(data_dir).name
    assert runner.returncode == 1 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        "Error: The sweep was stopped: 0 of 2 stored; `model-support sweep --resume "
        f"{sweep_id}` finishes it."
    )
    # nothing started after the stop
    assert not (store.sweep_dir(data_dir, sweep_id) / "logs").exists()
    wait_for(lambda: not probes(), timeout=30)  # and nothing left running


def test_a_models_own_words_about_a_full_disk_are_its_verdict_not_a_full_disk(
    fixture_models, tmp_path
):
    """A model whose own code fails with "No space left on device" about another file system (its
    shared memory, say; the runtime's words on stderr, in the probe's log) on a data disk with
    room: its FAIL row, not "disk full, make room" ending the sweep."""
    import shutil

    folder = tmp_path / "models" / "says-disk-full"
    shutil.copytree(fixture_models["fail-hang"]["path"], folder)
    (folder / "modeling_hang.py").write_text(
        "import errno\nimport os\n\nfrom transformers import LlamaForCausalLM\n\nfrom "
        ".configuration_hang import HangConfig\n\n\nclass "
        "HangForCausalLM(LlamaForCausalLM):\n    config_class = HangConfig\n\n    def "
        "forward(self, *args, **kwargs):\n        os.write(2, b'runtime: writing "
        "/dev/shm/torch_1: No space left on device\\n')\n        raise OSError(errno.ENOSPC, "
        "'No space left on device', '/dev/shm/torch_1')\n"
    )
    path = tmp_path / "words.yaml"
    models = [
        {"id": str(folder), "overrides": {"trust_remote_code": True}},
        fixture_models["tiny-gpt2"]["path"],
    ]
    path.write_text(
        yaml.safe_dump(
            {"name": "words", "probe": {"device": "cpu", "reference": "none"}, "models": models}
        )
    )
    data_dir = tmp_path / "data"
    run = subprocess.run(
        [*CLI, "sweep", str(path), "--data-dir", str(data_dir), "--workers", "1", "--no-report"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {
        display_name(m): r
        for m, *r in store.scan(data_dir)
        .collect()
        .select("model_id", "status", "error_message")
        .iter_rows()
    }
    assert rows["tiny-gpt2"][0] == schema.PASS
    status, message = rows["says-disk-full"]
    assert status.startswith("FAIL") and "No space left on device" in message


@pytest.mark.slow
def test_names_a_file_cannot_tell_apart_stay_two_models_and_a_torn_schedule_line_resumes(
    fixture_models, tmp_path
):
    """``tiny+opt`` and ``tiny_opt`` shared one record file (one overwrote the other); a torn
    last line of ``schedule.jsonl`` (a full disk mid-append) ended every later --resume in a
    JSONDecodeError, no report."""
    import shutil

    for name in ("tiny+opt", "tiny_opt"):
        shutil.copytree(fixture_models["tiny-opt"]["path"], tmp_path / "models" / name)
    params_file = tmp_path / "apart.yaml"
    params_file.write_text(
        yaml.safe_dump(
            {
                "name": "apart",
                "probe": {"device": "cpu", "reference": "none", "judge": False},
                "models": [str(tmp_path / "models" / n) for n in ("tiny+opt", "tiny_opt")],
            }
        )
    )
    data_dir = tmp_path / "data"
    first = subprocess.run(
        [
            *CLI,
            "sweep",
            str(params_file),
            "--data-dir",
            str(data_dir),
            "--workers",
            "2",
            "--no-report",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    (sweep_id,) = store.list_sweeps(data_dir)
    records = sorted((store.sweep_dir(data_dir, sweep_id) / "records").glob("*.json"))
    assert len(records) == 2
    assert sorted(r["model_id"] for r in store.iter_records(data_dir, sweep_id)) == [
        "local:tiny+opt",
        "local:tiny_opt",
    ]
    # one model to probe again, and a schedule whose last append was cut short
    store.record_file(data_dir, sweep_id, "local:tiny+opt").unlink()
    with open(store.sweep_dir(data_dir, sweep_id) / "schedule.jsonl", "a") as handle:
        handle.write('{"model_id": "local:tiny+opt", "variant": "eager+dyn')
    resumed = subprocess.run(
        [*CLI, "sweep", "--resume", sweep_id, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "1 probed now, 2 models" in resumed.stdout
    assert "schedule.jsonl: skipped 1 unreadable line(s)" in resumed.stderr
    # the report's words for a suspect PASS beside the verdicts; a CPU sweep held no device, so no
    # device line
    assert (
        "suspect passes: 0 (0 diverge from the reference, 0 not fluent with no reference)"
        in resumed.stdout
    )
    assert "devices:" not in resumed.stdout and "held" not in resumed.stdout
    # not a terminal: one plain progress line per model, no bar redrawn with control codes
    assert (
        "[2/2] local:tiny+opt: PASS" in resumed.stderr
        and "\x1b[" not in resumed.stderr
        and "\r" not in resumed.stderr
    )
    assert (data_dir / "reports" / f"{sweep_id}.html").exists()
    rows = store.scan(data_dir).collect()
    assert sorted(rows["model_id"].to_list()) == ["local:tiny+opt", "local:tiny_opt"]
    assert rows["status"].to_list() == ["PASS", "PASS"]
