"""Sweep scaling: the smoke sweep (every fixture) with 1 and 2 local workers, and the Ray executor
against the local one with the same 2 workers, in one run on this machine; and 2 local workers whose
probes each use every core (``OMP_NUM_THREADS`` = cores: what a sweep did before it shared the cores
among its processes, ``executors.local.thread_share``) against 2 that share them.

Targets: 2 workers at least 1.7x faster than 1 (2 cores); Ray at most 1.15x the local wall time.
Reports are not rendered: this measures the sweep itself.

    .venv/bin/python bench/bench_sweep.py [--params params/smoke.yaml]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from common import REPO, fixtures, write_results

TARGETS = {"speedup_2_workers": 1.7, "ray_over_local": 1.15}


def one_sweep(params_file: Path, workers: int, executor: str, threads: int | None = None) -> dict:
    from model_support.sweep import definition as params
    from model_support.sweep import runner as sweep

    data = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    if threads:  # a value of the user's: the sweep leaves it alone
        os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        definition = params.load(params_file)
        start = time.perf_counter()
        summary = sweep.run(definition, data, workers=workers, executor=executor)
        wall = time.perf_counter() - start
    finally:
        if threads:
            os.environ.pop("OMP_NUM_THREADS", None)
        shutil.rmtree(data, ignore_errors=True)
    return {"wall_s": round(wall, 2), "models": summary["total"], "verdicts": summary["verdicts"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=REPO / "params" / "smoke.yaml")
    args = parser.parse_args()
    fixtures()
    os.chdir(REPO)
    results = {
        "params": str(args.params.relative_to(REPO) if args.params.is_absolute() else args.params),
        "targets": TARGETS,
    }
    os.environ.pop("OMP_NUM_THREADS", None)
    cores = len(os.sched_getaffinity(0))
    runs = (("local_1", 1, "local", None), ("local_2", 2, "local", None), ("ray_2", 2, "ray", None))
    for label, workers, executor, threads in (*runs, ("local_2_every_core", 2, "local", cores)):
        results[label] = one_sweep(args.params, workers, executor, threads)
        print(f"{label:<8} {results[label]['wall_s']:8.1f} s  {results[label]['verdicts']}")
    results["speedup_2_workers"] = round(
        results["local_1"]["wall_s"] / results["local_2"]["wall_s"], 3
    )
    results["ray_over_local"] = round(results["ray_2"]["wall_s"] / results["local_2"]["wall_s"], 3)
    results["shared_over_every_core"] = round(
        results["local_2"]["wall_s"] / results["local_2_every_core"]["wall_s"], 3
    )
    results["met"] = {
        "speedup_2_workers": results["speedup_2_workers"] >= TARGETS["speedup_2_workers"],
        "ray_over_local": results["ray_over_local"] <= TARGETS["ray_over_local"],
    }
    print(
        f"2 workers vs 1: {results['speedup_2_workers']:.2f}x faster; ray vs local: "
        f"{results['ray_over_local']:.2f}x"
    )
    write_results("sweep_scaling", results)


if __name__ == "__main__":
    main()
