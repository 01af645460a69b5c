"""What the probe's instruments cost, on the command users type: each one's share of a probe (issue 47).

``model-support sweep`` of a few fixtures (``MODELS``; eager, 8 new tokens, the perf phase off so that its adaptive
repeats add no noise, one worker) on the pretend device (``MODEL_SUPPORT_PRETEND='{}'``) and on the CPU, once per
configuration of the instruments' probe settings (``CONFIGS``: ``-p census=...``, ``-p flight_recorder=...``, ``-p
host_cost=...``), interleaved: each repetition runs every configuration once, in a rotated order, each in a fresh
data folder. Per instrument (``SHARES``) the difference of the medians with and without it, as a share of the
default configuration's median, three times: of the command's CPU seconds (its processes' user and system time,
all of them waited for), of its wall time, and of its probes' (their records' ``duration_s`` summed, wall time),
each as the difference of the medians and as the median of the differences within a repetition. On this shared
2-core machine (load average 3 to 8 from others' tests) those move by a second or more from run to run, more than
an instrument costs; so each instrument is also timed alone, in one process (``STAGES``): its CPU seconds in the
probes' stages, over the command's CPU seconds, is the share judged.
Before: the defaults until issue 47 (a full census; the flight recorder recording every probe). After: the defaults
now (the census sampled; the recorder armed only, a crash rerun under it). The CPU has no recorder and no host meter
(it is the host). Goal: each at most 5% of a probe, or off by default with why.

Also, in one process, what each costs an operator (a CPU ``add``, 20,000 calls, median of 5): bare, under a dispatch
mode that does nothing, under the census, under the recording flight recorder.

    .venv/bin/python bench/bench_instruments.py [--reps 5] [--stage-reps 20] [--devices pretend,cpu] [--models ...]

Each device's figures are written once measured; a run of some devices keeps the others' from the results file
(same models and repetitions). Others editing this checkout while it runs: measure a frozen copy of the commit
(``git archive HEAD src pretend/src | tar -x -C DIR; git rev-parse --short HEAD > DIR/COMMIT``, then
``PYTHONPATH=DIR/src:DIR/pretend/src``), as the results were; ``code`` names the commit.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import REPO, RESULTS, fixtures, spread, write_results

MODELS = ["tiny-llama", "tiny-gpt2", "SmolLM2-135M-Instruct"]
RESULTS_FILE = RESULTS / "instruments.json"
GOAL = 0.05
#: The instruments' settings of each configuration (the rest at their defaults).
CONFIGS = {
    "default": {},  # after: census sampled, flight_recorder auto (armed only), host_cost on
    "census off": {"census": "off"},
    "census full": {"census": "full"},  # the census before
    "recorder on": {"flight_recorder": "on"},  # the flight recorder before
    "host cost off": {"host_cost": "off"},
}
#: The CPU's: no flight recorder and no host meter run there.
ON_CPU = ("default", "census off", "census full")
#: (instrument, state, the configuration with it, the one without it): its cost is the difference.
SHARES = (
    ("census", "after: sampled", "default", "census off"),
    ("census", "before: full", "census full", "census off"),
    ("flight_recorder", "before: on", "recorder on", "default"),
    ("host_cost", "on (before and after)", "default", "host cost off"),
)
#: Why an instrument that is not at most 5% is off by default, and where it is switched on.
OFF_BY_DEFAULT = {
    "flight_recorder": "a dispatch mode over every operator, and its answer, the operator a dead kernel died in, "
    "is only needed when one dies: armed only by default (flight_recorder auto: its file, no "
    "dispatch mode); a silent abort is rerun once under it (synchronously where the stack "
    "can), which names the operator; flight_recorder on records every probe (a nightly "
    "chasing an abort that does not come back in a rerun)",
}

#: In one warm process, per model: the probe's stages (``probe_core.run_stages``, as run.py holds
#: the instruments) under each instrument alone and under none, alternating in a rotated order; the
#: medians of their CPU and wall seconds, torch on one thread (an instrument's work is one thread's
#: Python; two OpenMP threads spinning on a loaded machine made CPU seconds as noisy as wall
#: seconds). Then what each costs one operator (a CPU ``add``, 20,000 calls): bare, under a dispatch
#: mode doing nothing, the census, the recording flight recorder.
STAGES = """
import contextlib, json, os, statistics, sys, tempfile, time
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from model_support.probe import census, census_mode, devices, probe_core, probe_params, run
from model_support.probe.instruments import flight_recorder, host_cost

device, reps, models = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
torch.set_num_threads(1)  # CPU time, not two OpenMP threads' spinning on a loaded machine
devices.prepare_environment(device)
adapter = devices.resolve(device)
settings = {**run.DEFAULTS, "device": device}
sync = adapter.synchronize if device != "cpu" else None
folder = tempfile.mkdtemp()
KINDS = ["none", "census sampled", "census full", *(["recorder on", "host meter"] if device != "cpu" else [])]

def stages(model, kind):
    counted = census_mode.Census(adapter.type, adapter.synchronous_ops) if kind.startswith("census") else None
    on = kind == "recorder on"
    recorder = flight_recorder.FlightRecorder(os.path.join(folder, "f.bin"), adapter.type) if on else None
    meter = host_cost.meter_for(adapter, "eager")[0] if kind == "host meter" else None
    timer = meter.timer(sync) if meter else probe_core.StepTimer(sync)
    if kind == "census sampled":
        timer = counted.following(timer, settings["max_new_tokens"])
    hooks = [h.enter for h in (counted, recorder) if h is not None]
    cpu, wall = time.process_time(), time.perf_counter()
    with recorder or contextlib.nullcontext(), counted or contextlib.nullcontext():
        result = probe_core.run_stages(
            model_id=model, **probe_params.stage_settings(settings), device=adapter.torch_device, synchronize=sync,
            timer=timer, on_stage=lambda stage: [hook(stage) for hook in hooks],
        )
    assert result["status"] == "PASS", result["exception"]
    return time.process_time() - cpu, time.perf_counter() - wall

out = {"models": {}}
for model in models:
    stages(model, "none")  # warm
    got = {kind: [] for kind in KINDS}
    for rep in range(reps):
        for kind in KINDS[rep % len(KINDS):] + KINDS[: rep % len(KINDS)]:
            got[kind].append(stages(model, kind))
    out["models"][os.path.basename(model)] = {
        kind: {
            "cpu_s": statistics.median(c for c, _ in v),
            "wall_s": statistics.median(w for _, w in v),
            "cpu_runs": [round(c, 4) for c, _ in v],
        }
        for kind, v in got.items()
    }

class Nothing(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))

x, y = torch.zeros(4), torch.ones(4)
def loop(n=20000):
    began = time.process_time()
    for _ in range(n):
        torch.add(x, y)
    return 1e6 * (time.process_time() - began) / n

def counted():
    with census_mode.Census("cpu") as c:
        c.enter("generate")
        return loop()

def recorded():
    with flight_recorder.FlightRecorder(os.path.join(folder, "micro.bin"), "cpu"):
        return loop()

def nothing():
    with Nothing():
        return loop()

micro = {"bare": [], "dispatch mode doing nothing": [], "census": [], "flight recorder": []}
for _ in range(5):
    for name, how in zip(micro, (loop, nothing, counted, recorded)):
        micro[name].append(how())
out["micro_us_per_op"] = {k: round(statistics.median(v), 2) for k, v in micro.items()}
print(json.dumps(out))
"""
#: (instrument, state, its kind in ``STAGES``) for the in-process figures.
IN_PROCESS = (
    ("census", "after: sampled", "census sampled"),
    ("census", "before: full", "census full"),
    ("flight_recorder", "before: on", "recorder on"),
    ("host_cost", "on (before and after)", "host meter"),
)


def _children_cpu() -> float:
    """The CPU seconds (user and system) of this process's children that ended and were waited
    for, so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def sweep_once(definition: Path, settings: dict, env: dict) -> dict:
    """The command, timed, in a fresh data folder: its wall time, its probes' ``duration_s``
    summed, per model its census calls and its census's ``ops_time_source``."""
    command = [str(Path(sys.executable).parent / "model-support"), "sweep", str(definition)]
    for key, value in settings.items():
        command += ["-p", f"{key}={value}"]
    with tempfile.TemporaryDirectory() as tmp:
        began, cpu = time.perf_counter(), _children_cpu()
        done = subprocess.run(
            [*command, "--data-dir", tmp], capture_output=True, text=True, env=env, cwd=REPO
        )
        wall, cpu = time.perf_counter() - began, _children_cpu() - cpu
        assert done.returncode == 0, done.stderr[-3000:]
        records = [json.loads(p.read_text()) for p in Path(tmp).glob("sweeps/*/records/*.json")]
    bad = [
        (r["model_id"], r["status"], r["error_message"]) for r in records if r["status"] != "PASS"
    ]
    assert not bad, bad
    return {
        "command_s": wall,
        "command_cpu_s": cpu,
        "probes_s": sum(r["duration_s"] for r in records),
        "calls": {r["model_id"].split(":")[-1]: sum(r["ops_calls"] or []) for r in records},
        "time_source": {r["model_id"].split(":")[-1]: r["ops_time_source"] for r in records},
    }


def in_process(device: str, paths: list[str], reps: int) -> dict:
    """``STAGES`` on ``device``: per model and instrument the medians of the stages' CPU and wall
    seconds."""
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "MODEL_SUPPORT_PRETEND": "{}"}
    done = subprocess.run(
        [sys.executable, "-c", STAGES, device, str(reps), *paths],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def commands(device: str, paths: list[str], reps: int) -> dict[str, list[dict]]:
    """The command in every configuration of ``device``, ``reps`` times, interleaved (a rotated
    order each time)."""
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "MODEL_SUPPORT_PRETEND": "{}"}
    configs = list(CONFIGS) if device == "pretend" else list(ON_CPU)
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as tmp:
        definition = Path(tmp) / "instruments.yaml"
        probe = {"device": device, "max_new_tokens": 8, "perf": "off"}
        plan = {
            "name": "instruments",
            "probe": probe,
            "timeout_s": 300,
            "workers": 1,
            "models": paths,
        }
        definition.write_text(yaml.safe_dump(plan))
        sweep_once(definition, {}, env)  # warm: the page cache, the compiled bytecode
        for rep in range(reps):
            for name in configs[rep % len(configs) :] + configs[: rep % len(configs)]:
                runs[name].append(sweep_once(definition, CONFIGS[name], env))
                got = [
                    round(runs[name][-1][k], 2) for k in ("command_s", "command_cpu_s", "probes_s")
                ]
                print(device, rep, name, *got, flush=True)
    return runs


def measure(device: str, names: list[str], models: dict, reps: int, stage_reps: int) -> dict:
    """Per instrument on ``device``: what it adds to the command (CPU and wall seconds, and its
    probes'), as the difference of the medians with and without it and the median of the
    differences within a repetition; and, timed alone in one process, what it adds to the probes'
    stages' CPU seconds, over the command's CPU seconds."""
    paths = [models[name]["path"] for name in names]
    runs = commands(device, paths, reps)
    alone = in_process(device, paths, stage_reps)
    found: dict = {"configs": {}, "shares": [], "in_process": alone}
    for name, got in runs.items():
        found["configs"][name] = {
            "settings": CONFIGS[name],
            **{k: spread([r[k] for r in got]) for k in ("command_cpu_s", "command_s", "probes_s")},
            "census_calls": got[-1]["calls"],
            "ops_time_source": got[-1]["time_source"],
        }
    default = {
        k: found["configs"]["default"][k]["median"]
        for k in ("command_cpu_s", "command_s", "probes_s")
    }
    stage_kind = {(i, s): kind for i, s, kind in IN_PROCESS}
    for instrument, state, with_it, without in SHARES:
        if with_it not in runs or without not in runs:
            continue
        share = {"instrument": instrument, "state": state, "with": with_it, "without": without}
        for k in ("command_cpu_s", "command_s", "probes_s"):
            extra = statistics.median(r[k] for r in runs[with_it]) - statistics.median(
                r[k] for r in runs[without]
            )
            paired = statistics.median(a[k] - b[k] for a, b in zip(runs[with_it], runs[without]))
            share[k] = {
                "extra_s": round(extra, 3),
                "share": round(extra / default[k], 4),
                "paired_extra_s": round(paired, 3),
                "paired_share": round(paired / default[k], 4),
            }
        kind = stage_kind[(instrument, state)]
        per_model = {m: t[kind]["cpu_s"] - t["none"]["cpu_s"] for m, t in alone["models"].items()}
        stages = sum(t["none"]["cpu_s"] for t in alone["models"].values())
        share["alone"] = {
            "extra_cpu_s": round(sum(per_model.values()), 3),
            "per_model_cpu_s": {m: round(v, 4) for m, v in per_model.items()},
            "share_of_stages": round(sum(per_model.values()) / stages, 4),
            "share": round(sum(per_model.values()) / default["command_cpu_s"], 4),
        }
        found["shares"].append(share)
    return found


def summary(devices: dict) -> tuple[dict, dict]:
    """Per instrument: its default, what it adds timed alone as a share of the command's CPU
    seconds (judged; the command's own differences are below this machine's noise) and of the
    probes' stages, before and after, on each device, and whether it is at most 5% or off by
    default (with why)."""
    found = {
        (s["instrument"], s["state"], d): s["alone"]
        for d, f in devices.items()
        for s in f["shares"]
    }

    def on(instrument: str, state: str | None) -> dict:
        if state is None:
            return {}
        return {
            d: {"share": v["share"], "share_of_stages": v["share_of_stages"]}
            for (i, s, d), v in found.items()
            if i == instrument and s == state
        }

    instruments = {}
    for name, default, before, after in (
        ("census", "sampled", "before: full", "after: sampled"),
        ("flight_recorder", "auto (armed only)", "before: on", None),
        ("host_cost", "on", "on (before and after)", "on (before and after)"),
    ):
        measured = on(name, after)
        instruments[name] = {
            "default": default,
            "before": on(name, before),
            "after": measured if after else "off by default",
            "met": True
            if name in OFF_BY_DEFAULT
            else (all(v["share"] <= GOAL for v in measured.values()) if measured else None),
            **({"why": OFF_BY_DEFAULT[name]} if name in OFF_BY_DEFAULT else {}),
        }
    return instruments, {name: verdict["met"] for name, verdict in instruments.items()}


def code_commit() -> str:
    """The commit measured: a frozen copy's (``PYTHONPATH=DIR/src``, its commit in
    ``DIR/COMMIT``), else HEAD's."""
    for entry in filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)):
        marker = Path(entry).parent / "COMMIT"
        if marker.exists():
            return marker.read_text().strip()
    head = ["git", "rev-parse", "--short", "HEAD"]
    return subprocess.run(head, capture_output=True, text=True, cwd=REPO).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--stage-reps", type=int, default=20)
    parser.add_argument("--devices", default="pretend,cpu")
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    models, names = fixtures(), args.models.split(",")
    results: dict = {
        "reps": args.reps,
        "stage_reps": args.stage_reps,
        "goal_share": GOAL,
        "models": names,
        "command": "model-support sweep DEF -p census=... -p flight_recorder=... -p host_cost=... "
        "(eager, 8 new tokens, perf off, 1 worker)",
        "code": code_commit(),
        "devices": {},
    }
    earlier = json.loads(RESULTS_FILE.read_text()) if RESULTS_FILE.exists() else {}
    # the devices not measured this time
    if earlier.get("models") == names and earlier.get("reps") == args.reps:
        results["devices"] = {
            d: f for d, f in earlier.get("devices", {}).items() if "in_process" in f
        }
    for device in args.devices.split(","):  # each written once measured: a later failure keeps it
        results["devices"][device] = measure(device, names, models, args.reps, args.stage_reps)
        print(device, json.dumps(results["devices"][device]["shares"]), flush=True)
        results["micro_us_per_op"] = results["devices"][device]["in_process"]["micro_us_per_op"]
        results["instruments"], results["met"] = summary(results["devices"])
        write_results("instruments", results)
    print(json.dumps(results["met"]))


if __name__ == "__main__":
    main()
