"""Where the device diverges from the reference, and where generation fails, as data.

Definitions used throughout:

- *relative difference* of a module output: ``max|device - reference| / max|reference|`` over the
  positions where both are finite. Relative to the reference's largest magnitude rather than
  element-wise, so that bf16 rounding of near-zero values does not look like a divergence;
- *new non-finite*: positions where the device output is inf or nan and the reference is finite.

``build_result`` gathers the findings into one JSON-safe dict (what the notebook shows and tools
read back).
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..probe import agreement, probe_core, provenance
from ..probe.checks import first_divergence
from .tracer import ForwardTrace, ModuleTracer, model_device

#: Default relative tolerance. Differences accumulate along the pass (each module sees the device's
#: own, already rounded, inputs): bf16 against a float32 reference peaks at 0.08 on the healthy
#: SmolLM2-135M-Instruct, while an overflow, a wrong kernel or a wrong mask gives O(1) or inf/nan.
DEFAULT_TOLERANCE = 0.2


# --- comparing a device pass with the reference
# ------------------------------------------------------

COLUMNS = (
    "index",
    "module",
    "class",
    "call",
    "shape",
    "device_dtype",
    "max_abs_diff",
    "max_rel_diff",
    "device_inf",
    "device_nan",
    "reference_inf",
    "reference_nan",
    "new_nonfinite",
    "exceeds",
    "first_offender",
    "note",
)


def compare_tensors(device, reference) -> dict:
    """Differences between two CPU float32 tensors of the same shape (see the module docstring)."""
    import torch

    dev_finite, ref_finite = torch.isfinite(device), torch.isfinite(reference)
    both = dev_finite & ref_finite
    if bool(both.any()):
        diff = (device[both] - reference[both]).abs()
        max_abs = float(diff.max())
        scale = float(reference[both].abs().max())
    else:
        max_abs, scale = 0.0, 0.0
    if max_abs == 0.0:
        max_rel = 0.0
    elif scale > 0.0:
        max_rel = max_abs / scale
    else:
        max_rel = math.inf
    return {
        "max_abs_diff": max_abs,
        "max_rel_diff": max_rel,
        "device_inf": int(torch.isinf(device).sum()),
        "device_nan": int(torch.isnan(device).sum()),
        "reference_inf": int(torch.isinf(reference).sum()),
        "reference_nan": int(torch.isnan(reference).sum()),
        "new_nonfinite": int((~dev_finite & ref_finite).sum()),
    }


def compare_traces(
    device: ForwardTrace, reference: ForwardTrace, tolerance: float = DEFAULT_TOLERANCE
):
    """One row per module call of the device pass, in completion order, against the reference's
    same call (same module, same n-th call): a polars DataFrame with ``COLUMNS``.

    A row ``exceeds`` when its relative difference is above ``tolerance``, its device output has new
    non-finite values, or the shapes differ; ``first_offender`` marks the first such row."""
    import polars as pl

    rows = []
    for call in device.calls:
        key = (call["name"], call["call"])
        row = {
            "index": call["index"],
            "module": call["name"],
            "class": call["class"],
            "call": call["call"],
            "shape": str(call.get("shape")) if call.get("shape") is not None else None,
            "device_dtype": (call.get("dtype") or "").removeprefix("torch.") or None,
            "max_abs_diff": None,
            "max_rel_diff": None,
            "device_inf": call.get("inf"),
            "device_nan": call.get("nan"),
            "reference_inf": None,
            "reference_nan": None,
            "new_nonfinite": None,
            "exceeds": False,
            "first_offender": False,
            "note": None,
        }
        dev, ref = device.outputs.get(key), reference.outputs.get(key)
        if dev is None:
            row["note"] = "no tensor output"
        elif ref is None:
            row["note"] = "not run by the reference"
        elif tuple(dev.shape) != tuple(ref.shape):
            row["note"] = (
                f"shape {list(dev.shape)} on the device, {list(ref.shape)} in the reference"
            )
            row["exceeds"] = True
        else:
            row.update(compare_tensors(dev, ref))
            row["exceeds"] = row["max_rel_diff"] > tolerance or row["new_nonfinite"] > 0
        rows.append(row)
    for row in rows:
        if row["exceeds"]:
            row["first_offender"] = True
            break
    schema = {
        "index": pl.Int64,
        "module": pl.String,
        "class": pl.String,
        "call": pl.Int64,
        "shape": pl.String,
        "device_dtype": pl.String,
        "max_abs_diff": pl.Float64,
        "max_rel_diff": pl.Float64,
        "device_inf": pl.Int64,
        "device_nan": pl.Int64,
        "reference_inf": pl.Int64,
        "reference_nan": pl.Int64,
        "new_nonfinite": pl.Int64,
        "exceeds": pl.Boolean,
        "first_offender": pl.Boolean,
        "note": pl.String,
    }
    return pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)


def first_offender(table) -> dict | None:
    """The first offending row of ``compare_traces``'s table as a dict, or None."""
    hits = table.filter(table["first_offender"])
    return hits.row(0, named=True) if hits.height else None


def offender_reason(row: dict, tolerance: float) -> str:
    if row["note"] and row["max_abs_diff"] is None:
        return row["note"]
    parts = []
    if row["new_nonfinite"]:
        parts.append(
            f"{row['new_nonfinite']} non-finite value(s) on the device where the reference is "
            f"finite (inf {row['device_inf']}, nan {row['device_nan']})"
        )
    if row["max_rel_diff"] is not None and row["max_rel_diff"] > tolerance:
        parts.append(f"relative difference {row['max_rel_diff']:.3g} > tolerance {tolerance:g}")
    return "; ".join(parts)


# --- generation, step by step
# ---------------------------------------------------------------------------


class TokenCounter:
    """A generate() streamer that keeps every new token (the first ``put`` is the prompt)."""

    def __init__(self):
        self.tokens: list[int] = []
        self._seen_prompt = False

    def put(self, value):
        if not self._seen_prompt:
            self._seen_prompt = True
            return
        self.tokens.extend(int(t) for t in value.reshape(-1).tolist())

    def end(self):
        pass


def generate_steps(
    model,
    tokenizer,
    input_ids,
    attention_mask,
    max_new_tokens: int,
    device=None,
    seed: int = 0,
    cache="dynamic",
    extra_inputs=None,
) -> dict:
    """The probe's greedy generation (``probe_core.generate``, with the variant's KV ``cache`` and
    an image-text-to-text model's image inputs), watched step by step.

    Step ``s`` is the forward that produces new token ``s`` (0-based): step 0 processes the prompt
    (``tokens_in`` tokens), step ``s >= 1`` feeds the token generated at step ``s - 1``. When it
    raises:

    - ``step``: the 0-based index of the new token whose forward raised = the number of new tokens
      generated before it (the probe's ``failed_step``);
    - ``seq_len``: the number of tokens in the sequence when that forward runs, including the ones
      it processes: ``tokens_in + step`` (the prompt plus the ``step`` tokens generated so far, the
      last of which is being fed). Its positions are ``0 .. seq_len - 1``;
    - ``failure``: the innermost module running when it raised (``ModuleTracer``), with its input
      shapes and dtypes, and the exception.

    ``forward_calls`` counts the model's top-level forward calls (the failing one included);
    ``step_scores`` holds the device's best logits per generated step (``probe_core.top_scores``),
    which ``reference_numerics`` checks against the reference as the probe does.
    """
    import torch

    device = device if device is not None else model_device(model)
    tokens_in = int(input_ids.shape[1])
    counter = TokenCounter()
    tracer = ModuleTracer(model, capture=False)
    torch.manual_seed(seed)
    result: dict[str, Any] = {
        "ok": True,
        "tokens_in": tokens_in,
        "max_new_tokens": max_new_tokens,
        "tokens_out": None,
        "output_token_ids": None,
        "step": None,
        "seq_len": None,
        "forward_calls": None,
        "failure": None,
        "step_scores": [],
    }
    with tracer:
        try:
            new_ids = probe_core.generate(
                model,
                tokenizer,
                input_ids,
                attention_mask,
                max_new_tokens,
                device,
                timer=counter,
                cache=cache,
                scores=result["step_scores"],
                extra_inputs=extra_inputs,
            )
        except Exception as exc:  # noqa: BLE001 the failure is the finding
            result.update(
                {
                    "ok": False,
                    "step": len(counter.tokens),
                    "seq_len": tokens_in + len(counter.tokens),
                    "failure": tracer.failure_from(exc),
                    "output_token_ids": list(counter.tokens),
                    "tokens_out": len(counter.tokens),
                }
            )
        else:
            result.update({"output_token_ids": list(new_ids), "tokens_out": len(new_ids)})
    result["forward_calls"] = tracer.root_calls
    return result


def reference_numerics(
    reference_model,
    input_ids,
    generation: dict,
    margin: float,
    bound: float,
    tokenizer=None,
    extra_inputs=None,
    dtype=None,
) -> dict | None:
    """Is the device's generation right? The probe's own check (``agreement``): the reference
    teacher-forced on the device's tokens, against the device's best logits step by step; the
    record's ``numerics`` fields (the same for the same run; ``extra_inputs``: an
    image-text-to-text model's image inputs). None when the device's generation failed."""
    if not generation["ok"]:
        return None
    logits = agreement.teacher_forced_logits(
        reference_model, input_ids[0].tolist(), generation["output_token_ids"], extra_inputs
    )
    found = agreement.compare(
        generation["step_scores"],
        logits,
        margin,
        bound,
        decode=tokenizer.decode if tokenizer else None,
        dtype=dtype,
    )
    return {key: found[key] for key in agreement.RECORD_KEYS}


# --- loading, as the probe does
# --------------------------------------------------------------------------


def load_for_debug(
    model_id: str,
    revision: str,
    dtype: str,
    trust_remote_code: bool,
    device,
    prompt: str,
    chat_template: str,
    task: str = "auto",
    image_prompt: str = probe_core.DEFAULT_IMAGE_PROMPT,
) -> dict:
    """Model, tokenizer and prompt exactly as the probe has them (``probe_core.load`` and
    ``prompt_inputs``): a dict with model, tokenizer, input_ids, attention_mask, extra_inputs (an
    image-text-to-text model's image inputs, else None), chat_template_used, tokens_in, task,
    image_tokens and info (model_type, architectures, task, num_params)."""
    info: dict = {}
    model, tokenizer = probe_core.load(
        model_id, revision, dtype, trust_remote_code, device, info, task=task
    )
    tokenizer, input_ids, attention_mask, extra_inputs = probe_core.prompt_inputs(
        model, tokenizer, info, prompt, image_prompt, chat_template
    )
    return {
        "model": model,
        "tokenizer": tokenizer,
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "extra_inputs": extra_inputs,
        "chat_template_used": info["chat_template_used"],
        "tokens_in": int(input_ids.shape[1]),
        "task": info["task"],
        "image_tokens": info.get("image_tokens"),
        "info": info,
    }


def load_reference(
    model_id: str, revision: str, reference_dtype: str, trust_remote_code: bool, task: str = "auto"
):
    """The CPU reference copy of the model, in ``reference_dtype``."""
    import torch

    cpu = torch.device("cpu")
    model, _ = probe_core.load(
        model_id, revision, reference_dtype, trust_remote_code, cpu, {}, task=task
    )
    return model


# --- the result
# ----------------------------------------------------------------------------------------------


def json_safe(value):
    """Non-finite floats as strings ("inf", "nan"): notebook JSON has no inf."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def build_result(
    settings: dict,
    loaded: dict | None,
    device_type: str | None,
    forward: ForwardTrace | None,
    table=None,
    generation: dict | None = None,
    reference_generation: dict | None = None,
    reference_forward: ForwardTrace | None = None,
    numerics: dict | None = None,
) -> dict:
    """The findings as one JSON-safe dict (what ``show`` displays and tools read back).

    ``forward_failure``: the first module whose forward raised on the device (None when the pass
    ran); ``first_offender``: the first module whose output diverges from the reference (None
    when none); ``generation``: step / seq_len / tokens_in / failing module of a generate-time
    failure, and the generated tokens against the reference's (``first_divergence``);
    ``numerics``: the reference's verdict on the device's logits (``reference_numerics``: match /
    ties / diverges, as the probe's record says)."""
    tolerance = settings.get("tolerance", DEFAULT_TOLERANCE)
    result = {
        "model_id": settings.get("model_id"),
        "revision": settings.get("revision") or None,
        "device": settings.get("device"),
        "device_type": device_type,
        "dtype": settings.get("dtype"),
        "reference_dtype": settings.get("reference_dtype"),
        "tolerance": tolerance,
        "prompt": settings.get(
            "image_prompt"
            if (loaded or {}).get("task") == probe_core.IMAGE_TEXT_TO_TEXT
            else "prompt"
        ),
        "chat_template": settings.get("chat_template"),
        "chat_template_used": loaded["chat_template_used"] if loaded else None,
        "task": (loaded or {}).get("task") or settings.get("task"),
        "tokens_in": loaded["tokens_in"] if loaded else None,
        "image_tokens": (loaded or {}).get("image_tokens"),
        "max_new_tokens": settings.get("max_new_tokens"),
        "seed": settings.get("seed"),
        "mode": settings.get("mode", "eager"),
        "cache": settings.get("cache", "dynamic"),
        "model_type": (loaded or {}).get("info", {}).get("model_type"),
        "forward_ok": forward.ok if forward is not None else None,
        "forward_failure": forward.failure if forward is not None else None,
        "reference_forward_failure": reference_forward.failure
        if reference_forward is not None
        else None,
        "modules_traced": len(forward.calls) if forward is not None else None,
        "first_offender": None,
        "modules_compared": None,
        "modules_exceeding": None,
        "generation": None,
        "numerics": numerics,
        "versions": provenance.versions(),
    }
    if table is not None:
        compared = table.filter(table["max_abs_diff"].is_not_null())
        result["modules_compared"] = compared.height
        result["modules_exceeding"] = int(table["exceeds"].sum())
        row = first_offender(table)
        if row is not None:
            result["first_offender"] = {**row, "reason": offender_reason(row, tolerance)}
    if generation is not None:
        gen = {key: value for key, value in generation.items() if key != "step_scores"}
        if reference_generation is not None:
            gen["reference_ok"] = reference_generation["ok"]
            gen["reference_token_ids"] = reference_generation["output_token_ids"]
            gen["reference_step"] = reference_generation["step"]
            gen["reference_failure"] = reference_generation["failure"]
            if generation["ok"] and reference_generation["ok"]:
                gen["first_divergence"] = first_divergence(
                    generation["output_token_ids"], reference_generation["output_token_ids"]
                )
            else:
                gen["first_divergence"] = None
        result["generation"] = gen
    return json_safe(result)


def conclusion(result: dict) -> str:
    """The debug notebook's finding in one line: does the failure (or divergence) belong to this
    device?"""
    generation = result.get("generation") or {}
    device = result.get("forward_failure") or (
        generation.get("failure") if generation.get("ok") is False else None
    )
    reference = result.get("reference_forward_failure") or (
        generation.get("reference_failure") if generation.get("reference_ok") is False else None
    )
    if device and reference:
        if (device["error_type"], device["module"]) == (
            reference["error_type"],
            reference["module"],
        ):
            return "fails the same way on the CPU reference: not specific to this device"
        return (
            f"fails on the CPU reference too, but differently: {_error(device)} in "
            f"{_where(device)} on the device, {_error(reference)} in {_where(reference)} on "
            "the reference"
        )
    if device and result.get("forward_failure") and generation.get("ok") is True:
        # the probe's own path (generate) ran on the device: what failed is the traced forward, the
        # tracer's
        return (
            "the tracer's failure, not the model's: its traced forward raised "
            f"{_error(device)} in {_where(device)}, while the probe's generation ran on the "
            "device"
        )
    if device:
        return f"only the device fails: first in {_where(device)}, {_error(device)}"
    offender = result.get("first_offender")
    numerics = result.get("numerics") or {}
    if offender:
        return (
            f"only the device diverges: first in {offender['module'] or '(model)'} "
            f"({offender['reason']})"
        )
    if numerics.get("numerics") == agreement.DIVERGES:
        return (
            f"runs, but its generation diverges from the CPU reference: {numerics['numerics_note']}"
        )
    if numerics.get("numerics") == agreement.TOO_FLAT:
        return (
            "runs, but the CPU reference's logits are too flat to say whether its numbers are "
            f"right: {numerics['numerics_note']}"
        )
    return "runs and agrees with the CPU reference within tolerance"


def _where(failure: dict) -> str:
    return (
        f"{failure['module'] or '(model)'} ({failure['class']})"
        if failure.get("module") is not None
        else "no module"
    )


#: A dispatcher operator as error messages name it: ``aten::rsqrt``, ``aten::add.Tensor``,
#: ``prims::convert``.
_OPERATOR = re.compile(r"\b[a-z_][a-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?")


def named_operator(failure: dict | None) -> str | None:
    """The operator a failure's message names (``aten::rsqrt`` of a backend without that kernel),
    or None."""
    found = _OPERATOR.search((failure or {}).get("error_message") or "")
    return found.group(0) if found else None


def _error(failure: dict) -> str:
    """The exception's type, and the operator when its message names one: ``NotImplementedError
    on aten::rsqrt``."""
    operator = named_operator(failure)
    return failure["error_type"] + (f" on {operator}" if operator else "")


def summary_text(result: dict) -> str:
    """Three lines for the terminal: where the forward breaks, where it diverges, where generate
    fails."""
    failure = result.get("forward_failure")
    offender = result.get("first_offender")
    generation = result.get("generation") or {}
    lines = [
        f"conclusion: {conclusion(result)}",
        "forward:    "
        f"{'raises ' + _error(failure) + ' in ' + _where(failure) if failure else 'runs'}",
        "divergence: "
        f"{offender['module'] + ': ' + offender['reason'] if offender else 'none above tolerance ' + str(result.get('tolerance'))}",
    ]
    if generation and not generation.get("ok", True):
        failed = generation.get("failure")
        lines.append(
            f"generate:   fails at step {generation.get('step')} (sequence length "
            f"{generation.get('seq_len')})"
            + (f": {_error(failed)} in {_where(failed)}" if failed else "")
        )
    elif generation:
        lines.append(
            f"generate:   {len(generation.get('output_token_ids') or [])} tokens, first "
            f"divergence from reference: {generation.get('first_divergence')}"
        )
    numerics = result.get("numerics")
    if numerics:
        lines.append(f"numerics:   {numerics['numerics']} ({numerics['numerics_note']})")
    return "\n".join(lines)
