"""Is a PASS right? The device's generation checked against a reference on logits, with teacher
forcing.

The device keeps, for each generated step, its best logits (``probe_core.top_scores``: the top
``probe_core.TOP_K_KEPT`` token ids and logits, and the log-sum-exp over the vocabulary, moved to
the host). The reference runs one forward pass over the prompt plus the device's own generated
tokens (``teacher_forced_logits``: cheaper than generating, and it never drifts onto another path
after a flip), so row ``s`` of its logits answers the question the device answered at step ``s``.
``compare`` then says, step by step:

- whether the device's top token is the reference's top token (top-1 agreement);
- where they disagree, how far below its own best the reference ranks the device's token: the *flip
  margin*, in nats (a log-probability difference, the same as the logit difference). A flip within
  the step's margin is a legitimate near-tie (bf16 against float32 picks either of two almost equal
  tokens). The margin is ``margin`` nats, or ``relative_margin`` times the reference's logit spread
  where that is smaller: logits spread over a tenth of a nat make every flip "within 0.5 nats", a
  wrong kernel's too;
- the *logit error*: how far the device's kept logits are from the reference's logits for the same
  ids (the root mean square of their difference, less its mean: a shift that softmax ignores),
  divided by the spread of the reference's logits over the whole vocabulary (their standard
  deviation). Scale-free: the same for logits spread over a tenth of a nat as over ten nats, so flat
  logits cannot hide a wrong kernel behind a small KL. Rounding noise spreads over the vocabulary
  like the logits it rounds, so the top-k's error tells the whole vocabulary's; and where the error
  is noise of that kind, the Pearson correlation (PCC) of the two logit vectors over the vocabulary
  is 1 / sqrt(1 + error^2): the ``DEFAULT_ERROR`` of 0.15 is a PCC of 0.989, next to the 0.99 tt-xla
  gates on. (The PCC of the 32 kept logits themselves is no good judge: it sees only the top of the
  distribution, whose own spread is small at a broad step: healthy bf16 takes it to 0.991 on
  SmolLM2, bf16-sized noise on its matmuls to 0.982; bench/README.md);
- the *logit scale*: the slope of the device's logits against the reference's over the reference's
  best tokens, averaged over the steps. A device whose logits come out 0.8 times the reference's (a
  model's logit scale or softcap left out) keeps every top token, and its logit error, less its mean
  over a top-k whose own spread is small against the vocabulary's, stays small; its slope reads 0.8;
- the KL divergence KL(reference || device) in nats over the device's top-k tokens plus one bucket
  for the rest of the vocabulary. Coarse-graining never increases a KL divergence, so this is a
  lower bound of the full-vocabulary KL, exact wherever the probability mass sits in the top-k; it
  needs k + 1 numbers per step from the device instead of the whole vocabulary (which a sharded rank
  would otherwise ship through its report, and an accelerator copy to the host, every step). KL is
  in nats: between two flat distributions it is small whatever computed them.

The result is ``match`` (every step agrees, no KL above ``bound``, no logit error above ``error``),
``ties`` (the same, but for flips within the margin), ``diverges`` (a flip beyond the margin, a KL
above ``bound``, a logit error above ``error``, a logit scale more than ``SCALE_TOLERANCE`` off 1,
or logits that are not finite on the device) or ``too flat``: a reference whose logits spread over
less than ``FLAT`` of their own size at some step, where a bf16 run's rounding of the logits alone
is of the size of the differences between them, so that neither a flip nor the logit error can tell
a right device from a wrong one there (never match or ties: nothing vouched for those steps; the
share is set for bf16 and scaled by the run's dtype, ``flat_share``). Masked logits (a padded
vocabulary's -inf or -1e9, ``MASKED``; the reference's to say, never the device's) are no logits:
left out of every measure but the flip (a device whose best token is one the reference masks flips
by an infinite margin), and a device that gives them more than ``LEAK`` of its probability diverges
(``MASK_LEAK``). ``numerics_measure`` says which measure judged. The defaults are measured
(docs/numerics.md, ``bench/bench_numerics.py``).

This module imports nothing from this package (only torch, lazily): its source follows
``probe_core``'s in every record's repro script, which prints the same ``numerics`` as the record.
"""

import math

MATCH, TIES, DIVERGES, TOO_FLAT = "match", "ties", "diverges", "too flat"
NUMERICS = (MATCH, TIES, DIVERGES, TOO_FLAT)
#: The measures (``numerics_measure``): a judged row says ``logit error`` (it judged every step,
#: beside the KL and the flips), a diverging one the measure(s) that tripped at its step (joined by
#: " + "), a too flat one ``KL`` (the one measure a flat reference leaves), logits that are not
#: finite ``finite``.
FLIP, LOGIT_ERROR, LOGIT_SCALE, KL, MASK_LEAK, FINITE = (
    "flip margin",
    "logit error",
    "logit scale",
    "KL",
    "masked tokens",
    "finite",
)
MEASURES = (FLIP, LOGIT_ERROR, LOGIT_SCALE, KL, MASK_LEAK, FINITE)
#: nats. bf16 against a float32 reference flips at near-ties with a flip margin of at most 0.029
#: (SmolLM2-135M-Instruct, 593 steps; 0.066 and 0.12 in earlier runs) and 0.003 (the random tiny
#: models of before); a wrong kernel that perturbs a linear layer's output by 5% flips with margins
#: up to 1.9.
DEFAULT_MARGIN = 0.5
#: Of the reference's logit spread (their standard deviation over the vocabulary): the margin where
#: it is below ``DEFAULT_MARGIN`` nats. Healthy bf16 flips at most 0.008 of it on SmolLM2 (0.015 on
#: the random tiny models of before, whose spread was 0.16 nats: 0.0024 nats); attention 5% off
#: flips at 0.16 of it, a 5% wrong linear layer at 0.50, every aten::mul or aten::silu wrong
#: (reversed and negated) at 1.7 to 10 (bench/bench_numerics.py).
DEFAULT_RELATIVE_MARGIN = 0.15
#: nats. The KL per step of bf16 against float32 is at most 0.010 on SmolLM2-135M-Instruct (5e-4 on
#: the trained tiny fixtures); a 5% wrong linear layer reaches 1.0, a 20% one 4.6
#: (bench/bench_numerics.py).
DEFAULT_BOUND = 0.1
#: The logit error (of the reference's spread) above which a step diverges: healthy bf16 reaches
#: 0.047 on SmolLM2 (0.034 on the tiny fixtures) and 0.043 with bf16-sized noise on every matmul; a
#: 1% wrong linear layer 0.074 (inside bf16's own rounding: not to be called wrong), a 5% one 0.39;
#: every aten::mul or aten::silu wrong (reversed and negated) 1.4 to 2.5 (bench/bench_numerics.py).
DEFAULT_ERROR = 0.15
#: A reference step whose logits' spread (standard deviation) is below this share of their size
#: (root mean square) is too flat to judge in a bf16 run: bf16 rounds each logit by up to 2^-9 of
#: its size (0.0023 in RMS), so at a share of 0.05 the rounding of the logits alone is a third of
#: ``DEFAULT_ERROR``. A scale-free bound: flatness in nats is no reason. The size counts the logits'
#: mean, since rounding does (logits near -60 are rounded by 0.12 nats, their spread or not); a run
#: in another dtype scales the share by its rounding (``flat_share``): float32 rounds 65,536 times
#: finer, so an exact device whose logits sit at -60 is judged, not called too flat.
FLAT = 0.05
#: The rounding (unit roundoff times 2) of each dtype a run's logits come in, against which ``FLAT``
#: is set (bf16).
ROUNDING = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-24, "float64": 2.0**-53}
ROUNDING.update(half=ROUNDING["float16"], float=ROUNDING["float32"], double=ROUNDING["float64"])
#: nats below the step's best: a reference logit further down is a mask, not a logit (a padded
#: vocabulary's -inf, -1e9 or the dtype's lowest), left out of the spread and the size (else -1e9
#: padding makes every error look small) and of the logit error and the KL (its probability is 0).
#: Masks are the reference's to say: a device's logits are never masks by their own measure (one
#: huge logit would make every other one a "mask" and hide its error: review).
MASKED = 1e4
#: The share of its probability a device may give the tokens the reference masks (padding, tokens a
#: model never emits): above it, it would sample them, and the step diverges (``MASK_LEAK``),
#: whatever the other measures say.
LEAK = 1e-3
#: The logit scale: over the judged steps, one slope of the device's logits against the reference's,
#: pooled, fitted on the reference's best ``SCALE_IDS`` tokens of each (the reference picks them, so
#: the device's noise cannot bias the slope; judged where its standard error is at most a quarter of
#: ``SCALE_TOLERANCE``). A device whose logits come out 0.8 of the reference's (a logit scale,
#: softcap or final norm weight left out) keeps every top-1 and most of the KL, and its error less
#: its mean is small against the whole vocabulary's spread; its slope reads 0.8. Pooled over a
#: prompt's steps, healthy bf16 reads within 0.0075 of 1 on SmolLM2 (10 prompts x 16 tokens; 0.002
#: on six tiny fixtures), bf16-sized noise on every matmul within 0.014 (0.004), a linear layer 1%
#: off 0.016 (bench/bench_numerics.py's calibrate, 2026-12-07); more than ``SCALE_TOLERANCE`` off 1
#: diverges.
SCALE_IDS = 16
SCALE_TOLERANCE = 0.1
#: A step's slope is left out where the reference's best tokens spread (standard deviation) over
#: less than this many of the run's rounding (``ROUNDING`` times the step's best logit): best logits
#: packed within a few bf16 steps round to the same values, and the slope reads the rounding, not
#: the device (0.57 for a healthy device at a level of 32 with a spread of 0.05: review); from a
#: spread of 4 roundings on, healthy reads within 0.01 of 1.
SCALE_RESOLUTION = 4
#: The keys ``compare`` returns that a record keeps, with the same names.
RECORD_KEYS = (
    "numerics",
    "numerics_step",
    "numerics_note",
    "numerics_measure",
    "reference_agreement",
    "reference_max_kl",
    "reference_flip_margin",
    "reference_logit_error",
    "reference_match",
    "first_divergence",
)


def reference_dtype(device_type, dtype):
    """The dtype the reference runs in: float32 for a half-precision run (the truth the run
    rounds), float64 for a float32 or wider run on the CPU (the same float32 on the same CPU
    would always agree)."""
    wide = dtype in ("float32", "float", "float64", "double")
    if not wide:
        return "float32"
    return "float64" if device_type == "cpu" else dtype


def teacher_forced_logits(model, prompt_ids, new_ids, extra_inputs=None):
    """The reference's logits for every generated step, from one forward pass over the prompt
    plus the device's tokens (all but the last): row ``s`` predicts new token ``s``. float32, on
    the CPU. ``extra_inputs``: an image-text-to-text model's image inputs
    (``probe_core.build_image_inputs``), floating ones cast to the model's dtype; those with one
    entry per prompt token (``token_type_ids``) are extended over the generated tokens with zeros
    (text)."""
    import torch

    ids = torch.tensor([list(prompt_ids) + list(new_ids[:-1])])
    dtype = next(model.parameters()).dtype
    extra = {}
    for name, value in (extra_inputs or {}).items():
        if value.is_floating_point():
            value = value.to(dtype=dtype)
        elif (
            name.endswith("token_type_ids")
            and value.dim() == 2
            and value.shape[1] == len(prompt_ids)
        ):
            value = torch.cat(
                [value, value.new_zeros((value.shape[0], ids.shape[1] - value.shape[1]))], dim=1
            )
        extra[name] = value
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, **extra)
    return out.logits[0, len(prompt_ids) - 1 :].float()


def rounding(dtype=None):
    """How finely a run in ``dtype`` (a torch dtype's name; None or unknown reads as bfloat16)
    rounds its logits: ``ROUNDING``'s share."""
    name = str(dtype or "bfloat16").removeprefix("torch.")
    return ROUNDING.get(name, ROUNDING["bfloat16"])


def flat_share(dtype=None):
    """``FLAT`` for a run in ``dtype``: scaled by how finely that dtype rounds its logits
    (``rounding``)."""
    return FLAT * rounding(dtype) / ROUNDING["bfloat16"]


def _masked(values):
    """Which of the reference's ``values`` (float64) are masks, not logits: -inf, or ``MASKED``
    nats or more below its best."""
    return values <= values.max() - MASKED


def _slope(values, ids, raw, resolution):
    """One step's part of the logit scale's fit: the reference's best ``SCALE_IDS`` logits and
    the device's for the same ids, each less its mean (least squares, the reference's as the
    variable: exact, and chosen by the reference), as two lists. None where the step cannot say:
    one of those tokens is not among the device's kept ones (a fit over the rest would be chosen
    by the device's own noise, and lean flat), or they spread over less than ``SCALE_RESOLUTION``
    roundings (``resolution`` times the best logit: the slope would read the rounding)."""
    import torch

    top = raw.topk(min(SCALE_IDS, int(torch.isfinite(raw).sum()))).indices.tolist()
    where = {int(i): j for j, i in enumerate(ids.tolist())}
    if len(top) < 4 or any(t not in where for t in top):
        return None
    x, y = raw[top], values[[where[t] for t in top]]
    if not bool(torch.isfinite(y).all()):
        return None
    x, y = x - x.mean(), y - y.mean()
    sxx = float(x.square().sum())
    if not sxx > 0 or math.sqrt(sxx / len(x)) < SCALE_RESOLUTION * resolution * abs(
        float(raw.max())
    ):
        return None
    return x.tolist(), y.tolist()


def logit_scale(steps) -> tuple[float, float, int] | None:
    """The logit scale over the steps that can say (``_slope``): one least-squares slope pooled
    over them (each step centred on its own means), its standard error, and how many steps; None
    where none can say. Pooled, not a mean of per-step slopes: at healthy bf16 noise each step's
    slope alone is too loose to judge (review: 0.8x read match when every step was left out),
    their pool is not (a standard error of about 0.012)."""
    fits = [step["fit"] for step in steps if step.get("fit") is not None]
    if not fits:
        return None
    sxy = sum(a * b for x, y in fits for a, b in zip(x, y, strict=True))
    sxx = sum(a * a for x, _ in fits for a in x)
    slope = sxy / sxx
    residual = sum((b - slope * a) ** 2 for x, y in fits for a, b in zip(x, y, strict=True))
    freedom = sum(len(x) for x, _ in fits) - len(fits) - 1
    return slope, math.sqrt(residual / max(freedom, 1) / sxx), len(fits)


def _step(device, reference_logits, margin, relative_margin, resolution=ROUNDING["bfloat16"]):
    """One step: the device's top token(s), the flip margin against the step's own margin, the KL
    over its top-k plus the rest, the logit error over its top-k, its slope against the reference
    (``_slope``), the probability it gives the tokens the reference masks, and whether the
    reference is too flat to judge by the error and the slope. ``resolution``: the run's rounding
    (``rounding``). Masked logits (``MASKED``) are the reference's to say."""
    import torch

    values = torch.tensor(device["logits"], dtype=torch.float64)
    ids = torch.tensor(device["ids"], dtype=torch.long)
    lse = float(device["logsumexp"])
    if bool(torch.isnan(values).any() or torch.isposinf(values).any()) or not math.isfinite(lse):
        return {"finite": False}
    if not values.numel() or not math.isfinite(float(values.max())):
        return {"finite": False}
    raw = reference_logits.double()
    if bool(torch.isnan(raw).any() or torch.isposinf(raw).any()) or not bool(
        torch.isfinite(raw.max())
    ):
        return {"finite": True, "reference_finite": False}
    live = ~_masked(raw)
    ref = torch.log_softmax(raw.masked_fill(~live, -math.inf), -1)
    best = int(ref.argmax())
    tied = ids[values == values.max()]  # bf16 logits tie exactly more often than one might think
    # of the device's equal best, the one the reference prefers
    chosen = int(tied[int(ref[tied].argmax())])
    flip = float(ref[best] - ref[chosen])
    device_lp = values - lse
    ref_top = ref[ids]
    device_rest = max(1.0 - float(device_lp.exp().sum()), 1e-12)
    ref_rest = max(1.0 - float(ref_top.exp().sum()), 0.0)
    p = ref_top.exp()
    # a masked id's probability is 0
    kl = float(torch.where(p > 0, p * (ref_top - device_lp), 0.0).sum())
    if ref_rest > 0:
        kl += ref_rest * (math.log(ref_rest) - math.log(device_rest))
    # over the whole live vocabulary: the scale the logits' errors are judged on
    spread = float(raw[live].std(unbiased=False)) if int(live.sum()) > 1 else 0.0
    size = float(raw[live].square().mean().sqrt())
    too_flat = not spread > FLAT * resolution / ROUNDING["bfloat16"] * size  # a spread of 0 too
    # the device's ids the reference does not mask (one it masks is a flip of infinite margin)
    on = live[ids]
    # what the device would sample that the reference never would
    leak = float(device_lp[~on].exp().sum())
    off = values[on] - raw[ids[on]]
    if not off.numel():
        error = None
    elif not bool(torch.isfinite(off).all()):
        error = math.inf  # the device masks a token the reference keeps
    else:
        off = off - off.mean()  # a shift of every logit changes no probability
        error = float(off.square().mean().sqrt()) / spread if spread > 0 else None
    error = None if too_flat else error
    fit = (
        None
        if too_flat
        else _slope(values[on], ids[on], raw.masked_fill(~live, -math.inf), resolution)
    )
    scale = (
        None
        if fit is None
        else sum(a * b for a, b in zip(*fit, strict=True)) / sum(a * a for a in fit[0])
    )
    return {
        "finite": True,
        "reference_finite": True,
        "agree": flip == 0.0,
        "flip": flip,
        "margin": min(margin, relative_margin * spread),
        "kl": max(kl, 0.0),
        "error": error,
        "scale": scale,
        "fit": fit,
        "leak": leak,
        "spread": spread,
        "flat": too_flat,
        "device_token": chosen,
        "reference_token": best,
    }


def _token(decode, token):
    return f"{decode([token])!r} ({token})" if decode else str(token)


def _trips(step, bound, error):
    """The measures by which one step diverges (``MEASURES``' order), none when it does not: on a
    step too flat to judge by them, neither a flip nor the logit error counts (bf16's rounding of
    the logits is their size there)."""
    trips = []
    if not step["flat"] and not step["agree"] and step["flip"] > step["margin"]:
        trips.append(FLIP)
    if not step["flat"] and step["error"] is not None and step["error"] > error:
        trips.append(LOGIT_ERROR)
    if step["kl"] > bound:
        trips.append(KL)
    if step.get("leak", 0.0) > LEAK:
        trips.append(MASK_LEAK)
    return trips


def _diverges_note(s, n, step, trips, bound, error, decode):
    """What a diverging step says: each measure that tripped, with its number and its limit."""
    said = []
    if FLIP in trips:
        said.append(
            f"the device chose {_token(decode, step['device_token'])}, {step['flip']:.3g} nats "
            f"below the reference's {_token(decode, step['reference_token'])} (margin "
            f"{step['margin']:.3g})"
        )
    if LOGIT_ERROR in trips:
        said.append(
            f"its logits are off the reference's by {step['error']:.3g} of their spread "
            f"({step['spread']:.3g} nats; at most {error:g})"
        )
    if KL in trips:
        said.append(f"KL {step['kl']:.3g} nats from the reference (bound {bound:g})")
    if MASK_LEAK in trips:
        said.append(
            f"it gives {step['leak']:.3g} of its probability to tokens the reference masks (at "
            f"most {LEAK:g})"
        )
    return f"step {s} of {n}: " + "; ".join(said)


def compare(
    device_steps,
    reference_logits,
    margin=DEFAULT_MARGIN,
    bound=DEFAULT_BOUND,
    decode=None,
    error=DEFAULT_ERROR,
    relative_margin=DEFAULT_RELATIVE_MARGIN,
    dtype=None,
):
    """The device's steps (``probe_core.top_scores`` each) against the reference's teacher-forced
    logits (one row per step). Returns ``RECORD_KEYS`` plus ``steps`` (per-step figures);
    ``decode`` (the tokenizer's) names tokens in the note; ``dtype``: the run's (its logits'
    rounding sets what is too flat to judge, ``flat_share``; None reads as bfloat16).

    ``numerics``: match / ties / diverges / too flat, or None when the reference's own logits are
    not finite (it cannot judge); ``numerics_step``: the first step that diverges, else the first
    too flat to judge, else the first near-tie flip, else None; ``numerics_measure``: what judged
    (``MEASURES``); ``reference_agreement``: the share of steps whose top token agrees;
    ``reference_max_kl``: the largest KL (nats); ``reference_flip_margin``: the largest flip
    margin (nats; None without a flip); ``reference_logit_error``: the largest logit error (None
    when no step could be judged by it); ``reference_match`` / ``first_divergence``: every step
    agrees (the reference would have generated the same tokens) / the first step that does not."""
    resolution = rounding(dtype)
    steps = [
        _step(d, reference_logits[s], margin, relative_margin, resolution)
        for s, d in enumerate(device_steps)
    ]
    found = dict.fromkeys(RECORD_KEYS)
    found["steps"] = steps
    if _not_finite(steps, found):
        return found
    n = len(steps)
    flips = [s for s, step in enumerate(steps) if not step["agree"]]
    kls = [step["kl"] for step in steps]
    worst_kl = max(range(n), key=kls.__getitem__)
    judged = [s for s, step in enumerate(steps) if not step["flat"] and step["error"] is not None]
    worst = max(judged, key=lambda s: steps[s]["error"], default=None)
    found.update(
        reference_agreement=(n - len(flips)) / n,
        reference_max_kl=kls[worst_kl],
        reference_flip_margin=max((steps[s]["flip"] for s in flips), default=None),
        reference_logit_error=None if worst is None else steps[worst]["error"],
        reference_match=not flips,
        first_divergence=flips[0] if flips else None,
    )
    for s, step in enumerate(steps):
        trips = _trips(step, bound, error)
        if trips:
            found.update(numerics=DIVERGES, numerics_step=s, numerics_measure=" + ".join(trips))
            found["numerics_note"] = _diverges_note(s, n, step, trips, bound, error, decode)
            return found
    said = f"largest KL {kls[worst_kl]:.2g} nats (step {worst_kl}, bound {bound:g})"
    if worst is not None:
        said += (
            f", largest logit error {steps[worst]['error']:.2g} of the spread (step {worst}, at "
            f"most {error:g})"
        )
    pooled = logit_scale(steps)
    # a looser fit says nothing either way
    if pooled is not None and pooled[1] <= SCALE_TOLERANCE / 4:
        said += (
            f", logits at {pooled[0]:.3g} of the reference's scale (1 \u00b1 {SCALE_TOLERANCE:g})"
        )
        if abs(pooled[0] - 1.0) > SCALE_TOLERANCE:
            _scaled(steps, pooled, said, found)
            return found
    _settled(steps, flips, said, margin, relative_margin, found)
    return found


def _not_finite(steps: list, found: dict) -> bool:
    """Whether a step's logits are not finite, said in ``found``: the device's diverge, the
    reference's cannot judge (``numerics`` None)."""
    n = len(steps)
    for s, step in enumerate(steps):
        if not step["finite"]:
            found.update(
                numerics=DIVERGES, numerics_step=s, reference_match=False, first_divergence=s
            )
            found.update(numerics_measure=FINITE)
            found["numerics_note"] = (
                f"step {s} of {n}: the device's logits are not finite (inf or nan)"
            )
            return True
        if not step["reference_finite"]:
            found["numerics_note"] = (
                f"step {s} of {n}: the reference's own logits are not finite: it cannot judge"
            )
            return True
    return False


def _scaled(steps: list, pooled: tuple, said: str, found: dict) -> None:
    """The logits' pooled scale more than ``SCALE_TOLERANCE`` off 1: diverges, at the step whose
    slope is worst."""
    scale, _, count = pooled
    sloped = [s for s, step in enumerate(steps) if step.get("scale") is not None]
    s = max(sloped, key=lambda s: abs(steps[s]["scale"] - 1.0))
    found.update(numerics=DIVERGES, numerics_step=s, numerics_measure=LOGIT_SCALE)
    found["numerics_note"] = (
        f"over {count} of {len(steps)} steps the device's logits come out {scale:.3g} times "
        f"the reference's (one slope on the reference's best {SCALE_IDS} tokens of each; at "
        f"most {SCALE_TOLERANCE:g} off 1; step {s} {steps[s]['scale']:.3g}): every probability "
        "is off though the top tokens agree; " + said
    )


def _settled(steps: list, flips: list, said: str, margin, relative_margin, found: dict) -> None:
    """Nothing diverged: too flat (the KL alone could judge), ties (near-tie flips) or match."""
    n = len(steps)
    flat = [s for s, step in enumerate(steps) if step["flat"]]
    if flat:
        step = steps[flat[0]]
        found.update(numerics=TOO_FLAT, numerics_step=flat[0], numerics_measure=KL)
        found["numerics_note"] = (
            f"{len(flat)} of {n} steps too flat to judge (first at step {flat[0]}: the "
            f"reference's logits spread by {step['spread']:.3g}, under {FLAT:g} of their size, "
            "where bf16's rounding alone moves them as much): neither a flip nor the logit "
            "error can tell a right device there, only the KL; " + said
        )
        return
    found["numerics_measure"] = LOGIT_ERROR
    if flips:
        found.update(numerics=TIES, numerics_step=flips[0])
        found["numerics_note"] = (
            f"{len(flips)} of {n} steps flip at a near-tie (first at step {flips[0]}; the "
            f"reference ranks the device's token at most {found['reference_flip_margin']:.3g} "
            f"nats below its best, margin {margin:g} nats or {relative_margin:g} of the "
            "spread); " + said
        )
    else:
        found.update(numerics=MATCH)
        found["numerics_note"] = f"all {n} steps agree; " + said
