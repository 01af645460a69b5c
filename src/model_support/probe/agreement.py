"""Is a PASS right? The device's generation checked against a reference on logits, with teacher forcing.

The device keeps, for each generated step, its best logits (``probe_core.top_scores``: the top
``probe_core.TOP_K_KEPT`` token ids and logits, and the log-sum-exp over the vocabulary, moved to the
host). The reference runs one forward pass over the prompt plus the device's own generated tokens
(``teacher_forced_logits``: cheaper than generating, and it never drifts onto another path after a
flip), so row ``s`` of its logits answers the question the device answered at step ``s``. ``compare``
then says, step by step:

- whether the device's top token is the reference's top token (top-1 agreement);
- where they disagree, how far below its own best the reference ranks the device's token: the *flip
  margin*, in nats (a log-probability difference, the same as the logit difference). A flip within
  ``margin`` is a legitimate near-tie (bf16 against float32 picks either of two almost equal tokens);
- the KL divergence KL(reference || device) in nats over the device's top-k tokens plus one bucket
  for the rest of the vocabulary. Coarse-graining never increases a KL divergence, so this is a lower
  bound of the full-vocabulary KL, exact wherever the probability mass sits in the top-k; it needs
  k + 1 numbers per step from the device instead of the whole vocabulary (which a sharded rank would
  otherwise ship through its report, and an accelerator copy to the host, every step).

The result is ``match`` (every step agrees, no KL above ``bound``), ``ties`` (the only disagreements
are flips within ``margin``, no KL above ``bound``) or ``diverges`` (a flip beyond ``margin``, a KL above
``bound``, or logits that are not finite on the device), with the step it points at. The defaults are
measured (docs/numerics.md, ``bench/bench_numerics.py``).

This module imports nothing from this package (only torch, lazily): its source follows
``probe_core``'s in every record's repro script, which prints the same ``numerics`` as the record.
"""

import math

MATCH, TIES, DIVERGES = "match", "ties", "diverges"
NUMERICS = (MATCH, TIES, DIVERGES)
#: nats. bf16 against a float32 reference flips at near-ties with a flip margin of at most 0.066
#: (SmolLM2-135M-Instruct, 586 steps; 0.12 in an earlier run counting raw argmaxes) and 0.003 (tiny random
#: models); a wrong kernel that perturbs a linear layer's output by 5% flips with margins up to 1.9.
DEFAULT_MARGIN = 0.5
#: nats. The KL per step of bf16 against float32 is at most 0.022 on SmolLM2-135M-Instruct (1e-7 on
#: tiny random models); a 5% wrong linear layer reaches 1.0, a 20% one 4.4 (bench/bench_numerics.py).
DEFAULT_BOUND = 0.1
#: The keys ``compare`` returns that a record keeps, with the same names.
RECORD_KEYS = (
    "numerics",
    "numerics_step",
    "numerics_note",
    "reference_agreement",
    "reference_max_kl",
    "reference_flip_margin",
    "reference_match",
    "first_divergence",
)


def reference_dtype(device_type, dtype):
    """The dtype the reference runs in: float32 for a half-precision run (the truth the run rounds),
    float64 for a float32 or wider run on the CPU (the same float32 on the same CPU would always agree)."""
    wide = dtype in ("float32", "float", "float64", "double")
    if not wide:
        return "float32"
    return "float64" if device_type == "cpu" else dtype


def teacher_forced_logits(model, prompt_ids, new_ids, extra_inputs=None):
    """The reference's logits for every generated step, from one forward pass over the prompt plus the
    device's tokens (all but the last): row ``s`` predicts new token ``s``. float32, on the CPU.
    ``extra_inputs``: an image-text-to-text model's image inputs (``probe_core.build_image_inputs``), floating
    ones cast to the model's dtype; those with one entry per prompt token (``token_type_ids``) are extended
    over the generated tokens with zeros (text)."""
    import torch

    ids = torch.tensor([list(prompt_ids) + list(new_ids[:-1])])
    dtype = next(model.parameters()).dtype
    extra = {}
    for name, value in (extra_inputs or {}).items():
        if value.is_floating_point():
            value = value.to(dtype=dtype)
        elif name.endswith("token_type_ids") and value.dim() == 2 and value.shape[1] == len(prompt_ids):
            value = torch.cat([value, value.new_zeros((value.shape[0], ids.shape[1] - value.shape[1]))], dim=1)
        extra[name] = value
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, **extra)
    return out.logits[0, len(prompt_ids) - 1 :].float()


def _step(device, reference_logits):
    """One step: the device's top token(s), the flip margin, the KL over its top-k plus the rest."""
    import torch

    values = torch.tensor(device["logits"], dtype=torch.float64)
    ids = torch.tensor(device["ids"], dtype=torch.long)
    lse = float(device["logsumexp"])
    if not (bool(torch.isfinite(values).all()) and math.isfinite(lse)):
        return {"finite": False}
    ref = torch.log_softmax(reference_logits.double(), -1)
    if not bool(torch.isfinite(ref).all()):
        return {"finite": True, "reference_finite": False}
    best = int(ref.argmax())
    tied = ids[values == values.max()]  # bf16 logits tie exactly more often than one might think
    chosen = int(tied[int(ref[tied].argmax())])  # of the device's equal best, the one the reference prefers
    flip = float(ref[best] - ref[chosen])
    device_lp = values - lse
    ref_top = ref[ids]
    device_rest = max(1.0 - float(device_lp.exp().sum()), 1e-12)
    ref_rest = max(1.0 - float(ref_top.exp().sum()), 0.0)
    kl = float((ref_top.exp() * (ref_top - device_lp)).sum())
    if ref_rest > 0:
        kl += ref_rest * (math.log(ref_rest) - math.log(device_rest))
    return {
        "finite": True,
        "reference_finite": True,
        "agree": flip == 0.0,
        "flip": flip,
        "kl": max(kl, 0.0),
        "device_token": chosen,
        "reference_token": best,
    }


def _token(decode, token):
    return f"{decode([token])!r} ({token})" if decode else str(token)


def compare(device_steps, reference_logits, margin=DEFAULT_MARGIN, bound=DEFAULT_BOUND, decode=None):
    """The device's steps (``probe_core.top_scores`` each) against the reference's teacher-forced logits
    (one row per step). Returns ``RECORD_KEYS`` plus ``steps`` (per-step figures); ``decode`` (the
    tokenizer's) names tokens in the note.

    ``numerics``: match / ties / diverges, or None when the reference's own logits are not finite (it
    cannot judge); ``numerics_step``: the first step that diverges, else the first near-tie flip, else
    None; ``reference_agreement``: the share of steps whose top token agrees; ``reference_max_kl``: the
    largest KL (nats); ``reference_flip_margin``: the largest flip margin (nats; None without a flip);
    ``reference_match`` / ``first_divergence``: every step agrees (the reference would have generated the
    same tokens) / the first step that does not."""
    steps = [_step(d, reference_logits[s]) for s, d in enumerate(device_steps)]
    found = dict.fromkeys(RECORD_KEYS)
    found["steps"] = steps
    n = len(steps)
    for s, step in enumerate(steps):
        if not step["finite"]:
            found.update(numerics=DIVERGES, numerics_step=s, reference_match=False, first_divergence=s)
            found["numerics_note"] = f"step {s} of {n}: the device's logits are not finite (inf or nan)"
            return found
        if not step["reference_finite"]:
            found["numerics_note"] = f"step {s} of {n}: the reference's own logits are not finite: it cannot judge"
            return found
    flips = [s for s, step in enumerate(steps) if not step["agree"]]
    kls = [step["kl"] for step in steps]
    worst_kl = max(range(n), key=kls.__getitem__)
    found.update(
        reference_agreement=(n - len(flips)) / n,
        reference_max_kl=kls[worst_kl],
        reference_flip_margin=max((steps[s]["flip"] for s in flips), default=None),
        reference_match=not flips,
        first_divergence=flips[0] if flips else None,
    )
    for s, step in enumerate(steps):
        if not step["agree"] and step["flip"] > margin:
            found.update(numerics=DIVERGES, numerics_step=s)
            found["numerics_note"] = (
                f"step {s} of {n}: the device chose {_token(decode, step['device_token'])}, {step['flip']:.3g} nats "
                f"below the reference's {_token(decode, step['reference_token'])} (margin {margin:g})"
            )
            return found
        if step["kl"] > bound:
            found.update(numerics=DIVERGES, numerics_step=s)
            found["numerics_note"] = f"step {s} of {n}: KL {step['kl']:.3g} nats from the reference (bound {bound:g})"
            return found
    kl_text = f"largest KL {kls[worst_kl]:.2g} nats (step {worst_kl}, bound {bound:g})"
    if flips:
        found.update(numerics=TIES, numerics_step=flips[0])
        found["numerics_note"] = (
            f"{len(flips)} of {n} steps flip at a near-tie (first at step {flips[0]}; the reference ranks the "
            f"device's token at most {found['reference_flip_margin']:.3g} nats below its best, margin {margin:g}); "
            + kl_text
        )
    else:
        found.update(numerics=MATCH)
        found["numerics_note"] = f"all {n} steps agree; " + kl_text
    return found
