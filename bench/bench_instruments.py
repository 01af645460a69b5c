"""What the probe's instruments cost: counting the host cost (syncs and fallbacks per token) and the flight recorder.

Per model, in one warm process on the pretend device (the only stack here whose backend counts syncs and
fallbacks; its operators run in Python, so a dispatch mode's share of an operator is smaller there than on a real
device's fast kernels, and the recorder's per-operator cost is reported in microseconds too), the probe's stages
(``probe_core.run_stages``, under the census as ``run.py`` holds it) alternate between: the plain step timer; the
host-cost meter's timer (item 5); and the meter with the flight recorder under the census (item 3). The extra cost
of each is the difference of the medians of the generation (``generate_s``) and of the whole stages, and its share
of a whole probe (``run_probe``'s ``duration_s``, reference and judge off as in a device phase). Goal: under 5%.

    .venv/bin/python bench/bench_instruments.py [--reps 5] [--models tiny-llama,...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from common import REPO, fixtures, write_results

MODELS = ["tiny-llama", "tiny-gpt2", "tiny-qwen2", "SmolLM2-135M-Instruct"]
GOAL = 0.05

CHILD = """
import contextlib, json, os, sys, tempfile, time
from model_support.probe import census, devices, probe_core, probe_params, run
from model_support.probe.instruments import flight_recorder, host_cost

model, reps = sys.argv[1], int(sys.argv[2])
devices.prepare_environment("pretend")
adapter = devices.resolve("pretend")
settings = {**run.DEFAULTS, "device": "pretend"}
folder = tempfile.mkdtemp()

def stages(meter, recorder):
    counted = census.Census(adapter.type, adapter.synchronous_ops)
    hooks = [h.enter for h in (counted, recorder) if h is not None]
    timer = meter.timer(adapter.synchronize) if meter else None
    began = time.perf_counter()
    with recorder or contextlib.nullcontext(), counted:
        result = probe_core.run_stages(
            model_id=model, **probe_params.stage_settings(settings), device=adapter.torch_device,
            synchronize=adapter.synchronize, compile_backend=adapter.compile_backend(), timer=timer,
            on_stage=lambda s: [h(s) for h in hooks],
        )
    assert result["status"] == "PASS", result["exception"]
    return time.perf_counter() - began, result["generate_s"], (recorder.count if recorder else 0)

out = {"plain": [], "meter": [], "both": [], "ops": 0, "probe_s": []}
stages(None, None)  # warm
for _ in range(reps):
    for kind in ("plain", "meter", "both"):
        meter = host_cost.meter_for(adapter, "eager")[0] if kind != "plain" else None
        recorder = flight_recorder.FlightRecorder(os.path.join(folder, "f.bin"), "pretend") if kind == "both" else None
        whole, generate, ops = stages(meter, recorder)
        out[kind].append([whole, generate])
        out["ops"] = max(out["ops"], ops)
    out["probe_s"].append(run.run_probe(model, device="pretend", reference="none", judge=False, perf=False)["duration_s"])
import torch
x = torch.zeros(4)
def loop(n=5000):
    began = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    return (time.perf_counter() - began) / n
bare, recorded = [], []
for _ in range(5):
    bare.append(loop())
    with flight_recorder.FlightRecorder(os.path.join(folder, "micro.bin"), "cpu"):
        recorded.append(loop())
out["recorder_us_per_op_micro"] = 1e6 * (sorted(recorded)[2] - sorted(bare)[2])
counters = adapter.host_counters()  # the meter's own work per token: a claim and a read of the counters
began = time.perf_counter()
for _ in range(5000):
    counters.claim(x)
    counters.read()
out["meter_us_per_token_micro"] = 1e6 * (time.perf_counter() - began) / 5000
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    models = fixtures()
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "MODEL_SUPPORT_PRETEND": "{}"}
    results: dict = {"reps": args.reps, "goal_share": GOAL, "models": {}}
    for name in args.models.split(","):
        done = subprocess.run(
            [sys.executable, "-c", CHILD, models[name]["path"], str(args.reps)],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=env,
        )
        if done.returncode:
            results["models"][name] = {"error": done.stderr[-2000:]}
            continue
        got = json.loads(done.stdout.strip().splitlines()[-1])
        med = {k: [statistics.median(x[i] for x in got[k]) for i in (0, 1)] for k in ("plain", "meter", "both")}
        probe = statistics.median(got["probe_s"])
        meter_s, recorder_s = med["meter"][0] - med["plain"][0], med["both"][0] - med["meter"][0]
        results["models"][name] = {
            "probe_s": round(probe, 3),
            "stages_plain_s": round(med["plain"][0], 3),
            "generate_plain_s": round(med["plain"][1], 4),
            "host_cost_extra_s": round(meter_s, 4),
            "host_cost_share_of_probe": round(meter_s / probe, 4),
            "generate_host_cost_extra_s": round(med["meter"][1] - med["plain"][1], 4),
            "recorder_extra_s": round(recorder_s, 4),
            "recorder_share_of_probe": round(recorder_s / probe, 4),
            "recorder_ops": got["ops"],
            "recorder_us_per_op": round(1e6 * recorder_s / got["ops"], 2) if got["ops"] else None,
            "recorder_us_per_op_micro": round(got["recorder_us_per_op_micro"], 2),  # a CPU add_, recorded or not
            "meter_us_per_token_micro": round(got["meter_us_per_token_micro"], 2),  # its reads, timed alone
        }
        print(name, results["models"][name], flush=True)
    measured = [m for m in results["models"].values() if "probe_s" in m]
    results["met"] = {
        "host_cost_under_5pct": all(m["host_cost_share_of_probe"] < GOAL for m in measured) if measured else None,
        "recorder_under_5pct": all(m["recorder_share_of_probe"] < GOAL for m in measured) if measured else None,
    }
    write_results("instruments", results)
    print(json.dumps(results["met"]))


if __name__ == "__main__":
    main()
