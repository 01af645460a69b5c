"""Prefetch: a sweep of 8 Hub fixtures from a throttled local Hub, downloads ahead on vs off, in one run.

The local server (tests/hub_server.py) serves the tiny fixtures as Hub repos and paces every file
body so that one model's download takes about as long as its probe. The command users type,
``model-support sweep``, runs twice on the same server with 1 worker: ``--prefetch 0`` (each model
downloaded when its turn comes) and ``--prefetch 1`` (the next model downloads while the current one
is probed). Target: at least 1.5x faster with prefetch.

    .venv/bin/python bench/bench_hub_prefetch.py [--seconds-per-download 3.5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, fixtures, write_results

sys.path.insert(0, str(REPO / "tests"))
from hub_server import HubServer  # noqa: E402

MODELS = (
    "tiny-llama",
    "tiny-mistral",
    "tiny-qwen2",
    "tiny-qwen3",
    "tiny-granite",
    "tiny-gpt2",
    "tiny-opt",
    "tiny-phi3",
)
TARGET = 1.5


def sweep(server: HubServer, prefetch: int, work: Path) -> dict:
    data, cache = work / f"data-{prefetch}", work / f"cache-{prefetch}"
    definition = work / f"hub-{prefetch}.yaml"
    definition.write_text(
        json.dumps(
            {
                "name": f"prefetch-{prefetch}",
                "probe": {"device": "cpu", "reference": "none"},
                "models": [f"fixtures/{m}" for m in MODELS],
                "cache": {"dir": str(cache)},
            }
        )
    )
    env = {
        **os.environ,
        "HF_ENDPOINT": server.url,
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_CACHE": str(cache),
    }
    start = time.perf_counter()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "model_support.cli",
            "sweep",
            str(definition),
            "--data-dir",
            str(data),
            "--workers",
            "1",
            "--prefetch",
            str(prefetch),
            "--no-report",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    wall = time.perf_counter() - start
    if run.returncode != 0:
        raise SystemExit(run.stderr[-3000:])
    records = [json.loads(p.read_text()) for p in data.glob("sweeps/*/records/*.json")]
    return {
        "wall_s": round(wall, 2),
        "models": len(records),
        "statuses": sorted({r["status"] for r in records}),
        "download_s_median": sorted(r["download_s"] for r in records)[len(records) // 2],
        "probe_s_median": sorted(r["duration_s"] for r in records)[len(records) // 2],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # about a tiny probe: see the docstring
    parser.add_argument("--seconds-per-download", type=float, default=3.5)
    args = parser.parse_args()
    found = fixtures()
    largest = max((Path(found[m]["path"]) / "model.safetensors").stat().st_size for m in MODELS)
    rate = int(largest / args.seconds_per_download)
    work = Path(tempfile.mkdtemp(prefix="bench-prefetch-"))
    try:
        with HubServer({f"fixtures/{m}": found[m]["path"] for m in MODELS}) as server:
            server.faults.throttle(rate)
            off = sweep(server, 0, work)
            print(f"prefetch 0: {off['wall_s']:.1f} s {off}")
            on = sweep(server, 1, work)
            print(f"prefetch 1: {on['wall_s']:.1f} s {on}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    speedup = round(off["wall_s"] / on["wall_s"], 3)
    print(f"prefetch on vs off: {speedup:.2f}x faster (target >= {TARGET}x)")
    write_results(
        "hub_prefetch",
        {
            "models": len(MODELS),
            "throttle_bytes_per_s": rate,
            "workers": 1,
            "prefetch_0": off,
            "prefetch_1": on,
            "speedup": speedup,
            "target": TARGET,
            "met": speedup >= TARGET,
        },
    )


if __name__ == "__main__":
    main()
