"""Multi-device scheduling, by simulation: the local sweep's own scheduling driving fake probes that only sleep.

8 pretend devices; 1,000 models, exactly 70% needing 1 device, 20% 2, 8% 4 and 2% 8, shuffled (seeded);
each probe sleeps a duration drawn from a seeded lognormal (median 20 ms, sigma 0.5, independent of the
size), so a run takes seconds. Per scheduler and model order:
- utilisation: busy device-seconds (devices held x time inside the probe) / (8 x wall time);
- head wait: once every model before it has its devices, how long a model waits for a fitting set of
  its own (starvation shows here); target: at most the longest probe time;
- wall time, and the peak RSS of the process that runs 100 and 1,000 models (each in its own process).
The head-wait bound is against the longest probe as measured (grant to end: the sleep plus thread
hand-offs), with 2 ms for the release and the next grant to pass between threads.

Schedulers: every row but the first runs ``scheduler.run_on_devices``, the function ``executors.contract.Executor.results``
schedules a sweep's probes with (one thread per device, each taking the next model and holding the
devices it needs from the scheduler while it runs), with the policy named:
- baseline: the slot queue of sweeps before devices were handed out (simulated here): 8 workers share 8
  one-device slots; a model needing N takes N slots one after another, under a lock (without it two
  8-device models each holding 4 slots deadlock), so the models behind it wait (FIFO, no backfill).
  Its slots are any free ids: not valid for TPUs.
- baseline-tpu: FIFO without backfill on aligned blocks (a TPU model needs neighbouring chips): the head
  waits until an aligned block is free, the models behind it wait too (a ``DeviceScheduler`` whose head
  reserves every device).
- greedy: ``DeviceScheduler`` without the reservation: any waiting model that fits starts (first-fit
  backfill); shown for the starvation it causes.
- runner: ``DeviceScheduler`` (FIFO + reservation backfilling), any free devices (cuda) or aligned blocks
  only (tpu): what a sweep runs.
Orders: ``given`` (the shuffled list) and ``largest`` (``scheduler.device_order``: biggest first, what
a sweep hands its models out in whenever one needs more than one device).

    .venv/bin/python bench/bench_scheduler.py [--models 1000] [--reps 1]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from queue import Queue

from common import spread, write_results

from model_support.sweep.scheduler import DeviceScheduler, device_order, run_on_devices

DEVICES = 8
MIX = {1: 0.70, 2: 0.20, 4: 0.08, 8: 0.02}
MEDIAN_S, SIGMA = 0.020, 0.5
SLACK_S = 0.002  # release -> next grant, between threads
ROWS = [  # (scheduler, order)
    ("baseline", "given"),
    ("baseline-tpu", "given"),
    ("greedy", "given"),
    ("runner-cuda", "given"),
    ("runner-tpu", "given"),
    ("baseline", "largest"),
    ("baseline-tpu", "largest"),
    ("runner-cuda", "largest"),
    ("runner-tpu", "largest"),
]
LABELS = {
    "baseline": "baseline: 1-device slots, N taken in turn (FIFO, no backfill)",
    "baseline-tpu": "baseline on aligned blocks (TPU): FIFO, no backfill",
    "greedy": "first-fit backfill, no reservation",
    "runner-cuda": "runner: FIFO + reservation backfill, any devices",
    "runner-tpu": "runner: FIFO + reservation backfill, aligned blocks (TPU)",
}


@dataclass
class Finished:
    """A fake probe that ran: its devices, and when (time.monotonic) it asked for them, became
    the oldest waiting request, got them, started and ended."""

    task: tuple[int, float]
    ids: tuple[int, ...]
    queued: float
    head: float
    granted: float
    started: float
    ended: float


def models(count: int, seed: int) -> list[tuple[int, float]]:
    """(devices needed, probe seconds) per model: the exact mix, shuffled; lognormal durations."""
    rng = random.Random(seed)
    needs = [need for need, share in MIX.items() for _ in range(round(share * count))]
    rng.shuffle(needs)
    return [(need, MEDIAN_S * math.exp(rng.gauss(0.0, SIGMA))) for need in needs]


def probe(task: tuple[int, float], devices) -> Finished:
    """A probe as ``run_on_devices`` runs one: it holds its devices while it sleeps its duration."""
    with devices() as grant:
        started = time.monotonic()
        time.sleep(task[1])
        ended = time.monotonic()
    return Finished(task, grant.ids, grant.queued, grant.head, grant.granted, started, ended)


def need_of(task: tuple[int, float]) -> int:
    return task[0]


def slots_schedule(tasks, need_of, devices: int):
    """The baseline: the old slot queue, a model taking its N slots in turn under a lock."""
    slots: Queue = Queue()
    for slot in range(devices):
        slots.put(slot)
    lock = threading.Lock()

    def one(task, queued: float) -> Finished:
        with lock:  # the model at the head collects its slots; the ones behind it wait
            head = time.monotonic()
            ids = tuple(slots.get() for _ in range(need_of(task)))
            granted = time.monotonic()
        try:
            started = time.monotonic()
            time.sleep(task[1])
            ended = time.monotonic()
        finally:
            for slot in ids:
                slots.put(slot)
        return Finished(task, ids, queued, head, granted, started, ended)

    with ThreadPoolExecutor(max_workers=devices) as pool:
        pending = {pool.submit(one, task, time.monotonic()) for task in tasks}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield future.result()


class Greedy(DeviceScheduler):
    """First-fit backfilling: the head reserves nothing (big models can starve)."""

    def _target(self, need: int) -> frozenset:
        return frozenset()


class StrictFifo(DeviceScheduler):
    """No backfilling: the head reserves every device, so nobody behind it starts before it."""

    def _target(self, need: int) -> frozenset:
        return frozenset(self.ids)


def child(name: str, order: str, count: int, seed: int) -> dict:
    tasks = models(count, seed)
    longest = max(seconds for _, seconds in tasks)
    if order == "largest":
        tasks = device_order(tasks, need_of)
    start = time.monotonic()
    if name == "baseline":
        results = slots_schedule(tasks, need_of, DEVICES)
    else:
        policy = {
            "greedy": Greedy(DEVICES),
            "baseline-tpu": StrictFifo(DEVICES, contiguous=True),
            "runner-cuda": DeviceScheduler(DEVICES),
            "runner-tpu": DeviceScheduler(DEVICES, contiguous=True),
        }[name]
        results = run_on_devices(tasks, need_of, policy, probe)
    busy = end = longest_hold = 0.0
    head_wait = {need: 0.0 for need in MIX}
    queue_wait = {need: 0.0 for need in MIX}
    done = 0
    for finished in results:  # streamed: nothing per model is kept
        need = len(finished.ids)
        busy += need * (finished.ended - finished.started)
        end = max(end, finished.ended)
        longest_hold = max(longest_hold, finished.ended - finished.granted)
        head_wait[need] = max(head_wait[need], finished.granted - finished.head)
        queue_wait[need] = max(queue_wait[need], finished.granted - finished.queued)
        done += 1
    assert done == count, (done, count)
    wall = end - start
    return {
        "scheduler": name,
        "order": order,
        "models": count,
        "seed": seed,
        "utilisation": round(busy / (DEVICES * wall), 4),
        "wall_s": round(wall, 3),
        "ideal_wall_s": round(sum(n * s for n, s in tasks) / DEVICES, 3),
        "longest_drawn_s": round(longest, 4),
        "longest_probe_s": round(longest_hold, 4),
        "max_head_wait_s": round(max(head_wait.values()), 4),
        "max_head_wait_by_need_s": {str(k): round(v, 4) for k, v in head_wait.items()},
        "max_queue_wait_by_need_s": {str(k): round(v, 4) for k, v in queue_wait.items()},
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def run_child(name: str, order: str, count: int, seed: int) -> dict:
    command = [sys.executable, __file__, "--child", name, order, str(count), str(seed)]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    lines = [
        "| scheduler | order | utilisation | max head wait / longest probe | wall (ideal) | "
        "peak RSS 100 / 1,000 models |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        util = r["utilisation"]
        cell = f"{util['median']:.1%}" + (
            f" [{util['min']:.1%}-{util['max']:.1%}]" if len(util["runs"]) > 1 else ""
        )
        lines.append(
            f"| {LABELS[r['scheduler']]} | {r['order']} | {cell} "
            f"{'met' if r['met']['utilisation'] else '**not met**'} | "
            f"{r['max_head_wait_s'] * 1000:.1f} ms / {r['longest_probe_s'] * 1000:.1f} ms "
            f"{'met' if r['met']['head_wait'] else '**not met**'} | "
            f"{r['wall_s']['median']:.2f} s ({r['ideal_wall_s']:.2f} s) | {r['rss_mb'][0]:.1f} "
            f"/ {r['rss_mb'][1]:.1f} MB |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument(
        "--small", type=int, default=100, help="the model count of the memory comparison"
    )
    parser.add_argument(
        "--reps", type=int, default=1, help="seeds per row (utilisation and wall: median, spread)"
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, order, count, seed = args.child
        print(json.dumps(child(name, order, int(count), int(seed))))
        return
    rows = []
    for name, order in ROWS:
        runs = [run_child(name, order, args.models, seed) for seed in range(args.reps)]
        small = run_child(name, order, args.small, 0)
        first = runs[0]
        row = {
            "scheduler": name,
            "order": order,
            "label": LABELS[name],
            "utilisation": spread([r["utilisation"] for r in runs]),
            "wall_s": spread([r["wall_s"] for r in runs]),
            "ideal_wall_s": first["ideal_wall_s"],
            "longest_probe_s": max(r["longest_probe_s"] for r in runs),
            "max_head_wait_s": max(r["max_head_wait_s"] for r in runs),
            "rss_mb": [small["peak_rss_mb"], max(r["peak_rss_mb"] for r in runs)],
            "runs": runs,
        }
        row["met"] = {
            "utilisation": row["utilisation"]["median"] >= 0.90,
            "head_wait": all(r["max_head_wait_s"] <= r["longest_probe_s"] + SLACK_S for r in runs),
            "memory_flat": row["rss_mb"][1] - row["rss_mb"][0] <= 5,
        }
        rows.append(row)
        print(
            f"{name:12} {order:8} utilisation {row['utilisation']['median']:.3f}  head wait "
            f"{row['max_head_wait_s'] * 1000:6.0f} ms (longest probe "
            f"{row['longest_probe_s'] * 1000:.0f} ms)  wall {row['wall_s']['median']:.2f} s  "
            f"RSS {row['rss_mb'][0]:.1f} / {row['rss_mb'][1]:.1f} MB",
            flush=True,
        )
    print()
    print(table(rows))
    write_results(
        "scheduler",
        {
            "devices": DEVICES,
            "models": args.models,
            "small": args.small,
            "mix": {str(k): v for k, v in MIX.items()},
            "probe_s": {"lognormal_median": MEDIAN_S, "sigma": SIGMA},
            "reps": args.reps,
            "targets": {
                "utilisation": ">= 90%",
                "head_wait": "<= the longest probe time (grant to end, measured) + 2 ms of thread hand-offs",
                "memory": "flat from 100 to 1,000 models (within 5 MB)",
            },
            "rows": rows,
            "table": table(rows),
        },
    )


if __name__ == "__main__":
    main()
