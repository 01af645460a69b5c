"""The headline command, cold: ``papermill notebooks/probe.ipynb out.ipynb -p model_id X`` against the
record's own repro script (``python repro.py X``), side by side in one run, alternating, on tiny-llama.

Both start a fresh Python, import torch and transformers, load the model and generate 8 tokens; the
difference is what the harness costs a one-off probe: papermill, a kernel, the notebook, the record.
Target: at most 2.5 s of fixed overhead (the median difference).

    .venv/bin/python bench/bench_cold_command.py [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, fixtures, spread, write_results

TARGET_S = 2.5


def timed(args: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(args, cwd=cwd, check=True, capture_output=True, timeout=900)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    folder = fixtures()["tiny-llama"]["path"]
    work = Path(tempfile.mkdtemp(prefix="bench-cold-"))
    papermill = os.path.join(os.path.dirname(sys.executable), "papermill")
    command = [
        papermill,
        "notebooks/probe.ipynb",
        str(work / "out.ipynb"),
        "-p",
        "model_id",
        folder,
        "-p",
        "device",
        "cpu",
        "-p",
        "reference",
        "none",
        "-p",
        "record_path",
        str(work / "record.json"),
    ]
    subprocess.run(command, cwd=REPO, check=True, capture_output=True, timeout=900)  # also warms the disk cache
    (work / "repro.py").write_text(json.loads((work / "record.json").read_text())["repro_script"])
    repro = [sys.executable, str(work / "repro.py"), folder]
    probe_s, repro_s = [], []
    for _ in range(args.reps):
        probe_s.append(timed(command, REPO))
        repro_s.append(timed(repro, work))
    probe, script = spread(probe_s), spread(repro_s)
    overhead = round(probe["median"] - script["median"], 2)
    print(f"papermill probe {probe['median']:.2f} s, repro script {script['median']:.2f} s: +{overhead:.2f} s")
    write_results(
        "cold_command",
        {
            "model": "tiny-llama",
            "reps": args.reps,
            "papermill_probe_s": probe,
            "repro_script_s": script,
            "overhead_s": overhead,
            "target_s": TARGET_S,
            "met": overhead <= TARGET_S,
        },
    )


if __name__ == "__main__":
    main()
