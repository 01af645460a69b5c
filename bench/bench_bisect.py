"""model-support bisect over 10 releases for 5 models, the overlay environments built (cold) and cached (warm).

A wheelhouse written by hand: tinyswitch 1.0 .. 1.11 (12 releases: sweep A on 1.0, sweep B on 1.11, 10 in
between; 1.7 breaks the models) and tinydecoy 1.0 / 1.1 (changes nothing, so the package step has two
candidates). Five fixture models whose custom code imports tinyswitch. The two sweeps are written directly
(sweep.json with each stack, one record per model with its real repro script, compacted to Parquet): the
bisect reruns those scripts, which is all it does with a sweep. Goal: under 2 minutes here.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, write_results

from fixtures.wheelhouse import SWITCH_FORWARD, custom_model, wheelhouse
from model_support.bisect import forms as bisect_run
from model_support.probe import probe_params, provenance, repro
from model_support.record import schema, store
from model_support.record.sweep_meta import ModelEntry, SweepMeta

VERSIONS = [f"1.{k}" for k in range(12)]
BROKEN_FROM = "1.7"
MODELS = 5


def _sweep(data: Path, name: str, when: str, pins: dict, status: str, folders: list[Path]) -> str:
    sweep_id = f"{name}-{when}-0000"
    stack = {**provenance.stack(), **pins}
    models = [ModelEntry(f"local:{f.name}", str(f)) for f in folders]
    meta = SweepMeta(
        sweep_id, name, when, probe={"device": "cpu"}, models=models, stack=stack, timeout_s=300
    )
    meta.write(store.sweep_dir(data, sweep_id))
    settings = {
        **probe_params.defaults(),
        "device": "cpu",
        "reference": "none",
        "trust_remote_code": True,
    }
    for entry in models:
        script = repro.repro_script({**settings, "model_id": entry.model_id}, sweep_id)
        record = schema.empty_record(
            sweep_id=sweep_id,
            model_id=entry.model_id,
            status=status,
            repro_script=script,
            device_type="cpu",
        )
        store.store_result(data, sweep_id, record, None, "")
    store.compact(data, sweep_id)
    return sweep_id


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-bisect-"))
    wheels = wheelhouse(tmp / "wheels", VERSIONS, broken_from=BROKEN_FROM)
    source = REPO / "data" / "models" / "modes-graph-break"
    folders = [
        custom_model(source, tmp / "models" / f"switch-{k}", SWITCH_FORWARD) for k in range(MODELS)
    ]
    data = tmp / "data"
    a = _sweep(
        data,
        "before",
        "20261201T000000Z",
        {"tinyswitch": "1.0", "tinydecoy": "1.0"},
        "PASS",
        folders,
    )
    b = _sweep(
        data,
        "after",
        "20261202T000000Z",
        {"tinyswitch": "1.11", "tinydecoy": "1.1"},
        "FAIL(gen)",
        folders,
    )
    cache = tmp / "envs"
    out: dict = {
        "models": MODELS,
        "releases_between": len(VERSIONS) - 2,
        "candidates": 2,
        "goal_s": 120,
    }
    for label in ("cold", "warm"):  # cold: no overlay environment built yet; warm: all cached
        cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        answers = bisect_run.bisect_sweeps(data, a, b, find_links=wheels, cache=cache)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_s = (after.ru_utime - cpu.ru_utime) + (after.ru_stime - cpu.ru_stime)
        runs = [s["seconds"] for x in answers for s in x["steps"] if s.get("verdict") is not None]
        right = all(
            (x["package"], x["first_changed"]) == ("tinyswitch", BROKEN_FROM) for x in answers
        )
        out[label] = {
            "wall_s": round(wall, 1),
            "runs": len(runs),
            "runs_per_model": round(len(runs) / MODELS, 1),
            "run_s_median": round(statistics.median(runs), 2),
            "runs_s_total": round(sum(runs), 1),
            "env_s_total": round(sum(s.get("env_s", 0) for x in answers for s in x["steps"]), 1),
            "right": right,
            # CPU seconds of every child (repro scripts, uv): what the bisect costs whatever the
            # machine's load; cpu_s / cores is its wall time on an otherwise idle machine
            "cpu_s": round(cpu_s, 1),
            "idle_estimate_s": round(cpu_s / (os.cpu_count() or 1), 1),
            "load_average": round(os.getloadavg()[0], 1),
        }
        print(label, out[label], flush=True)
        write_results("bisect", out)  # after each phase: a long cold phase is not lost
    bisect_run.clean(data, cache)
    write_results("bisect", out)


if __name__ == "__main__":
    sys.exit(main())
