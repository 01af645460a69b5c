"""The operator census's cost per probe, and the prediction's time for a sweep of 1,000 models.

Census: the probe's stages (``probe_core.run_stages``) with and without a ``census_mode.Census`` held over them,
alternating each repetition in one warm process (tiny-llama and SmolLM2-135M on the CPU; tiny-llama on the
pretend device, whose every operator already goes through Python), then one whole probe (``run_probe``:
stages, CPU reference, judge) for the denominator: the census's cost is the difference of the fastest runs,
as a share of the probe's time (goal: under 5%).

Prediction: 1,000 synthetic result rows (each a census of 40-70 operators from a pool of 160, as real
ones are), written as a sweep's Parquet file; ``model-support ops SWEEP --json`` end to end (a fresh process:
the command a user types), and ``--on pretend`` (a child process loads the backend and asks its adapter), and
the prediction plus the plan alone, in process.

    .venv/bin/python bench/bench_ops.py [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, fixtures, spread, write_results

CENSUS_CHILD = """
import json, sys, time
import torch
from model_support.probe import devices, probe_core
from model_support.probe.census_mode import Census
from model_support.probe.run import run_probe

model, device, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
adapter = devices.resolve(device)
out = {"plain": [], "census": [], "ops": 0, "calls": 0}
for rep in range(reps + 1):  # the first round warms caches and is not counted
    for name in ("plain", "census"):
        counted = Census(adapter.type) if name == "census" else None
        start = time.perf_counter()
        if counted is None:
            result = probe_core.run_stages(model_id=model, device=adapter.torch_device)
        else:
            with counted:
                result = probe_core.run_stages(model_id=model, device=adapter.torch_device, on_stage=counted.enter)
            fields = counted.fields("run")
            out["ops"], out["calls"] = len(fields["ops"]), sum(fields["ops_calls"])
        assert result["status"] == "PASS", result["exception"]
        if rep:
            out[name].append(time.perf_counter() - start)
probes = [run_probe(model, device=device)["duration_s"] for _ in range(2)]
out["probe_s"] = min(probes)
print(json.dumps(out))
"""


def census_cost(model: str, device: str, reps: int) -> dict:
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    if device == "pretend":
        env["MODEL_SUPPORT_PRETEND"] = "{}"
    done = subprocess.run(
        [sys.executable, "-c", CENSUS_CHILD, model, device, str(reps)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=3600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    raw = json.loads(done.stdout.strip().splitlines()[-1])
    extra = min(raw["census"]) - min(raw["plain"])
    return {
        "model": Path(model).name,
        "device": device,
        "stages_s": spread(raw["plain"]),
        "stages_with_census_s": spread(raw["census"]),
        "census_s": round(extra, 3),
        "probe_s": round(raw["probe_s"], 2),
        "share_of_probe": round(extra / raw["probe_s"], 4),
        "ops": raw["ops"],
        "calls": raw["calls"],
    }


def synthetic_sweep(data: Path, models: int = 1000, seed: int = 0) -> str:
    """A sweep of ``models`` result rows with synthetic censuses, written as the store writes a
    real one."""
    from model_support.record import schema, store
    from model_support.record.sweep_meta import ModelEntry, SweepMeta

    rng = random.Random(seed)
    pool = [f"aten::op{i}" for i in range(160)]
    common = pool[:30]  # what every model calls (views, mm, add, ...)
    sweep_id = "ops-bench-20261204T000000Z-0000"
    ids = [f"org/model-{i}" for i in range(models)]
    SweepMeta(
        sweep_id=sweep_id,
        name="ops-bench",
        created_at="2026-12-04T00:00:00+00:00",
        probe={"device": "cpu"},
        models=[ModelEntry(m, m) for m in ids],
    ).write(store.sweep_dir(data, sweep_id))
    rows = []
    for model_id in ids:
        ops = common + rng.sample(pool[30:], rng.randint(10, 40))
        rows.append(
            schema.empty_record(
                sweep_id=sweep_id,
                model_id=model_id,
                status="PASS",
                device_type="cpu",
                ops=ops,
                ops_stages=["load"] * 2 + ["generate"] * (len(ops) - 2),
                ops_calls=[rng.randint(1, 200) for _ in ops],
                ops_source="run",
                ops_missing=[],
                ops_fallback=[],
                ops_unknown=[],
            )
        )
    store.write_parquet(rows, store.parquet_file(data, "results", sweep_id))
    return sweep_id


def prediction_time(reps: int) -> dict:
    from model_support import ops

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        sweep_id = synthetic_sweep(data)
        missing = [f"aten::op{i}" for i in range(30, 160, 13)]  # 10 missing operators
        pretend = json.dumps({"missing_ops": [], "fallback_ops": []})
        env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "MODEL_SUPPORT_PRETEND": pretend}
        command = [
            sys.executable,
            "-m",
            "model_support.cli",
            "ops",
            sweep_id,
            "--json",
            "--data-dir",
            str(data),
        ]
        cli_s, on_s, inproc_s = [], [], []
        for _ in range(reps):
            start = time.perf_counter()
            done = subprocess.run(
                command, capture_output=True, text=True, env=env, cwd=REPO, timeout=600
            )
            cli_s.append(time.perf_counter() - start)
            assert done.returncode == 0, done.stderr[-2000:]
            start = time.perf_counter()
            done = subprocess.run(
                [*command, "--on", "cpu"], capture_output=True, text=True, env=env, cwd=REPO
            )
            on_s.append(time.perf_counter() - start)
            assert done.returncode == 0, done.stderr[-2000:]
            start = time.perf_counter()
            models = ops.sweep_models(data, sweep_id)
            ops.predict(
                models,
                {
                    op: "missing" if op in missing else "implemented"
                    for op in ops.coverage.census_ops(models)
                },
            )
            steps = ops.porting_plan(models)
            inproc_s.append(time.perf_counter() - start)
        return {
            "models": len(models),
            "plan_steps": len(steps),
            "predicted_fail": sum(m.predicted != "PASS" for m in models),
            "cli_s": spread(cli_s),
            "cli_on_cpu_s": spread(on_s),
            "in_process_s": spread(inproc_s),
        }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    found = fixtures()
    models = REPO / "data" / "models"
    assert "tiny-llama" in found
    census = [
        census_cost(str(models / "tiny-llama"), "cpu", args.reps),
        census_cost(str(models / "SmolLM2-135M-Instruct"), "cpu", args.reps),
        census_cost(str(models / "tiny-llama"), "pretend", args.reps),
    ]
    prediction = prediction_time(args.reps)
    write_results(
        "ops",
        {
            "reps": args.reps,
            "census": census,
            "prediction": prediction,
            "met": {
                "census_under_5pct": all(c["share_of_probe"] < 0.05 for c in census),
                "prediction_in_seconds": prediction["cli_on_cpu_s"]["median"] < 10,
            },
        },
    )


if __name__ == "__main__":
    main()
