"""Like with like, generated from the rules it guards (issue 59, item 1): every field of the perf
comparison's likeness (``decision.LIKE``) and of the verdict gate's (``decision.ALIKE``), one
case each, through the gate as a CI runs it (records stored, compacted, read back).

Each case is two sweeps alike in everything but that one field, B's repeats 30% slower: a field
the likeness lost would read them as "slower" (a bf16 night timed against an fp32 one, eager
against compile), and the case fails. The cases are the union of the declaration and this file's
spec (``PERF_LIKE``, ``GATE_ALIKE``: a value of each side per field), so a field dropped from the
declaration keeps its case, and fails it; a field added there without a case here fails the first
test. Review found five of LIKE's ten fields removable with every gate test green."""

from __future__ import annotations

import polars as pl
import pytest

from helpers import ready_made_sweep
from model_support.analysis import decision, gate, perf
from model_support.errors import UserError

A, B = "nightly-20261204T000000Z-aaaa", "nightly-20261205T000000Z-bbbb"
SHORT = "The future of AI is"
HOST_NOTE = "3 repeats of 4 tokens after a warm-up, on the host's wall clock"
DEVICE_NOTE = (
    "2 repeats of 1 token; TPOT from the verdict's decode steps, on the device's own clock "
    "(torch.x.perf_clock)"
)

#: What two runs' timings must share, with a value on each side: the spec of ``decision.LIKE``.
#: ``perf_clock`` is no column: the gate reads it from ``perf_note`` (``perf.clock_col``), so its
#: values are the notes that say each clock.
PERF_LIKE = {
    "perf_tokens_out": (4, 8),  # a TTFT and tokens/s over 4 tokens against over 8
    "device_type": ("cuda", "pretend"),
    "device_name": ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"),
    "mode": ("eager", "compile"),
    "dtype": ("bfloat16", "float32"),  # a bf16 night timed against an fp32 one
    "stack_name": ("stable", "nightly"),
    "perf_clock": (HOST_NOTE, DEVICE_NOTE),
    "prompt": (SHORT, "Once upon a time"),
    "chat_template_used": (False, True),
    "tokens_in": (5, 6),  # another tokenizer's count of the same prompt
}
#: What two gated sweeps' runs must share (``--across`` word -> (the record's field, A's value,
#: B's)): the spec of ``decision.ALIKE``; ``ACROSS`` the words that may be allowed to differ (the
#: mode never: the variant names it).
GATE_ALIKE = {
    "device": ("device_type", "cpu", "pretend"),
    "dtype": ("dtype", "float32", "bfloat16"),
    "mode": ("mode", "eager", "compile"),
}
ACROSS = ("device", "dtype")

#: A timed PASS in every field alike: three repeats each.
TIMED = {
    "tpot_s_repeats": [0.0100, 0.0101, 0.0099],
    "ttft_s_repeats": [0.0200, 0.0201, 0.0199],
    "perf_tokens_per_s_repeats": [100.0, 99.0, 101.0],
    "perf_tokens_out": 4,
    "device_type": "cuda",
    "device_name": "NVIDIA H100 80GB HBM3",
    "mode": "eager",
    "dtype": "bfloat16",
    "stack_name": "stable",
    "perf_note": HOST_NOTE,
    "prompt": SHORT,
    "chat_template_used": False,
    "tokens_in": 5,
}


def _slower(fields: dict, by: float = 1.3) -> dict:
    """The same run with every repeat ``by`` times slower (tokens/s ``by`` times fewer)."""
    return {
        **fields,
        "tpot_s_repeats": [v * by for v in fields["tpot_s_repeats"]],
        "ttft_s_repeats": [v * by for v in fields["ttft_s_repeats"]],
        "perf_tokens_per_s_repeats": [v / by for v in fields["perf_tokens_per_s_repeats"]],
    }


def _with(fields: dict, name: str, value) -> dict:
    return {**fields, "perf_note": value} if name == "perf_clock" else {**fields, name: value}


def _clock(row: dict) -> str | None:
    """The clock the gate reads from a row's ``perf_note`` (``perf.clock_col``, the store
    reader's expression)."""
    return (
        pl.DataFrame({"perf_note": [row.get("perf_note")]}, schema={"perf_note": pl.String})
        .select(perf.clock_col())
        .item()
    )


def _sweep(data, sweep_id: str, day: int, fields: dict, status: str = "PASS") -> None:
    """A sweep of one ready-made record of org/m with ``fields``: a PASS, or a failure at
    generation."""
    if status == "PASS":
        fields = {
            **{m: sorted(fields[r])[1] for m, (r, _) in perf.METRICS.items() if fields.get(r)},
            **fields,
        }
    ready_made_sweep(data, sweep_id, day, {"org/m": {**fields, "status": status}})


def test_the_spec_names_every_field_of_each_likeness_and_nothing_else():
    """A field added to a likeness needs its case here; one dropped from it fails its case below."""
    assert set(decision.LIKE) == set(PERF_LIKE)
    assert {word: column for word, (column, _) in decision.ALIKE.items()} == {
        word: column for word, (column, _, _) in GATE_ALIKE.items()
    }
    assert decision.ACROSS == gate.ACROSS == ACROSS


def test_runs_alike_in_every_field_compare_and_a_30_percent_slowdown_fails_the_gate(tmp_path):
    """The control of every case below: nothing differs but the speed, and the gate says slower."""
    _sweep(tmp_path, A, 4, TIMED)
    _sweep(tmp_path, B, 5, _slower(TIMED))
    kind, metrics, why = perf.compare_runs(TIMED, _slower(TIMED), perf.DEFAULT_THRESHOLD)
    assert (kind, why) == (decision.SLOWER, "") and {m.kind for m in metrics} == {decision.SLOWER}
    found = gate.gate(tmp_path, A, B, ["perf"])
    assert found.failed and found.failing[0].startswith("slower: org/m [eager+dynamic]"), (
        found.failing
    )


@pytest.mark.parametrize("name", sorted(set(decision.LIKE) | set(PERF_LIKE)))
def test_runs_that_differ_in_one_field_of_the_likeness_are_not_comparable_naming_it(tmp_path, name):
    was, now = PERF_LIKE[name]
    then, later = _with(TIMED, name, was), _slower(_with(TIMED, name, now))
    # the clock read from the note, as the gate does
    rows = [{**r, "perf_clock": _clock(r)} for r in (then, later)]
    # first what the gate decides: never "slower" (the field unheld, a 30% slowdown would read so),
    # not comparable
    assert perf.compare_runs(*rows, perf.DEFAULT_THRESHOLD)[0] == decision.NOT_COMPARABLE
    _sweep(tmp_path, A, 4, then)
    _sweep(tmp_path, B, 5, later)
    failing, notes = perf.gate_lines(tmp_path, A, B, perf.DEFAULT_THRESHOLD)
    assert not any(f.startswith("slower:") for f in failing), failing
    assert failing[-1].startswith("perf: nothing compared: no run is a PASS timed alike"), failing
    # then what it says: the field in its words, each side's value
    shown = repr if name in decision._QUOTED else str
    if name == "perf_clock":
        was, now = "host", "device"
    line = f"{decision.LIKE[name]} {shown(was)} -> {shown(now)}"
    assert decision.unlike(*rows) == [line]
    assert perf.compare_runs(*rows, perf.DEFAULT_THRESHOLD) == (decision.NOT_COMPARABLE, [], line)
    assert f"perf: not comparable: org/m [eager+dynamic]: {line}" in notes, notes


def test_a_field_neither_row_says_is_no_difference_and_one_only_one_says_is():
    """An older file's gap (neither side has it) is not held against two runs; a null on one side
    is."""
    for name in decision.LIKE:
        column = "perf_clock" if name == "perf_clock" else name
        neither = {**TIMED, "perf_clock": "host", column: None}
        assert not [
            d
            for d in decision.unlike(neither, dict(neither))
            if d.startswith(decision.LIKE[name] + " ")
        ]
        one = decision.unlike({**TIMED, "perf_clock": "host"}, neither)
        assert one and all("unknown in B (its row does not say)" in d for d in one), (name, one)
        other = decision.unlike(neither, {**TIMED, "perf_clock": "host"})
        assert other and all(
            d.startswith(decision.LIKE[name] + " unknown in A (its row does not say) -> ")
            for d in other
        )


def test_the_stacks_of_one_sweep_are_compared_less_their_stack_only():
    """Between the stacks of one sweep (``perf.stack_lines``) the stack is what differs on
    purpose: only it is ignored; any other field still sets the runs apart."""
    a, b = (
        {**TIMED, "perf_clock": "host"},
        {**_slower(TIMED), "perf_clock": "host", "stack_name": "nightly"},
    )
    assert perf.compare_runs(a, b, 0.05, ignore=("stack_name",))[0] == decision.SLOWER
    assert (
        perf.compare_runs(a, {**b, "dtype": "float32"}, 0.05, ignore=("stack_name",))[0]
        == decision.NOT_COMPARABLE
    )


@pytest.mark.parametrize("word", sorted(set(decision.ALIKE) | set(GATE_ALIKE)))
def test_gated_sweeps_that_differ_in_one_setting_are_refused_naming_it(tmp_path, word):
    """A bf16 night against an fp32 one, a CPU sweep against an accelerator's, eager against
    compile: refused in one sentence before anything is judged, under every gate word, unless
    ``--across`` names the setting (the mode never: the variant names it). The run itself fails
    in B: judged, it would read as a regression."""
    column, was, now = GATE_ALIKE[word]
    base = {"device_type": "cpu", "dtype": "float32", "mode": "eager"}
    _sweep(tmp_path, A, 4, {**TIMED, **base})
    _sweep(tmp_path, B, 5, {**base, column: now}, status="FAIL(gen)")
    said = decision.ALIKE[word][1]
    how = (
        f"give --across {word} to compare them anyway"
        if word in ACROSS
        else "runs of another mode are other runs (the variant names the mode): gate sweeps of the "
        "same mode"
    )
    sentence = (
        f"Sweeps {A} and {B} differ in {said} ({was} in {A}; {now} in {B}): the gate compares "
        f"a run only with itself on the same device, dtype and mode; {how}."
    )
    for words in (["regressions"], ["new-failures"], ["dropped"], ["perf"]):
        with pytest.raises(UserError) as refused:
            gate.gate(tmp_path, A, B, words)
        assert str(refused.value) == sentence
    if word in ACROSS:
        found = gate.gate(tmp_path, A, B, ["regressions"], across=(word,))
        assert found.failing == [
            "regression: org/m [eager+dynamic]: PASS -> FAIL(gen): RuntimeError: boom"
        ]
    else:
        with pytest.raises(UserError, match=f"--across {word!r} is not one of"):
            gate.gate(tmp_path, A, B, ["regressions"], across=(word,))
    assert not gate.gate(tmp_path, A, B, []).failed  # no gate word: nothing gated, nothing refused


def test_runs_that_swapped_settings_are_refused_though_the_sweeps_share_every_value():
    """Two models on two devices, each on the other's the next night: both sweeps ran on both
    devices, yet every run they share moved: refused. Sweeps sharing no value are refused too
    (nothing pairs); a null says nothing."""
    cpu, pretend = {"device_type": "cpu"}, {"device_type": "pretend"}
    before = {("m1", "v"): cpu, ("m2", "v"): pretend}
    after = {("m1", "v"): pretend, ("m2", "v"): cpu}
    assert decision.unlike_sweeps(before, after) == {
        "device": (["cpu", "pretend"], ["cpu", "pretend"])
    }
    assert decision.unlike_sweeps({("m1", "v"): cpu}, {("m2", "v"): pretend}) == {
        "device": (["cpu"], ["pretend"])
    }
    assert decision.unlike_sweeps(before, dict(before)) == {}
    assert decision.unlike_sweeps(before, after, across=("device",)) == {}
    # one run moved back (pretend -> cpu), the sweeps still sharing the cpu: refused too
    assert decision.unlike_sweeps(before, {("m1", "v"): cpu, ("m2", "v"): cpu}) == {
        "device": (["cpu", "pretend"], ["cpu"])
    }
    # and the other way
    assert decision.unlike_sweeps({("m1", "v"): cpu, ("m2", "v"): cpu}, before) == {
        "device": (["cpu"], ["cpu", "pretend"])
    }
    # --across names one setting: the others are still held, whatever their order in ALIKE
    both = {("m1", "v"): {"device_type": "cpu", "dtype": "float32", "mode": "eager"}}
    moved = {("m1", "v"): {"device_type": "pretend", "dtype": "bfloat16", "mode": "eager"}}
    assert decision.unlike_sweeps(both, moved, across=("device",)) == {
        "dtype": (["float32"], ["bfloat16"])
    }
    assert decision.unlike_sweeps(both, moved, across=("dtype",)) == {
        "device": (["cpu"], ["pretend"])
    }
    assert (
        decision.unlike_sweeps({}, after) == {}
        and decision.unlike_sweeps(before, {("m1", "v"): {}}) == {}
    )


def test_a_setting_no_row_of_one_sweep_says_is_skipped_and_the_next_still_held():
    """Older rows that do not say their device (null) set nothing apart on it; their dtype still
    does."""
    older = {("m1", "v"): {"device_type": None, "dtype": "float32", "mode": "eager"}}
    now = {("m1", "v"): {"device_type": "cpu", "dtype": "bfloat16", "mode": "eager"}}
    assert decision.unlike_sweeps(older, now) == {"dtype": (["float32"], ["bfloat16"])}


def test_a_long_prompt_is_said_in_forty_characters():
    long = "Write a long and careful essay about " + "the future of artificial intelligence, " * 6
    assert decision.unlike({"prompt": SHORT}, {"prompt": long}) == [
        "prompt 'The future of AI is' -> 'Write a long and careful essay about th…'"
    ]


def test_a_quoted_prompt_is_said_whole_up_to_its_length_and_cut_with_an_ellipsis_past_it():
    limit = decision._QUOTED_CHARS
    whole, longer = "p" * limit, "q" * (limit + 1)
    assert decision.unlike({"prompt": whole}, {"prompt": "x"}) == [f"prompt {whole!r} -> 'x'"]
    assert decision.unlike({"prompt": longer}, {"prompt": "x"}) == [
        f"prompt {'q' * (limit - 1) + '…'!r} -> 'x'"
    ]
    assert decision.unlike({"tokens_in": 5}, {"tokens_in": 6}, ignore=("tokens_in",)) == []
