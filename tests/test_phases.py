"""A device held for the device's work only: the device phase, then the host checks after the
release.

Real sweeps on two pretend devices (the checks of one model run while the next holds its device; a
runner killed between the phases resumes the model as its checks only), the single papermill probe
that still shows everything, and the pieces: a check that raises is a note, the figures of
``sweep.device_time``, the warm-up that asks no device anything.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import yaml

from helpers import REPO, FakeClock, run_notebook
from model_support.probe import phases
from model_support.probe.run import record_from_notebook
from model_support.record import schema, store
from model_support.sweep import device_time
from model_support.sweep.worker import host_checks

CLI = [sys.executable, "-m", "model_support.cli"]
PRETEND_VAR = "MODEL_SUPPORT_PRETEND"


def _sweep_file(tmp_path: Path, models: list[str], **more) -> Path:
    path = tmp_path / "phases.yaml"
    # no perf phase: its repeats are device work too, and these tests hold the phases to the
    # verdict's stages
    definition = {
        "name": "phases",
        "probe": {"device": "pretend", "perf": False},
        "workers": 2,
        "models": models,
        **more,
    }
    path.write_text(yaml.safe_dump(definition))
    return path


def _env(config: dict) -> dict:
    return {**os.environ, PRETEND_VAR: json.dumps(config)}


@pytest.fixture(scope="module")
def phased_sweep(tmp_path_factory, fixture_models) -> dict:
    """Three tiny models on two pretend devices, reference and judge on, through the CLI."""
    tmp = tmp_path_factory.mktemp("phases")
    names = ["tiny-llama", "tiny-gpt2", "tiny-qwen2"]
    definition = _sweep_file(tmp, [fixture_models[n]["path"] for n in names])
    data = tmp / "data"
    done = subprocess.run(
        [*CLI, "sweep", str(definition), "--data-dir", str(data), "--no-report"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_env({"devices": 2}),
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (sweep_id,) = store.list_sweeps(data)
    folder = store.sweep_dir(data, sweep_id)
    rows = [json.loads(line) for line in (folder / "schedule.jsonl").read_text().splitlines()]
    return {
        "data": data,
        "sweep_id": sweep_id,
        "folder": folder,
        "rows": rows,
        "stdout": done.stdout,
    }


@pytest.mark.slow
def test_the_checks_run_while_the_next_model_holds_the_device(phased_sweep):
    """schedule.jsonl: one row per hold, with the device phase inside it and the host checks
    after its release; some model's checks overlap another model's hold of the same device."""
    rows = phased_sweep["rows"]
    assert len(rows) == 3
    for row in rows:
        assert (
            row["start"]
            <= row["device_start"]
            <= row["device_end"]
            <= row["end"]
            <= row["checks_start"]
        )
        assert (
            row["checks_end"] > row["checks_start"]
            and 0 < row["device_s"] <= row["end"] - row["start"]
        )
    overlaps = [
        (a["model_id"], b["model_id"])
        for a in rows
        for b in rows
        if a is not b
        and a["devices"] == b["devices"]
        and b["start"] < a["checks_end"]
        and b["end"] > a["checks_start"]
    ]
    assert overlaps, rows
    # each device phase is the device's own work as the probe measured it: at least its generation,
    # never its host-side loading (config, tokenizer, weights built in host memory) nor its chat
    # template
    records = {
        r["model_id"]: r for r in store.read_records(phased_sweep["data"], phased_sweep["sweep_id"])
    }
    for row in rows:
        record = records[row["model_id"]]
        assert record["generate_s"] <= row["device_s"] < record["load_s"] + record["generate_s"], (
            row,
            record,
        )
    # the figures in the terminal and sweep.json: what the worker (holds) and the probes (device
    # phases) measured
    meta = store.read_sweep(phased_sweep["data"], phased_sweep["sweep_id"])
    held = sum((row["end"] - row["start"]) * len(row["devices"]) for row in rows)
    device = sum(row["device_s"] * len(row["devices"]) for row in rows)
    span = max(row["end"] for row in rows) - min(row["start"] for row in rows)
    assert meta.device_time["held_s"] == pytest.approx(held, abs=0.01)
    assert meta.device_time["device_s"] == pytest.approx(device, abs=0.01)
    assert meta.device_time["held_idle_s"] == pytest.approx(held - device, abs=0.01)
    assert meta.device_time["utilisation"] == pytest.approx(device / (2 * span), abs=0.001)
    assert meta.device_time["checks_after_release"] == 3
    assert device_time.sentence(meta.device_time) in phased_sweep["stdout"]
    # kept only until the record is stored
    assert not list((phased_sweep["folder"] / "phases").glob("*.json"))


@pytest.mark.slow
def test_every_pass_is_still_checked_and_its_notebook_tells_the_whole_story(phased_sweep, tmp_path):
    """Every PASS has its reference and judge; the executed notebook holds the device phase, then
    the host checks' cells with their output, and the record it stores is the final one; rerun
    top to bottom (as a user does in JupyterLab) it runs both phases in one kernel and ends with
    the same verdict, checked."""
    records = store.read_records(phased_sweep["data"], phased_sweep["sweep_id"])
    assert {r["status"] for r in records} == {schema.PASS}
    for record in records:
        assert record["numerics"] == "match" and record["reference_match"] is True, record[
            "numerics_note"
        ]
        assert record["fluency_note"] and phases.PENDING not in json.dumps(record)
    record = next(r for r in records if r["model_id"].endswith("tiny-llama"))
    path = phased_sweep["data"] / record["notebook_path"]
    nb = nbformat.read(path, as_version=4)
    sources = [c.source for c in nb.cells]
    assert any("run_probe" in s for s in sources) and any("finish_checks" in s for s in sources)
    assert record_from_notebook(path) == record
    out = tmp_path / "rerun.ipynb"
    os.environ[PRETEND_VAR] = json.dumps({"devices": 2})
    try:
        import papermill

        papermill.execute_notebook(str(path), str(out), progress_bar=False, kernel_name="python3")
    finally:
        os.environ.pop(PRETEND_VAR)
    again = record_from_notebook(out)
    assert (again["status"], again["numerics"], again["generated_text"]) == (
        "PASS",
        "match",
        record["generated_text"],
    )


@pytest.mark.slow
def test_under_ray_the_device_phase_and_the_host_checks_are_separate_tasks(
    tmp_path, fixture_models
):
    """`model-support sweep --executor ray` on the pretend devices (a local Ray the sweep starts,
    given them as its `pretend` resource): each model's device phase is a Ray task holding its
    device, its host checks another, of a CPU only, that starts after the device was given back;
    every PASS is still checked, and nothing is left kept once its record is stored."""
    pytest.importorskip("ray")
    names = ["tiny-llama", "tiny-gpt2"]
    definition = _sweep_file(tmp_path, [fixture_models[n]["path"] for n in names])
    data = tmp_path / "data"
    done = subprocess.run(
        [
            *CLI,
            "sweep",
            str(definition),
            "--data-dir",
            str(data),
            "--no-report",
            "--executor",
            "ray",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={k: v for k, v in _env({"devices": 2}).items() if k != "RAY_ADDRESS"},
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (sweep_id,) = store.list_sweeps(data)
    folder = store.sweep_dir(data, sweep_id)
    rows = [json.loads(line) for line in (folder / "schedule.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert (
            row["start"]
            <= row["device_start"]
            <= row["device_end"]
            <= row["end"]
            <= row["checks_start"]
        )
        assert row["checks_end"] > row["checks_start"] and row["node"] and row["checks_node"]
    records = store.read_records(data, sweep_id)
    assert {r["status"] for r in records} == {schema.PASS}
    for record in records:
        assert record["numerics"] == "match" and record["reference_match"] is True, record[
            "numerics_note"
        ]
        assert record["fluency_note"] and phases.PENDING not in json.dumps(record)
        sources = [
            c.source for c in nbformat.read(data / record["notebook_path"], as_version=4).cells
        ]
        assert any("run_probe" in s for s in sources) and any("finish_checks" in s for s in sources)
    assert store.read_sweep(data, sweep_id).device_time["checks_after_release"] == 2
    assert not list((folder / "phases").glob("*.json"))


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["local", "ray"])
def test_a_kill_between_the_phases_resumes_as_the_checks_only(tmp_path, fixture_models, executor):
    """The runner SIGKILLed once a model's device phase is kept (its checks running): --resume
    runs its checks from the kept state, holds no device again, and stores the whole record;
    under Ray too (the resumed sweep keeps its executor)."""
    if executor == "ray":
        pytest.importorskip("ray")
    definition = _sweep_file(
        tmp_path, [fixture_models["tiny-llama"]["path"]], workers=1, executor=executor
    )
    data = tmp_path / "data"
    runner = subprocess.Popen(
        [*CLI, "sweep", str(definition), "--data-dir", str(data), "--no-report"],
        cwd=REPO,
        env=_env({"devices": 1}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 600
        while time.time() < deadline and not list(data.glob("sweeps/*/phases/*.json")):
            assert runner.poll() is None, "the sweep ended before its device phase was kept"
            time.sleep(0.2)
        runner.send_signal(signal.SIGKILL)
    finally:
        runner.wait()
    (sweep_id,) = store.list_sweeps(data)
    folder = store.sweep_dir(data, sweep_id)
    assert not store.read_records(data, sweep_id) and not (folder / "schedule.jsonl").exists()
    resumed = time.time()
    done = subprocess.run(
        [*CLI, "sweep", "--resume", sweep_id, "--data-dir", str(data), "--no-report"],
        capture_output=True,
        text=True,
        cwd=REPO,
        # the device is never touched again: it would crash
        env=_env({"devices": 1, "crash_ops": ["aten::mm"]}),
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (record,) = store.read_records(data, sweep_id)
    assert (
        record["status"] == schema.PASS and record["numerics"] == "match" and record["fluency_note"]
    )
    (row,) = [json.loads(line) for line in (folder / "schedule.jsonl").read_text().splitlines()]
    assert row["end"] < resumed < row["checks_start"]  # the first run's hold, this run's checks
    assert not list((folder / "phases").glob("*.json"))


def test_the_single_papermill_probe_still_shows_everything(tmp_path, fixture_models):
    """One papermill probe (checks "here", the default): both phases in its own process, the
    record whole."""
    out = tmp_path / "out.ipynb"
    os.environ[PRETEND_VAR] = "{}"
    try:
        run_notebook(
            "probe.ipynb", out, model_id=fixture_models["tiny-llama"]["path"], device="pretend"
        )
    finally:
        os.environ.pop(PRETEND_VAR)
    record = record_from_notebook(out)
    assert (
        record["status"] == schema.PASS and record["numerics"] == "match" and record["fluency_note"]
    )
    assert phases.PENDING not in json.dumps(record)


def test_the_device_phase_is_the_devices_work_not_the_hosts_loading(fixture_models):
    """What the probe measures as its device phase (``device_phase.json``, the sweep's held-idle
    figures) starts once the host has loaded the config, the tokenizer and the weights and
    applied the chat template: it wrapped them all, and held-idle read better than it was.
    Compared with the stages' own clocks in the record."""
    from model_support.probe.run import run_probe

    record = run_probe(
        fixture_models["tiny-gpt2"]["path"], device="cpu", reference="none", judge=False, perf=False
    )
    timed = phases.device_phase()
    assert record["status"] == schema.PASS
    assert record["generate_s"] <= timed["device_s"] < record["load_s"] + record["generate_s"], (
        timed,
        record,
    )
    # it starts after the loading
    assert timed["end"] - timed["start"] < record["load_s"] + record["generate_s"]


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    """The device phase timed on a fake clock (``phases.now``), from zero device seconds."""
    fake = FakeClock()
    monkeypatch.setattr(phases, "now", fake)
    phases.start()
    yield fake
    phases.start()


def test_the_stages_hook_pauses_the_device_clock_while_the_host_works(clock):
    """``phases.stages``: inside ``device_work`` a host stage (load, template) stops the clock
    and a device stage starts it again, the weights' move to the device (``to_device``) included,
    so the phase starts with the move; the hook it chains (the census's) sees every stage;
    without stages the whole block is the device's (a sharded run's ranks)."""
    seen: list[str] = []
    on_stage = phases.stages(seen.append)
    with phases.device_work():
        on_stage("load")
        clock.advance(0.3)  # config, tokenizer, weights built in host memory
        phases.to_device()
        clock.advance(0.05)  # the weights move
        on_stage("template")
        clock.advance(0.3)  # the chat template
        on_stage("compile")
        clock.advance(0.2)
        on_stage("generate")  # one device stage after another: the clock runs on, from the first
        clock.advance(0.05)
    device = phases.device_phase()
    assert seen == ["load", "template", "compile", "generate"]
    # from the move on
    assert device["device_s"] == pytest.approx(0.3) and device["start"] == pytest.approx(1000.3)
    assert device["end"] - device["start"] == pytest.approx(0.6)
    with phases.device_work():  # no stages: the whole block
        clock.advance(0.05)
    assert phases.device_phase()["device_s"] == pytest.approx(0.35)


def test_outside_a_device_block_nothing_counts(clock):
    """Review (issue 59): ``if _Clock.inside:`` made ``if True:``, or ``_open`` not asking
    whether a block is open, passed every test: the 0.02 s slept outside fitted a 0.04 s
    tolerance. On the fake clock a move announced (``to_device``), a device stage said or a part
    timed outside any block counts nothing, however long after."""
    on_stage = phases.stages()
    phases.to_device()  # a move announced before any block (a probe outside a sweep's device phase)
    on_stage("generate")  # a device stage said outside a block
    clock.advance(7.0)
    with phases.part("perf"):
        clock.advance(3.0)
    assert phases.device_phase() == {"device_s": 0.0, "start": None, "end": None, "parts": {}}
    with phases.device_work():
        clock.advance(0.25)
        with phases.part("perf"):
            clock.advance(0.5)
    phases.to_device()  # and after the block closed
    on_stage("generate")
    clock.advance(11.0)
    with phases.part("perf"):
        clock.advance(2.0)
    assert phases.device_phase() == {
        "device_s": 0.75,
        "start": 1010.0,
        "end": 1010.75,
        "parts": {"perf": 0.5},
    }


def test_a_fresh_process_counts_nothing_before_its_first_device_block():
    """The state a probe's process starts in: no block open, so a move or a device stage said
    before the first ``device_work`` counts nothing (every test above runs after some block
    closed; this one in a process of its own)."""
    code = (
        "from model_support.probe import phases\n"
        "t = [100.0]\n"
        "phases.now = lambda: t[0]\n"
        "phases.to_device(); phases.stages()('generate'); t[0] += 5.0\n"
        "with phases.part('perf'):\n    t[0] += 1.0\n"
        "with phases.device_work():\n    t[0] += 0.5\n"
        "print(phases.device_phase())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "{'device_s': 0.5, 'start': 106.0, 'end': 106.5, 'parts': {}}"


def test_a_new_probe_in_the_same_process_counts_from_zero(clock):
    with phases.device_work():
        clock.advance(2.0)
        with phases.part("recompiles"):
            clock.advance(1.0)
    assert phases.device_phase()["device_s"] == 3.0
    phases.start()
    with phases.device_work():
        clock.advance(0.5)
    assert phases.device_phase() == {"device_s": 0.5, "start": 1003.0, "end": 1003.5, "parts": {}}


def _record(**fields) -> dict:
    return schema.empty_record(model_id="m", sweep_id="s", variant="eager+dynamic", **fields)


def test_a_check_that_raises_is_a_note_and_never_changes_the_verdict(monkeypatch):
    record = _record(status=schema.PASS)
    phases.checks(record, {"checks": "after"}, "pass", [[1]], [1])
    assert record["numerics_note"] == record["fluency_note"] == phases.PENDING

    def broken(*args):
        raise RuntimeError("the judge's folder vanished")

    monkeypatch.setattr(phases.host, "check_pass", broken)
    state = phases._pending.pop(phases.key(record))
    phases.run_checks(record, state)
    assert record["status"] == schema.PASS and record["failure_stage"] is None
    assert "RuntimeError: the judge's folder vanished" in record["reference_note"]
    assert "vanished" in record["numerics_note"] and "vanished" in record["fluency_note"]


def test_host_checks_whose_kernel_never_started_are_retried_then_left_pending_for_resume(tmp_path):
    """A host process whose kernel never starts (an IPython startup that outlasts the start
    limit) ran no check: it is tried once more on a fresh process, then the model is left pending
    (problem ``harness``) with no schedule row, its device phase kept for ``--resume`` to run its
    checks, as a device phase's kernel would be. It was a record stored with "host checks not
    finished: the probe's kernel never started" in place of its reference and judge, which
    ``--resume`` never redoes."""
    from model_support.sweep.worker.process import TaskResult

    startup = tmp_path / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-slow.py").write_text("import time\ntime.sleep(60)\n")
    never = {"IPYTHONDIR": str(tmp_path / "ipython"), "MODEL_SUPPORT_KERNEL_START_S": "1"}
    checks = host_checks.HostChecks(
        1, tmp_path, prewarm=False, env={**never, "MODEL_SUPPORT_KERNEL_ZYGOTE": "off"}
    )
    record = _record(status=schema.PASS)
    phases.checks(record, {"checks": "after"}, "pass", [[1]], [1])
    state = {**phases._pending.pop(phases.key(record)), "record": record}
    held = {"devices": [0], "start": 1.0, "end": 2.0}
    device_phase = TaskResult(
        record, None, "device phase\n", "m", "eager+dynamic", schedule=held, checks=state
    )
    task = {"model_id": "m", "variant": "eager+dynamic", "timeout_s": 60.0}
    final = checks.run(task, device_phase)  # type: ignore[arg-type]  # run_checks reads these keys only
    assert (final.record, final.problem, final.schedule) == (None, "harness", None), final.record
    assert final.pending.startswith("its host checks did not run: the probe's kernel never started")
    assert final.pending.endswith("; tried 2 times") and final.model_id == "m"


def test_the_figures_of_held_idle_share_and_utilisation():
    """Two devices over an 8 s span (first grant to last release): holds of 4 s and 6 s with 3 s
    and 6 s of device phase, a 2-device hold of 2 s with 2 s: held 14 device-seconds, device 13,
    idle 1 (7%), utilisation 13 / 16, 2 device-seconds not held; the first model's checks end 2 s
    after the last release."""
    rows = [
        {
            "devices": [0],
            "start": 100.0,
            "end": 104.0,
            "device_s": 3.0,
            "checks_start": 104.0,
            "checks_end": 110.0,
        },
        {"devices": [1], "start": 100.0, "end": 106.0, "device_s": 6.0},
        {"devices": [0, 1], "start": 106.0, "end": 108.0, "device_s": 2.0},
    ]
    got = device_time.summarise(rows, 2)
    assert (got["span_s"], got["held_s"], got["device_s"], got["held_idle_s"]) == (
        8.0,
        14.0,
        13.0,
        1.0,
    )
    assert (got["held_idle_share"], got["utilisation"], got["unheld_s"]) == (
        round(1 / 14, 4),
        0.8125,
        2.0,
    )
    assert (
        got["checks_after_release"] == 1
        and got["ideal_span_s"] == 6.5
        and got["checks_tail_s"] == 2.0
    )
    # older rows: no figures
    assert device_time.summarise([{"devices": [0], "start": 0, "end": 1}], 1) is None


def test_the_checks_cells_are_appended_and_only_the_final_record_is_tagged():
    device = nbformat.v4.new_notebook()
    shown = nbformat.v4.new_output(
        "display_data",
        data={"application/json": {"status": "PASS"}},
        metadata={"model_support": {"record": True}},
    )
    device.cells = [nbformat.v4.new_code_cell("record = probe.run_probe(...)", outputs=[shown])]
    checks = nbformat.read(REPO / "notebooks" / "checks.ipynb", as_version=4)
    merged = nbformat.reads(
        host_checks.append_checks(
            nbformat.writes(device).encode(), nbformat.writes(checks).encode()
        ).decode(),
        4,
    )
    sources = [c.source for c in merged.cells]
    assert sources[0].startswith("record = probe.run_probe") and any(
        "finish_checks" in s for s in sources
    )
    assert not any("phases.resume" in s for s in sources)  # the loader stays in the host process
    assert "model_support" not in merged.cells[0].outputs[0].metadata


def test_the_warm_up_loads_no_backend_and_asks_no_device(tmp_path):
    """A gated probe process is pinned at its grant, not at its start: what it runs before must
    leave every device untouched (no backend loaded, so its visibility variables are still read
    when one loads)."""
    from model_support.sweep.worker.process import WARM_UP

    code = (
        WARM_UP
        + "\nimport sys\nprint(sorted(m for m in sys.modules if 'pretend' in m or 'torch_tpu' "
        "in m))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=_env({"devices": 2}),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
