"""The perf phase sized by what it measures (issue 47): the verdict's generation as its first
repeat, as many repeats as TPOT's spread needs within a budget and a cap, and its device seconds
counted and said apart.

The rule (``performance.Plan``) is a table; the rest runs real probes on the pretend device,
whose own clock makes a step's time a model of the device's work (noise-free where
``clock_jitter`` is 0), and on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from helpers import REPO, FakeClock
from model_support.probe import performance, phases
from model_support.sweep import device_time

PLAN = performance.Plan(cap=5, goal=0.05, budget_s=1.0)
STEADY = [1.0] * 6  # a verdict's decode steps, alike


@pytest.mark.parametrize(
    ("tpot", "own", "spent", "last", "adds", "stop"),
    [
        (STEADY, 0, 0.0, 0.0, False, None),  # nothing of its own yet: two warm TTFTs always run
        # ... over the budget or not (a TTFT of one repeat compares with nothing)
        (STEADY, 1, 5.0, 5.0, False, None),
        (STEADY, 2, 0.1, 0.1, False, "spread"),  # TPOT settled by the verdict's steps: enough
        # 20%, but repeats of one token add no step: said so
        ([1.0, 1.2, 1.0], 2, 0.1, 0.1, False, "spread"),
        ([1.0, 1.2, 1.0], 2, 0.1, 0.1, True, None),  # repeats that add steps: one more
        ([1.0, 1.2, 1.0], 2, 0.95, 0.1, True, "budget"),  # ... which would pass the budget
        ([1.0, 1.2, 1.0], 2, 0.9, 0.1, True, None),  # exactly at the budget is within it
        ([1.0, 1.2, 1.0, 1.2], 5, 0.2, 0.01, True, "cap"),  # five: the cap, spread or not
        ([1.0, 1.0], 2, 0.0, 0.0, True, None),  # two samples: the spread is judged over three
        # ... and the budget waits for them (a spread of two is no figure)
        ([1.0, 1.0], 2, 5.0, 5.0, True, None),
        # every sample counts: none is chosen for agreeing
        ([1.3, 1.0, 1.02, 1.01], 3, 0.1, 0.1, True, None),
        ([1.0, 1.0], 1, 5.0, 5.0, True, None),  # one repeat: two always run
        # a sample that is no number: no spread, not settled
        ([1.0, 1.0, float("nan")], 2, 0.1, 0.1, True, None),
        ([1.0, 1.0, float("inf")], 2, 0.1, 0.1, True, None),  # ... nor one without end
        # ... nor a median of 0 (a clock that did not move)
        ([0.0, 0.0, 0.0], 2, 0.1, 0.1, True, None),
        ([1.0, 1.0, float("nan")], 2, 0.95, 0.1, True, "budget"),  # the budget still stops it
    ],
)
def test_the_plan_stops_on_spread_budget_or_cap(tpot, own, spent, last, adds, stop):
    assert PLAN.stop(tpot, own, spent, last, adds) == stop


def test_the_probes_time_limit_stops_any_repeat_after_the_first_two_that_would_pass_half_of_what_is_left():
    """Past the deadline no repeat starts, before the three samples too; the first two always run
    (a single TTFT is "not comparable" to the gate: a slower one would pass), and the stop says
    "time"."""
    plan = performance.Plan(cap=10, goal=0.0, budget_s=None, deadline_s=1.0)
    # two always run
    assert plan.stop([], 0, 0.0, 0.0) is None and plan.stop([1.0], 1, 5.0, 5.0) is None
    assert plan.stop([1.0, 1.0], 2, 0.6, 0.6) == "time"
    # a goal of 0: the spread never stops it
    assert plan.stop([1.0, 1.0, 1.0], 2, 0.6, 0.6) == "time"
    settled = performance.Plan(cap=3, goal=0.05, budget_s=None, deadline_s=1.0)
    assert (
        settled.stop([1.0, 1.0, 1.0], 2, 0.6, 0.6) == "spread"
        and settled.stop([1.0, 1.3], 3, 0.6, 0.6) == "cap"
    )
    assert plan.stop([1.0, 1.0], 2, 0.5, 0.5) is None
    # a probe 100 s into a 300 s limit: 100 s for the phase; past its limit, none
    assert performance._deadline({"started": 50.0, "timeout_s": 300.0}, 150.0) == 100.0
    assert performance._deadline({"started": 50.0, "timeout_s": 300.0}, 400.0) == 0.0
    assert performance._deadline({"timeout_s": 300.0}, 150.0) is None
    assert performance._deadline({"started": 50.0, "timeout_s": 0}, 150.0) is None


def test_no_budget_means_the_cap_or_the_spread_decides_and_a_cap_of_one_runs_one():
    plan = performance.Plan(cap=3, goal=0.0, budget_s=None)
    assert (
        plan.stop([1.0, 1.1, 1.0], 2, 1e9, 1e9) is None
        and plan.stop([1.0, 1.1, 1.0], 3, 1e9, 1e9) == "cap"
    )
    # a goal of 0: every repeat the cap allows, even alike
    assert plan.stop(STEADY, 3, 0, 0, False) == "cap"
    # the cap wins over two
    assert performance.Plan(cap=1, goal=0.05, budget_s=None).stop(STEADY, 1, 0, 0) == "spread"


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    """One fake clock for the device phase (``phases.now``) and the perf phase's host clock
    (``performance.host_clock``), from zero device seconds."""
    fake = FakeClock()
    monkeypatch.setattr(phases, "now", fake)
    monkeypatch.setattr(performance, "host_clock", fake)
    phases.start()
    yield fake
    phases.start()


def test_the_budget_is_a_share_of_the_device_phase_so_far_and_zero_is_none(clock):
    with phases.device_work():
        clock.advance(0.2)
    clock.advance(5.0)  # the host's work after the device phase is not the device's
    assert performance.budget({"perf_budget": 0.25}, {"generate_s": 9.0}) == pytest.approx(0.05)
    assert performance.budget({"perf_budget": 0}, {"generate_s": 9.0}) is None
    # no device phase timed (a probe outside a sweep's worker): the verdict's generation
    phases.start()
    assert performance.budget({"perf_budget": 0.5}, {"generate_s": 4.0}) == 2.0
    # on the CPU the host is the device: the whole probe so far (a tiny model's device phase bought
    # two repeats)
    started = clock()
    clock.advance(2.0)
    cpu = performance.budget({"perf_budget": 0.25, "started": started}, {"generate_s": 0.01}, "cpu")
    assert cpu == pytest.approx(0.5)
    # on an accelerator the probe's start says nothing: its device phase (here none: the verdict's
    # generation)
    assert (
        performance.budget({"perf_budget": 0.25, "started": started}, {"generate_s": 0.01}, "cuda")
        == 0.0025
    )
    # no start known
    assert performance.budget({"perf_budget": 0.25}, {"generate_s": 0.01}, "cpu") == 0.0025
    # nothing timed at all: nothing to share
    assert performance.budget({"perf_budget": 0.25}, {}) == 0.0
    # the CPU by its name, however the name was made (a record's, read back), and no other device,
    # whatever its name
    said = {"perf_budget": 0.25, "started": started}
    assert performance.budget(said, {"generate_s": 0.01}, "".join(["c", "pu"])) == pytest.approx(
        0.5
    )
    assert performance.budget(said, {"generate_s": 0.01}, "accel") == 0.0025


class _Model:
    """A model whose every generation takes ``ttft`` to its first token and ``step`` for each one
    after, on the fake clock: what ``performance.measure`` times, without a model (its settings:
    eager, no clock of the device's own)."""

    def __init__(self, clock: FakeClock, ttft: float, step: float):
        import torch

        self.clock, self.ttft, self.step, self.runs = clock, ttft, step, 0
        self.layer = torch.nn.Linear(4, 4)
        self.config = type("Config", (), {})()

    def named_parameters(self):
        return self.layer.named_parameters()

    def parameters(self):
        return self.layer.parameters()

    def generate(self, input_ids, streamer, max_new_tokens, **_):
        self.runs += 1
        streamer.put(input_ids)  # the prompt: no token
        for i in range(max_new_tokens):
            self.clock.advance(self.ttft if i == 0 else self.step)
            streamer.put(None)


class _Adapter:
    type = "fake"
    torch_device = "cpu"
    profiler_activities = ()

    def synchronize(self):
        pass

    def perf_clock(self, mode):
        return None  # the host's clock: the repeats give TPOT, after a warm-up of the phase's own

    def compile_backend(self):
        return None

    def reset_peak_memory(self):
        pass

    def peak_memory_mb(self):
        return None, None

    def peak_bandwidth_gbs(self):
        return None, "no peak bandwidth declared"


SETTINGS = {
    "perf_repeats": 10,
    "perf_spread": 0.0,
    "perf_tokens": 1,
    "mode": "eager",
    "cache": "dynamic",
}


def _measure(clock: FakeClock, settings: dict, budget_s: float | None) -> tuple[dict, _Model]:
    tokenizer = type("Tokenizer", (), {"pad_token_id": 0, "eos_token_id": 0})()
    model = _Model(clock, ttft=0.1, step=0.05)
    return performance.measure(
        model, tokenizer, [1, 2, 3], settings, _Adapter(), budget_s=budget_s
    ), model


def test_the_repeats_stop_at_the_budget_exactly_on_the_phases_clock(clock):
    """Each repeat of 4 tokens (the floor where the verdict gives no TPOT) takes 0.1 + 3 x 0.05 =
    0.25 s; a budget of 1.0 s once TPOT has its three samples: the fourth repeat ends at exactly
    1.0 s (within it), a fifth would pass it. The warm-up runs first, outside the budget; the
    phase's seconds count both."""
    fields, model = _measure(clock, SETTINGS, budget_s=1.0)
    assert (fields["perf_stop"], fields["perf_repeats_run"], model.runs) == ("budget", 4, 5)
    assert fields["perf_tokens_out"] == 4 and fields["ttft_s_repeats"] == pytest.approx([0.1] * 4)
    assert fields["tpot_s_repeats"] == pytest.approx([0.05] * 4) and fields["tpot_spread"] == 0.0
    assert fields["perf_tokens_per_s_repeats"] == pytest.approx([16.0] * 4)  # 4 tokens in 0.25 s
    assert fields["perf_device_s"] == pytest.approx(1.25) and fields[
        "perf_first_call_s"
    ] == pytest.approx(0.25)
    assert fields["perf_note"].startswith(
        "4 repeats of 4 tokens; stopped by the budget: another repeat would take"
    )
    # a budget a hair under 1.0 s: three repeats (the budget waits for TPOT's three samples, then
    # stops)
    fewer, _ = _measure(clock, SETTINGS, budget_s=0.999)
    assert (fewer["perf_stop"], fewer["perf_repeats_run"]) == ("budget", 3)


def test_the_repeats_stop_at_half_the_time_the_probe_has_left_and_at_the_cap(clock):
    """A probe started 9 s ago with a 10 s limit: half the 1 s left, 0.5 s, buys two repeats (the
    first two always run) and a third would pass it; no budget and a cap of 3: three."""
    started = clock()
    clock.advance(9.0)
    timed, _ = _measure(clock, {**SETTINGS, "started": started, "timeout_s": 10.0}, budget_s=None)
    assert (timed["perf_stop"], timed["perf_repeats_run"]) == ("time", 2)
    capped, _ = _measure(clock, {**SETTINGS, "perf_repeats": 3}, budget_s=None)
    assert (capped["perf_stop"], capped["perf_repeats_run"]) == ("cap", 3)


def test_the_verdicts_steps_count_in_eager_on_the_phases_clock_never_in_compile():
    verdict = {"token_times": [10.0, 10.2, 10.4, 10.6, 10.8]}  # each token on the device's clock
    clock = time.perf_counter  # a device's own clock
    # the first step (the decode shape's first call) left out
    assert performance.verdict_steps(verdict, {"mode": "fused"}, clock) == pytest.approx([0.2] * 3)
    # the host's clock: instruments, noise
    assert performance.verdict_steps(verdict, {"mode": "eager"}, None) is None
    # its forward compiled again
    assert performance.verdict_steps(verdict, {"mode": "compile"}, clock) is None
    # a mode read back
    assert performance.verdict_steps(verdict, {"mode": "".join(["com", "pile"])}, clock) is None
    three = {"token_times": [1.0, 1.1, 1.2]}
    # one step left: no median of steps
    assert performance.verdict_steps(three, {"mode": "eager"}, clock) is None
    four = {"token_times": [1.0, 1.5, 1.75, 2.0]}
    # two steps: enough
    assert performance.verdict_steps(four, {"mode": "eager"}, clock) == [0.25, 0.25]
    # no device stamps
    assert performance.verdict_steps({"token_times": []}, {"mode": "eager"}, clock) is None


def test_a_repeat_suppresses_the_end_only_where_it_could_come_and_keeps_the_cache():
    verdict = {"tokens_out": 8}
    assert performance.generate_options(4, {"cache": "dynamic"}, verdict) == {"max_new_tokens": 4}
    assert performance.generate_options(16, {"cache": "static"}, verdict) == {
        "max_new_tokens": 16,
        "min_new_tokens": 16,
        "cache_implementation": "static",
    }
    # it stopped early
    assert performance.generate_options(4, {}, {"tokens_out": 2})["min_new_tokens"] == 4


def test_a_part_counts_inside_a_device_block_only_and_the_sweep_sums_it_per_device(clock):
    with phases.part("perf"):  # outside a device phase: nothing
        clock.advance(0.02)
    with phases.device_work():
        clock.advance(0.05)
        with phases.part("perf"):
            clock.advance(0.1)
    timed = phases.device_phase()
    assert timed["parts"] == {"perf": pytest.approx(0.1)} and timed["device_s"] == pytest.approx(
        0.15
    )
    rows = [
        {
            "start": 0,
            "end": 10,
            "devices": [0, 1],
            "device_s": 9,
            "device_parts": {"perf": 2.0, "recompiles": 1.0},
        },
        {"start": 1, "end": 11, "devices": [0], "device_s": 9, "device_parts": {"perf": 1.5}},
    ]
    stats = device_time.summarise(rows, 2)
    assert stats["parts_s"] == {"perf": 5.5, "recompiles": 2.0} and stats["device_s"] == 27
    said = device_time.sentence(stats)
    assert "(of which the perf phase 5.5 s, the recompile check 2.0 s)" in said, said


def _probe(model: str, device: str, **settings) -> dict:
    from model_support.probe.run import run_probe

    return run_probe(model, device=device, reference="none", judge=False, perf="on", **settings)


#: A probe on the pretend device, in a child process (registering the device renames PrivateUse1 for
#: the life of the process: in a test worker it leaked into every later test there), with a
#: noise-free clock; prints the record and the device phase's parts.
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
    """The defaults: TPOT from the verdict's decode steps on the device's clock (no work the
    verdict did not do, such as suppressing the end, sets the repeats apart), two repeats of one
    token for a warm TTFT the gate can compare, the phase's seconds said and counted as the
    device's part "perf"; every repeat the cap allows when the budget and the spread goal are
    off, each generation's median step a TPOT sample."""
    default, every = _pretend(
        fixture_models["tiny-llama"]["path"],
        {},
        {"perf_repeats": 5, "perf_budget": 0, "perf_spread": 0, "perf_tokens": 3},
    )
    record = default["record"]
    assert record["status"] == "PASS" and record["perf_stop"] == "spread", record["perf_note"]
    assert (
        record["perf_repeats_run"] == len(record["ttft_s_repeats"]) == 2
        and record["perf_tokens_out"] == 1
    )
    # the verdict's steps but its first
    assert len(record["tpot_s_repeats"]) == record["tokens_out"] - 2
    assert record["perf_note"].startswith(
        "2 repeats of 1 token; TPOT from the verdict's decode steps; stopped by TPOT"
    )
    assert record["tpot_spread"] <= 0.05 and record["ttft_spread"] <= 0.05, record["perf_note"]
    assert record["perf_tokens_per_s"] == pytest.approx(
        8 / (record["ttft_s"] + 7 * record["tpot_s"]), rel=0.01
    )
    assert (
        record["perf_first_call_s"] > 0 and default["parts"]["perf"] >= record["perf_device_s"] > 0
    )
    every = every["record"]
    assert (
        every["perf_repeats_run"] == 5 == len(every["ttft_s_repeats"])
        and every["perf_stop"] == "cap"
    )
    # each generation's median: the verdict's and five of its own
    assert len(every["tpot_s_repeats"]) == 1 + 5
    assert "stopped by the cap of perf_repeats=5" in every["perf_note"]


def test_on_the_cpu_the_repeats_add_steps_until_the_spread_is_reached(fixture_models):
    """On the host's clock TPOT comes from the phase's own repeats (16 tokens on the CPU), each
    one's median step a sample, until three give the spread goal (a goal of 1000% here: the
    shared machine's noise is not the subject)."""
    record = _probe(
        fixture_models["tiny-gpt2"]["path"], "cpu", perf_budget=0, perf_spread=10.0, perf_tokens=3
    )
    assert record["status"] == "PASS" and record["perf_stop"] == "spread", record["perf_note"]
    assert record["perf_tokens_out"] == 16 and record["perf_repeats_run"] == 3 == len(
        record["tpot_s_repeats"]
    )
    assert record["perf_note"].startswith("3 repeats of 16 tokens; stopped by TPOT spread"), record[
        "perf_note"
    ]


def test_on_the_hosts_clock_the_budget_waits_for_three_samples_of_tpot(fixture_models):
    """On an accelerator timed on the host's clock (the pretend device with ``clock: host``, as
    CUDA) the repeats give TPOT, 4 tokens each; a budget its device phase cannot buy a third
    repeat with stops the phase only once TPOT has the three samples a spread is judged over
    (bench_perf on the CPU: every run stopped at two before)."""
    (got,) = _pretend(
        fixture_models["tiny-gpt2"]["path"],
        {"perf_budget": 1e-6, "perf_spread": 0},
        device={"clock": "host"},
    )
    record = got["record"]
    assert record["status"] == "PASS" and record["perf_stop"] == "budget", record["perf_note"]
    assert record["perf_tokens_out"] == 4, record["perf_note"]
    assert record["perf_repeats_run"] == 3 == len(record["tpot_s_repeats"]), record["perf_note"]
    assert "on the host's wall clock" in record["perf_note"]


def test_a_phase_with_no_other_limit_stops_at_half_the_time_the_probe_has_left(fixture_models):
    """No spread goal, no budget and a cap of 100,000 repeats: the probe's time limit (2 s) still
    stops the phase, at half the time the probe had left, so the checks after it keep theirs; the
    note names the limit. The wiring, on a real probe: the deadline the note says is at most half
    the 2 s (the phase's own seconds depend on the machine's load, the first two repeats always
    running: the rule itself is timed exactly on a fake clock above)."""
    import re

    record = _probe(
        fixture_models["tiny-gpt2"]["path"],
        "cpu",
        perf_spread=0,
        perf_budget=0,
        perf_repeats=100_000,
        timeout_s=2.0,
    )
    assert record["status"] == "PASS" and record["perf_stop"] == "time", record["perf_note"]
    said = re.search(
        r"stopped by the probe's time limit: another repeat would take the phase past ([\d.]+) s \(half "
        r"the time the probe had left before timeout_s\)",
        record["perf_note"],
    )
    assert said and 0.0 <= float(said.group(1)) <= 1.0, record["perf_note"]
    assert 2 <= record["perf_repeats_run"] < 100_000, record["perf_note"]


def test_the_repro_scripts_timing_gives_tpot_with_the_default_of_one_token(fixture_models):
    """``bisect --metric tpot`` times the repro script: with ``perf_tokens`` 1 (the perf phase's
    default, whose TPOT comes from the verdict's steps) its repeats still decode the phase's own
    floor (16 on the CPU) and give TPOT."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from model_support.probe import reproduce

    path = fixture_models["tiny-gpt2"]["path"]
    model, tokenizer = (
        AutoModelForCausalLM.from_pretrained(path),
        AutoTokenizer.from_pretrained(path),
    )
    ids = tokenizer("The future of AI is")["input_ids"]
    settings = {"perf_tokens": 1, "device": "cpu", "mode": "eager", "compile_backend": None}
    result = {"model": model, "tokenizer": tokenizer, "input_ids": ids}
    timed = reproduce.timed_repeats(settings, result, torch.device("cpu"), None, 2)
    assert (
        timed["perf_tokens"] == 16
        and len(timed["tpot_s_repeats"]) == 2
        and min(timed["tpot_s_repeats"]) > 0
    )


def test_tpot_samples_are_each_generations_median_step_or_the_one_generations_steps():
    # a pause moves no median
    assert performance.tpot_samples([[1.0, 2.0, 9.0], [4.0, 5.0, 6.0]]) == [2.0, 5.0]
    # one generation: its steps are the noise
    assert performance.tpot_samples([[1.0, 2.0, 9.0]]) == [1.0, 2.0, 9.0]
    assert performance.tpot_samples([]) == []


def test_the_spread_is_relative_to_the_median_over_every_repeat_and_none_without_a_positive_median():
    assert performance.spread([1.8, 2.0, 2.4]) == pytest.approx(0.3)  # (2.4 - 1.8) / 2.0
    assert performance.spread([5.0]) == 0.0
    for said in ([], [1.0, float("nan")], [0.0, 0.0, 0.0], [-1.0, -2.0, -3.0]):
        assert performance.spread(said) is None, said


def test_the_plans_cap_and_deadline_at_their_edges():
    cap = int("300")  # not the literal's object: the cap compares by value
    plan = performance.Plan(cap=cap, goal=0.0, budget_s=None)
    assert (
        plan.stop([1.0] * 3, 300, 0.0, 0.0) == "cap" and plan.stop([1.0] * 3, 299, 0.0, 0.0) is None
    )
    # past it too
    assert performance.Plan(cap=3, goal=0.0, budget_s=None).stop([1.0] * 3, 4, 0.0, 0.0) == "cap"
    # a spread exactly at the goal is settled
    at_goal = performance.Plan(cap=10, goal=0.25, budget_s=None)
    assert (
        at_goal.stop([1.0, 1.25, 1.0], 2, 0.0, 0.0) == "spread"
        and at_goal.stop([1.0, 1.3, 1.0], 2, 0, 0) is None
    )
    timed = performance.Plan(cap=10, goal=0.0, budget_s=None, deadline_s=1.0)
    assert timed.stop([1.0] * 3, 2, 0.2, 0.2) is None  # well within the time left
    assert timed.stop([1.0] * 3, 2, 0.5, 0.5) is None  # exactly at it: within
    assert timed.stop([1.0] * 3, 2, 0.5, 0.51) == "time"


def test_tokens_per_s_measured_over_a_repeat_or_derived_over_the_verdicts_length():
    # measured: its tokens
    assert performance.tokens_per_s([0.25, 0.5], [0.1, 0.2], 4, None, 0.05) == [16.0, 8.0]
    # derived: 8 tokens, a warm TTFT and the verdict's TPOT median for each of the 7 after it
    assert performance.tokens_per_s([], [0.1, 0.2], 1, 8, 0.05) == pytest.approx(
        [8 / 0.45, 8 / 0.55]
    )
    # a clock that did not move: no step time
    assert performance.tokens_per_s([], [0.5], 1, 8, 0.0) == [16.0]
    assert performance.tokens_per_s([], [0.5], 1, 8, None) == [16.0]
