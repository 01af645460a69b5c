"""What the perf phase costs a decode-bound sweep: the same sweep with its defaults and with ``perf: off``.

Issue 47's check: 8 tiny models over 2 pretend devices whose every matrix product (``aten::mm``, ``aten::bmm``,
``aten::addmm``, ``aten::baddbmm``) takes 250 ms (``slow_ops``: a sleep per call during which the host is free, as
while a TPU computes: a decode-bound device in eager mode), each swept with ``model-support sweep`` (the command
users type) twice, interleaved: the defaults (the perf phase on, as on any accelerator) and ``perf: off``.

Goals: the default sweep within 1.25 times the ``perf: off`` one; every PASS with TTFT and TPOT; the devices held
idle at most 10% of their held time, the perf phase counted as device work (``sweep.device_time``'s ``parts_s``).
Per model: the repeats the phase chose, why it stopped, TPOT's spread, the phase's device seconds against the
verdict's generation.

    .venv/bin/python bench/bench_perf_cost.py [--models 8] [--delay 0.25] [--quick]   # --quick: 3 models, 0.05 s

Results: bench/results/perf_cost.json (perf_cost_quick.json with --quick).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import yaml
from bench_phases import MODELS  # the same 8 tiny models as the device-phase bench
from common import fixtures, pretend_sweep, write_results

MATMULS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm")
GOALS = {"ratio": 1.25, "held_idle_share": 0.10}


def sweep(data: Path, name: str, models: list[str], delay: float, perf: str | None) -> dict:
    """One sweep through the CLI: its wall time, its device figures, its PASS rows' perf fields."""
    probe: dict = {"device": "pretend"}
    if perf is not None:
        probe["perf"] = perf
    definition = data / f"{name}.yaml"
    definition.write_text(
        yaml.safe_dump({"name": name, "probe": probe, "workers": 2, "models": models})
    )
    _, wall = pretend_sweep(
        definition, data, {"devices": 2, "slow_ops": dict.fromkeys(MATMULS, delay)}
    )
    folder = max((data / "sweeps").iterdir(), key=lambda p: p.stat().st_mtime)
    used = json.loads((folder / "sweep.json").read_text())["device_time"]
    records = [json.loads(p.read_text()) for p in (folder / "records").glob("*.json")]
    passes = [r for r in records if r["status"] == "PASS"]
    per_model = {
        Path(r["model_id"]).name: {
            "ttft_ms": round(1e3 * r["ttft_s"], 1) if r.get("ttft_s") else None,
            "tpot_ms": round(1e3 * r["tpot_s"], 1) if r.get("tpot_s") else None,
            "tpot_spread": r.get("tpot_spread"),
            "repeats": r.get("perf_repeats_run"),
            "stop": r.get("perf_stop"),
            "perf_device_s": round(r["perf_device_s"], 2) if r.get("perf_device_s") else None,
            "verdict_generate_s": round(r["generate_s"], 2) if r.get("generate_s") else None,
        }
        for r in passes
    }
    return {
        "wall_s": round(wall, 1),
        "device_time": used,
        "models": len(records),
        "passes": len(passes),
        "passes_timed": sum(
            r.get("ttft_s") is not None and r.get("tpot_s") is not None for r in passes
        ),
        "per_model": per_model,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=len(MODELS))
    parser.add_argument("--delay", type=float, default=0.25)
    parser.add_argument(
        "--quick", action="store_true", help="3 models, 0.05 s per product: a smoke run"
    )
    args = parser.parse_args()
    count, delay = (3, 0.05) if args.quick else (args.models, args.delay)
    found = fixtures()
    models = [found[m]["path"] for m in MODELS[:count]]
    data = Path(tempfile.mkdtemp(prefix="bench-perf-cost-"))
    runs = {}
    for label, perf in (("perf_off", "off"), ("default", None)):
        print(f"== {label}", flush=True)
        runs[label] = sweep(data, label.replace("_", "-"), models, delay, perf)
        print(json.dumps(runs[label]), flush=True)
    on, off = runs["default"], runs["perf_off"]
    spreads = [m["tpot_spread"] for m in on["per_model"].values() if m["tpot_spread"] is not None]
    results = {
        "models": count,
        "matmul_s": delay,
        "devices": 2,
        "runs": runs,
        "ratio": round(on["wall_s"] / off["wall_s"], 3),
        "held_idle_share": on["device_time"]["held_idle_share"],
        "perf_device_s": on["device_time"].get("parts_s", {}).get("perf"),
        "tpot_spread_median": round(statistics.median(spreads), 4) if spreads else None,
        "tpot_spread_worst": round(max(spreads), 4) if spreads else None,
    }
    results["met"] = {
        "ratio": results["ratio"] <= GOALS["ratio"],
        "every_pass_timed": on["passes_timed"] == on["passes"] > 0,
        "held_idle_share": (results["held_idle_share"] or 1) <= GOALS["held_idle_share"],
    }
    write_results("perf_cost_quick" if args.quick else "perf_cost", results)


if __name__ == "__main__":
    main()
