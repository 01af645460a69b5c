"""The perf phase's cost per probe, and the spread of TPOT over its repeats, on the smoke list's text models.

Per model, in one warm process on the device (``--device``: the CPU, the smoke list's device, where ``perf`` is
off by default; or the pretend accelerator, where it is on, timed on its modelled clock), whole probes
(``run_probe``: stages, the perf phase, the CPU reference, the judge) alternate with the perf phase off
(``perf=False``) and on (its defaults: on the pretend device's own clock the verdict's decode steps give TPOT and
two repeats of ``perf_tokens`` 1 a warm TTFT; on the CPU's, after a warm-up, repeats of 16 tokens give TPOT too,
until its spread over all of them is within ``perf_spread`` 5%, or ``perf_budget`` (a quarter of the probe's device
time: on the CPU the whole probe so far) or ``perf_repeats``, the cap, stops it: ``probe.performance.Plan``); the
perf phase's cost is the difference of the medians, as a share of a probe without it (goal: under a fifth). From the
runs with it on: TPOT's spread over the repeats the phase chose ((max - min) / median; goal: within 5%, the worst of
the runs, and how many probes met it), and, not chosen by the stop rule, how far the probes' TPOT medians lie apart (what the gate compares between sweeps); its coefficient of variation, how many repeats ran
and why they stopped, and torch's CPU threads in the probes (``OMP_NUM_THREADS``, else one per core).

    .venv/bin/python bench/bench_perf.py [--reps 3] [--models tiny-llama,...] [--device cpu|pretend]

Results: bench/results/perf.json (CPU), perf_pretend.json (the pretend device).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from common import REPO, fixtures, spread, write_results

MODELS = ["SmolLM2-135M-Instruct", "tiny-llama", "tiny-qwen2", "tiny-gpt2", "tiny-opt", "tiny-phi3"]

CHILD = """
import json, sys
from model_support.probe.run import run_probe

model, reps, device = sys.argv[1], int(sys.argv[2]), sys.argv[3]
run_probe(model, device=device)  # warm: imports, the judge's first load
out = {"off": [], "on": [], "tpot_spread": [], "tpot_cv": [], "tpot_s": [], "first_call_s": [], "repeats": [], "stops": [], "tokens": [], "threads": []}
for _ in range(reps):
    for perf in (False, True):
        r = run_probe(model, device=device, perf=perf)
        assert r["status"] == "PASS", r["error_message"]
        out["on" if perf else "off"].append(r["duration_s"])
        if perf:
            rep = r["tpot_s_repeats"]
            out["tpot_spread"].append(r["tpot_spread"])
            out["threads"].append(r["cpu_threads"])
            out["tpot_cv"].append(statistics.stdev(rep) / statistics.mean(rep))
            out["tpot_s"].append(r["tpot_s"])
            out["first_call_s"].append(r["perf_first_call_s"])
            out["repeats"].append(r["perf_repeats_run"])
            out["stops"].append(r["perf_stop"])
            out["tokens"].append(r["perf_tokens_out"])
print(json.dumps(out))
""".replace("import json, sys", "import json, statistics, sys")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--device", choices=("cpu", "pretend"), default="cpu")
    args = parser.parse_args()
    fixtures()
    from model_support.probe.probe_params import BY_NAME

    perf = {
        name: BY_NAME[name].default
        for name in ("perf_tokens", "perf_repeats", "perf_spread", "perf_budget")
    }
    results: dict = {"reps": args.reps, **perf, "device": args.device, "models": {}}
    env = dict(os.environ)
    if args.device == "pretend":
        env["MODEL_SUPPORT_PRETEND"] = json.dumps({"bandwidth_gbs": 10})
    tokens: set = set()
    threads: set = set()
    for name in args.models.split(","):
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                CHILD,
                str(REPO / "data" / "models" / name),
                str(args.reps),
                args.device,
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=env,
        )
        if done.returncode:
            results["models"][name] = {"error": done.stderr[-2000:]}
            continue
        got = json.loads(done.stdout.strip().splitlines()[-1])
        off, on = statistics.median(got["off"]), statistics.median(got["on"])
        tokens.update(got["tokens"])
        threads.update(got["threads"])
        results["models"][name] = {
            "probe_off_s": spread(got["off"]),
            "probe_on_s": spread(got["on"]),
            "perf_cost_s": round(on - off, 3),
            "perf_share": round((on - off) / off, 3),
            "tpot_ms": round(1e3 * statistics.median(got["tpot_s"]), 3),
            "tpot_spread": round(statistics.median(got["tpot_spread"]), 4),
            "tpot_spread_worst": round(max(got["tpot_spread"]), 4),
            "probes_within_5pct": sum(s <= 0.05 for s in got["tpot_spread"]),
            # not chosen by the stop rule: how far the probes' TPOT medians lie apart (what the gate
            # compares)
            "tpot_across_probes": round(
                (max(got["tpot_s"]) - min(got["tpot_s"])) / statistics.median(got["tpot_s"]), 4
            ),
            "repeats": got["repeats"],
            "stops": got["stops"],
            "tpot_cv": round(statistics.median(got["tpot_cv"]), 4),
            "first_call_s": round(statistics.median(got["first_call_s"]), 3),
        }
        print(name, results["models"][name], flush=True)
    measured = [m for m in results["models"].values() if "perf_share" in m]
    # as run: 16 on the CPU, where the repeats give TPOT (repeat_tokens)
    results["repeat_tokens"] = sorted(tokens)
    # torch's intra-op threads in the probes (OMP_NUM_THREADS, else cores)
    results["cpu_threads"] = sorted(threads)
    results["probes_within_5pct"] = (
        f"{sum(m['probes_within_5pct'] for m in measured)} of {args.reps * len(measured)}"
        if measured
        else None
    )
    results["met"] = {
        "perf_share_under_a_fifth": all(m["perf_share"] < 0.2 for m in measured)
        if measured
        else None,
        "tpot_cv_under_5pct": all(m["tpot_cv"] < 0.05 for m in measured) if measured else None,
        "tpot_spread_within_5pct": all(m["tpot_spread_worst"] <= 0.05 for m in measured)
        if measured
        else None,
        "tpot_across_probes_within_5pct": all(m["tpot_across_probes"] <= 0.05 for m in measured)
        if measured
        else None,
    }
    write_results("perf" if args.device == "cpu" else f"perf_{args.device}", results)


if __name__ == "__main__":
    main()
