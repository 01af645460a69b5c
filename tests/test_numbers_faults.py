"""Numbers a PASS can stand on (issue 56, parts 1 and 5): a stack that computes wrong numbers gets
no unflagged PASS, and one that only rounds differently gets no flag. One real sweep per fault on
the pretend device, with the CPU reference on, over the tiny fixtures, which are trained
(``fixtures.tiny.train``) so that their logits have margins a wrong kernel changes:

- every ``aten::mul.Tensor`` wrong (each output reversed and negated, raising nothing): no tiny text
  fixture PASSes unflagged. Before this, tiny-llama and tiny-qwen3 said ``ties`` and tiny-opt
  ``match``: the random fixtures' logits were nearly flat, and a KL between flat distributions is
  small whatever computed them;
- ``aten::silu`` wrong, both ways the pretend device has (a bug: reversed and negated; imprecise:
  every value off by 50%): tiny-llama is flagged;
- every matrix product off by a relative error within bf16's rounding (``matmul_noise``, no fault):
  no fault-free model is flagged, SmolLM2-135M-Instruct among them.

"Flagged" is what a reader of the sweep sees: the export marks the row suspect, the check and the
measure that judged it are named. The comparison itself (``agreement.compare``) is also run here on
logits whose answer is known: flat logits cannot hide a wrong kernel from the logit error, a
reference too flat to judge is called ``too flat``, never ``match`` or ``ties``, and the tie rule's
margin follows the logits' spread.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fixtures.build import TINY_ARCHS
from fixtures.tiny import MIN_MARGIN
from model_support.probe import agreement, probe_core

REPO = Path(__file__).resolve().parents[1]
MUL = {"wrong_ops": ["aten::mul.Tensor"]}
SILU_BUG = {"wrong_ops": ["aten::silu"]}
SILU_OFF = {"wrong_ops": {"aten::silu": 0.5}}
NOISE = {"matmul_noise": 2.0**-8}  # bf16's unit roundoff
#: Each probe's settings: the CPU reference on (the check under test), the judge and the perf phase
#: off (not it).
PROBE = {"device": "pretend", "reference": "cpu", "judge": False, "perf": False}


def sweep(tmp: Path, name: str, stack: dict, models: list[str]) -> list[dict]:
    """``model-support sweep`` for real on the pretend device configured as ``stack``, then
    ``model-support export --format json``: the export's rows (each model's verdict, check, the
    measure that judged it, suspect or not)."""
    import yaml

    from model_support.record import store

    definition = tmp / f"{name}.yaml"
    definition.write_text(
        yaml.safe_dump({"name": name, "probe": PROBE, "models": models, "workers": 2})
    )
    data = tmp / name
    env = {**os.environ, "MODEL_SUPPORT_PRETEND": json.dumps(stack), "OMP_NUM_THREADS": "1"}
    for args in (["sweep", str(definition), "--no-report"], None):
        if args is None:
            (sweep_id,) = store.list_sweeps(data)
            args = ["export", sweep_id, "--format", "json"]
        done = subprocess.run(
            [sys.executable, "-m", "model_support.cli", *args, "--data-dir", str(data)],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=env,
            timeout=900,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def unflagged(rows: list[dict]) -> dict:
    """The PASSes a reader would take as right: not suspect, and agreeing with the reference."""
    return {
        r["model_id"]: (r["check"], r["check_measure"])
        for r in rows
        if r["status"] == "PASS" and not r["suspect"]
    }


def text_fixtures(fixture_models) -> list[str]:
    """The tiny text-generation fixtures that PASS on a healthy stack."""
    return [fixture_models[name]["path"] for name in (*TINY_ARCHS, "tiny-eos-early")]


@pytest.mark.slow
def test_every_multiplication_wrong_leaves_no_tiny_fixture_an_unflagged_pass(
    tmp_path, fixture_models
):
    rows = sweep(tmp_path, "mul", MUL, text_fixtures(fixture_models))
    assert len(rows) == len(TINY_ARCHS) + 1
    assert unflagged(rows) == {}
    passed = {r["model_id"]: r for r in rows if r["status"] == "PASS"}
    # the three that passed as ties and match before
    for name in ("tiny-llama", "tiny-qwen3", "tiny-opt"):
        row = passed[f"local:{name}"]
        assert row["check"] == "diverges" and row["suspect"] is True, row
        assert row["check_measure"] and set(row["check_measure"].split(" + ")) <= set(
            agreement.MEASURES
        ), row


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stack", "how"), [(SILU_BUG, "reversed and negated"), (SILU_OFF, "off by 50%")]
)
def test_silu_wrong_flags_tiny_llama(tmp_path, fixture_models, stack, how):
    (row,) = sweep(tmp_path, "silu", stack, [fixture_models["tiny-llama"]["path"]])
    assert row["status"] == "PASS" and row["suspect"] is True and row["check"] == "diverges", (
        how,
        row,
    )


@pytest.mark.slow
def test_bf16_sized_noise_on_every_matmul_flags_no_fault_free_model(tmp_path, fixture_models):
    models = [*text_fixtures(fixture_models), fixture_models["SmolLM2-135M-Instruct"]["path"]]
    rows = sweep(tmp_path, "noise", NOISE, models)
    assert [r["status"] for r in rows] == ["PASS"] * len(models)
    checks = unflagged(rows)
    assert sorted(checks) == sorted(r["model_id"] for r in rows)
    assert {check for check, _ in checks.values()} <= {"agrees", "agrees within ties"}, checks
    assert {measure for _, measure in checks.values()} == {agreement.LOGIT_ERROR}, checks


def test_the_tiny_fixtures_have_real_margins(fixture_models):
    """What part 5 built, as the manifest says and the files show: every happy-path tiny model
    was trained, and at each of the probe's greedy steps its best logit stands at least
    MIN_MARGIN nats above the next (a random model's stand hundredths of a nat apart)."""
    for name in TINY_ARCHS:
        entry = fixture_models[name]
        assert entry["training"]["steps"] >= 100 and entry["min_margin"] >= MIN_MARGIN, (
            name,
            entry,
        )
    model, tokenizer = probe_core.load(
        fixture_models["tiny-opt"]["path"], "", "float32", False, "cpu", {}
    )
    input_ids, mask, _ = probe_core.build_inputs(tokenizer, probe_core.DEFAULT_PROMPT, "auto")
    scores: list[dict] = []
    probe_core.generate(model, tokenizer, input_ids, mask, 8, "cpu", scores=scores)
    assert min(step["logits"][0] - step["logits"][1] for step in scores) >= MIN_MARGIN


def test_matmul_noise_is_rounding_not_a_fault():
    """``matmul_noise`` is said in one sentence when it is no size, and the stack it makes
    reports no operator wrong (``op_coverage``): a what-if or a plan must never try to fix a
    stack's rounding."""
    from model_support_pretend import PretendConfigError, parse
    from model_support_pretend.adapter import _status

    config = parse(json.dumps(NOISE))
    assert config.matmul_noise == 2.0**-8 and not config.wrong_ops
    assert {_status(config, op) for op in ("aten::mm", "aten::addmm", "aten::bmm")} == {
        "implemented"
    }
    for bad in (0, 0.5, True, "0.004"):
        with pytest.raises(
            PretendConfigError,
            match="'matmul_noise' must be a relative error above 0 and below 0.5",
        ):
            parse(json.dumps({"matmul_noise": bad}))


# --------------------------------------------------------------------------------------------
# the comparison on logits whose answer is known

VOCAB = 1000


def _flat_pair(seed: int = 0, scale: float = 0.16, steps: int = 4, wrong: float = 0.0):
    """A random model's logits (spread ``scale`` nats, as the random fixtures' were) as the
    reference, and the device's: the same rounded to bf16, plus ``wrong`` times an unrelated
    vector (a wrong kernel's doing)."""
    generator = torch.Generator().manual_seed(seed)
    reference = torch.randn(steps, VOCAB, generator=generator) * scale
    device = reference + wrong * torch.randn(steps, VOCAB, generator=generator) * scale
    return [probe_core.top_scores(row.to(torch.bfloat16)) for row in device], reference


def test_flat_logits_cannot_hide_a_wrong_kernel_from_the_logit_error():
    """Logits spread over a tenth of a nat: a device whose logits are a third off has a KL far
    below the bound (the old check said match or ties), and a logit error far above its limit.
    Scaled by 100, the same: scale-free."""
    right = agreement.compare(*_flat_pair())
    assert right["numerics"] == "match" and right["numerics_measure"] == agreement.LOGIT_ERROR
    assert right["reference_logit_error"] < 0.05
    device, reference = _flat_pair(wrong=0.3)
    wrong = agreement.compare(device, reference)
    assert wrong["reference_max_kl"] < 1e-3 < agreement.DEFAULT_BOUND  # KL cannot see it
    assert wrong["numerics"] == "diverges" and agreement.LOGIT_ERROR in wrong[
        "numerics_measure"
    ].split(" + ")
    assert wrong["reference_logit_error"] > 2 * agreement.DEFAULT_ERROR
    assert "of their spread" in wrong["numerics_note"]
    device, reference = _flat_pair(wrong=0.3, scale=16.0)
    steep = agreement.compare(device, reference)
    assert steep["reference_logit_error"] == pytest.approx(wrong["reference_logit_error"], rel=0.05)


def test_a_flip_is_a_tie_only_within_the_logits_own_spread():
    """Flat logits (spread 0.16 nats): a device that picks a token 0.1 nats below the reference's
    best flips within 0.5 nats, but not within 0.15 of the spread (0.024 nats): it diverges by
    its flip margin. The same flip on logits spread over 4 nats is a tie."""
    generator = torch.Generator().manual_seed(1)
    reference = torch.randn(1, VOCAB, generator=generator) * 0.16
    best = int(reference[0].argmax())
    other = int(reference[0].argsort(descending=True)[5])
    reference[0, other] = reference[0, best] - 0.1
    device = reference.clone()
    device[0, other] = device[0, best] + 0.1  # the device's best is the reference's runner-up
    flat = agreement.compare([probe_core.top_scores(device[0])], reference)
    assert flat["numerics"] == "diverges" and agreement.FLIP in flat["numerics_measure"], flat[
        "numerics_note"
    ]
    # within DEFAULT_MARGIN's 0.5 nats
    assert flat["reference_flip_margin"] == pytest.approx(0.1, abs=1e-3)
    # spread 4 nats; the flip is 2.5 nats now: scale the runner-up back to 0.1 below
    steep = reference * 25
    steep[0, other] = steep[0, best] - 0.1
    device = steep.clone()
    device[0, other] = device[0, best] + 0.05
    tie = agreement.compare([probe_core.top_scores(device[0])], steep)
    assert tie["numerics"] == "ties", tie["numerics_note"]


def test_a_reference_too_flat_to_judge_is_called_too_flat_never_match():
    """Logits of 5 nats each, spread by a thousandth: bf16 rounds each by up to 0.02, twenty
    times their spread, so no flip and no logit error can tell a right device there. The device
    computed them right (the same, rounded), yet the answer is ``too flat``, judged by the KL
    alone, with the step and why."""
    generator = torch.Generator().manual_seed(2)
    reference = 5.0 + torch.randn(3, VOCAB, generator=generator) * 1e-3
    found = agreement.compare(
        [probe_core.top_scores(row.to(torch.bfloat16)) for row in reference], reference
    )
    assert found["numerics"] == agreement.TOO_FLAT and found["numerics_step"] == 0
    assert found["numerics_measure"] == agreement.KL and found["reference_logit_error"] is None
    assert "too flat to judge" in found["numerics_note"]
    constant = torch.zeros(1, VOCAB)
    assert (
        agreement.compare([probe_core.top_scores(constant[0])], constant)["numerics"]
        == agreement.TOO_FLAT
    )


def _peaked(seed: int = 3, steps: int = 8) -> torch.Tensor:
    """A decisive reference: logits spread over 3 nats, each step's best 2 nats above the rest."""
    generator = torch.Generator().manual_seed(seed)
    reference = torch.randn(steps, VOCAB, generator=generator) * 3
    for s in range(steps):
        reference[s, 10 + s] = reference[s].max() + 2
    return reference


def test_logits_scaled_down_keep_every_top_token_and_diverge_by_their_scale():
    """A device whose logits come out 0.85 times the reference's (a model's logit scale or
    softcap left out): every top token agrees, the KL stays under its bound and the logit error
    under its limit; the slope on the reference's best tokens reads 0.85, beyond
    ``SCALE_TOLERANCE``. At 0.95 (within it) the same run matches."""
    reference = _peaked()
    steps = [probe_core.top_scores((row * 0.85).to(torch.bfloat16)) for row in reference]
    found = agreement.compare(steps, reference)
    assert (
        found["reference_agreement"] == 1.0 and found["reference_max_kl"] < agreement.DEFAULT_BOUND
    )
    assert found["reference_logit_error"] < agreement.DEFAULT_ERROR
    assert found["numerics"] == "diverges" and found["numerics_measure"] == agreement.LOGIT_SCALE
    assert "the device's logits come out 0.85" in found["numerics_note"]
    near = agreement.compare(
        [probe_core.top_scores((row * 0.95).to(torch.bfloat16)) for row in reference], reference
    )
    assert near["numerics"] == "match", near["numerics_note"]


def test_what_is_too_flat_to_judge_follows_the_runs_dtype():
    """Logits near -60 spread by 2 nats: in bf16 each is rounded by up to 0.23 nats, so the step
    is too flat to judge; a float32 run rounds them 65,536 times finer, and the same logits,
    exact, are judged and match."""
    reference = _peaked() * (2 / 3) - 60
    bf16 = agreement.compare(
        [probe_core.top_scores(row.to(torch.bfloat16)) for row in reference], reference
    )
    assert bf16["numerics"] == agreement.TOO_FLAT
    exact = [probe_core.top_scores(row) for row in reference]
    assert agreement.compare(exact, reference, dtype="float32")["numerics"] == "match"
    assert agreement.compare(exact, reference, dtype="torch.float32")["numerics"] == "match"
    assert (
        agreement.flat_share("float16") == agreement.FLAT / 8
        and agreement.flat_share(None) == agreement.FLAT
    )


@pytest.mark.parametrize("pad", [-math.inf, -1e9, torch.finfo(torch.float32).min])
def test_a_padded_vocabulary_is_judged_on_its_live_logits(pad):
    """A vocabulary padded with masked ids (-inf, -1e9 or float32's lowest): a right device still
    matches (the reference's -inf once made every step 'cannot judge'), and a device 30% off
    still diverges by its logit error (the -1e9 once swelled the spread and hid it)."""
    reference = torch.cat([_peaked(), torch.full((8, 24), pad)], dim=1)
    right = agreement.compare(
        [probe_core.top_scores(row.to(torch.bfloat16)) for row in reference], reference
    )
    assert right["numerics"] == "match", right["numerics_note"]
    generator = torch.Generator().manual_seed(4)
    off = reference.clone()
    off[:, :VOCAB] += 0.3 * 3 * torch.randn(8, VOCAB, generator=generator)
    wrong = agreement.compare(
        [probe_core.top_scores(row.to(torch.bfloat16)) for row in off], reference
    )
    assert wrong["numerics"] == "diverges" and agreement.LOGIT_ERROR in wrong["numerics_measure"], (
        wrong
    )
    assert wrong["reference_logit_error"] > 2 * agreement.DEFAULT_ERROR
    # fewer live ids than the device keeps
    small = torch.cat([_peaked()[:, :20], torch.full((8, 40), pad)], dim=1)
    assert (
        agreement.compare([probe_core.top_scores(row) for row in small], small)["numerics"]
        == "match"
    )


def test_masks_are_the_references_to_say_never_the_devices():
    """Review's two ways round the masks: a device that blows its best logit up to 3e4 (the
    others exact) made every other logit a 'mask' by its own measure and read match; it diverges
    by its logit error. A device that leaves the reference's padded ids live, giving them a
    quarter of its probability, diverges by ``MASK_LEAK``: it would sample padding."""
    reference = _peaked()
    spiked = reference.clone()
    for s in range(8):
        spiked[s, 10 + s] = 3e4
    found = agreement.compare(
        [probe_core.top_scores(row) for row in spiked], reference, dtype="float32"
    )
    assert found["numerics"] == "diverges" and agreement.LOGIT_ERROR in found["numerics_measure"], (
        found
    )
    padded = torch.cat([reference, torch.full((8, 24), -math.inf)], dim=1)
    leaking = padded.clone()
    leaking[:, VOCAB:] = padded[:, :VOCAB].max(dim=1, keepdim=True).values - 1.5
    found = agreement.compare(
        [probe_core.top_scores(row) for row in leaking], padded, dtype="float32"
    )
    assert found["numerics"] == "diverges" and agreement.MASK_LEAK in found["numerics_measure"], (
        found
    )
    assert "of its probability to tokens the reference masks" in found["numerics_note"]


def test_a_slope_the_rounding_or_the_noise_decides_is_no_scale():
    """Review's false alarms: the reference's best 16 packed within a few bf16 steps at a level
    of 32 (a healthy device read a slope of 0.57), and a broad step with noise the logit error
    calls healthy: such steps give no slope, and a healthy device matches; a real 0.8x on
    decisive steps still diverges by its scale."""
    generator = torch.Generator().manual_seed(5)
    packed = torch.randn(8, VOCAB, generator=generator) * 2.5 + 20
    top = torch.randperm(VOCAB, generator=generator)[:16]
    packed[:, top] = 32 + torch.randn(8, 16, generator=generator) * 0.05
    noisy = packed + 0.01 * torch.randn(8, VOCAB, generator=generator)
    found = agreement.compare(
        [probe_core.top_scores(row.to(torch.bfloat16)) for row in noisy], packed
    )
    assert found["numerics"] in ("match", "ties") and all(
        s["scale"] is None for s in found["steps"]
    ), found
    reference = _peaked()
    found = agreement.compare(
        [probe_core.top_scores((row * 0.8).to(torch.bfloat16)) for row in reference], reference
    )
    assert found["numerics"] == "diverges" and found["numerics_measure"] in (
        agreement.LOGIT_SCALE,
        "KL",
    ), found
