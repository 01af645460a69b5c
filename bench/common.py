"""What the bench scripts share: the fixtures, spread statistics, result files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
# The offline fixture builders and the synthetic history are test code, under tests/fixtures/ (not
# in the package).
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pretend_sweep(
    definition: Path, data: Path, pretend: dict, env: dict | None = None, executor: str = "local"
):
    """``model-support sweep DEFINITION`` (the command users type, no report) on the pretend
    device configured by ``pretend``, with ``env`` added: (the finished process, its wall
    seconds); a failed sweep ends the bench."""
    import subprocess

    started = time.time()
    done = subprocess.run(
        [
            *(sys.executable, "-m", "model_support.cli", "sweep", str(definition)),
            *("--data-dir", str(data), "--no-report", "--executor", executor),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={
            **os.environ,
            "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
            "MODEL_SUPPORT_PRETEND": json.dumps(pretend),
            **(env or {}),
        },
        timeout=3600,
    )
    wall = time.time() - started
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return done, wall


def spread(values: list[float]) -> dict:
    """Median and spread of repeated measurements (seconds, or whatever was measured)."""
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "runs": [round(v, 3) for v in values],
    }


def fixtures() -> dict:
    from fixtures.build import ensure_fixtures

    return ensure_fixtures()["fixtures"]


def write_results(name: str, results: dict) -> Path:
    results = {
        **results,
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path = RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {path.relative_to(REPO)}")
    return path
