"""The reference check's thresholds, measured, and its cost against the generated reference it replaces.

Calibration (``probe.agreement``'s ``DEFAULT_MARGIN`` and ``DEFAULT_BOUND``): each model generates greedily in
bfloat16 on the CPU, keeping its best logits per step as the probe does, and the float32 reference is
teacher-forced on those tokens. Over 20 prompts x 32 new tokens, per model: the steps, the flips (the top
tokens differ), the largest flip margin (how far below its best the reference ranks the bf16 model's
token), the largest and 99th-percentile KL per step, and what ``compare`` says with the defaults. Then the
same on SmolLM2-135M-Instruct with a wrong kernel (a TorchDispatchMode multiplying one operator's outputs
by 1 + eps * sin(0.7 * index): wrong numbers, no error), at 1%, 5% and 20%: the check must say diverges
there, and match or ties on every healthy model.

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


def steps_of(model, reference, tokenizer, prompt: str, new_tokens: int, mode=None) -> dict:
    """One prompt: the device's (bf16) generation with its kept scores, the reference's teacher-forced
    logits, and ``compare``'s answer with the defaults."""
    import contextlib

    import torch

    from model_support.probe import agreement, probe_core

    ids, mask, _ = probe_core.build_inputs(tokenizer, prompt, "auto")
    scores: list[dict] = []
    with mode or contextlib.nullcontext():
        new = probe_core.generate(model, tokenizer, ids, mask, new_tokens, torch.device("cpu"), scores=scores)
    logits = agreement.teacher_forced_logits(reference, ids[0].tolist(), new)
    return agreement.compare(scores, logits)


def calibrate(name: str, path: str, prompts: list[str], new_tokens: int, wrong=None) -> dict:
    import torch

    from model_support.probe import probe_core

    model, tokenizer = probe_core.load(path, "", "bfloat16", False, torch.device("cpu"), {})
    reference, _ = probe_core.load(path, "", "float32", False, torch.device("cpu"), {})
    steps, verdicts = [], Counter()
    for prompt in prompts:
        found = steps_of(model, reference, tokenizer, prompt, new_tokens, _perturbing_mode(*wrong) if wrong else None)
        verdicts[found["numerics"]] += 1
        steps += [s for s in found["steps"] if s["finite"]]
    flips = [s["flip"] for s in steps if not s["agree"]]
    kls = sorted(s["kl"] for s in steps)
    return {
        "model": name,
        "wrong": f"{wrong[0][0]} x(1 +- {wrong[1]:.0%})" if wrong else None,
        "steps": len(steps),
        "flips": len(flips),
        "max_flip": max(flips, default=None),
        "max_kl": kls[-1] if kls else None,
        "p99_kl": kls[int(0.99 * (len(kls) - 1))] if kls else None,
        "verdicts": dict(verdicts),
    }


def cost(path: str, reps: int = 3) -> dict:
    """The generated reference (load + greedy generation) against the teacher-forced one (load + one forward)."""
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
        logits = agreement.teacher_forced_logits(model, device["input_ids"], device["output_token_ids"])
        agreement.compare(device["step_scores"], logits, decode=tokenizer.decode)
        forced.append(time.perf_counter() - start)
    return {"generated_s": spread(generated), "teacher_forced_s": spread(forced)}


def _f(value, digits=3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def main() -> None:
    from model_support.probe import agreement

    models = fixtures()
    rows = [calibrate("SmolLM2-135M-Instruct", models["SmolLM2-135M-Instruct"]["path"], PROMPTS, NEW_TOKENS)]
    for name in sorted(n for n in models if n.startswith("tiny-")):
        rows.append(calibrate(name, models[name]["path"], PROMPTS[:8], NEW_TOKENS))
    for wrong in WRONG:
        rows.append(calibrate("SmolLM2-135M-Instruct", models["SmolLM2-135M-Instruct"]["path"], PROMPTS[:8], 8, wrong))
    costs = cost(models["SmolLM2-135M-Instruct"]["path"])
    lines = [
        f"bf16 on the CPU against the float32 reference, teacher-forced; defaults: margin "
        f"{agreement.DEFAULT_MARGIN:g} nats, bound {agreement.DEFAULT_BOUND:g} nats. Healthy models must say match "
        "or ties, a wrong kernel diverges.",
        "",
        "| model | wrong kernel | steps | flips | largest flip margin (nats) | largest KL | p99 KL | numerics per prompt |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['wrong'] or '-'} | {r['steps']} | {r['flips']} | {_f(r['max_flip'])} | "
            f"{_f(r['max_kl'])} | {_f(r['p99_kl'])} | "
            + ", ".join(f"{k} {v}" for k, v in sorted(r["verdicts"].items(), key=lambda kv: str(kv[0])))
            + " |"
        )
    g, t = costs["generated_s"]["median"], costs["teacher_forced_s"]["median"]
    lines += [
        "",
        f"Cost on SmolLM2-135M-Instruct, 8 new tokens, float32 on the CPU (median of 3, load included): the generated "
        f"reference {g:.2f} s, the teacher-forced one {t:.2f} s ({g / t:.2f}x faster).",
    ]
    write_results("numerics", {"rows": rows, "cost": costs, "table": "\n".join(lines)})
    print("\n".join(lines))


if __name__ == "__main__":
    main()
