"""Memory of a long sweep: the runner's own peak RSS as the model count grows.

The probe is replaced by a fake fast one (a stand-in for ``execute.run_task`` that returns a
small real record at once), so only the runner is measured: queueing, storing records atomically,
compaction to Parquet. Each count runs in its own process so that its peak RSS (ru_maxrss) is its own.
Flat means the 1,000-model peak is within a few MB of the 100-model one.

    .venv/bin/python bench/bench_runner_memory.py [--counts 100 300 1000]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time

from common import write_results


def child(count: int) -> dict:
    import yaml

    from model_support.record import schema
    from model_support.sweep import definition as params
    from model_support.sweep import runner as sweep
    from model_support.sweep.worker import process as execute

    class FakeStandby:  # no process: the runner alone is measured
        def __init__(self, *args, **kwargs):
            pass

        def discard(self):
            pass

    def fake_run_task(task, work_root=None, standby=None, fetched=None):
        record = schema.empty_record(
            sweep_id=task["sweep_id"],
            model_id=task["model_id"],
            status="PASS",
            tokens_in=5,
            tokens_out=8,
            duration_s=0.001,
            repro_script="print('x')\n" * 50,
        )
        return execute.TaskResult(record=record, notebook=b"{}", log="fake probe\n")

    from model_support.sweep.executors import contract, local

    local.run_task = contract.run_task = fake_run_task
    local.Standby = FakeStandby
    from model_support.probe import hub_fetch

    # nothing to download: the runner alone
    hub_fetch.is_local = sweep.is_local = lambda source: True
    with tempfile.TemporaryDirectory() as tmp:
        raw = {
            "name": "memory",
            "models": [f"org/model-{i:05d}" for i in range(count)],
            "workers": 2,
        }
        definition = params.parse(yaml.safe_load(yaml.safe_dump(raw)), source="memory.yaml")
        start = time.perf_counter()
        summary = sweep.run(definition, tmp, workers=2)
        wall = time.perf_counter() - start
    assert summary["total"] == count
    return {
        "count": count,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "wall_s": round(wall, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[100, 300, 1000])
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    rows = []
    for count in args.counts:
        out = subprocess.run(
            [sys.executable, __file__, "--child", str(count)],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(
            f"{count:>6} models  peak RSS {rows[-1]['peak_rss_mb']:7.1f} MB  "
            f"({rows[-1]['wall_s']:.1f} s)"
        )
    growth = rows[-1]["peak_rss_mb"] - rows[0]["peak_rss_mb"]
    print(f"growth from {rows[0]['count']} to {rows[-1]['count']} models: {growth:+.1f} MB")
    write_results(
        "runner_memory",
        {
            "rows": rows,
            "growth_mb": round(growth, 1),
            "target": "flat (within ~10 MiB)",
            "met": growth <= 10,
        },
    )


if __name__ == "__main__":
    main()
