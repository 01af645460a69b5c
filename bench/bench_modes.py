"""Execution modes on SmolLM2-135M-Instruct, CPU: eager vs torch.compile x dynamic vs static KV cache.

One run of the command users type for one model (``papermill notebooks/probe.ipynb ... -p mode M -p
cache C``) per combination, one after another: the record's first-token time (which carries the
compilation in compile mode), decode tokens/s, graphs and recompilations, and whether the compiled
tokens match eager ones. 32 new tokens, so that the decode rate is measured over more than a few steps.

    .venv/bin/python bench/bench_modes.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, fixtures, write_results

MODEL = "SmolLM2-135M-Instruct"
COMBOS = [("eager", "dynamic"), ("eager", "static"), ("compile", "dynamic"), ("compile", "static")]


def main() -> None:
    path = fixtures()[MODEL]["path"]
    work = Path(tempfile.mkdtemp(prefix="bench-modes-"))
    papermill = os.path.join(os.path.dirname(sys.executable), "papermill")
    rows = []
    for mode, cache in COMBOS:
        record_path = work / f"{mode}-{cache}.json"
        start = time.perf_counter()
        subprocess.run(
            [
                papermill,
                "notebooks/probe.ipynb",
                str(work / f"{mode}-{cache}.ipynb"),
                "-p",
                "model_id",
                path,
                "-p",
                "device",
                "cpu",
                "-p",
                "reference",
                "none",
                "-p",
                "max_new_tokens",
                "32",
                "-p",
                "mode",
                mode,
                "-p",
                "cache",
                cache,
                "-p",
                "record_path",
                str(record_path),
            ],
            cwd=REPO,
            check=True,
            capture_output=True,
            timeout=1800,
        )
        wall = time.perf_counter() - start
        r = json.loads(record_path.read_text())
        rows.append(
            {
                "variant": r["variant"],
                "status": r["status"],
                "wall_s": round(wall, 1),
                "first_token_s": r["first_token_s"],
                "decode_tokens_per_s": r["decode_tokens_per_s"],
                "tokens_out": r["tokens_out"],
                "graphs": r["graphs"],
                "recompilations": r["recompilations"],
                "graph_breaks": r["graph_breaks"],
                "matches_eager": r["matches_eager"],
            }
        )
        print(rows[-1])
    write_results("modes", {"model": MODEL, "max_new_tokens": 32, "rows": rows})


if __name__ == "__main__":
    main()
