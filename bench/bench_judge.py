"""The fluency judge (``probe.judge``) on a labelled set: its accuracy, its thresholds, its cost per probe.

The labelled set, ``bench/data/fluency_labelled.jsonl`` (``{"prompt", "text", "label", "source"}``), is built
once by ``python bench/bench_judge.py --build`` (minutes: it generates with real and broken models) and
committed, so the bench itself only scores it:

- fluent (label true): the real SmolLM2-135M-Instruct's greedy answers to 20 prompts (8 tokens, and 24 for
  six of them), and continuations written by hand for the same prompts;
- not fluent (label false): one word or sign repeated, random token ids decoded, the greedy output of the
  tiny random fixture models (8 tokens, three prompts each), and SmolLM2 computing with a wrong kernel
  (every ``aten::linear`` output perturbed by 20%, or every ``aten::add`` by 5%, a deterministic pattern,
  the kind of bug the pretend accelerator's ``wrong_ops`` plays), labelled by reading them: most are garbage,
  some stay English (``label`` true), a few decode to nothing (left out: nothing to judge).

The bench reports the judge's accuracy at its thresholds (``judge.MIN_SCORE``, ``judge.MAX_REPEATED``), per
source, the best thresholds on a grid (to show the chosen ones are not tuned to the last text), the judge's
load time and the time of one score (what a probe pays: one load per process, one forward pass per PASS).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from common import HERE, fixtures, spread, write_results

SET = HERE / "data" / "fluency_labelled.jsonl"
PROMPTS = [
    "The future of AI is",
    "Write a short poem about the sea.",
    "Explain how a bicycle works.",
    "What is the capital of France?",
    "Tell me a story about a dragon.",
    "Why is the sky blue?",
    "List three fruits.",
    "How do I bake bread?",
    "Describe a sunset over the mountains.",
    "What is machine learning?",
    "Give me advice for a job interview.",
    "Summarize the plot of Romeo and Juliet.",
    "What causes earthquakes?",
    "How does the internet work?",
    "Translate 'good morning' to Spanish.",
    "What are the benefits of exercise?",
    "Who was Albert Einstein?",
    "Write a haiku about autumn.",
    "How do vaccines work?",
    "What is the meaning of life?",
]
#: Fluent continuations written by hand, one per prompt.
BY_HAND = [
    "bright, but it depends on the choices we make today.",
    "The tide rolls in with silver foam, and gulls call out across the bay.",
    "Pushing the pedals turns a chain that drives the rear wheel forward.",
    "The capital of France is Paris.",
    "Long ago, a dragon guarded a mountain full of gold and old books.",
    "Sunlight scatters off the air, and blue light scatters the most.",
    "Apples, bananas and oranges.",
    "Mix flour, water, yeast and salt, let the dough rise, then bake it.",
    "The sky turned orange and pink as the sun slipped behind the peaks.",
    "Machine learning lets computers learn patterns from data.",
    "Research the company, prepare examples, and arrive a little early.",
    "Two young lovers from feuding families marry in secret, and both die.",
    "Earthquakes happen when plates in the Earth's crust slip suddenly.",
    "Computers exchange small packets of data through routers and cables.",
    "In Spanish, 'good morning' is 'buenos días'.",
    "Exercise strengthens the heart, improves sleep and lifts the mood.",
    "Albert Einstein was a physicist best known for the theory of relativity.",
    "Red leaves drifting down, the cool wind hums through the pines, evening comes early.",
    "Vaccines train the immune system to recognise a germ before it strikes.",
    "Many people find meaning in love, work and the people around them.",
]
REPEATED = ["the", "AI", "future", "is", "and", "of", "!", ".", "data", "a"]
WRONG_KERNELS = ((("linear",), 0.2), (("add",), 0.05))


def _perturbing_mode(ops: tuple[str, ...], eps: float):
    """A TorchDispatchMode that multiplies the outputs of ``ops`` by 1 + eps * sin(0.7 * index):
    a wrong kernel that raises nothing."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Wrong(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if (
                func._schema.name.split("::")[1] in ops
                and isinstance(out, torch.Tensor)
                and out.is_floating_point()
            ):
                pattern = torch.sin(torch.arange(out.numel(), dtype=torch.float32) * 0.7).reshape(
                    out.shape
                )
                out = out * (1 + eps * pattern.to(out.dtype))
            return out

    return Wrong()


def build(models: dict) -> list[dict]:
    """The labelled set (see the module docstring); the wrong kernels' outputs get ``label``
    None, to be read."""
    import contextlib

    import torch

    from model_support.probe import probe_core

    def generate(model, tokenizer, prompt, n, mode=None):
        ids, mask, _ = probe_core.build_inputs(tokenizer, prompt, "auto")
        with mode or contextlib.nullcontext():
            new = probe_core.generate(model, tokenizer, ids, mask, n, torch.device("cpu"))
        return tokenizer.decode(new, skip_special_tokens=True)

    rows = [
        {"prompt": p, "text": t, "label": True, "source": "by hand"}
        for p, t in zip(PROMPTS, BY_HAND)
    ]
    model, tokenizer = probe_core.load(
        models["SmolLM2-135M-Instruct"]["path"], "", "bfloat16", False, torch.device("cpu"), {}
    )
    for k, prompt in enumerate(PROMPTS):
        for n in (8, 24) if k < 6 else (8,):
            rows.append(
                {
                    "prompt": prompt,
                    "text": generate(model, tokenizer, prompt, n),
                    "label": True,
                    "source": f"smollm2 {n} tokens",
                }
            )
        for ops, eps in WRONG_KERNELS if k < 6 else ():
            text = generate(model, tokenizer, prompt, 8, _perturbing_mode(ops, eps))
            rows.append(
                {
                    "prompt": prompt,
                    "text": text,
                    "label": None,
                    "source": f"wrong kernel ({ops[0]} {eps:.0%})",
                }
            )
    rng = random.Random(0)
    for k, prompt in enumerate(PROMPTS):
        word = REPEATED[k % len(REPEATED)]
        rows.append(
            {
                "prompt": prompt,
                "text": ("" if word in "!." else " ").join([word] * 8),
                "label": False,
                "source": "repeated",
            }
        )
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(8)]
        rows.append(
            {
                "prompt": prompt,
                "text": tokenizer.decode(ids),
                "label": False,
                "source": "random ids",
            }
        )
    for name in sorted(n for n in models if n.startswith("tiny-")):
        tiny, tiny_tokenizer = probe_core.load(
            models[name]["path"], "", "bfloat16", False, torch.device("cpu"), {}
        )
        for prompt in PROMPTS[:3]:
            rows.append(
                {
                    "prompt": prompt,
                    "text": generate(tiny, tiny_tokenizer, prompt, 8),
                    "label": False,
                    "source": "tiny random model",
                }
            )
    return rows


def score_set(rows: list[dict], judge) -> list[dict]:
    scored = []
    for row in rows:
        start = time.perf_counter()
        found = judge.score(row["prompt"], row["text"])
        scored.append({**row, **found, "score_s": time.perf_counter() - start})
    return scored


def accuracy(scored: list[dict], min_score: float, max_repeated: float) -> float:
    judged = [r for r in scored if r["fluency_score"] is not None]
    right = sum(
        ((r["fluency_score"] >= min_score) and (r["repeated"] <= max_repeated)) == r["label"]
        for r in judged
    )
    return right / len(judged)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--build", action="store_true", help="rebuild bench/data/fluency_labelled.jsonl (minutes)"
    )
    args = parser.parse_args()
    models = fixtures()
    if args.build or not SET.exists():
        rows = build(models)
        SET.parent.mkdir(parents=True, exist_ok=True)
        SET.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        print(f"wrote {SET}: label the wrong kernels' rows (label null) by reading them")
        return
    from model_support.probe import judge as judge_mod

    rows = [json.loads(line) for line in SET.read_text().splitlines() if line.strip()]
    unlabelled = [r for r in rows if r["label"] is None]
    if unlabelled:
        raise SystemExit(
            f"{len(unlabelled)} rows of {SET} have no label yet: read them and set label true "
            "or false"
        )
    loads = []
    for _ in range(3):
        judge_mod.load_judge.cache_clear()
        start = time.perf_counter()
        judge = judge_mod.load_judge(judge_mod.judge_source())
        loads.append(time.perf_counter() - start)
    scored = score_set(rows, judge)
    judged = [r for r in scored if r["fluency_score"] is not None]
    chosen = accuracy(scored, judge_mod.MIN_SCORE, judge_mod.MAX_REPEATED)
    grid = [
        (accuracy(scored, s / 2, r / 10), s / 2, r / 10)
        for s in range(-16, -3)
        for r in range(3, 9)
    ]
    best = max(grid)
    by_source = {}
    for r in judged:
        right = (
            (r["fluency_score"] >= judge_mod.MIN_SCORE)
            and (r["repeated"] <= judge_mod.MAX_REPEATED)
        ) == r["label"]
        entry = by_source.setdefault((r["source"], r["label"]), {"n": 0, "right": 0, "scores": []})
        entry["n"] += 1
        entry["right"] += right
        entry["scores"].append(r["fluency_score"])
    score_s = [r["score_s"] for r in judged]
    lines = [
        f"Labelled set: {len(judged)} texts ({sum(r['label'] for r in judged)} fluent, "
        f"{sum(not r['label'] for r in judged)} not; {len(scored) - len(judged)} with no "
        f"visible text left out). Thresholds: score >= {judge_mod.MIN_SCORE:g} nats/token and "
        f"at most {judge_mod.MAX_REPEATED:.0%} repeated tokens: **accuracy {chosen:.1%}** "
        f"(best on a grid of thresholds: {best[0]:.1%} at {best[1]:g} / {best[2]:.0%}). Judge "
        f"load {statistics.median(loads):.2f} s (median of 3), one score "
        f"{1000 * statistics.median(score_s):.0f} ms (median over the set): a probe pays one "
        "load and one score.",
        "",
        "| source | label | texts | right | score median [min, max] |",
        "|---|---|---|---|---|",
    ]
    for (source, label), e in by_source.items():
        s = sorted(e["scores"])
        lines.append(
            f"| {source} | {'fluent' if label else 'not fluent'} | {e['n']} | {e['right']} | "
            f"{statistics.median(s):.2f} [{s[0]:.2f}, {s[-1]:.2f}] |"
        )
    wrong = [
        r
        for r in judged
        if r["label"]
        != (
            (r["fluency_score"] >= judge_mod.MIN_SCORE)
            and (r["repeated"] <= judge_mod.MAX_REPEATED)
        )
    ]
    if wrong:
        lines += ["", "Misjudged:", ""]
        lines += [
            f"- {r['source']}: {r['text']!r} ({r['fluency_score']:.2f}, {r['repeated']:.0%} "
            "repeated)"
            for r in wrong
        ]
    write_results(
        "judge",
        {
            "accuracy": chosen,
            "best": best,
            "load_s": spread(loads),
            "score_s": spread(score_s),
            "texts": len(judged),
            "table": "\n".join(lines),
        },
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
