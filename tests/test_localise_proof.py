"""The blame proven (issue 48, part 6; issue 56, part 3): ``model-support localise`` ends with the
run replayed again, the wrong operator on the host (``probe.host_ops``), confirmed when the model's
output then matches the CPU reference (``ops.proof.rerun_wrong``: the judgement ``ops --prove``
gives a what-if run, so the two cannot contradict each other), else the next wrong operator named
and put there too, up to ``localise_proof.MAX_ON_HOST``.

For real, on the pretend device over tiny-llama (its rotary embedding, RMSNorm and gated MLP
multiply; its MLP's activation is SiLU): a wrong ``aten::mul`` is confirmed; with ``aten::mul`` and
``aten::silu`` wrong both are named and the model matches with both on the host. The command's
printed answer is the stored one's. The pretend stack names ``aten::mul.Tensor``: its fault check
cannot take the packet ``aten::mul``, which has no default overload. The proof's other endings (a
refused operator, a device without host kernels, the bound, an output not checked or diverging,
operators not judged, a run that raises, a kernel the device ignores, a divergence the replay cannot
reach) run on made-up reruns, and so does the check that localise's verdict and ``ops --prove``'s
are one judgement. The records here hold no generated tokens: the run replayed is the prompt's
forward and the token it gives (tests/test_localise_decode.py replays real runs through their decode
steps).
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_localise import MODEL, child_env, pretend_sweep

from model_support.debug import findings, localise, localise_proof, localise_words
from model_support.debug.localise import Localised
from model_support.ops import localised as localised_answers

MUL = "aten::mul.Tensor"
#: Each case: its stack, the chain of wrong operators it names (as the plan does) and what goes to
#: the host.
CASES = {
    "mul": ({"wrong_ops": [MUL]}, [MUL], ["aten::mul"]),
    "mul-silu": (
        {"wrong_ops": [MUL, "aten::silu"]},
        [MUL, "aten::silu"],
        ["aten::mul", "aten::silu"],
    ),
}


def run_cli(data: Path, config: dict) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "model_support.cli",
        "localise",
        "s",
        MODEL,
        "--data-dir",
        str(data),
    ]
    return subprocess.run(
        command, capture_output=True, text=True, env=child_env(config), timeout=300
    )


@pytest.fixture(scope="module")
def proved(tmp_path_factory, fixture_models) -> dict:
    """Each case localised through the command line, in its own process: name -> (printed lines,
    stored answer)."""
    path = fixture_models[MODEL]["path"]
    jobs = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        for name, (config, _, _) in CASES.items():
            data = tmp_path_factory.mktemp(f"proof-{name}")
            pretend_sweep(data, path, config)
            jobs[name] = (pool.submit(run_cli, data, config), data)
        done = {name: (job.result(), data) for name, (job, data) in jobs.items()}
    results = {}
    for name, (run, data) in done.items():
        assert run.returncode == 0, f"{name}: {run.stderr[-3000:]}"
        results[name] = (run.stdout.splitlines(), localise.stored(data, "s", f"local:{MODEL}"))
    return results


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_the_wrong_operators_are_named_and_the_model_matches_with_them_on_the_host(proved, case):
    lines, answer = proved[case]
    _, chain, on_host = CASES[case]
    assert lines == localise_words.answer_lines(answer)  # the printed answer is the stored one
    assert (answer["operator"], answer["overload"]) == ("aten::mul", "Tensor")
    proof = answer["proof"]
    assert [link["name"] for link in proof["chain"]] == chain
    assert [link["on_host"] for link in proof["chain"]] == on_host == proof["on_host"]
    assert (proof["verdict"], proof["matches"], proof["bound"]) == (
        "confirmed",
        True,
        localise_proof.MAX_ON_HOST,
    )
    last = proof["reruns"][-1]
    assert (
        last["ops_wrong"] == last["ops_not_judged"] == 0
        and last["ops_checked"] == answer["ops_checked"]
    )
    assert last["host_calls"][MUL] > 0 and last["forward_failure"] is None
    assert lines[-1].startswith(
        f"confirmed: with {' and '.join(on_host)} on the host the model matches the reference"
    )
    # the plan's wrong operators of the model
    assert localised_answers.wrong_ops(answer)[: len(chain)] == chain


@pytest.mark.slow
def test_the_second_wrong_operator_is_found_with_the_first_on_the_host(proved):
    lines, answer = proved["mul-silu"]
    first, second = answer["proof"]["reruns"]
    assert first["on_host"] == ["aten::mul"] and first["next"]["operator"] == "aten::silu"
    assert "aten::silu" not in first["host_calls"] and second["host_calls"]["aten::silu"] > 0
    (enough,) = [line for line in lines if line.startswith("not enough:")]
    # the record holds no generated tokens: the prompt's forward is the run
    assert first["next"]["step"] == 0
    assert enough.startswith(
        "not enough: with aten::mul on the host the run still goes wrong at step 0 (the prompt's"
    )
    assert f"at operator #{first['next']['index'] + 1} of that step's forward" in enough
    assert (
        "the next wrong operator is aten::silu (default) in model.layers.0.mlp.act_fn "
        "(SiLUActivation)" in enough
    )
    assert lines.index(enough) == len(lines) - 2  # then the confirmation
    _, single = proved["mul"]
    assert (
        single["proof"]["reruns"][0]["on_host"] == ["aten::mul"]
        and len(single["proof"]["reruns"]) == 1
    )


def test_every_operator_of_the_chain_is_a_wrong_operator_of_the_plan():
    """The first ``MAX_LISTED`` flags can all be the first operator's: the chain's second still
    reaches the plan."""
    answer = {
        "operator": "aten::mul",
        "overload": "Tensor",
        "wrong_ops": [{"operator": "aten::mul", "overload": "Tensor"}] * findings.MAX_LISTED,
        "proof": {
            "chain": [{"operator": "aten::mul", "overload": "Tensor"}, {"operator": "aten::silu"}]
        },
    }
    assert localised_answers.wrong_ops(answer) == [MUL, "aten::silu"]
    del answer["proof"]  # an answer stored before the proof reads as before
    assert localised_answers.wrong_ops(answer) == [MUL]


# --- the proof's other endings, on made-up reruns
# ---------------------------------------------------------------


def wrong(operator: str, overload: str = "default", index: int = 5) -> dict:
    """A flagged operator as the localiser lists it."""
    return {
        "operator": operator,
        "overload": overload,
        "module": "model.layers.0.mlp",
        "module_class": "LlamaMLP",
        "index": index,
        "max_rel_error": 0.5,
    }


def found(
    *flagged: dict,
    checked: int = 100,
    not_judged: list | None = None,
    failure: dict | None = None,
    numerics: str | None = None,
    replay: localise.Replay | None = None,
):
    """A made-up run; ``numerics``: its output against the CPU reference, as the localiser judges
    a rerun with no operator wrong (None: not judged)."""
    unjudged = not_judged or []
    return Localised(
        checked=checked,
        flagged=len(flagged),
        wrong=list(flagged),
        not_judged=len(unjudged),
        unjudged=unjudged,
        forward_failure=failure,
        device_type="pretend",
        numerics={"numerics": numerics, "numerics_note": f"step 3 of 8: {numerics}"}
        if numerics
        else None,
        replay=replay,
    )


class Reruns:
    """Made-up reruns: each call the next ``Localised``, the names it was asked to put on the
    host kept."""

    def __init__(self, *results: Localised):
        self.results, self.asked = list(results), []

    def __call__(self, names):
        self.asked.append(list(names))
        return self.results.pop(0), {name: 1 for name in names}


def test_the_bound_is_said_when_reached_and_the_next_operator_named():
    operators = ["aten::mul", "aten::silu", "aten::exp", "aten::neg"]
    reruns = Reruns(*(found(wrong(op, index=i)) for i, op in enumerate(operators[1:])))
    proof = localise_proof.prove(found(wrong("aten::mul", "Tensor")), (True, None), reruns)
    assert (
        reruns.asked == [operators[:1], operators[:2], operators[:3]]
        and localise_proof.MAX_ON_HOST == 3
    )
    assert [link["name"] for link in proof["chain"]] == [MUL, *operators[1:]] and proof["chain"][
        -1
    ]["on_host"] is None
    assert (proof["verdict"], proof["matches"]) == ("bound", False)
    assert [s.split(":")[0] for s in proof["sentences"]] == ["not enough"] * 3 + [
        "the proof stops at its bound of 3 operators on the host"
    ]
    assert "aten::neg is named, not proven" in proof["sentences"][-1]


@pytest.mark.parametrize(
    ("operator", "why"),
    [
        ("aten::transpose", "it is a view"),
        ("aten::_scaled_dot_product_flash_attention", "the CPU has no kernel for it"),
    ],
)
def test_an_operator_that_cannot_go_to_the_host_is_said_by_name_with_why(operator, why):
    reruns = Reruns()
    proof = localise_proof.prove(
        found(wrong(operator, "int" if "transpose" in operator else "default")),
        (True, None),
        reruns,
    )
    assert reruns.asked == [] and proof["verdict"] == "refused" and not proof["matches"]
    (sentence,) = proof["sentences"]
    assert sentence.startswith(f"not proven: {operator}") and why in sentence


def test_a_second_operator_refused_ends_the_chain_with_both_named():
    reruns = Reruns(found(wrong("aten::transpose", "int")))
    proof = localise_proof.prove(found(wrong("aten::mul", "Tensor")), (True, None), reruns)
    assert [link["name"] for link in proof["chain"]] == [MUL, "aten::transpose.int"] and proof[
        "verdict"
    ] == "refused"
    assert proof["sentences"][0].startswith("not enough") and proof["sentences"][1].startswith(
        "not proven"
    )


def test_a_device_without_host_kernels_says_why_and_reruns_nothing():
    reruns = Reruns()
    proof = localise_proof.prove(
        found(wrong("aten::mul", "Tensor")), (False, "its backend ignores them"), reruns
    )
    assert (
        reruns.asked == []
        and proof["verdict"] == "no host kernels"
        and proof["chain"][0]["on_host"] is None
    )
    assert "takes no host kernels (its backend ignores them)" in proof["sentences"][0]


def test_no_confirmation_without_an_output_that_matches_nor_over_a_raising_run_or_an_ignored_kernel():
    """A rerun with no operator wrong is judged by its output against the CPU reference, as ``ops
    --prove`` judges a what-if run: not checked, tied or diverging, it confirms nothing;
    operators not judged are said either way."""
    unjudged = {
        **wrong("pretend::attention"),
        "reason": "the CPU cannot run it (NotImplementedError)",
    }
    proof = localise_proof.prove(
        found(wrong("aten::silu")), (True, None), Reruns(found(not_judged=[unjudged]))
    )
    assert (proof["verdict"], proof["matches"]) == ("not confirmed", False)
    (said,) = proof["sentences"]
    assert "its numbers were not checked against the CPU reference" in said
    assert "1 of the 101 operators could not be judged" in said
    proof = localise_proof.prove(
        found(wrong("aten::silu")), (True, None), Reruns(found(numerics="diverges"))
    )
    assert (proof["verdict"], proof["matches"]) == ("not confirmed", False)
    assert (
        "no operator judged is wrong, but its output diverges from the CPU reference (step 3"
        in proof["sentences"][0]
    )
    matches = Reruns(found(not_judged=[unjudged], numerics="match"))
    proof = localise_proof.prove(found(wrong("aten::silu")), (True, None), matches)
    assert (proof["verdict"], proof["matches"]) == ("confirmed", True)
    # said, never counted as agreeing
    assert "1 of the 101 operators could not be judged" in proof["sentences"][0]
    failure = {"error_type": "RuntimeError", "module": "model.norm", "error_message": "boom"}
    proof = localise_proof.prove(
        found(wrong("aten::silu")), (True, None), Reruns(found(failure=failure, numerics="match"))
    )
    assert (
        proof["verdict"] == "raised"
        and "raised RuntimeError in model.norm" in proof["sentences"][0]
    )
    proof = localise_proof.prove(
        found(wrong("aten::silu")), (True, None), Reruns(found(wrong("aten::silu")))
    )
    assert (
        proof["verdict"] == "not taken" and "did not run its host kernel" in proof["sentences"][0]
    )
    # nothing wrong: nothing to prove
    assert localise_proof.prove(found(), (True, None), Reruns()) is None


def test_a_divergence_the_replay_cannot_reach_is_never_confirmed():
    """The verdict's generation matches with the operator on the host, but the record's long-text
    check diverged at a position this replay does not reach: not proven, never "matches the
    reference"."""
    replay = localise.Replay(
        tokens=[1, 2], unreached="the long-text check diverged at position 600 of its text"
    )
    proof = localise_proof.prove(
        found(wrong("aten::silu")), (True, None), Reruns(found(numerics="match", replay=replay))
    )
    assert (proof["verdict"], proof["matches"]) == ("not reached", False)
    assert (
        "matches the reference" in proof["sentences"][0] and "position 600" in proof["sentences"][0]
    )
    assert proof["sentences"][0].startswith("not proven:")


@pytest.mark.parametrize("numerics", ["match", "ties", "diverges", None])
def test_localise_and_ops_prove_judge_a_rerun_with_one_function(numerics):
    """The proof's verdict on a rerun with no wrong operator and a what-if run's ``right`` (what
    ``ops --prove`` confirms a step by) are one judgement of the same output: they cannot say
    different things."""
    from model_support.ops import proof as proof_mod

    proof = localise_proof.prove(
        found(wrong("aten::silu")), (True, None), Reruns(found(numerics=numerics))
    )
    row = {"sweep_id": "w", "status": "PASS", "numerics": numerics, "host_ops": "aten::silu"}
    run = proof_mod.run_of(row)
    assert proof["matches"] == run.right == (proof_mod.rerun_wrong(True, numerics) is None)
    assert (proof["verdict"] == "confirmed") == (numerics == "match")
    if not run.right:  # the same words for why not
        assert run.stuck in proof["sentences"][0]


def test_a_what_if_run_whose_long_text_still_diverges_proves_nothing():
    """A wrong operator only the long text saw (a PASS whose 8 tokens match): ``ops --prove``'s
    what-if run with it on the host is right only where its long text agrees too
    (``long_text.proven``); one still diverging is stuck, saying so; a stray position or two is
    no fault, even in a short text; a long text that could run and did not (the device raised)
    proves nothing; one that cannot run for this model (``not run:``: sharded, too few positions)
    asks nothing, and a run that asked for none is judged by its 8 tokens (review: both were
    stuck for good)."""
    from model_support.ops import proof as proof_mod

    row = {
        "sweep_id": "w",
        "status": "PASS",
        "numerics": "match",
        "host_ops": "aten::_safe_softmax",
    }
    assert proof_mod.run_of(row).right
    ran = {
        **row,
        "long_text_note": "1024 positions of two_cities: ...",
        "long_text_rate": 1.0,
        "long_text_tokens": 1024,
    }
    assert (
        proof_mod.run_of(ran).right and proof_mod.run_of({**ran, "long_text_rate": 125 / 128}).right
    )
    # two of 32
    assert proof_mod.run_of({**ran, "long_text_rate": 30 / 32, "long_text_tokens": 32}).right
    # a 72-position window
    assert proof_mod.run_of({**ran, "long_text_rate": 70 / 72, "long_text_tokens": 200}).right
    wrong = proof_mod.run_of({**ran, "long_text_rate": 0.2, "long_text_decode_diverges_at": 600})
    assert not wrong.right and wrong.stuck == (
        "its long text still diverges from the CPU reference (rate 0.200, at least 0.975, "
        "first at position 600)"
    )
    raised = proof_mod.run_of(
        {**row, "long_text_note": "the device raised on the long text: RuntimeError: x"}
    )
    assert not raised.right and raised.stuck.startswith(
        "its long text did not run (the device raised"
    )
    for note in (
        "not run: the device phase ran no long text (it runs on one device, after a PASS)",
        "not run: the model holds 12 positions of the text, fewer than 16",
    ):
        assert proof_mod.run_of({**row, "long_text_note": note}).right
    for column in (
        "long_text_rate",
        "long_text_note",
        "long_text_tokens",
        "long_text_decode_diverges_at",
    ):
        assert column in proof_mod.COLUMNS
