"""Probe overhead: the probe through papermill (what a sweep pays per model) against the same
model's ``repro_script`` run with plain python, for SmolLM2-135M-Instruct and a tiny fixture.

Measured two ways: cold (the probe process starts when the model is handed over: a worker's
first model, or a one-off run) and warm (the process was started ahead and has finished warming
up, as a sweep worker's next process does while the current model runs: ``execute.Standby``).
Both run the same stages (load, template, generate) on the CPU; the probe's CPU reference check is
off (``reference: none``) so that both do the same work. Repetitions alternate the two, so drift in
the machine's load hits both alike. Where the overhead goes is read from the executed notebook
(papermill's per-cell durations) and the record (``duration_s``, the probe's own time):

- harness  = wall of the whole task - sum of cell durations: process start, papermill import,
             kernel start and shutdown, notebook reads and writes;
- imports  = the probe cell - the record's duration_s: importing model_support in the kernel;
- record   = duration_s - (load_s + generate_s + template, i.e. the stages): provenance, repro
             script, record writing.

Targets: at most 1.10x for SmolLM2, at most 1.5 s of fixed overhead for the tiny one, judged on
the warm probe (the steady state of a sweep); the cold numbers are reported beside them.

    .venv/bin/python bench/bench_probe.py [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import fixtures, spread, write_results

TARGETS = {"smollm2_ratio": 1.10, "tiny_overhead_s": 1.5}


def run_probe(model_id: str, warm: bool = False) -> dict:
    """One probe as a sweep runs it. ``warm``: its process was started ahead and has finished
    warming up (the steady state of a sweep worker, whose next process warms while the current
    model runs); otherwise cold (a worker's first model, or a one-off papermill run)."""
    import nbformat

    from model_support.sweep.worker.process import Standby

    task = {
        "sweep_id": "bench",
        "model_id": model_id,
        "source": model_id,
        "params": {"device": "cpu", "reference": "none"},
        "timeout_s": 600,
        "notebook_path": "bench.ipynb",
    }
    if warm:
        standby = Standby()
        assert standby.wait_warm(), "the standby did not warm up"
    start = time.perf_counter()
    result = (standby if warm else Standby()).run(task)
    wall = time.perf_counter() - start
    nb = nbformat.reads(result.notebook.decode(), as_version=4)
    cells = [
        c.metadata.get("papermill", {}).get("duration") or 0.0
        for c in nb.cells
        if c.cell_type == "code"
    ]
    record = result.record
    assert record["status"] == "PASS", record["error_message"]
    probe_cell = max(cells)
    return {
        "wall": wall,
        "cells": sum(cells),
        "probe_cell": probe_cell,
        "duration_s": record["duration_s"],
        "stages": (record["load_s"] or 0) + (record["generate_s"] or 0),
        "record": record,
    }


def run_repro(script: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "repro.py"
        path.write_text(script)
        start = time.perf_counter()
        out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, cwd=tmp)
        wall = time.perf_counter() - start
    assert out.returncode == 0, out.stderr[-2000:]
    json.loads(out.stdout.strip().splitlines()[-1])
    return wall


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def measure(model_id: str, reps: int) -> dict:
    probes, warm_probes, repros = [], [], []
    first = run_probe(model_id)  # warm the page cache for all; not counted
    script = first["record"]["repro_script"]
    run_repro(script)
    for _ in range(reps):
        probes.append(run_probe(model_id))
        warm_probes.append(run_probe(model_id, warm=True))
        repros.append(run_repro(script))
    walls = [p["wall"] for p in probes]
    warm_walls = [p["wall"] for p in warm_probes]
    out = {
        "probe_s": spread(walls),
        "warm_probe_s": spread(warm_walls),
        "repro_s": spread(repros),
        "ratio": round(median(walls) / median(repros), 3),
        "overhead_s": round(median(walls) - median(repros), 3),
        "warm_ratio": round(median(warm_walls) / median(repros), 3),
        "warm_overhead_s": round(median(warm_walls) - median(repros), 3),
        "breakdown_s": {
            "harness (process, kernel start, importing torch and transformers in the warm-up, "
            "papermill, notebook I/O)": spread([p["wall"] - p["cells"] for p in probes]),
            "kernel imports of model_support": spread(
                [p["probe_cell"] - p["duration_s"] for p in probes]
            ),
            "probe itself (duration_s)": spread([p["duration_s"] for p in probes]),
            "of which load + generate": spread([p["stages"] for p in probes]),
            "other cells (parameters, display)": spread(
                [p["cells"] - p["probe_cell"] for p in probes]
            ),
        },
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    found = fixtures()
    results = {"reps": args.reps, "targets": TARGETS}
    for label, name in (("smollm2", "SmolLM2-135M-Instruct"), ("tiny", "tiny-llama")):
        results[label] = measure(found[name]["path"], args.reps)
        r = results[label]
        print(
            f"{name:<24} probe cold {r['probe_s']['median']:.2f} s, warm "
            f"{r['warm_probe_s']['median']:.2f} s  repro {r['repro_s']['median']:.2f} s  ratio "
            f"cold {r['ratio']:.3f}x, warm {r['warm_ratio']:.3f}x  overhead cold "
            f"{r['overhead_s']:+.2f} s, warm {r['warm_overhead_s']:+.2f} s"
        )
        for part, value in r["breakdown_s"].items():
            print(f"    {part:<64} {value['median']:.3f} s")
    # Judged on the steady state of a sweep (warm); the cold numbers are reported beside them.
    results["met"] = {
        "smollm2_ratio": results["smollm2"]["warm_ratio"] <= TARGETS["smollm2_ratio"],
        "tiny_overhead_s": results["tiny"]["warm_overhead_s"] <= TARGETS["tiny_overhead_s"],
        "cold_smollm2_ratio": results["smollm2"]["ratio"] <= TARGETS["smollm2_ratio"],
        "cold_tiny_overhead_s": results["tiny"]["overhead_s"] <= TARGETS["tiny_overhead_s"],
    }
    write_results("probe_overhead", results)


if __name__ == "__main__":
    main()
