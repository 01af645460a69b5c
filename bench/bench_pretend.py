"""The pretend accelerator's cost: a tiny probe on the pretend device against the same probe on the CPU.

The pretend device runs every operator on the CPU underneath, through one Python function
(``model_support_pretend.tensor.run``: faults, unwrap, the CPU kernel, wrap and count memory): what it
costs is the Python dispatch per operator. Both sides run the probe's own stages
(``probe_core.run_stages``: load, template, greedy generation) in one process with the backend on,
alternating CPU and pretend each repetition so that drift in the machine's load hits both alike; the
tokens must be equal (the same kernels, in the same order). Reported: load and generate seconds,
the operators one generation dispatches, and the overhead per operator (from the fastest run of
each side: on a shared machine the slow runs are other people's work).

    .venv/bin/python bench/bench_pretend.py [--reps 7]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from common import fixtures, spread, write_results

CHILD = """
import json, sys
import torch
from model_support.probe import devices, probe_core
from model_support_pretend import tensor

adapter = devices.resolve("pretend")
calls = [0]
run = tensor.run

def counting(func, args, kwargs):
    calls[0] += 1
    return run(func, args, kwargs)

tensor.run = counting
model, reps = sys.argv[1], int(sys.argv[2])
out = {"cpu": [], "pretend": []}
for _ in range(reps + 1):  # the first round warms caches and is not counted
    for name, device in (("cpu", torch.device("cpu")), ("pretend", adapter.torch_device)):
        calls[0] = 0
        result = probe_core.run_stages(model_id=model, device=device, synchronize=None if name == "cpu" else adapter.synchronize)
        assert result["status"] == "PASS", result["exception"]
        out[name].append({"load_s": result["load_s"], "generate_s": result["generate_s"], "ops": calls[0],
                          "tokens": result["output_token_ids"]})
out = {k: v[1:] for k, v in out.items()}
print(json.dumps(out))
"""


def measure(path: str, reps: int) -> dict:
    env = {**os.environ, "MODEL_SUPPORT_PRETEND": "{}", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, path, str(reps)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    cpu, pretend = runs["cpu"], runs["pretend"]
    assert all(r["tokens"] == cpu[0]["tokens"] for r in cpu + pretend), (
        "the pretend device changed the tokens"
    )
    generate_cpu = spread([r["generate_s"] for r in cpu])
    generate_pretend = spread([r["generate_s"] for r in pretend])
    ops = pretend[0]["ops"]
    return {
        "load_s": {
            "cpu": spread([r["load_s"] for r in cpu]),
            "pretend": spread([r["load_s"] for r in pretend]),
        },
        "generate_s": {"cpu": generate_cpu, "pretend": generate_pretend},
        "generate_ratio": round(generate_pretend["median"] / generate_cpu["median"], 2),
        "generate_ratio_min": round(generate_pretend["min"] / generate_cpu["min"], 2),
        "ops_per_generation": ops,
        "us_per_op": round(1e6 * (generate_pretend["min"] - generate_cpu["min"]) / ops, 1),
        "tokens_equal": True,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    models = fixtures()
    results = {"reps": args.reps, "models": {}}
    for name in ("tiny-llama", "SmolLM2-135M-Instruct"):
        results["models"][name] = measure(models[name]["path"], args.reps)
        print(name, json.dumps(results["models"][name]))
    write_results("pretend", results)


if __name__ == "__main__":
    main()
