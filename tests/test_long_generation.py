"""Long generation, checked: the reference covers every generated position, a bug that appears only
past a sequence length is found where it appears, and a length the model's positions cannot hold is
excluded.

One child process on the pretend device whose attention softmax is wrong once the key positions
reach 32 (``wrong_past_length``, a KV-cache or long-context bug), running the probe's own library
call (``probe.run.run_probe``) on tiny-llama in-process: ``match`` at 8 tokens, ``diverges`` at 64
tokens from the generated position 32 - the prompt's tokens, and that position moves back by as many
tokens as a longer prompt adds (run at 32 tokens, which reach past it, at half the cost of 64). Then
the length axis: a length beyond tiny-llama's 256 positions is excluded (no verdict, the reason
naming both numbers), while fail-short-positions, whose 8 positions cannot hold even the verdict's 8
tokens, stays the FAIL(gen) it is at the default length.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from helpers import REPO
from model_support_pretend import PretendConfigError, parse

PAST = 32
FAULT = {"wrong_past_length": {"aten::_safe_softmax": PAST}}
LONGER_PROMPT = "The future of AI is, in the words of the people who build it every day,"
#: The probe's settings here. No chat template: the prompt is 5 tokens, so 8 new tokens stay below
#: 32 positions (tiny-llama's template makes it 26). float32 on the device and in the reference, and
#: bounds scaled to float32 against float32 (set when the fixture was random and its next-token
#: distribution nearly flat, where the default bounds, set for real models' bf16, called its wrong
#: attention a near-tie): the clean run's KL is ~5e-15 nats, so any flip (margin 0) or a KL above
#: 1e-6 nats is a divergence, the step where the wrong softmax first acts.
PROBE = {
    "device": "pretend",
    "judge": False,
    "perf": False,
    "dtype": "float32",
    "chat_template": "none",
    "numerics_margin": 0.0,
    "numerics_bound": 1e-6,
}

CHILD = """
    import json, sys
    from model_support.probe.run import run_probe

    KEEP = ("status", "exclusion_reason", "tokens_in", "tokens_out", "numerics", "numerics_step", "first_divergence",
            "reference_match", "peak_device_mem_mb", "failure_stage", "perf_note", "tpot_s")
    out = {}
    for name, model, settings in json.loads(sys.argv[1]):
        record = run_probe(model, **settings)
        out[name] = {key: record[key] for key in KEEP}
    print(json.dumps(out))
"""


def _probes(runs: list) -> dict:
    env = {"MODEL_SUPPORT_PRETEND": json.dumps(FAULT)}
    import os

    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), json.dumps(runs)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **env},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_bug_past_a_length_is_found_where_it_appears_and_moves_with_the_prompt(fixture_models):
    llama, short = (
        fixture_models["tiny-llama"]["path"],
        fixture_models["fail-short-positions"]["path"],
    )
    got = _probes(
        [
            ("short", llama, {**PROBE, "max_new_tokens": 8}),
            ("long", llama, {**PROBE, "max_new_tokens": 64}),
            # 32 tokens reach past the moved divergence (prompt 26 tokens: position 6), at half the
            # cost of 64
            ("longer_prompt", llama, {**PROBE, "max_new_tokens": 32, "prompt": LONGER_PROMPT}),
            ("beyond_positions", llama, {**PROBE, "max_new_tokens": 300}),
            ("fails_at_any_length", short, {**PROBE, "max_new_tokens": 16, "reference": "none"}),
            # the perf phase's longer decode, checked against the positions as max_new_tokens is
            (
                "perf_beyond_positions",
                llama,
                {**PROBE, "reference": "none", "perf": True, "perf_tokens": 300},
            ),
        ]
    )
    short_run, long_run, moved = got["short"], got["long"], got["longer_prompt"]
    assert short_run["status"] == long_run["status"] == moved["status"] == "PASS"
    assert (short_run["numerics"], short_run["reference_match"]) == ("match", True)
    assert short_run["tokens_in"] + 8 < PAST  # the bug's length is never reached in 8 tokens
    assert (
        long_run["tokens_out"] == 64
        and long_run["peak_device_mem_mb"] > short_run["peak_device_mem_mb"] > 0
    )
    # every position is checked: the first one whose keys reach 32 positions is where it leaves the
    # reference; the greedy token itself may hold a step or two longer (first_divergence), the
    # trained fixture's margins being real
    where = PAST - long_run["tokens_in"]
    assert (long_run["numerics"], long_run["numerics_step"]) == ("diverges", where)
    assert where <= long_run["first_divergence"] < long_run["tokens_out"]
    longer = moved["tokens_in"] - long_run["tokens_in"]
    assert longer > 0 and moved["tokens_in"] < PAST
    assert (moved["numerics"], moved["numerics_step"]) == ("diverges", where - longer)
    assert moved["first_divergence"] >= where - longer
    # the length axis: what the positions cannot hold is excluded, with both numbers; a model that
    # cannot hold even the verdict's 8 tokens fails at any length as at the default (its own
    # verdict, not the axis's)
    beyond = got["beyond_positions"]
    assert beyond["status"] is None and beyond["tokens_out"] is None
    need = beyond["tokens_in"] + 300
    assert beyond["exclusion_reason"].startswith(
        f"max_position_embeddings=256 cannot hold the prompt's {beyond['tokens_in']} tokens "
        f"plus max_new_tokens=300 ({need} positions): excluded on the length axis"
    )
    failed = got["fails_at_any_length"]
    assert (failed["status"], failed["failure_stage"], failed["exclusion_reason"]) == (
        "FAIL(gen)",
        "generate",
        None,
    )
    timed = got["perf_beyond_positions"]  # a PASS still; its perf phase not run, saying why
    assert timed["status"] == "PASS" and timed["tpot_s"] is None
    assert (
        f"max_position_embeddings=256 cannot hold the prompt's {timed['tokens_in']} tokens "
        "plus the repeats' 300 (perf_tokens=300" in (timed["perf_note"])
    )


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (
            {"aten::mm": 32},
            "'wrong_past_length' names aten::mm, whose sequence axis it does not know",
        ),
        ({"aten::bmm": 0}, "'wrong_past_length' must map operator names to a length N >= 1"),
        (["aten::bmm"], "'wrong_past_length' must map operator names to a length N >= 1"),
    ],
)
def test_a_past_length_fault_names_an_operator_whose_sequence_axis_is_known(value, words):
    with pytest.raises(PretendConfigError) as refused:
        parse(json.dumps({"wrong_past_length": value}))
    assert words in str(refused.value)
    assert parse(json.dumps(FAULT)).wrong_past_length == {"aten::_safe_softmax": PAST}


@pytest.mark.parametrize(
    ("positions", "tokens_in", "new", "excluded"),
    [
        (256, 5, 251, False),  # 256 positions hold 5 + 251 exactly
        (256, 5, 252, True),  # one more is the length axis's to exclude
        # not even 5 + 8 fit: it fails at any length as at the default (FAIL(gen), not excluded)
        (8, 5, 16, False),
        (8, 5, 3, False),
        (None, 5, 10**6, False),  # a config that names no positions: nothing to check
    ],
)
def test_the_length_axis_excludes_only_what_the_length_adds(positions, tokens_in, new, excluded):
    from types import SimpleNamespace

    from model_support.probe.probe_core import positions_short

    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=positions))
    said = positions_short(model, tokens_in, new)
    assert bool(said) is excluded
    if excluded:
        assert f"max_position_embeddings={positions}" in said and f"max_new_tokens={new}" in said
