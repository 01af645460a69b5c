"""A rerun on the stack as found, and a device that is not there (issue 54, item 5: what a new user
met).

A porting team reruns a record's repro script to check its fix. The script sets the backend's
settings as the probe ran them (here the pretend device's faults, ``MODEL_SUPPORT_PRETEND``) and
says so on stdout, with the command that runs on this environment's stack as found instead
(``--stack-as-found``; ``MODEL_SUPPORT_REPRO_KEEP_CONFIG=1`` is its alias); a device that stack does
not have is one sentence and exit status 2, never a traceback. The same holds for the one-operator
script ``localise`` writes. And a single probe of a device that is not there keeps its verdict
(FAIL(other) at runner: papermill exits 0), with the sentence that says why as the executed
notebook's headline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest
import torch

from helpers import REPO
from model_support.debug import op_check, op_repro
from model_support.probe import probe_params, repro

CONFIG_VAR = "MODEL_SUPPORT_PRETEND"
#: The stack the probe ran on: the pretend device without aten::rsqrt (tiny-llama's RMSNorm:
#: FAIL(gen)).
RECORDED = json.dumps({"missing_ops": ["aten::rsqrt"]})
#: The flag a user types, and the variable that is its alias (the bisect's): the script's contract,
#: spelled out.
FLAG, KEEP_VAR = "--stack-as-found", "MODEL_SUPPORT_REPRO_KEEP_CONFIG"


def env_of(pretend: str | None, **extra: str) -> dict:
    """The environment a user's shell gives the script: the pretend backend set to ``pretend``
    (None: unset)."""
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "OMP_NUM_THREADS": "1", **extra}
    env.pop(CONFIG_VAR, None)
    if extra.get(KEEP_VAR) is None:
        env.pop(KEEP_VAR, None)
    if pretend is not None:
        env[CONFIG_VAR] = pretend
    return env


def run(script: Path, *args: str, pretend: str | None, **extra: str) -> subprocess.CompletedProcess:
    """The script with plain python in its folder (nothing of this project on its path)."""
    return subprocess.run(
        [sys.executable, "-I", script.name, *args],
        capture_output=True,
        text=True,
        env=env_of(pretend, **extra),
        cwd=script.parent,
        timeout=300,
    )


@pytest.fixture(scope="module")
def probe_runs(tmp_path_factory, fixture_models) -> dict:
    """tiny-llama's repro script, as a probe on the faulty pretend stack writes it, run three
    ways at once: in a shell whose pretend device is healthy ('{}') as it is and with the flag,
    and with the backend off and the flag."""
    folder = tmp_path_factory.mktemp("as-found")
    settings = {
        **probe_params.defaults(),
        "model_id": "local:tiny-llama",
        "device": "pretend",
        "reference": "none",
        "device_config": {CONFIG_VAR: RECORDED},
    }
    script = folder / "run.py"
    script.write_text(repro.repro_script(settings, "s"))
    model = fixture_models["tiny-llama"]["path"]
    cases = {
        "recorded": ((model,), "{}"),
        "as-found": ((model, FLAG), "{}"),
        "off": ((FLAG, model), None),  # the flag anywhere on the line
    }
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:
        jobs = {
            name: pool.submit(run, script, *args, pretend=pretend)
            for name, (args, pretend) in cases.items()
        }
        done = {name: job.result() for name, job in jobs.items()}
    return {"script": script, "model": model, **done}


def last_json(done: subprocess.CompletedProcess) -> dict:
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_script_says_on_stdout_which_recorded_setting_it_sets_and_how_to_run_as_found(
    probe_runs,
):
    done = probe_runs["recorded"]
    assert done.returncode == 1, done.stderr[-3000:]  # the probe's stack again: its FAIL(gen)
    assert last_json(done)["status"] == "FAIL(gen)"
    lines = done.stdout.splitlines()
    assert f"setting {CONFIG_VAR}={RECORDED!r} as the probe ran it (here it was '{{}}')" in lines
    rerun = f"python run.py {probe_runs['model']} {FLAG}"
    assert any(line.endswith(rerun) and "stack as found" in line for line in lines), done.stdout
    assert (
        lines[-2].startswith("verdict: FAIL(gen) at generate: NotImplementedError")
        and "exit status 1" in lines[-2]
    )


def test_the_flag_runs_on_the_stack_as_found(probe_runs):
    done = probe_runs["as-found"]
    # the fixed stack: the model passes
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert last_json(done)["status"] == "PASS" and "setting " not in done.stdout
    assert (
        f"on the stack as found: {CONFIG_VAR} stays '{{}}', not {RECORDED!r} as the probe ran it"
        in done.stdout
    )


def test_a_device_not_on_the_stack_as_found_is_one_sentence_and_exit_status_2(probe_runs):
    done = probe_runs["off"]
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and not any(
        line.startswith("{") for line in done.stdout.splitlines()
    )
    (sentence,) = [line for line in done.stderr.splitlines() if line.strip()]
    assert sentence.startswith(
        "no verdict: device 'pretend' is not available on this stack as found"
    )
    assert f"without {FLAG} this script sets that" in sentence and RECORDED in sentence


@pytest.fixture(scope="module")
def op_script(tmp_path_factory) -> Path:
    """A one-operator script as ``localise`` writes it: aten::rsqrt, wrong on the recorded stack."""
    settings = {
        "model_id": "local:tiny-llama",
        "device": "pretend",
        "device_config": {CONFIG_VAR: json.dumps({"wrong_ops": ["aten::rsqrt"]})},
        "operator": "aten::rsqrt",
        "overload": "default",
        "module": "model.layers.0.input_layernorm",
        "shapes": [[8]],
        "dtypes": ["float32"],
    }
    inputs = [{op_check.ON_DEVICE: torch.linspace(0.5, 4.0, 8)}]
    return op_repro.write(tmp_path_factory.mktemp("op"), "op", settings, inputs, {})


def test_the_one_operator_script_sets_the_recorded_stack_says_so_and_takes_the_flag(op_script):
    with ThreadPoolExecutor(max_workers=3) as pool:
        recorded = pool.submit(run, op_script, pretend=None)
        found = pool.submit(run, op_script, FLAG, pretend="{}")
        off = pool.submit(run, op_script, pretend=None, **{KEEP_VAR: "1"})
    recorded, found, off = recorded.result(), found.result(), off.result()
    assert recorded.returncode == 1 and "WRONG" in recorded.stdout, (
        recorded.stdout[-2000:] + recorded.stderr[-2000:]
    )
    assert f"setting {CONFIG_VAR}=" in recorded.stdout and f"python op.py {FLAG}" in recorded.stdout
    assert found.returncode == 0 and "they agree" in found.stdout, (
        found.stdout[-2000:] + found.stderr[-2000:]
    )
    # the backend off, and the variable that is the flag's alias: before, torch's "Expected one of
    # cpu, ... device string: pretend" traceback; now one sentence and exit status 2
    assert off.returncode == 2 and "Traceback" not in off.stderr, off.stderr[-3000:]
    assert off.stderr.strip().startswith(
        "no verdict: device 'pretend' is not available on this stack as found"
    )
    assert f"({KEEP_VAR}=1 is the same as {FLAG})" in off.stdout


def test_a_single_probe_of_a_device_not_there_keeps_its_verdict_and_shows_why_first(tmp_path):
    """``papermill notebooks/probe.ipynb out.ipynb -p model_id X -p device gpu``: FAIL(other) at
    runner (README's choice: a verdict was recorded, so papermill exits 0), the sentence the
    record holds shown before its table."""
    out = tmp_path / "out.ipynb"
    command = [
        os.path.join(os.path.dirname(sys.executable), "papermill"),
        "notebooks/probe.ipynb",
        str(out),
    ]
    command += [
        "-p",
        "model_id",
        "data/models/tiny-llama",
        "-p",
        "device",
        "gpu",
        "-p",
        "record_path",
        str(tmp_path / "r.json"),
    ]
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=600, env=env_of(None)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "r.json").read_text())
    assert (record["status"], record["failure_stage"], record["error_type"]) == (
        "FAIL(other)",
        "runner",
        "DeviceUnavailable",
    )
    shown = [
        o
        for c in nbformat.read(str(out), as_version=4).cells
        for o in c.get("outputs", [])
        if "data" in o
    ]
    headline = shown[0]["data"]
    assert (
        headline["text/plain"]
        == f"FAIL(other) at runner: DeviceUnavailable: {record['error_message']}"
    )
    assert "Device &#x27;gpu&#x27; was requested" in headline["text/html"]
    assert "application/json" in shown[-1]["data"]  # the record's own output follows
