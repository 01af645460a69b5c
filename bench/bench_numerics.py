"""The reference check's thresholds, measured, and its cost against the generated reference it replaces.

Calibration (``probe.agreement``'s ``DEFAULT_MARGIN``, ``DEFAULT_RELATIVE_MARGIN``, ``DEFAULT_BOUND`` and
``DEFAULT_ERROR``): each model generates greedily in bfloat16 on the CPU, keeping its best logits per step as the
probe does, and the float32 reference is teacher-forced on those tokens. Over 20 prompts x 32 new tokens, per model:
the steps, the flips (the top tokens differ), the largest flip margin (how far below its best the reference ranks
the bf16 model's token; in nats and as a share of the reference's logit spread), the largest and 99th-percentile KL
and logit error per step, the logit scale's largest distance from 1 (per prompt, as ``compare`` judges it, and
per step), the lowest PCC of the kept top-k logits with the reference's (the measure the logit error
replaced, shown to say why), and what ``compare`` says with the defaults. Then wrong kernels, raising nothing: a
TorchDispatchMode multiplying one operator's outputs by 1 + eps * sin(0.7 * index) on SmolLM2-135M-Instruct (1%, 5%,
20%); the pretend device's bug (``bug``: the outputs reversed along their last dimension and negated, as its
``wrong_ops`` list makes them) of every aten::mul.Tensor and of aten::silu on the tiny fixtures; and the pretend
device's ``matmul_noise`` (every matrix product off by a relative error drawn uniformly within bf16's unit roundoff,
2^-8, then rounded to bf16 again: no fault) on every model; on the CPU the products reach the mode as aten::linear and
attention whole, which get the noise on their outputs instead. The check must say diverges for the bugs and the 5% and 20% kernels, and match or ties
on every healthy or noisy model.

Cost: on SmolLM2-135M-Instruct, the reference as it ran before (``probe_core.run_stages`` on the CPU in
float32: load and greedy generation of 8 tokens) against the teacher-forced one (load and one forward pass
over the prompt plus the 8 tokens, then ``compare``), alternating, 3 repetitions each.
"""

from __future__ import annotations

import time
from collections import Counter

from bench_judge import PROMPTS, _perturbing_mode  # the same prompts and wrong kernel
from common import fixtures, spread, write_results

NEW_TOKENS = 32
WRONG = [
    (("linear",), 0.01),
    (("linear",), 0.05),
    (("linear",), 0.2),
    (("scaled_dot_product_attention",), 0.05),
    (("silu",), 0.2),
]
#: The pretend device's faults, played on the CPU (``_fault_mode``): (model, kind, operators).
#: ``matmul_noise``'s products (model_support_pretend.config.MATMUL_OPS), and what reaches a
#: dispatch mode on the CPU instead under inference mode: aten::linear and attention whole (the
#: pretend device receives them decomposed).
MATMULS = (
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::linear",
    "aten::matmul",
    "aten::scaled_dot_product_attention",
)
BF16_ROUNDOFF = 2.0**-8
FAULTS = [
    *[
        (name, "bug", ("aten::mul.Tensor",))
        for name in ("tiny-llama", "tiny-qwen3", "tiny-opt", "tiny-gpt2")
    ],
    ("tiny-llama", "bug", ("aten::silu",)),
    ("tiny-qwen3", "bug", ("aten::silu",)),
    ("SmolLM2-135M-Instruct", "bug", ("aten::silu",)),
]


def _fault_mode(kind: str, ops: tuple[str, ...]):
    """The pretend device's faults as a TorchDispatchMode on the CPU: ``bug`` reverses the
    outputs of ``ops`` along their last dimension and negates them (``tensor._wrong``); ``noise``
    multiplies them by 1 + u, u uniform within bf16's unit roundoff, drawn afresh each call from
    a seeded generator (``tensor._noisy``)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    generator = torch.Generator().manual_seed(0)

    class Fault(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func._schema.name
            overload = func._overloadname
            named = {name, f"{name}.{overload}"}
            if (
                named & set(ops)
                and isinstance(out, torch.Tensor)
                and out.is_floating_point()
                and out.numel()
            ):
                if kind == "bug":
                    out = -(out.flip(-1) if out.dim() else out)
                else:
                    u = torch.rand(out.shape, generator=generator, dtype=torch.float64) * 2 - 1
                    out = (out.double() * (1 + BF16_ROUNDOFF * u)).to(out.dtype)
            return out

    return Fault()


def steps_of(model, reference, tokenizer, prompt: str, new_tokens: int, mode=None) -> dict:
    """One prompt: the device's (bf16) generation with its kept scores, the reference's
    teacher-forced logits, and ``compare``'s answer with the defaults; each step also gets the
    PCC of its kept logits with the reference's for the same ids (``topk_pcc``)."""
    import contextlib

    import torch

    from model_support.probe import agreement, probe_core

    ids, mask, _ = probe_core.build_inputs(tokenizer, prompt, "auto")
    scores: list[dict] = []
    with mode or contextlib.nullcontext():
        new = probe_core.generate(
            model, tokenizer, ids, mask, new_tokens, torch.device("cpu"), scores=scores
        )
    logits = agreement.teacher_forced_logits(reference, ids[0].tolist(), new)
    found = agreement.compare(scores, logits)
    for s, (step, kept) in enumerate(zip(found["steps"], scores)):
        if step.get("finite") and step.get("reference_finite"):
            kept_logits = torch.tensor(kept["logits"], dtype=torch.float64)
            theirs = logits[s].double()[torch.tensor(kept["ids"])]
            step["topk_pcc"] = float(torch.corrcoef(torch.stack([kept_logits, theirs]))[0, 1])
    return found


def calibrate(
    name: str, path: str, prompts: list[str], new_tokens: int, wrong=None, fault=None
) -> dict:
    """One model over ``prompts``: healthy, with a ``wrong`` kernel (bench_judge's perturbation)
    or with a pretend ``fault`` ((kind, operators): ``_fault_mode``)."""
    import torch

    from model_support.probe import agreement, probe_core

    model, tokenizer = probe_core.load(path, "", "bfloat16", False, torch.device("cpu"), {})
    reference, _ = probe_core.load(path, "", "float32", False, torch.device("cpu"), {})
    steps, verdicts, measures, scales = [], Counter(), Counter(), []
    for prompt in prompts:
        mode = _perturbing_mode(*wrong) if wrong else _fault_mode(*fault) if fault else None
        found = steps_of(model, reference, tokenizer, prompt, new_tokens, mode)
        verdicts[found["numerics"]] += 1
        if found["numerics"] == "diverges":
            measures.update(found["numerics_measure"].split(" + "))
        steps += [s for s in found["steps"] if s["finite"]]
        # the logit scale compare judges: one slope over the steps
        pooled = agreement.logit_scale(found["steps"])
        if pooled is not None:
            scales.append(pooled[0])
    flips = [s for s in steps if not s["agree"]]
    kls = sorted(s["kl"] for s in steps)
    errors = sorted(s["error"] for s in steps if s["error"] is not None)
    pccs = sorted(s["topk_pcc"] for s in steps if "topk_pcc" in s)
    if wrong:
        label = f"{wrong[0][0]} x(1 +- {wrong[1]:.0%})"
    elif fault:
        label = f"{fault[1][0] if fault[0] == 'bug' else 'every matmul'} {fault[0]}"
    else:
        label = None
    return {
        "model": name,
        "wrong": label,
        "steps": len(steps),
        "flips": len(flips),
        "max_flip": max((s["flip"] for s in flips), default=None),
        "max_flip_share": max(
            (s["flip"] / s["spread"] for s in flips if s["spread"] > 0), default=None
        ),
        "max_kl": kls[-1] if kls else None,
        "p99_kl": kls[int(0.99 * (len(kls) - 1))] if kls else None,
        "max_error": errors[-1] if errors else None,
        "p99_error": errors[int(0.99 * (len(errors) - 1))] if errors else None,
        "min_error": errors[0] if errors else None,
        "min_topk_pcc": pccs[0] if pccs else None,
        "flat_steps": sum(bool(s.get("flat")) for s in steps),
        "max_scale_off": max((abs(x - 1.0) for x in scales), default=None),
        "max_step_scale_off": max(
            (abs(s["scale"] - 1.0) for s in steps if s.get("scale") is not None), default=None
        ),
        "verdicts": dict(verdicts),
        "diverged_by": dict(measures),
    }


def cost(path: str, reps: int = 3) -> dict:
    """The generated reference (load + greedy generation) against the teacher-forced one (load +
    one forward)."""
    import torch

    from model_support.probe import agreement, probe_core

    settings = {
        "revision": "",
        "prompt": probe_core.DEFAULT_PROMPT,
        "max_new_tokens": 8,
        "chat_template": "auto",
        "trust_remote_code": False,
        "seed": 0,
    }
    device = probe_core.run_stages(path, **settings, dtype="bfloat16", device=torch.device("cpu"))
    generated, forced = [], []
    for _ in range(reps):
        start = time.perf_counter()
        probe_core.run_stages(path, **settings, dtype="float32", device=torch.device("cpu"))
        generated.append(time.perf_counter() - start)
        start = time.perf_counter()
        model, tokenizer = probe_core.load(path, "", "float32", False, torch.device("cpu"), {})
        logits = agreement.teacher_forced_logits(
            model, device["input_ids"], device["output_token_ids"]
        )
        agreement.compare(device["step_scores"], logits, decode=tokenizer.decode)
        forced.append(time.perf_counter() - start)
    return {"generated_s": spread(generated), "teacher_forced_s": spread(forced)}


def _f(value, digits=3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def main() -> None:
    from model_support.probe import agreement

    models = fixtures()
    smol = models["SmolLM2-135M-Instruct"]["path"]
    tiny = sorted(n for n in models if n.startswith("tiny-") and n in _text_fixtures(models))
    rows = [calibrate("SmolLM2-135M-Instruct", smol, PROMPTS, NEW_TOKENS)]
    for name in tiny:
        rows.append(calibrate(name, models[name]["path"], PROMPTS[:8], NEW_TOKENS))
    for wrong in WRONG:
        rows.append(calibrate("SmolLM2-135M-Instruct", smol, PROMPTS[:8], 8, wrong))
    for name, kind, ops in FAULTS:
        rows.append(calibrate(name, models[name]["path"], PROMPTS[:8], 8, fault=(kind, ops)))
    rows.append(calibrate("SmolLM2-135M-Instruct", smol, PROMPTS[:8], 8, fault=("noise", MATMULS)))
    for name in tiny:
        rows.append(calibrate(name, models[name]["path"], PROMPTS[:8], 8, fault=("noise", MATMULS)))
    costs = cost(smol)
    lines = [
        "bf16 on the CPU against the float32 reference, teacher-forced; defaults: margin "
        f"{agreement.DEFAULT_MARGIN:g} nats or {agreement.DEFAULT_RELATIVE_MARGIN:g} of the "
        f"spread, bound {agreement.DEFAULT_BOUND:g} nats, logit error "
        f"{agreement.DEFAULT_ERROR:g}, logit scale 1 +- {agreement.SCALE_TOLERANCE:g}. Healthy "
        "and noisy models must say match or ties, a wrong kernel diverges. Flip share: the "
        "flip margin over the reference's logit spread. Top-k PCC: the PCC of the 32 kept "
        "logits with the reference's (not used; shown to say why).",
        "",
        "| model | wrong kernel | steps | flips | largest flip (nats) | largest flip share | "
        "largest KL | p99 KL | largest logit error | p99 logit error | smallest logit error | "
        "lowest top-k PCC | logit scale off 1 (prompt; step) | numerics per prompt | diverged "
        "by |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['wrong'] or '-'} | {r['steps']} | {r['flips']} | "
            f"{_f(r['max_flip'])} | {_f(r['max_flip_share'])} | {_f(r['max_kl'])} | "
            f"{_f(r['p99_kl'])} | {_f(r['max_error'])} | {_f(r['p99_error'])} | "
            f"{_f(r['min_error'])} | {_f(r['min_topk_pcc'], 4)} | {_f(r['max_scale_off'], 2)}; "
            f"{_f(r['max_step_scale_off'], 2)} | "
            + ", ".join(
                f"{k} {v}" for k, v in sorted(r["verdicts"].items(), key=lambda kv: str(kv[0]))
            )
            + " | "
            + (", ".join(f"{k} {v}" for k, v in sorted(r["diverged_by"].items())) or "-")
            + " |"
        )
    g, t = costs["generated_s"]["median"], costs["teacher_forced_s"]["median"]
    lines += [
        "",
        "Cost on SmolLM2-135M-Instruct, 8 new tokens, float32 on the CPU (median of 3, load "
        f"included): the generated reference {g:.2f} s, the teacher-forced one {t:.2f} s "
        f"({g / t:.2f}x faster).",
    ]
    write_results("numerics", {"rows": rows, "cost": costs, "table": "\n".join(lines)})
    print("\n".join(lines))


def _text_fixtures(models: dict) -> set[str]:
    """The tiny text-generation fixtures that PASS (the vision-language ones need an image)."""
    from fixtures.build import TINY_ARCHS

    return {name for name in models if name in TINY_ARCHS or name == "tiny-eos-early"}


if __name__ == "__main__":
    main()
