"""The probe's stages, self-contained: load, template, generate, classify.

This module imports nothing from this package on purpose: its source *is* the body of every
record's ``repro_script`` (see ``repro.py``), so the script that reproduces a probe runs exactly the
code the probe ran, with plain ``python`` and no project install. Keep it to the standard library,
torch and transformers.
"""

import time
import traceback as _traceback

PASS, FAIL_LOAD, FAIL_GEN, FAIL_OTHER = "PASS", "FAIL(load)", "FAIL(gen)", "FAIL(other)"
DEFAULT_PROMPT = "The future of AI is"
STAGE_VERDICT = {
    "download": FAIL_LOAD,
    "load": FAIL_LOAD,
    "template": FAIL_OTHER,
    "generate": FAIL_GEN,
    "runner": FAIL_OTHER,
}


class NewlyInitialisedWeights(RuntimeError):
    """The checkpoint does not cover the loaded model: some weights would be random. Not a PASS."""


class NoChatTemplate(ValueError):
    """chat_template='required' but the tokenizer has none."""


def is_oom(exc):
    """Out of memory, on the device or the host, whatever raised it."""
    text = f"{type(exc).__name__}: {exc}".lower()
    return (
        isinstance(exc, MemoryError) or "outofmemory" in text or "out of memory" in text or "resource_exhausted" in text
    )


def classify(stage, exc):
    """The verdict for an exception raised in ``stage`` (docs/design.md): OOM is always FAIL(other)."""
    if is_oom(exc):
        return FAIL_OTHER
    return STAGE_VERDICT.get(stage, FAIL_OTHER)


def trimmed_traceback(exc, max_lines=60):
    lines = "".join(_traceback.format_exception(type(exc), exc, exc.__traceback__)).splitlines()
    if len(lines) > max_lines:
        lines = lines[:10] + [f"... ({len(lines) - max_lines} lines trimmed) ..."] + lines[-(max_lines - 11) :]
    return "\n".join(lines)


def load(model_id, revision, dtype, trust_remote_code, device, info):
    """Config, tokenizer and weights, moved to ``device``. Fills ``info`` as it learns things, so a
    later failure still records the model type, architectures and size."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    kwargs = {"revision": revision or None, "trust_remote_code": trust_remote_code}
    config = AutoConfig.from_pretrained(model_id, **kwargs)
    info["model_type"] = getattr(config, "model_type", None)
    info["architectures"] = list(getattr(config, "architectures", None) or [])
    tokenizer = AutoTokenizer.from_pretrained(model_id, **kwargs)
    model, loading = AutoModelForCausalLM.from_pretrained(
        model_id, dtype=getattr(torch, dtype), output_loading_info=True, **kwargs
    )
    info["num_params"] = sum(p.numel() for p in model.parameters())
    newly = sorted(loading.get("missing_keys") or []) + sorted(str(k) for k in (loading.get("mismatched_keys") or []))
    if newly:
        shown = ", ".join(newly[:5]) + (", ..." if len(newly) > 5 else "")
        raise NewlyInitialisedWeights(
            f"{len(newly)} weights of {type(model).__name__} are not in the checkpoint and were newly initialised: {shown}"
        )
    model.to(device)
    model.eval()
    return model, tokenizer


def build_inputs(tokenizer, prompt, chat_template):
    """Token ids of the prompt, through the chat template when the tokenizer has one ("auto").

    Returns (input_ids, attention_mask, chat_template_used)."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if chat_template == "required" and not has_template:
        raise NoChatTemplate("chat_template='required' but the tokenizer has no chat template")
    if has_template and chat_template in ("auto", "required"):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        encoded = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        return encoded["input_ids"], encoded["attention_mask"], True
    encoded = tokenizer(prompt, return_tensors="pt")
    return encoded["input_ids"], encoded["attention_mask"], False


class StepTimer:
    """A generate() streamer that timestamps each new token (after a device sync, so compilation and
    queued work are counted where they happen)."""

    def __init__(self, synchronize=None):
        self.synchronize = synchronize
        self.times = []
        self._seen_prompt = False

    def put(self, value):
        if not self._seen_prompt:
            self._seen_prompt = True
            return
        if self.synchronize:
            self.synchronize()
        self.times.append(time.perf_counter())

    def end(self):
        pass


def generate(model, tokenizer, input_ids, attention_mask, max_new_tokens, device, timer=None):
    """Greedy generation; returns the new token ids (fewer than max_new_tokens when EOS came early)."""
    import torch

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.inference_mode():
        output = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            streamer=timer,
        )
    return output[0, input_ids.shape[1] :].tolist()


def run_stages(
    model_id,
    revision="",
    dtype="bfloat16",
    prompt=DEFAULT_PROMPT,
    max_new_tokens=8,
    chat_template="auto",
    trust_remote_code=False,
    seed=0,
    device="cpu",
    synchronize=None,
    keep_model=False,
):
    """Load, template, generate, each guarded: every exception lands in the result with its stage.

    Returns a dict with status, failure_stage, exception (the object), token counts and ids, the
    generated text, timings, and what was learned about the model."""
    import torch

    result = {
        "status": None,
        "failure_stage": None,
        "exception": None,
        "model_type": None,
        "architectures": None,
        "num_params": None,
        "chat_template_used": None,
        "tokens_in": None,
        "tokens_out": None,
        "output_token_ids": None,
        "generated_text": None,
        "failed_step": None,
        "load_s": None,
        "first_token_s": None,
        "generate_s": None,
        "decode_tokens_per_s": None,
        "input_ids": None,
        "model": None,
        "tokenizer": None,
    }
    stage = "load"
    try:
        start = time.perf_counter()
        model, tokenizer = load(model_id, revision, dtype, trust_remote_code, device, result)
        if synchronize:
            synchronize()
        result["load_s"] = time.perf_counter() - start
        stage = "template"
        input_ids, attention_mask, used = build_inputs(tokenizer, prompt, chat_template)
        result["chat_template_used"] = used
        result["tokens_in"] = int(input_ids.shape[1])
        result["input_ids"] = input_ids[0].tolist()
        stage = "generate"
        torch.manual_seed(seed)
        timer = StepTimer(synchronize)
        start = time.perf_counter()
        try:
            new_ids = generate(model, tokenizer, input_ids, attention_mask, max_new_tokens, device, timer)
        except Exception:
            result["failed_step"] = len(timer.times)
            raise
        end = time.perf_counter()
        result["output_token_ids"] = new_ids
        result["tokens_out"] = len(new_ids)
        result["generated_text"] = tokenizer.decode(new_ids, skip_special_tokens=True)
        result["generate_s"] = end - start
        if timer.times:
            result["first_token_s"] = timer.times[0] - start
            if len(timer.times) > 1 and timer.times[-1] > timer.times[0]:
                result["decode_tokens_per_s"] = (len(timer.times) - 1) / (timer.times[-1] - timer.times[0])
        result["status"] = PASS
        if keep_model:
            result["model"], result["tokenizer"] = model, tokenizer
    except Exception as exc:  # noqa: BLE001 every failure is the result, classified by its stage
        result["status"] = classify(stage, exc)
        result["failure_stage"] = stage
        result["exception"] = exc
    return result
