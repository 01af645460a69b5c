"""Benchmark what a CI reads from the dataset: ``model-support export`` (JUnit, Markdown, CSV, JSON) and
``model-support support MODEL`` (issue 39's goal: under a second on the smoke list).

Measured as users run them: the command in a fresh process (its imports included), and the library call
alone in this process (the part that grows with the dataset), each repeated; on a smoke-list-sized history
(10 sweeps of the smoke list's size, read from the dataset alone: no sweeps/ folder) and on a large one
(10 sweeps x 10,000 models) to show how it scales. Writes bench/results/exports.json:

    .venv/bin/python bench/bench_exports.py [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, spread, write_results

GOAL_S = 1.0
FORMATS = ("junit", "markdown", "csv", "json")


def smoke_size() -> int:
    """How many models params/smoke.yaml lists (the history is that size)."""
    import yaml

    return len(yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())["models"])


def history(data: Path, n_models: int) -> tuple[str, str]:
    """A synthetic history (dataset only, as pulled from the Hub): the newest sweep and a model
    in it."""
    import polars as pl

    from fixtures import synthetic
    from model_support.record import store

    ids = synthetic.write_synthetic_history(data, 10, n_models)
    shutil.rmtree(data / "sweeps")
    latest = ids[-1]
    model = (
        store.scan(data, "results")
        .filter(pl.col("sweep_id") == latest)
        .select("model_id")
        .first()
        .collect()
    )
    return latest, model.item()


def timed_command(args: list[str], data: Path, reps: int) -> dict:
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        done = subprocess.run(
            [str(REPO / ".venv" / "bin" / "model-support"), *args, "--data-dir", str(data)],
            capture_output=True,
            text=True,
            env=env,
        )
        times.append(time.perf_counter() - start)
        assert done.returncode == 0, done.stderr[-2000:]
    return spread(times)


def timed_call(fn, reps: int) -> dict:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return spread(times)


def measure(data: Path, sweep: str, model: str, reps: int) -> dict:
    from model_support.analysis.support import support
    from model_support.render import exports

    out: dict = {"command_s": {}, "library_s": {}}
    for fmt in FORMATS:
        out["command_s"][fmt] = timed_command(["export", sweep, "--format", fmt], data, reps)
        out["library_s"][fmt] = timed_call(lambda fmt=fmt: exports.export(data, sweep, fmt), reps)
    out["command_s"]["support"] = timed_command(["support", model], data, reps)
    out["library_s"]["support"] = timed_call(lambda: support(model, data), reps)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    results: dict = {"reps": args.reps, "goal_s": GOAL_S}
    with tempfile.TemporaryDirectory() as tmp:
        for label, n in (("smoke", smoke_size()), ("large", 10_000)):
            data = Path(tmp) / label
            sweep, model = history(data, n)
            results[label] = {"models": n, "sweeps": 10, **measure(data, sweep, model, args.reps)}
            worst = max(d["median"] for d in results[label]["command_s"].values())
            print(f"{label} ({n} models x 10 sweeps): slowest command median {worst:.2f} s")
    smoke_worst = max(d["median"] for d in results["smoke"]["command_s"].values())
    results["met"] = {"smoke_command_under_goal": smoke_worst < GOAL_S}
    write_results("exports", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
