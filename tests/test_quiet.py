"""Quiet by default: what a command prints is its own output, not a library's noise.

- The judge on a machine with torch_tpu installed and no TPU (this one): torch's backend autoload
  stays off, as in the probe, so torch_tpu's tcmalloc warning, absl's and PJRT's lines never print.
- Every notebook run of ours goes through ``engine.run_notebook`` on an ipc kernel: no "Kernel is
  running over TCP without encryption" warning (the report, the debug notebook, and the tests'
  single probe).
- transformers' "Loading weights" progress bars are off where the output is a log or a repro
  script's output.
- A user's plain ``papermill`` run (the README's first command) starts a TCP kernel: the venv's
  kernel configuration (``etc/ipython/ipython_kernel_config.py``, copied by ``make venv``) drops
  that one warning, and only it.
- ``make lab`` installs JupyterLab from its lock, once per lock.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOISE = ("tcmalloc", "absl::", "pjrt", "Kernel is running over TCP", "Loading weights")


def quiet_env() -> dict:
    """This environment without the variables that would hide the noise (what a user's shell
    has)."""
    drop = {
        "TORCH_DEVICE_BACKEND_AUTOLOAD",
        "HF_HUB_DISABLE_PROGRESS_BARS",
        "TRANSFORMERS_VERBOSITY",
    }
    return {k: v for k, v in os.environ.items() if k not in drop}


def noise_in(text: str) -> list[str]:
    return [
        line for line in text.splitlines() if any(word.lower() in line.lower() for word in NOISE)
    ]


def test_the_judge_prints_no_backend_noise():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "model_support.cli",
            "judge",
            "The future of AI is bright and full of promise.",
        ],
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
    """The record's repro script, run with plain python: its output is the script's, no progress
    bars."""
    from model_support.probe import run as probe

    folder = fixture_models["tiny-gpt2"]["path"]
    record = probe.run_probe(folder, device="cpu", reference="none", judge=False)
    assert record["status"] == "PASS", record["error_message"]
    script = tmp_path / "repro.py"
    script.write_text(record["repro_script"])
    # plain python: no install of ours needed
    env = {k: v for k, v in quiet_env().items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, str(script), folder], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert noise_in(done.stderr + done.stdout) == []


def test_the_single_probe_the_tests_run_uses_the_ipc_kernel(tmp_path, capfd):
    """``helpers.run_notebook`` (every test's single probe) goes through ``engine.run_notebook``:
    no TCP warning."""
    from helpers import probe_record

    record = probe_record(tmp_path, "data/models/tiny-gpt2", judge=False)
    assert record["status"] == "PASS"
    captured = capfd.readouterr()
    assert noise_in(captured.err + captured.out) == []
    # tqdm.auto's "IProgress not found" (no ipywidgets in a probe kernel) is no longer in the
    # executed notebook
    assert "IProgress" not in (tmp_path / "tiny-gpt2.ipynb").read_text()


KERNEL_CONFIG = REPO / "etc" / "ipython" / "ipython_kernel_config.py"


def test_a_plain_papermill_run_prints_no_tcp_warning(tmp_path, fixture_models):
    """The README's first command, as a user types it: papermill's own kernel (TCP), no engine of
    ours."""
    folder = fixture_models["tiny-gpt2"]["path"]
    params = {"model_id": folder, "device": "cpu", "reference": "none", "judge": "False"}
    argv = [
        str(Path(sys.prefix, "bin", "papermill")),
        "notebooks/probe.ipynb",
        str(tmp_path / "out.ipynb"),
    ]
    argv += [arg for name, value in params.items() for arg in ("-p", name, value)]
    done = subprocess.run(
        argv, capture_output=True, text=True, cwd=REPO, env=quiet_env(), timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Executing notebook with kernel" in done.stderr  # papermill's own lines still print
    assert noise_in(done.stderr + done.stdout) == [], (
        "is the venv's kernel config there? (`make venv` copies it)"
    )
    installed = Path(sys.prefix, "etc", "ipython", KERNEL_CONFIG.name)  # IPython reads it there
    assert installed.read_text() == KERNEL_CONFIG.read_text(), (
        "the venv's kernel config is stale: run `make venv`"
    )


def test_the_kernel_config_drops_the_tcp_warning_and_nothing_else():
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader(KERNEL_CONFIG.name, path=str(KERNEL_CONFIG.parent)).load_config()
    logging_config = config.IPKernelApp.logging_config
    assert logging_config["handlers"]["console"]["filters"] == ["no_tcp_warning"]
    keep = logging_config["filters"]["no_tcp_warning"]["()"]().filter

    def line(message, level=logging.WARNING):
        return logging.LogRecord("IPKernelApp", level, __file__, 1, message, None, None)

    assert not keep(
        line(
            "Kernel is running over TCP without encryption. All communication (...) is sent in ..."
        )
    )
    assert keep(line("Failed to load connection file: %r", logging.ERROR))
    assert keep(line("Detected CurveZMQ secret key; using transport encryption"))


def test_make_lab_installs_jupyterlab_from_its_lock_once_per_lock(tmp_path):
    """Dry runs of `make lab` on a lab venv of its own: the first installs from
    constraints-lab.txt, the next (its stamp there) installs nothing. JupyterLab is never started
    here."""
    lock = [
        line
        for line in (REPO / "constraints-lab.txt").read_text().splitlines()
        if not line.startswith("#")
    ]
    assert any(line.startswith("jupyterlab==") for line in lock) and all(
        "==" in line for line in lock
    )
    lab = tmp_path / "lab"

    def dry_run():
        done = subprocess.run(
            ["make", "-n", "lab", f"LAB_VENV={lab}"],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return [
            line
            for line in done.stdout.splitlines()
            if line.startswith(f"{lab}/") or f" {lab}/" in line
        ]

    first = dry_run()
    installs = [line for line in first if "pip install" in line]
    assert installs and all("-c constraints-lab.txt" in line for line in installs), first
    [stamp] = [line.split()[1] for line in first if line.startswith("touch ")]
    lab.mkdir()
    Path(stamp).touch()  # what the install leaves
    assert [line for line in dry_run() if "pip" in line or "venv" in line] == []
