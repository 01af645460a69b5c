"""Quiet by default: what a command prints is its own output, not a library's noise.

- The judge on a machine with torch_tpu installed and no TPU (this one): torch's backend autoload stays off, as
  in the probe, so torch_tpu's tcmalloc warning, absl's and PJRT's lines never print.
- Every notebook run of ours goes through ``engine.run_notebook`` on an ipc kernel: no "Kernel is running over
  TCP without encryption" warning (the report, the debug notebook, and the tests' single probe).
- transformers' "Loading weights" progress bars are off where the output is a log or a repro script's output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOISE = ("tcmalloc", "absl::", "pjrt", "Kernel is running over TCP", "Loading weights")


def quiet_env() -> dict:
    """This environment without the variables that would hide the noise (what a user's shell has)."""
    drop = {"TORCH_DEVICE_BACKEND_AUTOLOAD", "HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def noise_in(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(word.lower() in line.lower() for word in NOISE)]


def test_the_judge_prints_no_backend_noise():
    done = subprocess.run(
        [sys.executable, "-m", "model_support.cli", "judge", "The future of AI is bright and full of promise."],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=quiet_env(),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert '"fluent": true' in done.stdout
    assert noise_in(done.stderr + done.stdout) == []


def test_a_repro_script_prints_no_loading_bars(tmp_path, fixture_models):
    """The record's repro script, run with plain python: its output is the script's, no progress bars."""
    from model_support.probe import run as probe

    folder = fixture_models["tiny-gpt2"]["path"]
    record = probe.run_probe(folder, device="cpu", reference="none", judge=False)
    assert record["status"] == "PASS", record["error_message"]
    script = tmp_path / "repro.py"
    script.write_text(record["repro_script"])
    env = {k: v for k, v in quiet_env().items() if k != "PYTHONPATH"}  # plain python: no install of ours needed
    done = subprocess.run([sys.executable, str(script), folder], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert noise_in(done.stderr + done.stdout) == []


def test_the_single_probe_the_tests_run_uses_the_ipc_kernel(tmp_path, capfd):
    """``helpers.run_notebook`` (every test's single probe) goes through ``engine.run_notebook``: no TCP warning."""
    from helpers import probe_record

    record = probe_record(tmp_path, "data/models/tiny-gpt2", judge=False)
    assert record["status"] == "PASS"
    captured = capfd.readouterr()
    assert noise_in(captured.err + captured.out) == []
    # tqdm.auto's "IProgress not found" (no ipywidgets in a probe kernel) is no longer in the executed notebook
    assert "IProgress" not in (tmp_path / "tiny-gpt2.ipynb").read_text()
