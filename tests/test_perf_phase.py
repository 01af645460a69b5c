"""The perf phase sized by what it measures (issue 47): the verdict's generation as its first repeat, as many repeats
as TPOT's spread needs within a budget and a cap, and its device seconds counted and said apart.

The rule (``performance.Plan``) is a table; the rest runs real probes on the pretend device, whose own clock makes a
step's time a model of the device's work (noise-free where ``clock_jitter`` is 0), and on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from helpers import REPO
from model_support.probe import performance, phases
from model_support.sweep import device_time

PLAN = performance.Plan(cap=5, goal=0.05, budget_s=1.0)
STEADY = [1.0] * 6  # a verdict's decode steps, alike


@pytest.mark.parametrize(
    ("tpot", "own", "spent", "last", "adds", "stop"),
    [
        (STEADY, 0, 0.0, 0.0, False, None),  # nothing of its own yet: two warm TTFTs always run
        (STEADY, 1, 5.0, 5.0, False, None),  # ... over the budget or not (a TTFT of one repeat compares with nothing)
        (STEADY, 2, 0.1, 0.1, False, "spread"),  # TPOT settled by the verdict's steps: enough
        ([1.0, 1.2, 1.0], 2, 0.1, 0.1, False, "spread"),  # 20%, but repeats of one token add no step: said so
        ([1.0, 1.2, 1.0], 2, 0.1, 0.1, True, None),  # repeats that add steps: one more
        ([1.0, 1.2, 1.0], 2, 0.95, 0.1, True, "budget"),  # ... which would pass the budget
        ([1.0, 1.2, 1.0], 2, 0.9, 0.1, True, None),  # exactly at the budget is within it
        ([1.0, 1.2, 1.0, 1.2], 5, 0.2, 0.01, True, "cap"),  # five: the cap, spread or not
        ([1.0, 1.0], 2, 0.0, 0.0, True, None),  # two samples: the spread is judged over three
        ([1.0, 1.0], 2, 5.0, 5.0, True, None),  # ... and the budget waits for them (a spread of two is no figure)
        ([1.3, 1.0, 1.02, 1.01], 3, 0.1, 0.1, True, None),  # every sample counts: none is chosen for agreeing
        ([1.0, 1.0], 1, 5.0, 5.0, True, None),  # one repeat: two always run
        ([1.0, 1.0, float("nan")], 2, 0.1, 0.1, True, None),  # a sample that is no number: no spread, not settled
        ([1.0, 1.0, float("inf")], 2, 0.1, 0.1, True, None),  # ... nor one without end
        ([0.0, 0.0, 0.0], 2, 0.1, 0.1, True, None),  # ... nor a median of 0 (a clock that did not move)
        ([1.0, 1.0, float("nan")], 2, 0.95, 0.1, True, "budget"),  # the budget still stops it
    ],
)
def test_the_plan_stops_on_spread_budget_or_cap(tpot, own, spent, last, adds, stop):
    assert PLAN.stop(tpot, own, spent, last, adds) == stop


def test_the_probes_time_limit_stops_any_repeat_after_the_first_two_that_would_pass_half_of_what_is_left():
    """Past the deadline no repeat starts, before the three samples too; the first two always run (a single TTFT is
    "not comparable" to the gate: a slower one would pass), and the stop says "time"."""
    plan = performance.Plan(cap=10, goal=0.0, budget_s=None, deadline_s=1.0)
    assert plan.stop([], 0, 0.0, 0.0) is None and plan.stop([1.0], 1, 5.0, 5.0) is None  # two always run
    assert plan.stop([1.0, 1.0], 2, 0.6, 0.6) == "time"
    assert plan.stop([1.0, 1.0, 1.0], 2, 0.6, 0.6) == "time"  # a goal of 0: the spread never stops it
    settled = performance.Plan(cap=3, goal=0.05, budget_s=None, deadline_s=1.0)
    assert settled.stop([1.0, 1.0, 1.0], 2, 0.6, 0.6) == "spread" and settled.stop([1.0, 1.3], 3, 0.6, 0.6) == "cap"
    assert plan.stop([1.0, 1.0], 2, 0.5, 0.5) is None
    started = time.perf_counter() - 100.0  # a probe 100 s into a 300 s limit: 100 s for the phase
    assert performance._deadline({"started": started, "timeout_s": 300.0}, time.perf_counter()) == pytest.approx(
        100.0, abs=1.0
    )
    assert performance._deadline({"timeout_s": 300.0}, time.perf_counter()) is None


def test_no_budget_means_the_cap_or_the_spread_decides_and_a_cap_of_one_runs_one():
    plan = performance.Plan(cap=3, goal=0.0, budget_s=None)
    assert plan.stop([1.0, 1.1, 1.0], 2, 1e9, 1e9) is None and plan.stop([1.0, 1.1, 1.0], 3, 1e9, 1e9) == "cap"
    assert plan.stop(STEADY, 3, 0, 0, False) == "cap"  # a goal of 0: every repeat the cap allows, even alike
    assert performance.Plan(cap=1, goal=0.05, budget_s=None).stop(STEADY, 1, 0, 0) == "spread"  # the cap wins over two


def test_the_budget_is_a_share_of_the_device_phase_so_far_and_zero_is_none():
    phases.start()
    with phases.device_work():
        time.sleep(0.2)
    assert performance.budget({"perf_budget": 0.25}, {"generate_s": 9.0}) == pytest.approx(0.05, abs=0.01)
    assert performance.budget({"perf_budget": 0}, {"generate_s": 9.0}) is None
    phases.start()  # no device phase timed (a probe outside a sweep's worker): the verdict's generation
    assert performance.budget({"perf_budget": 0.5}, {"generate_s": 4.0}) == 2.0
    # on the CPU the host is the device: the whole probe so far (a tiny model's device phase bought two repeats)
    started = time.perf_counter() - 2.0
    cpu = performance.budget({"perf_budget": 0.25, "started": started}, {"generate_s": 0.01}, "cpu")
    assert cpu == pytest.approx(0.5, abs=0.05)


def test_the_verdicts_steps_count_in_eager_on_the_phases_clock_never_in_compile():
    verdict = {"token_times": [10.0, 10.2, 10.4, 10.6, 10.8]}  # each token on the device's clock
    clock = time.perf_counter  # a device's own clock
    # the first step (the decode shape's first call) left out
    assert performance.verdict_steps(verdict, {"mode": "fused"}, clock) == pytest.approx([0.2] * 3)
    assert performance.verdict_steps(verdict, {"mode": "eager"}, None) is None  # the host's clock: instruments, noise
    assert performance.verdict_steps(verdict, {"mode": "compile"}, clock) is None  # its forward compiled again
    three = {"token_times": [1.0, 1.1, 1.2]}
    assert performance.verdict_steps(three, {"mode": "eager"}, clock) is None  # one step left: no median of steps
    assert performance.verdict_steps({"token_times": []}, {"mode": "eager"}, clock) is None  # no device stamps


def test_a_repeat_suppresses_the_end_only_where_it_could_come_and_keeps_the_cache():
    verdict = {"tokens_out": 8}
    assert performance.generate_options(4, {"cache": "dynamic"}, verdict) == {"max_new_tokens": 4}
    assert performance.generate_options(16, {"cache": "static"}, verdict) == {
        "max_new_tokens": 16,
        "min_new_tokens": 16,
        "cache_implementation": "static",
    }
    assert performance.generate_options(4, {}, {"tokens_out": 2})["min_new_tokens"] == 4  # it stopped early


def test_a_part_counts_inside_a_device_block_only_and_the_sweep_sums_it_per_device():
    phases.start()
    with phases.part("perf"):  # outside a device phase: nothing
        time.sleep(0.02)
    with phases.device_work():
        time.sleep(0.05)
        with phases.part("perf"):
            time.sleep(0.1)
    timed = phases.device_phase()
    assert timed["parts"]["perf"] == pytest.approx(0.1, abs=0.04) and timed["device_s"] >= timed["parts"]["perf"]
    rows = [
        {"start": 0, "end": 10, "devices": [0, 1], "device_s": 9, "device_parts": {"perf": 2.0, "recompiles": 1.0}},
        {"start": 1, "end": 11, "devices": [0], "device_s": 9, "device_parts": {"perf": 1.5}},
    ]
    stats = device_time.summarise(rows, 2)
    assert stats["parts_s"] == {"perf": 5.5, "recompiles": 2.0} and stats["device_s"] == 27
    said = device_time.sentence(stats)
    assert "(of which the perf phase 5.5 s, the recompile check 2.0 s)" in said, said


def _probe(model: str, device: str, **settings) -> dict:
    from model_support.probe.run import run_probe

    return run_probe(model, device=device, reference="none", judge=False, perf="on", **settings)


#: A probe on the pretend device, in a child process (registering the device renames PrivateUse1 for the life of the
#: process: in a test worker it leaked into every later test there), with a noise-free clock; prints the record and
#: the device phase's parts.
CHILD = """
import json, sys
from model_support.probe import phases
from model_support.probe.run import run_probe
for settings in json.loads(sys.argv[2]):
    r = run_probe(sys.argv[1], device="pretend", reference="none", judge=False, perf="on", **settings)
    print(json.dumps({"record": r, "parts": phases.device_phase()["parts"]}, default=str))
"""


def _pretend(model: str, *settings: dict, device: dict | None = None) -> list[dict]:
    config = json.dumps(device or {"clock_jitter": 0})
    env = {**os.environ, "MODEL_SUPPORT_PRETEND": config}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, model, json.dumps(list(settings))],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_on_the_pretend_device_the_verdict_gives_tpot_and_two_repeats_a_warm_ttft(fixture_models):
    """The defaults: TPOT from the verdict's decode steps on the device's clock (no work the verdict did not do, such
    as suppressing the end, sets the repeats apart), two repeats of one token for a warm TTFT the gate can compare,
    the phase's seconds said and counted as the device's part "perf"; every repeat the cap allows when the budget and
    the spread goal are off, each generation's median step a TPOT sample."""
    default, every = _pretend(
        fixture_models["tiny-llama"]["path"],
        {},
        {"perf_repeats": 5, "perf_budget": 0, "perf_spread": 0, "perf_tokens": 3},
    )
    record = default["record"]
    assert record["status"] == "PASS" and record["perf_stop"] == "spread", record["perf_note"]
    assert record["perf_repeats_run"] == len(record["ttft_s_repeats"]) == 2 and record["perf_tokens_out"] == 1
    assert len(record["tpot_s_repeats"]) == record["tokens_out"] - 2  # the verdict's steps but its first
    assert record["perf_note"].startswith("2 repeats of 1 token; TPOT from the verdict's decode steps; stopped by TPOT")
    assert record["tpot_spread"] <= 0.05 and record["ttft_spread"] <= 0.05, record["perf_note"]
    assert record["perf_tokens_per_s"] == pytest.approx(8 / (record["ttft_s"] + 7 * record["tpot_s"]), rel=0.01)
    assert record["perf_first_call_s"] > 0 and default["parts"]["perf"] >= record["perf_device_s"] > 0
    every = every["record"]
    assert every["perf_repeats_run"] == 5 == len(every["ttft_s_repeats"]) and every["perf_stop"] == "cap"
    assert len(every["tpot_s_repeats"]) == 1 + 5  # each generation's median: the verdict's and five of its own
    assert "stopped by the cap of perf_repeats=5" in every["perf_note"]


def test_on_the_cpu_the_repeats_add_steps_until_the_spread_is_reached(fixture_models):
    """On the host's clock TPOT comes from the phase's own repeats (16 tokens on the CPU), each one's median step a
    sample, until three give the spread goal (a goal of 1000% here: the shared machine's noise is not the subject)."""
    record = _probe(fixture_models["tiny-gpt2"]["path"], "cpu", perf_budget=0, perf_spread=10.0, perf_tokens=3)
    assert record["status"] == "PASS" and record["perf_stop"] == "spread", record["perf_note"]
    assert record["perf_tokens_out"] == 16 and record["perf_repeats_run"] == 3 == len(record["tpot_s_repeats"])
    assert record["perf_note"].startswith("3 repeats of 16 tokens; stopped by TPOT spread"), record["perf_note"]


def test_on_the_hosts_clock_the_budget_waits_for_three_samples_of_tpot(fixture_models):
    """On an accelerator timed on the host's clock (the pretend device with ``clock: host``, as CUDA) the repeats give
    TPOT, 4 tokens each; a budget its device phase cannot buy a third repeat with stops the phase only once TPOT has
    the three samples a spread is judged over (bench_perf on the CPU: every run stopped at two before)."""
    (got,) = _pretend(
        fixture_models["tiny-gpt2"]["path"], {"perf_budget": 1e-6, "perf_spread": 0}, device={"clock": "host"}
    )
    record = got["record"]
    assert record["status"] == "PASS" and record["perf_stop"] == "budget", record["perf_note"]
    assert record["perf_tokens_out"] == 4, record["perf_note"]
    assert record["perf_repeats_run"] == 3 == len(record["tpot_s_repeats"]), record["perf_note"]
    assert "on the host's wall clock" in record["perf_note"]


def test_a_phase_with_no_other_limit_stops_at_half_the_time_the_probe_has_left(fixture_models):
    """No spread goal, no budget and a cap of 100,000 repeats: the probe's time limit (2 s) still stops the phase, at
    half the time the probe had left, so the checks after it keep theirs; the note names the limit."""
    record = _probe(
        fixture_models["tiny-gpt2"]["path"], "cpu", perf_spread=0, perf_budget=0, perf_repeats=100_000, timeout_s=2.0
    )
    assert record["status"] == "PASS" and record["perf_stop"] == "time", record["perf_note"]
    assert "stopped by the probe's time limit" in record["perf_note"]
    assert 2 <= record["perf_repeats_run"] < 100_000 and record["perf_device_s"] < 1.5, record["perf_note"]


def test_the_repro_scripts_timing_gives_tpot_with_the_default_of_one_token(fixture_models):
    """``bisect --metric tpot`` times the repro script: with ``perf_tokens`` 1 (the perf phase's default, whose TPOT
    comes from the verdict's steps) its repeats still decode the phase's own floor (16 on the CPU) and give TPOT."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from model_support.probe import reproduce

    path = fixture_models["tiny-gpt2"]["path"]
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    ids = tokenizer("The future of AI is")["input_ids"]
    settings = {"perf_tokens": 1, "device": "cpu", "mode": "eager", "compile_backend": None}
    result = {"model": model, "tokenizer": tokenizer, "input_ids": ids}
    timed = reproduce.timed_repeats(settings, result, torch.device("cpu"), None, 2)
    assert timed["perf_tokens"] == 16 and len(timed["tpot_s_repeats"]) == 2 and min(timed["tpot_s_repeats"]) > 0
