"""The one decision (``analysis.decision``) as a table: every state of A against every state of B, with and
without expectations, flakes and expiry, each with its kind, the line the gate prints and the gate words it fails
under; and the perf rule on hand-built repeat lists. Pure data: well under a second."""

from __future__ import annotations

import datetime as _dt

import pytest

from model_support.analysis import decision as d
from model_support.analysis.expectations import Expectation

# Columns: B's state; rows: A's state; cells: the kind (abbreviated below). Read a row as "A was X, B is ...".
B_STATES = ("PASS", "suspect PASS", "FAIL(load)", "FAIL(gen)", "FAIL(other)", "excluded", "not run", "absent", "no row")
SHORT = {
    "pass": d.PASSING,
    "regr": d.REGRESSION,
    "new": d.NEW_FAILURE,
    "fixd": d.FIXED,
    "same": d.STILL_FAILING,
    "excl": d.EXCLUDED_CHANGE,
    "todo": d.NOT_RUN_IN_B,
    "drop": d.DROPPED,
    "gone": d.VANISHED,
}
TABLE = """
A \\ B         PASS  susp  load  gen   other excl  todo  abs   norow
PASS           pass  regr  regr  regr  regr  excl  todo  drop  gone
suspect PASS   fixd  same  same  same  same  excl  todo  drop  gone
FAIL(load)     fixd  same  same  same  same  excl  todo  drop  gone
FAIL(gen)      fixd  same  same  same  same  excl  todo  drop  gone
FAIL(other)    fixd  same  same  same  same  excl  todo  drop  gone
excluded       excl  excl  excl  excl  excl  excl  todo  excl  excl
not run        pass  new   new   new   new   excl  todo  pass  pass
absent         pass  new   new   new   new   excl  todo  pass  pass
no row         pass  new   new   new   new   excl  todo  pass  pass
"""
#: Which words each kind fails under: regressions, new-failures, dropped, perf.
FAILS = {
    d.NOT_RUN_IN_B: {"regressions", "new-failures", "dropped", "perf"},
    d.REGRESSION: {"regressions", "new-failures"},
    d.NEW_FAILURE: {"new-failures"},
    d.VANISHED: {"regressions", "new-failures"},
    d.DROPPED: {"dropped"},
}


def _cells():
    lines = [line for line in TABLE.strip().splitlines()[1:]]
    for line in lines:
        a_state = line[:15].strip()
        for b_state, cell in zip(B_STATES, line[15:].split()):
            yield a_state, b_state, SHORT[cell]


CELLS = list(_cells())


def run(state: str, **kw) -> d.Run:
    return d.Run(state, signature="RuntimeError: boom" if state.startswith("FAIL") else None, **kw)


def test_the_table_covers_every_state_against_every_state():
    assert len(CELLS) == len(d.STATES) ** 2
    assert {(a, b) for a, b, _ in CELLS} == {(a, b) for a in d.STATES for b in d.STATES}


@pytest.mark.parametrize("a_state,b_state,kind", CELLS, ids=[f"{a}->{b}" for a, b, _ in CELLS])
def test_each_cell_decides_its_kind_line_and_gate_words(a_state, b_state, kind):
    change = d.decide("org/m", "eager+dynamic", run(a_state), run(b_state), None, "a1", "b1")
    assert change.kind == kind
    assert change.fails == frozenset(FAILS.get(kind, set()))
    for word in d.GATES:
        assert change.fails_on([word]) == (word in FAILS.get(kind, set()))
    assert "org/m [eager+dynamic]" in change.line
    if kind in (d.REGRESSION, d.NEW_FAILURE, d.VANISHED, d.DROPPED, d.NOT_RUN_IN_B, d.EXCLUDED_CHANGE):
        assert change.line.startswith(kind + ":")


LINES = {
    ("PASS", "FAIL(gen)"): "regression: org/m [eager+dynamic]: PASS -> FAIL(gen): RuntimeError: boom",
    ("PASS", "suspect PASS"): "regression: org/m [eager+dynamic]: PASS -> suspect PASS",
    ("no row", "FAIL(load)"): "new failure: org/m [eager+dynamic]: not in a1 -> FAIL(load): RuntimeError: boom",
    ("not run", "FAIL(gen)"): "new failure: org/m [eager+dynamic]: not run in a1 -> FAIL(gen): RuntimeError: boom",
    ("PASS", "absent"): "dropped: org/m [eager+dynamic]: PASS in a1, left out of b1's definition",
    ("FAIL(gen)", "no row"): "vanished: org/m [eager+dynamic]: FAIL(gen) in a1, no row in b1 (nothing says why)",
    ("PASS", "not run"): "not run: org/m [eager+dynamic]: b1 has not run it yet",
    ("excluded", "FAIL(gen)"): "excluded: org/m [eager+dynamic]: excluded in a1 (too large)",
    ("FAIL(gen)", "PASS"): "fixed: org/m [eager+dynamic]: FAIL(gen) -> PASS",
}


@pytest.mark.parametrize("states,line", LINES.items(), ids=[f"{a}->{b}" for a, b in LINES])
def test_the_lines_the_gate_prints(states, line):
    a_state, b_state = states
    a = run(a_state, reason="too large") if a_state == "excluded" else run(a_state)
    assert d.decide("org/m", "eager+dynamic", a, run(b_state), None, "a1", "b1").line == line


EXPECT_GEN = Expectation("FAIL(gen)", "https://example.org/issue/1")
EXPECT_PASS = Expectation("PASS", "passes since 2.13")
EXPECT_SUSPECT = Expectation("suspect PASS", "bf16 rounding")


@pytest.mark.parametrize(
    "a_state,b_state,expected,kind,fails",
    [
        ("PASS", "FAIL(gen)", EXPECT_GEN, d.EXPECTED, set()),  # a known failure: never fails
        ("no row", "FAIL(gen)", EXPECT_GEN, d.EXPECTED, set()),
        ("PASS", "PASS", EXPECT_PASS, d.EXPECTED, set()),  # expected to pass, passes: nothing unexpected
        ("PASS", "suspect PASS", EXPECT_SUSPECT, d.EXPECTED, set()),
        ("FAIL(gen)", "PASS", EXPECT_GEN, d.UNEXPECTEDLY_PASSING, set()),
        ("PASS", "FAIL(load)", EXPECT_GEN, d.REGRESSION, {"regressions", "new-failures"}),  # another verdict: none
        ("PASS", "not run", EXPECT_GEN, d.NOT_RUN_IN_B, set(d.GATES)),  # unfinished beats an expectation
    ],
)
def test_expectations(a_state, b_state, expected, kind, fails):
    change = d.decide("org/m", "eager+dynamic", run(a_state), run(b_state), expected)
    assert (change.kind, set(change.fails)) == (kind, fails)
    if kind == d.REGRESSION:
        assert change.line.endswith("(expected FAIL(gen), got FAIL(load))")
    if kind == d.EXPECTED and b_state != "PASS":
        assert change.line == f"org/m [eager+dynamic]: {b_state}, expected ({expected.reason})"


def sweeps(before: dict, after: dict, after_defined: bool = False) -> tuple[d.SweepRuns, d.SweepRuns]:
    return d.SweepRuns("a1", before, False, []), d.SweepRuns("b1", after, after_defined, [])


def test_an_expired_expectation_counts_as_none_and_is_said_once():
    exp = {"org/m": Expectation("FAIL(gen)", "r", _dt.date(2026, 1, 1))}
    pair = sweeps({("org/m", "v"): run("PASS")}, {("org/m", "v"): run("FAIL(gen)")})
    found = d.decide_sweeps(*pair, exp, _dt.date(2026, 12, 5))
    assert [(c.kind, c.fails_on(["regressions"])) for c in found] == [(d.REGRESSION, True), (d.EXPIRED, False)]
    assert found[1].line == "expired expectation: org/m (until 2026-01-01): renew or remove it"
    live = d.decide_sweeps(*pair, exp, _dt.date(2025, 12, 5))
    assert [c.kind for c in live] == [d.EXPECTED]


@pytest.mark.parametrize(
    "attempts,flaky",
    [
        ([("FAIL(gen)", False), ("PASS", False)], "FAIL(gen) then PASS"),
        ([("PASS", False), ("FAIL(other)", False)], "PASS then FAIL(other)"),
        ([("FAIL(load)", False), ("FAIL(gen)", False)], None),  # two failures: the worse counts
        ([("FAIL(gen)", False), ("FAIL(other)", False), ("FAIL(gen)", False)], None),
        ([("PASS", True), ("FAIL(gen)", False)], None),  # a suspect PASS never passed
        ([("PASS", True), ("PASS", False)], "suspect PASS then PASS"),
        ([("FAIL(gen)", False)], None),
    ],
)
def test_flaky_means_it_passed_once(attempts, flaky):
    said = d.flaky_attempts([{"status": s, "suspect": suspect} for s, suspect in attempts])
    assert said == flaky
    b = d.Run("FAIL(gen)", flaky=said)
    change = d.decide("org/m", "v", run("PASS"), b)
    assert change.kind == (d.FLAKY if flaky else d.REGRESSION)
    assert change.fails_on(["regressions"]) is (flaky is None)


def test_a_missing_run_is_read_by_whether_bs_definition_is_known():
    before = {("org/m", "v"): run("PASS")}
    assert d.decide_sweeps(*sweeps(before, {}))[0].kind == d.VANISHED
    assert d.decide_sweeps(*sweeps(before, {}, after_defined=True))[0].kind == d.DROPPED


# --------------------------------------------------------------------------------------------
# perf: like with like, the medians against the noise


def test_one_disturbed_baseline_repeat_does_not_hide_a_20_percent_slowdown():
    moved = d.compare_repeats([0.010, 0.0101, 0.015], [0.0121] * 3, more_is_better=False, threshold=0.05)
    assert moved.kind == d.SLOWER and moved.change == pytest.approx(0.198, abs=1e-3)


@pytest.mark.parametrize(
    "ra,rb",
    [
        ([0.010, 0.010, 0.0101], [0.010, 0.0101, 0.030]),  # one wild repeat in B
        ([0.010, 0.030, 0.0101], [0.010, 0.0101, 0.010]),  # one wild repeat in A
        ([0.010, 0.0002, 0.0101], [0.010, 0.0101, 0.0100]),  # one wild fast one
    ],
)
def test_one_wild_repeat_on_either_side_does_not_decide(ra, rb):
    assert d.compare_repeats(ra, rb, more_is_better=False, threshold=0.05).kind == d.WITHIN_NOISE


def test_a_change_beyond_the_threshold_but_inside_the_noise_is_within_noise_and_says_why():
    moved = d.compare_repeats(
        [0.8, 1.0, 1.2, 0.9, 1.1], [0.9, 1.1, 1.3, 1.0, 1.2], more_is_better=False, threshold=0.05
    )
    assert moved.kind == d.WITHIN_NOISE and "more repeats would tell" in moved.why


def test_more_is_better_flips_the_direction_and_one_repeat_is_not_comparable():
    assert d.compare_repeats([100, 101, 99], [80, 81, 79], more_is_better=True, threshold=0.05).kind == d.SLOWER
    assert d.compare_repeats([100, 101, 99], [120, 121, 119], more_is_better=True, threshold=0.05).kind == d.FASTER
    assert d.compare_repeats([100], [80, 81, 79], more_is_better=True, threshold=0.05).kind == d.NOT_COMPARABLE


def test_unlike_runs_are_not_comparable_naming_what_differs():
    then = {
        "perf_tokens_out": 32,
        "device_type": "pretend",
        "mode": "eager",
        "dtype": "bfloat16",
        "perf_clock": "device",
    }
    assert d.unlike(then, dict(then)) == []
    assert d.unlike(then, {**then, "perf_tokens_out": 8}) == [
        "tokens per timed repeat (perf_tokens, or the phase's own floor: 4, 16 on the CPU) 32 -> 8"
    ]
    assert d.unlike(then, {**then, "perf_clock": "host"}) == ["clock device -> host"]


# --------------------------------------------------------------------------------------------
# what the cold review found (each failed before its fix)


def test_a_run_flaky_in_a_that_fails_outright_in_b_is_a_regression():
    """A flaky night's record is its failure, so the night after compared a failure with a failure and passed."""
    a = d.Run("FAIL(gen)", "RuntimeError: boom", flaky="FAIL(gen) then PASS")
    change = d.decide("org/m", "v", a, run("FAIL(gen)"), None, "a1", "b1")
    assert change.kind == d.REGRESSION and "flaky in a1 (FAIL(gen) then PASS)" in change.line


def test_a_night_that_excluded_or_did_not_run_a_model_hides_no_regression_after_it():
    before = d.SweepRuns("b1", {("org/m", "v"): d.Run(d.EXCLUDED, reason="no access")}, True, [])
    after = d.SweepRuns("c1", {("org/m", "v"): run("FAIL(gen)")}, True, [])
    earlier = {("org/m", "v"): d.Run("PASS", reason="the last verdict before b1, in a1")}
    (change,) = d.decide_sweeps(before, after, None, None, earlier.get)
    assert change.kind == d.REGRESSION and "the last verdict before b1, in a1" in change.line
    (alone,) = d.decide_sweeps(before, after, None, None, lambda key: None)  # nothing earlier: neither direction
    assert alone.kind == d.EXCLUDED_CHANGE


def test_a_changed_variant_is_no_dropped_model_and_a_model_excluded_whole_is_excluded_in_every_variant():
    before = d.SweepRuns(
        "a1", {("org/m", "eager+dynamic"): run("PASS"), ("org/x", "compile+dynamic"): run("PASS")}, True, []
    )
    after = d.SweepRuns(
        "b1",
        {("org/m", "eager+dynamic+16t"): run("FAIL(gen)")},
        True,
        [],
        models={"org/m": {"eager+dynamic+16t"}},
        excluded_models={"org/x": "no access"},
    )
    kinds = {(c.model_id, c.variant): (c.kind, c.line) for c in d.decide_sweeps(before, after)}
    kind, line = kinds["org/m", "eager+dynamic"]
    assert kind == d.VANISHED and "B's definition runs it as eager+dynamic+16t: the variant changed" in line
    assert kinds["org/x", "compile+dynamic"][0] == d.EXCLUDED_CHANGE


def test_more_repeats_narrow_the_noise_and_a_nan_is_no_timing():
    import random

    spread_out = [0.95, 1.0, 1.05]
    assert d.median_noise(spread_out * 20) < d.median_noise(spread_out) / 3  # a standard error: more repeats tell
    rng = random.Random(7)
    many = [1.0 + rng.gauss(0, 0.05) for _ in range(60)], [1.12 + rng.gauss(0, 0.05) for _ in range(60)]
    assert d.compare_repeats(*many, more_is_better=False, threshold=0.05).kind == d.SLOWER
    nan = float("nan")
    assert d.compare_repeats([0.01, 0.01, 0.0101], [nan, nan, 0.03], False, 0.05).kind == d.NOT_COMPARABLE


def test_the_rerun_screen_keeps_the_same_rule_for_a_flake():
    """Why 3: ``sweep.reruns`` set ``flaky`` whenever the attempts differed (FAIL(load) then FAIL(gen))."""
    from model_support.sweep import reruns

    assert reruns.flaky([("FAIL(load)", False), ("FAIL(gen)", False)]) is False
    assert reruns.flaky([("PASS", True), ("FAIL(gen)", False)]) is False  # a suspect PASS never passed
    assert reruns.flaky([("FAIL(gen)", False), ("PASS", False)]) is True
    assert reruns.flaky([("PASS", False), ("PASS", False)]) is False


def test_noise_alone_rarely_reads_as_slower_with_three_repeats():
    """The sigma less the farthest of three repeats is the two closest's, a third of the true one on average:
    corrected (``_TRIMMED_SIGMA``), noise alone reads as slower under 1.5% of the time at 3% noise per repeat and a
    5% threshold (3.4% uncorrected, review's simulation), and a 20% slowdown is still caught 4 times in 5."""
    import random

    rng = random.Random(11)
    pairs = [
        ([1 + rng.gauss(0, 0.03) for _ in range(3)], [1 + rng.gauss(0, 0.03) for _ in range(3)]) for _ in range(4000)
    ]
    false = sum(d.compare_repeats(a, b, False, 0.05).kind == d.SLOWER for a, b in pairs) / len(pairs)
    assert false < 0.015, false
    slower = [(a, [v * 1.2 for v in b]) for a, b in pairs[:1000]]
    assert sum(d.compare_repeats(a, b, False, 0.05).kind == d.SLOWER for a, b in slower) / 1000 >= 0.75  # 80%
