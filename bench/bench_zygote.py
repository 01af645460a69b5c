"""Kernels forked from the zygote vs fresh kernels: `model-support sweep` (the command users type) over a
handful of fixtures, with `MODEL_SUPPORT_KERNEL_ZYGOTE=off` and without, in one run, alternating.

Measured: CPU seconds of the whole process tree (the runner, its probe processes, their kernels, the zygote:
everything the command waited for, ``RUSAGE_CHILDREN``) and wall seconds; the records compared field for
field, timings and peak host memory aside. Target: the zygote's sweep at most 0.7x the CPU of the fresh one,
with the same records.

    .venv/bin/python bench/bench_zygote.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import REPO, fixtures, spread, write_results

MODELS = [
    "tiny-llama",
    "tiny-gpt2",
    "tiny-opt",
    "tiny-qwen2",
    "SmolLM2-135M-Instruct",
    "fail-missing-weights",
]
TARGET = 0.7
#: What differs between two runs of the same probe whatever starts its kernel.
TIMINGS = {
    "duration_s",
    "load_s",
    "generate_s",
    "first_token_s",
    "decode_tokens_per_s",
    "started_at",
    "sweep_id",
}
TIMINGS |= {"notebook_path", "peak_host_mem_mb", "judge_s", "reference_s", "checks_s", "census_s"}


def one_sweep(definition: Path, zygote: bool) -> tuple[dict, dict]:
    from model_support.record import store

    data = Path(tempfile.mkdtemp(prefix="bench-zygote-"))
    env = {k: v for k, v in os.environ.items() if k != "MODEL_SUPPORT_KERNEL_ZYGOTE"}
    if not zygote:
        env["MODEL_SUPPORT_KERNEL_ZYGOTE"] = "off"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    command = [
        sys.executable,
        "-m",
        "model_support.cli",
        "sweep",
        str(definition),
        "--data-dir",
        str(data),
    ]
    subprocess.run([*command, "--no-report"], check=True, cwd=REPO, env=env, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    (sweep_id,) = store.list_sweeps(data)
    records = {
        r["model_id"]: {k: v for k, v in r.items() if k not in TIMINGS}
        for r in store.read_records(data, sweep_id)
    }
    shutil.rmtree(data, ignore_errors=True)
    return {"cpu_s": cpu, "wall_s": wall}, records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    fixtures()
    folder = Path(tempfile.mkdtemp(prefix="bench-zygote-def-"))
    definition = folder / "zygote.yaml"
    models = [str(REPO / "data" / "models" / m) for m in MODELS]
    definition.write_text(
        yaml.safe_dump(
            {"name": "zygote", "probe": {"device": "cpu"}, "models": models, "workers": 2}
        )
    )
    runs: dict[str, list[dict]] = {"fresh": [], "zygote": []}
    records: dict[str, dict] = {}
    for _ in range(args.repeats):
        for label in ("fresh", "zygote"):
            measured, records[label] = one_sweep(definition, zygote=label == "zygote")
            runs[label].append(measured)
            print(
                f"{label:<7} {measured['cpu_s']:7.1f} CPU s  {measured['wall_s']:6.1f} s wall",
                flush=True,
            )
    shutil.rmtree(folder, ignore_errors=True)
    cpu = {label: spread([r["cpu_s"] for r in rs]) for label, rs in runs.items()}
    wall = {label: spread([r["wall_s"] for r in rs]) for label, rs in runs.items()}
    ratio = round(cpu["zygote"]["median"] / cpu["fresh"]["median"], 3)
    same = records["fresh"] == records["zygote"]
    results = {
        "models": MODELS,
        "cpu_s": cpu,
        "wall_s": wall,
        "cpu_ratio": ratio,
        "wall_ratio": round(wall["zygote"]["median"] / wall["fresh"]["median"], 3),
        "same_records": same,
        "target": TARGET,
        "met": ratio <= TARGET and same,
    }
    print(
        f"zygote vs fresh: {ratio:.2f}x the CPU, {results['wall_ratio']:.2f}x the wall time; "
        f"same records: {same}"
    )
    write_results("zygote", results)


if __name__ == "__main__":
    main()
