"""Hold a device for the device's work only: held-idle share and utilisation, before and after the split.

Two scenarios on 2 pretend devices whose attention's matrix products (``aten::bmm``, 32 per probe of 8 tokens on
these 2-layer models) are device time (``slow_ops``: a sleep per call, during which the host is free, as
while a TPU computes), reference and judge on, each swept with
``model-support sweep`` twice: *before* (``MODEL_SUPPORT_PHASES=together``: the host checks in the probe's
own process, inside its hold; as the sweep ran before the split) and *after* (the default: the device
phase in a gated probe process, the checks in a host process after the release).

- host-heavy: 8 tiny models, 0.25 s per product (8 s of device time a model);
  the host's own work (process start, imports, the reference, the judge) is as large as the device's.
- device-bound: 6 tiny models, 1.0 s per product (32 s a model): the host has spare capacity.

Figures from each sweep's ``sweep.json`` (``sweep.device_time``): the share of held time the devices
were idle, the utilisation (device-phase time / devices x span) and the span against the ideal (sum of
device phases / devices); every PASS checked against the reference. The host's load (CPU busy over
the span, from psutil) says where the host is the bottleneck.

``--quick``: 3 models, the host-heavy scenario only (a smoke run of this script). ``--executor ray``: the same
sweeps on a local Ray the sweep starts (the device phase and the checks as two Ray tasks), into
``phases_ray.json``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import psutil
import yaml
from common import RESULTS, fixtures, pretend_sweep, write_results

MODELS = [
    "tiny-llama",
    "tiny-gpt2",
    "tiny-qwen2",
    "tiny-mistral",
    "tiny-phi3",
    "tiny-gemma",
    "tiny-granite",
    "tiny-stablelm",
]
# attention's batched matrix products (scaled_dot_product_attention's parts)
ATTENTION = "aten::bmm"
SCENARIOS = {"host-heavy": (8, 0.25), "device-bound": (6, 1.0)}
TARGETS = {"held_idle_share": 0.10, "utilisation": 0.90, "span_over_ideal": 1.15}


def sweep(
    data: Path, name: str, models: list[str], delay: float, phases: str, executor: str = "local"
) -> dict:
    """One sweep through the CLI; its device figures, its verdicts and checks, the host's load."""
    definition = data / f"{name}.yaml"
    definition.parent.mkdir(parents=True, exist_ok=True)
    definition.write_text(
        yaml.safe_dump(
            {"name": name, "probe": {"device": "pretend"}, "workers": 2, "models": models}
        )
    )
    psutil.cpu_percent()  # starts the machine-wide CPU counter
    load = os.getloadavg()[0]
    pretend = {"devices": 2, "slow_ops": {ATTENTION: delay}}
    _, wall = pretend_sweep(definition, data, pretend, {"MODEL_SUPPORT_PHASES": phases}, executor)
    cpu = psutil.cpu_percent() / 100
    sweep_id = max((data / "sweeps").iterdir(), key=lambda p: p.stat().st_mtime).name
    folder = data / "sweeps" / sweep_id
    meta = json.loads((folder / "sweep.json").read_text())
    records = [json.loads(p.read_text()) for p in (folder / "records").glob("*.json")]
    passes = [r for r in records if r["status"] == "PASS"]
    used = meta["device_time"]
    return {
        **used,
        "span_over_ideal": round(used["span_s"] / used["ideal_span_s"], 3),
        "wall_s": round(wall, 1),
        "models": len(records),
        "passes": len(passes),
        "passes_checked": sum(r["numerics"] is not None for r in passes),
        "host_cpu_busy": round(cpu, 3),
        "load_before": round(load, 1),
        "device_phase_s": sorted(
            round(json.loads(line)["device_s"], 2) for line in (folder / "schedule.jsonl").open()
        ),
    }


def main() -> None:
    quick = "--quick" in sys.argv
    only = sys.argv[sys.argv.index("--scenario") + 1] if "--scenario" in sys.argv else None
    executor = sys.argv[sys.argv.index("--executor") + 1] if "--executor" in sys.argv else "local"
    name_of_results = "phases" + ("" if executor == "local" else f"_{executor}")
    found = fixtures()
    data = Path(tempfile.mkdtemp(prefix="bench-phases-"))
    results: dict = {"scenarios": {}, "cores": os.cpu_count(), "quick": quick, "executor": executor}
    chosen = {"host-heavy": (3, 0.25)} if quick else SCENARIOS
    if only:  # one scenario again, the others' runs kept from the last results (a run cut short)
        kept = RESULTS / f"{name_of_results}.json"
        if kept.exists():
            results["scenarios"] = json.loads(kept.read_text())["scenarios"]
        chosen = {only: SCENARIOS[only]}
    for name, (count, delay) in chosen.items():
        models = [found[m]["path"] for m in MODELS[:count]]
        runs = {}
        for label, phases in (("before", "together"), ("after", "split")):
            print(f"== {name}, {label}", flush=True)
            runs[label] = sweep(data, f"{name}-{label}", models, delay, phases, executor)
            print(json.dumps(runs[label]), flush=True)
        runs["attention_s"], runs["models"] = delay, count
        results["scenarios"][name] = runs
    after = results["scenarios"].get("host-heavy", {}).get("after", {})
    bound = results["scenarios"].get("device-bound", {}).get("after", {})
    results["met"] = {
        "held_idle_share": all(
            s["after"]["held_idle_share"] <= TARGETS["held_idle_share"]
            for s in results["scenarios"].values()
        ),
        "utilisation": bound.get("utilisation", 0) >= TARGETS["utilisation"] if bound else None,
        "span_over_ideal": bound.get("span_over_ideal", 9) <= TARGETS["span_over_ideal"]
        if bound
        else None,
        "every_pass_checked": all(
            r["passes_checked"] == r["passes"]
            for s in results["scenarios"].values()
            for r in (s["before"], s["after"])
        ),
    }
    results["host_bound"] = host_words(after)
    write_results(f"{name_of_results}_quick" if quick else name_of_results, results)


def host_words(after: dict, per_product: float = 0.25, products: int = 32) -> str:
    """Where the host is the bottleneck, with numbers: the devices not held, the host's cores
    busy, and the device phases against the device time they hold (the pretend device's dispatch
    runs on the host)."""
    if not after:
        return ""
    waiting = after["unheld_s"] / (after["devices"] * after["span_s"])
    phases = sorted(after["device_phase_s"])
    median = phases[len(phases) // 2]
    return (
        f"host-heavy, after: the host's {os.cpu_count()} cores were "
        f"{after.get('host_cpu_busy', 0) * 100:.0f}% busy (load average "
        f"{after.get('load_before')} at the start, a shared machine) while the devices were "
        f"held {100 * (1 - waiting):.0f}% of the span: the host is the bottleneck there, and "
        f"it shows in the device phases (median {median:.1f} s for "
        f"{per_product * products:.0f} s of device time: the pretend device's operators run on "
        f"those busy cores) and in the wall time ({after['wall_s']:.0f} s for a "
        f"{after['span_s']:.0f} s span: the first process's warm-up, then "
        f"{after['checks_tail_s']:.0f} s of checks after the last release)"
    )


if __name__ == "__main__":
    main()
