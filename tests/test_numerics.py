"""Is a PASS right? The reference's verdict on the device's logits (``agreement``), by hand-made
logits whose answer is known, and the fluency judge (``judge``) on texts whose answer is plain,
through its command."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys

import pytest
import torch

from helpers import probe_record
from model_support.probe import agreement, probe_core
from model_support.probe import judge as judge_mod

VOCAB = 50


def _reference(seed: int = 0, steps: int = 4, scale: float = 4.0) -> torch.Tensor:
    """A peaked reference: row s has its best token 10 + s, the others well below."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(steps, VOCAB, generator=generator) * scale
    for s in range(steps):
        logits[s, 10 + s] = logits[s].max() + 3.0
    return logits


def _device(logits: torch.Tensor) -> list[dict]:
    """The device's kept scores for each step, exactly as the probe keeps them
    (``probe_core.top_scores``)."""
    return [probe_core.top_scores(row.to(torch.bfloat16)) for row in logits]


def test_the_same_logits_in_bf16_match():
    reference = _reference()
    found = agreement.compare(_device(reference), reference)
    assert found["numerics"] == "match" and found["numerics_step"] is None
    assert found["reference_agreement"] == 1.0 and found["reference_match"] is True
    assert found["first_divergence"] is None and found["reference_flip_margin"] is None
    assert 0 <= found["reference_max_kl"] < 1e-3  # bf16 rounding of the logits only
    assert found["numerics_note"].startswith("all 4 steps agree")


def test_a_flip_at_a_near_tie_is_a_tie_and_beyond_the_margin_diverges():
    reference = _reference()
    device = reference.clone()
    runner_up = 20
    reference[2, runner_up] = reference[2, 12] - 0.2  # the reference's two best, 0.2 nats apart
    device[2, runner_up] = device[2, 12] + 0.05  # the device picks the runner-up
    found = agreement.compare(_device(device), reference, margin=0.5, bound=10.0)
    assert found["numerics"] == "ties" and found["numerics_step"] == 2
    assert found["reference_agreement"] == 0.75 and found["first_divergence"] == 2
    assert found["reference_flip_margin"] == pytest.approx(0.2, abs=0.05)  # bf16 of logits near 10
    strict = agreement.compare(_device(device), reference, margin=0.1, bound=10.0)
    assert strict["numerics"] == "diverges" and strict["numerics_step"] == 2
    assert (
        "below the reference's" in strict["numerics_note"]
        and "(margin 0.1)" in strict["numerics_note"]
    )


def test_a_token_the_reference_does_not_consider_close_diverges_with_its_step_and_tokens():
    reference = _reference()
    device = reference.clone()
    device[1, 3] = device[1].max() + 5.0  # the device's best is far down the reference's list
    found = agreement.compare(_device(device), reference, decode=lambda ids: f"tok{ids[0]}")
    assert found["numerics"] == "diverges" and found["numerics_step"] == 1
    assert (
        "the device chose 'tok3' (3)" in found["numerics_note"]
        and "'tok11' (11)" in found["numerics_note"]
    )
    assert found["reference_match"] is False and found["first_divergence"] == 1


def test_distributions_apart_beyond_the_bound_diverge_even_when_the_top_token_agrees():
    reference = _reference()
    device = reference.clone()
    # same order, much flatter: the top token agrees, the probabilities do not
    device[3] = device[3] * 0.2
    found = agreement.compare(_device(device), reference, margin=0.5, bound=0.1)
    assert found["reference_agreement"] == 1.0 and found["reference_match"] is True
    assert found["numerics"] == "diverges" and found["numerics_step"] == 3
    assert found["reference_max_kl"] > 0.1 and "bound 0.1" in found["numerics_note"]


def test_the_kl_over_the_top_k_and_the_rest_is_a_lower_bound_of_the_full_kl():
    generator = torch.Generator().manual_seed(3)
    reference = torch.randn(1, VOCAB, generator=generator) * 2
    device = reference + torch.randn(1, VOCAB, generator=generator) * 0.5
    scores = [probe_core.top_scores(device[0], k=8)]
    found = agreement.compare(scores, reference, margin=100.0, bound=100.0)
    ref, dev = (
        torch.log_softmax(reference[0].double(), -1),
        torch.log_softmax(device[0].double(), -1),
    )
    full = float((ref.exp() * (ref - dev)).sum())
    assert 0 < found["reference_max_kl"] <= full + 1e-9
    every = agreement.compare(
        [probe_core.top_scores(device[0], k=VOCAB)], reference, margin=100.0, bound=100.0
    )
    # the whole vocabulary kept: exact
    assert every["reference_max_kl"] == pytest.approx(full, rel=1e-5)


def test_logits_that_are_not_finite_diverge_and_a_reference_that_is_not_cannot_judge():
    reference = _reference()
    device = reference.clone()
    device[2, 5] = math.nan
    found = agreement.compare(_device(device), reference)
    assert found["numerics"] == "diverges" and found["numerics_step"] == 2
    assert "not finite" in found["numerics_note"]
    broken = reference.clone()
    broken[0, 0] = math.inf
    unjudged = agreement.compare(_device(reference), broken)
    assert unjudged["numerics"] is None and "cannot judge" in unjudged["numerics_note"]


def test_exact_ties_among_the_devices_best_are_not_a_flip():
    reference = _reference(steps=1)
    reference[0, 30] = reference[0, 10] - 0.01  # a near-tie in float32 ...
    device = reference.clone()
    device[0, 30] = device[0, 10]  # ... is an exact tie in bf16, and topk may list either first
    found = agreement.compare(_device(device), reference)
    assert found["numerics"] == "match"


def test_the_reference_runs_wider_than_the_run():
    assert agreement.reference_dtype("tpu", "bfloat16") == "float32"
    assert agreement.reference_dtype("cpu", "float16") == "float32"
    # the same float32 on the CPU always agrees
    assert agreement.reference_dtype("cpu", "float32") == "float64"
    assert agreement.reference_dtype("cuda", "float32") == "float32"


def test_teacher_forcing_asks_the_question_each_step_answered(fixture_models):
    """Row s of the teacher-forced logits is what generation saw at step s: the greedy tokens are
    its argmax."""
    model, tokenizer = probe_core.load(
        fixture_models["tiny-llama"]["path"], "", "float32", False, "cpu", {}
    )
    input_ids, attention_mask, _ = probe_core.build_inputs(
        tokenizer, probe_core.DEFAULT_PROMPT, "auto"
    )
    scores: list[dict] = []
    new_ids = probe_core.generate(
        model, tokenizer, input_ids, attention_mask, 6, "cpu", scores=scores
    )
    logits = agreement.teacher_forced_logits(model, input_ids[0].tolist(), new_ids)
    assert logits.shape[0] == len(new_ids) == len(scores) == 6
    assert logits.argmax(-1).tolist() == new_ids == [step["ids"][0] for step in scores]
    found = agreement.compare(scores, logits)
    assert found["numerics"] == "match" and found["reference_max_kl"] < 1e-6


# --------------------------------------------------------------------------------------------
# the fluency judge


@pytest.fixture(scope="module")
def judge(fixture_models):
    return judge_mod.load_judge(
        judge_mod.judge_source(fixture_models["SmolLM2-135M-Instruct"]["path"])
    )


def test_the_judge_tells_english_from_repetition_and_random_tokens(judge):
    fluent = judge.score("The future of AI is", "bright, and it will change how we work and live.")
    assert (
        fluent["fluent"] is True
        and fluent["fluency_score"] >= judge_mod.MIN_SCORE
        and fluent["repeated"] <= judge_mod.MAX_REPEATED
    )
    repeated = judge.score("The future of AI is", "the the the the the the the the")
    assert (
        repeated["fluent"] is False
        and repeated["repeated"] > judge_mod.MAX_REPEATED
        and "repeat" in repeated["note"]
    )
    ids = torch.randint(
        200, judge.tokenizer.vocab_size, (8,), generator=torch.Generator().manual_seed(0)
    ).tolist()
    random = judge.score("The future of AI is", judge.tokenizer.decode(ids))
    assert random["fluent"] is False and random["fluency_score"] < judge_mod.MIN_SCORE
    # nothing visible: nothing to judge
    assert judge.score("The future of AI is", "  ")["fluent"] is None


def test_judge_command_scores_text_and_jsonl_with_one_load(tmp_path, fixture_models):
    model = fixture_models["SmolLM2-135M-Instruct"]["path"]
    command = [sys.executable, "-m", "model_support.cli", "judge", "--judge-model", model]
    one = subprocess.run(
        [*command, "--prompt", "The future of AI is", "bright and full of promise."],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert one.returncode == 0, one.stderr
    (line,) = one.stdout.splitlines()
    assert json.loads(line)["fluent"] is True
    lines = tmp_path / "texts.jsonl"
    lines.write_text(
        json.dumps(
            {"prompt": "Tell me a story.", "text": "Once upon a time, a girl lived by the sea."}
        )
        + "\n\n"
        + json.dumps({"text": "!!!!!!!!!!!!!!!!"})
        + "\n"
    )
    many = subprocess.run(
        [*command, "--jsonl", str(lines)], capture_output=True, text=True, timeout=300
    )
    assert many.returncode == 0, many.stderr
    out = [json.loads(x) for x in many.stdout.splitlines()]
    assert [o["fluent"] for o in out] == [True, False]
    assert set(out[0]) == {"fluent", "fluency_score", "repeated", "note"}


@pytest.mark.parametrize(
    ("args", "content", "says"),
    [
        ([], None, "Give either TEXT or --jsonl FILE"),
        (
            ["--jsonl", "{file}"],
            '{"prompt": "p"}\n',
            'line 1: each line is a JSON object like {"prompt"',
        ),
        (["--jsonl", "{file}"], '{"text": "ok"}\nnot json\n', "line 2: not JSON"),
        (["--jsonl", "{file}", "--prompt", "p"], '{"text": "ok"}\n', "--prompt goes with TEXT"),
        (["--judge-model", "{missing}", "text"], None, "could not load"),
    ],
)
def test_judge_command_refuses_bad_input_in_one_sentence(tmp_path, args, content, says):
    path = tmp_path / "in.jsonl"
    if content is not None:
        path.write_text(content)
    args = [a.format(file=path, missing=tmp_path / "no-such-judge") for a in args]
    run = subprocess.run(
        [sys.executable, "-m", "model_support.cli", "judge", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2 and says in run.stderr and "Traceback" not in run.stderr, run.stderr


# --------------------------------------------------------------------------------------------
# end to end on a stack that computes wrong numbers (the pretend accelerator, model_support_pretend)

needs_pretend = pytest.mark.skipif(
    importlib.util.find_spec("model_support_pretend") is None,
    reason="the pretend accelerator (issue 18, branch pretend) is not in this tree yet",
)


@needs_pretend
def test_a_stack_that_computes_wrong_numbers_passes_but_diverges_and_is_not_fluent(
    tmp_path, fixture_models, monkeypatch
):
    """SmolLM2 on the pretend device with a wrong activation kernel (aten::silu): PASS (nothing
    raised), numerics diverges at step 0, not fluent; the same model on a clean pretend device:
    match, fluent. The verdict is PASS both times."""
    model = fixture_models["SmolLM2-135M-Instruct"]["path"]
    (tmp_path / "wrong").mkdir()
    (tmp_path / "clean").mkdir()
    monkeypatch.setenv("MODEL_SUPPORT_PRETEND", json.dumps({"wrong_ops": ["aten::silu"]}))
    wrong = probe_record(tmp_path / "wrong", model, device="pretend", reference="cpu", perf=False)
    assert wrong["status"] == "PASS" and wrong["device_type"] == "pretend", wrong["error_message"]
    assert wrong["numerics"] == "diverges" and wrong["numerics_step"] == 0, wrong["numerics_note"]
    assert wrong["fluent"] is False, wrong["fluency_note"]
    monkeypatch.setenv("MODEL_SUPPORT_PRETEND", json.dumps({}))
    clean = probe_record(tmp_path / "clean", model, device="pretend", reference="cpu", perf=False)
    assert clean["status"] == "PASS" and clean["device_type"] == "pretend"
    assert clean["numerics"] == "match" and clean["fluent"] is True, (
        clean["numerics_note"],
        clean["fluency_note"],
    )


# --------------------------------------------------------------------------------------------
# the checks of a PASS never change it


def test_a_judge_that_cannot_score_leaves_the_pass_a_pass(tmp_path, fixture_models):
    """A real fault: the judge is a model whose position embeddings (8) are shorter than the text
    it scores, so scoring raises IndexError. The PASS stays a PASS; the judge's note says why it
    has no opinion."""
    record = probe_record(
        tmp_path,
        fixture_models["tiny-llama"]["path"],
        judge=True,
        judge_model=fixture_models["fail-short-positions"]["path"],
    )
    assert record["status"] == "PASS", record["error_message"]
    assert record["fluent"] is None and record["fluency_score"] is None
    assert record["fluency_note"].startswith(
        "the judge could not run: IndexError: index out of range"
    )


#: A fault no fixture or setting makes (found: none reaches these two with a real model), put into
#: the probe's kernel from outside, by the test only: ``sitecustomize`` on the kernel's PYTHONPATH
#: replaces a function.
BREAK = {
    "compare": "from model_support.probe import agreement\n"
    "def compare(*args, **kwargs):\n    raise ValueError('the comparison cannot run')\n"
    "agreement.compare = compare\n",
    "eager": "from model_support.probe import probe_core\n"
    "def eagerly(self):\n    raise RuntimeError('the eager rerun cannot run')\n"
    "probe_core._Generation.eagerly = eagerly\n",
}


def broken_kernel(tmp_path, monkeypatch, what: str) -> None:
    import os

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(BREAK[what])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]))


def test_a_comparison_that_raises_leaves_the_pass_a_pass(tmp_path, monkeypatch, fixture_models):
    """``agreement.compare`` raising (a hook: see BREAK) after the reference ran: PASS, numerics
    null with the reason in reference_note and numerics_note (it was FAIL(other) at stage
    runner)."""
    broken_kernel(tmp_path, monkeypatch, "compare")
    record = probe_record(
        tmp_path, fixture_models["tiny-llama"]["path"], reference="cpu", judge=False
    )
    assert record["status"] == "PASS", record["error_message"]
    assert record["numerics"] is None and record["reference_match"] is None
    assert (
        record["reference_note"]
        == "the reference check could not run: ValueError: the comparison cannot run"
    )
    assert record["numerics_note"] == f"no reference: {record['reference_note']}"


@pytest.mark.skipif(
    importlib.util.find_spec("model_support_pretend") is None, reason="needs the pretend device"
)
def test_an_eager_rerun_that_raises_leaves_the_compiled_pass_a_pass(
    tmp_path, monkeypatch, fixture_models
):
    """Compile mode compares its tokens with plain eager's; that rerun raising (a hook: see
    BREAK) leaves the compiled run's PASS (it was FAIL(gen)), matches_eager null and the reason
    in matches_eager_note."""
    broken_kernel(tmp_path, monkeypatch, "eager")
    monkeypatch.setenv("MODEL_SUPPORT_PRETEND", json.dumps({}))
    record = probe_record(
        tmp_path,
        fixture_models["tiny-gpt2"]["path"],
        device="pretend",
        mode="compile",
        judge=False,
        recompile_check="off",
        perf=False,
    )  # the subject is the eager rerun; the recompile check has its own tests
    assert (record["status"], record["variant"]) == ("PASS", "compile+dynamic"), record[
        "error_message"
    ]
    assert record["matches_eager"] is None and record["tokens_out"] == 8
    assert (
        record["matches_eager_note"]
        == "the plain eager rerun failed: RuntimeError: the eager rerun cannot run"
    )
