"""The gate judges only what it can (issue 54, item 3.2 and 3.3): a perf run timed on another
prompt is "not comparable", and the verdict gate refuses, in one sentence, two sweeps whose runs
differ in device, dtype or mode unless ``--across`` names what may differ. Sweeps are hand-made
records, as tests/test_gate.py builds them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import ready_made_sweep
from model_support.analysis import decision, gate, perf
from model_support.errors import UserError

A, B = "nightly-20261204T000000Z-aaaa", "nightly-20261205T000000Z-bbbb"
SHORT = "The future of AI is"
LONG = "Write a long and careful essay about " + "the future of artificial intelligence, " * 6
#: Two like timed PASS rows' perf fields (three repeats each, the same figures: nothing moved).
TIMED = {
    "tpot_s": 0.01,
    "tpot_s_repeats": [0.01, 0.0101, 0.0099],
    "ttft_s": 0.02,
    "ttft_s_repeats": [0.02, 0.0201, 0.0199],
    "perf_tokens_per_s": 100.0,
    "perf_tokens_per_s_repeats": [100.0, 99.0, 101.0],
    "perf_tokens_out": 4,
    "device_type": "cuda",
    "mode": "eager",
    "dtype": "bfloat16",
    "perf_note": "3 repeats of 4 tokens after a warm-up, on the host's wall clock",
    "prompt": SHORT,
    "chat_template_used": False,
    "tokens_in": 5,
}


def _sweep(data, sweep_id: str, day: int, rows: dict[str, dict]) -> None:
    """A sweep of ready-made records, ``rows`` {model: the record's fields}."""
    ready_made_sweep(data, sweep_id, day, rows)


# --------------------------------------------------------------------------------------------
# 3.2: the input is part of the work timed


def test_a_52_token_prompt_is_not_comparable_with_a_5_token_one_naming_what_differs(tmp_path):
    """It was "2 run(s) timed alike ... passed": the likeness had no prompt, tokens_in or chat
    template."""
    long = {**TIMED, "prompt": LONG, "chat_template_used": True, "tokens_in": 52}
    kind, metrics, why = perf.compare_runs(TIMED, long, perf.DEFAULT_THRESHOLD)
    assert (kind, metrics) == (decision.NOT_COMPARABLE, [])
    assert why == (
        f"prompt {SHORT!r} -> 'Write a long and careful essay about th…'; chat template used "
        "False -> True; prompt tokens (tokens_in, after the chat template) 5 -> 52"
    )
    _sweep(tmp_path, A, 4, {"org/m": TIMED, "org/n": TIMED})
    # another tokenizer's count
    _sweep(tmp_path, B, 5, {"org/m": long, "org/n": {**TIMED, "tokens_in": 6}})
    found = gate.gate(tmp_path, A, B, ["perf"])
    assert found.failed and found.failing[-1].startswith(
        "perf: nothing compared: no run is a PASS timed alike"
    )
    assert f"perf: not comparable: org/m [eager+dynamic]: {why}" in found.notes
    assert (
        "perf: not comparable: org/n [eager+dynamic]: prompt tokens (tokens_in, after the "
        "chat template) 5 -> 6" in found.notes
    )


def test_a_row_that_does_not_say_its_input_is_not_comparable_and_neither_saying_is_not_held_against_them():
    """A null on one side: nothing vouches the input was alike (every timed row records it:
    prompt and chat_template_used since version 1, tokens_in since 2, the timings since 16); on
    both: an older file's gap."""
    kind, _, why = perf.compare_runs({**TIMED, "tokens_in": None}, TIMED, perf.DEFAULT_THRESHOLD)
    assert kind == decision.NOT_COMPARABLE
    assert (
        why == "prompt tokens (tokens_in, after the chat template) unknown in A (its row does not "
        "say) -> 5"
    )
    neither = {**TIMED, "prompt": None, "tokens_in": None, "chat_template_used": None}
    assert (
        perf.compare_runs(neither, dict(neither), perf.DEFAULT_THRESHOLD)[0]
        == decision.WITHIN_NOISE
    )


# --------------------------------------------------------------------------------------------
# 3.3: the verdict gate compares a run only with itself on the same device, dtype and mode


@pytest.fixture
def cpu_and_pretend(tmp_path):
    """A CPU sweep where tiny-llama passes and a pretend device's where it fails at generation."""
    _sweep(
        tmp_path,
        A,
        4,
        {"local:tiny-llama": {"device_type": "cpu", "dtype": "bfloat16", "mode": "eager"}},
    )
    pretend = {
        "device_type": "pretend",
        "dtype": "bfloat16",
        "mode": "eager",
        "status": "FAIL(gen)",
    }
    _sweep(tmp_path, B, 5, {"local:tiny-llama": pretend})
    return tmp_path


def test_a_cpu_sweep_against_a_pretend_sweep_is_refused_in_one_sentence_unless_across_device(
    cpu_and_pretend,
):
    """It failed as "regression: tiny-llama PASS -> FAIL(gen)", the devices named only in the
    diff's header."""
    sentence = (
        f"Sweeps {A} and {B} differ in device (cpu in {A}; pretend in {B}): the gate compares "
        "a run only with itself on the same device, dtype and mode; give --across device to "
        "compare them anyway."
    )
    for words in (["regressions"], ["new-failures", "perf"]):
        with pytest.raises(UserError) as refused:
            gate.gate(cpu_and_pretend, A, B, words)
        assert str(refused.value) == sentence
    compared = gate.gate(cpu_and_pretend, A, B, ["regressions"], across=("device",))
    assert compared.failing == [
        "regression: local:tiny-llama [eager+dynamic]: PASS -> FAIL(gen): RuntimeError: boom"
    ]
    with pytest.raises(UserError, match="--across 'stack' is not one of device, dtype"):
        gate.gate(cpu_and_pretend, A, B, ["regressions"], across=("stack",))
    # through the command: exit status 2, the sentence, and nothing judged before it
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "model_support.cli",
            "diff",
            A,
            B,
            "--data-dir",
            str(cpu_and_pretend),
        ]
        + ["--fail-on", "regressions"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and " ".join(sentence.split()) in " ".join(done.stderr.split()), (
        done.stderr
    )
    assert "regression:" not in done.stdout


def test_the_diff_command_compares_across_what_across_names(cpu_and_pretend):
    from click.testing import CliRunner

    from model_support.cli import main

    args = ["diff", A, B, "--data-dir", str(cpu_and_pretend), "--fail-on", "regressions"]
    across = CliRunner().invoke(main, [*args, "--across", "device"])
    assert across.exit_code == 1, across.output
    assert "regression: local:tiny-llama [eager+dynamic]: PASS -> FAIL(gen)" in across.output
    alone = CliRunner().invoke(
        main, ["diff", A, B, "--data-dir", str(cpu_and_pretend), "--across", "device"]
    )
    assert alone.exit_code == 2 and "--across applies to --fail-on" in alone.output


def test_only_what_across_names_may_differ_and_a_shared_mode_still_compares(tmp_path):
    """A dtype differing too is still refused under --across device; sweeps of disjoint modes
    share no run (the variant names the mode: every run would read as vanished and new) and are
    refused; a definition that adds a mode compares the mode both ran."""
    _sweep(tmp_path, A, 4, {"org/m": {"device_type": "cpu", "dtype": "float32", "mode": "eager"}})
    _sweep(
        tmp_path, B, 5, {"org/m": {"device_type": "pretend", "dtype": "bfloat16", "mode": "eager"}}
    )
    with pytest.raises(
        UserError, match=r"differ in dtype \(float32 in .*; bfloat16 in .*\): .* --across dtype "
    ):
        gate.gate(tmp_path, A, B, ["regressions"], across=("device",))
    assert not gate.gate(tmp_path, A, B, ["regressions"], across=("device", "dtype")).failed

    eager, compiled = (
        {"device_type": "cpu", "mode": "eager"},
        {"device_type": "cpu", "mode": "compile"},
    )
    assert decision.unlike_sweeps(
        {("m", "eager+dynamic"): eager}, {("m", "compile+dynamic"): compiled}
    ) == {"mode": (["eager"], ["compile"])}
    # review: nothing would pair
    with pytest.raises(UserError, match="--across 'mode' is not one of device, dtype"):
        decision.check_across("mode")
    both = {("m", "eager+dynamic"): eager, ("m", "compile+dynamic"): compiled}
    assert decision.unlike_sweeps({("m", "eager+dynamic"): eager}, both) == {}
    # a row that does not say: says nothing
    unsaid = {"device_type": None, "dtype": None, "mode": "eager"}
    assert (
        decision.unlike_sweeps({("m", "eager+dynamic"): unsaid}, {("m", "eager+dynamic"): eager})
        == {}
    )


def test_the_nightly_says_a_refusal_as_its_gate_and_exits_2(tmp_path):
    """The nightly gates against its baseline of the same name and device; a night whose dtype
    changed is refused (exit status 2, the push still runs), and compared with --across dtype."""
    from model_support import nightly

    _sweep(tmp_path, A, 4, {"org/m": {"device_type": "cpu", "dtype": "float32", "mode": "eager"}})
    _sweep(tmp_path, B, 5, {"org/m": {"device_type": "cpu", "dtype": "bfloat16", "mode": "eager"}})
    lines: list[str] = []
    assert nightly.after_sweep(tmp_path, B, bisect=False, log=lines.append) == 2
    assert any(
        line.startswith("  gate refused: Sweeps") and "--across dtype" in line for line in lines
    ), lines
    assert nightly.after_sweep(tmp_path, B, across=("dtype",), bisect=False, log=lines.append) == 0
    with pytest.raises(UserError, match="--across 'device type' is not one of"):
        nightly.check_across("device type")
