"""``model-support ops SWEEP --prove``'s time: the porting plan proven by running (issue 48, part 5).

A four-model sweep on the pretend device whose stack lacks ``aten::rsqrt`` and ``aten::gelu`` (tiny-llama and
tiny-qwen2: RMSNorm; tiny-gpt-neox: GELU; tiny-gemma: both), two workers, 2 new tokens, judge and perf off, as the
tests run it. Its plan has two steps (rsqrt unlocks two models, gelu the other two); ``--prove`` runs each step's
operators, cumulatively, on the host over the models it unlocks: two what-if sweeps of two probes each. Timed end
to end, the command a user types in a fresh process, from a copy of the data folder holding the stack's sweep only
(each repetition proves from nothing); then once more on the proven copy (every step read back, nothing run). The
stack's own sweep of the four models is timed beside it, for scale. Goal: a few minutes.

    .venv/bin/python bench/bench_ops_prove.py [--reps N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from common import fixtures, spread, write_results
from test_ops_prove import MODELS, STACK, cli, sweep  # the tests' sweep and command, timed

GOAL_S = 180.0


def timed(args: list, data: Path) -> tuple[float, dict]:
    """``args`` run as the tests run them (a fresh process, the stack in its environment);
    seconds, its JSON."""
    started = time.perf_counter()
    done = cli(args, data, STACK)
    return time.perf_counter() - started, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    reps = parser.parse_args().reps
    fixtures()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "stack"
        started = time.perf_counter()
        stack = sweep(Path(tmp), base, "stack", MODELS, STACK, 2)
        sweep_s = time.perf_counter() - started
        proofs, answers = [], []
        for i in range(reps):
            data = Path(tmp) / f"rep{i}"
            shutil.copytree(base, data)
            seconds, answer = timed(["ops", stack, "--prove", "--json"], data)
            proofs.append(seconds)
            answers.append(answer)
            print(f"--prove {i + 1}/{reps}: {seconds:.1f} s", flush=True)
        again_s, _ = timed(["ops", stack, "--prove", "--json"], data)
        what_if = [p.name for p in (data / "sweeps").iterdir() if p.name != stack]
        probes = sum(len(list((data / "sweeps" / s / "records").glob("*.json"))) for s in what_if)
    answer = answers[-1]
    steps = [
        {
            "op": s["op"],
            "unlocks": len(s["unlocks"]),
            "outcome": s["proof"]["outcome"],
            "said": s["proof"]["said"],
        }
        for s in answer["plan"]
    ]
    confirmed = all(
        s["outcome"] == "confirmed" for a in answers for s in (x["proof"] for x in a["plan"])
    )
    results = {
        "models": list(MODELS),
        "stack": STACK,
        "workers": 2,
        "reps": reps,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "stack_sweep_s": round(sweep_s, 2),
        "prove_s": spread(proofs),
        "prove_again_s": round(again_s, 2),
        "what_if_sweeps": len(what_if),
        "probes": probes,
        "steps": steps,
        "goal_s": GOAL_S,
        "met": {"every_step_confirmed": confirmed, "within_a_few_minutes": max(proofs) < GOAL_S},
    }
    write_results("ops_prove", results)


if __name__ == "__main__":
    main()
