"""bench/device_check.sh, the prepared check for a machine with a CUDA GPU, dry-run on the
pretend device with small sizes, so it never rots: every step runs and reports its numbers."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from helpers import REPO


@pytest.mark.slow
def test_the_device_check_dry_runs_every_step(tmp_path, fixture_models):
    out = tmp_path / "results"
    done = subprocess.run(
        ["bash", str(REPO / "bench" / "device_check.sh"), "--dry-run", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "DEVICE_CHECK_SCRATCH": str(tmp_path / "scratch")},
        timeout=900,
    )
    results = json.loads((out / "device_check.json").read_text())
    steps = results["steps"]
    failed = {
        name: step.get("error")
        for name, step in steps.items()
        if "error" in step or "skipped" in step
    }
    assert done.returncode == 0 and not failed, (failed, done.stdout[-2000:], done.stderr[-2000:])
    assert results["dry_run"] and results["device"] == "pretend"
    assert steps["probe_eager"]["status"] == "PASS" and steps["probe_eager"]["peak_device_mem_mb"]
    # the perf phase
    assert steps["probe_eager"]["tpot_s"] > 0 and steps["probe_eager"]["bandwidth_utilisation"] > 0
    assert steps["probe_compile"]["compile_backend"] and steps["probe_compile"]["graphs"]
    for name in ("sweep_1_worker", "sweep_shared"):
        assert (
            set(steps[name]["verdicts"].values()) == {"PASS"}
            and steps[name]["device_time"]["held_s"] > 0
        )
    for name in ("llama-3-8b", "llama-3.2-1b"):
        real = steps["real_size"][name]
        assert (
            real["status"] == "PASS"
            and real["load_s"] > 0
            and real["generate_s"] > 0
            and real["peak_device_mem_mb"]
        )
    assert steps["false_suspects"]["checked"] >= 5 and steps["false_suspects"]["rate"] is not None
