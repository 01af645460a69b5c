"""How fast a PASS runs on its device: the perf phase, repeated, after the verdict's generation.

Why: the verdict's generation times 8 tokens once, compilation included; a team porting a stack asks how
fast a model decodes in steady state and whether that moved. So, in the device phase, after the verdict and
before the device is released (``run.py``), the same model generates ``perf_tokens`` greedy tokens from the
probe's own prompt once as a warm-up (``perf_first_call_s``: compilation and first-call costs included), then
``perf_repeats`` more times, each timed per token after a device sync (``probe_core.StepTimer``): TTFT (the
prompt's prefill and first token), TPOT (the median of the seconds between tokens after it: a pause of the
host on one token moves no median, where it would move a mean) and tokens/s over the whole generation, with their medians, their per-repeat values (the gate's "ranges do not overlap") and their spread
((max - min) / median). End of sequence is suppressed (``min_new_tokens``) so every repeat decodes as many
tokens. The model bandwidth utilisation (MBU) is the bytes a decode step reads (the parameters, only the
active experts' share of a mixture of experts, plus the KV cache at the mean position) over TPOT, against the
peak bandwidth the device adapter declares (``peak_bandwidth_gbs``; none on the CPU).

A measurement that cannot run, or raises, is a note (``perf_note``), never a verdict change. The fields are
the record's group ``perf`` (``record.schema``).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Mapping
from typing import Any

from ..record import schema
from . import probe_core

#: The record's performance fields (group ``perf``), null unless measured.
FIELDS = schema.names_in("perf")


def spread(values: list[float]) -> float | None:
    """(max - min) / median of repeated measurements: how far apart the repeats were, relative."""
    if not values:
        return None
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else None


def not_measured(why: str) -> dict:
    """The perf fields of a probe whose performance was not measured, with the reason."""
    return {**dict.fromkeys(FIELDS), "perf_note": f"not measured: {why}"}


def wanted(settings: dict, device_type: str | None) -> str | None:
    """Why the perf phase is off for these settings on ``device_type``, or None: ``perf`` off (or false), or auto on
    the CPU, where its repeats cost more than the probe itself (bench/results/perf.json: SmolLM2-135M 2.5 times)."""
    perf = settings.get("perf", "auto")
    if perf in (False, "off"):
        return "perf=off"
    if perf in ("auto", None) and device_type == "cpu":
        return "perf=auto, off on the CPU (its repeats would cost more than the probe; perf=on times it)"
    return None


def why_not(record: Mapping[str, Any], settings: dict) -> str | None:
    """Why this probe's performance is not measured, or None: switched off (``wanted``), not a PASS, an
    image-text-to-text model (its image inputs are not kept past the verdict's generation)."""
    off = wanted(settings, record.get("device_type"))
    if off is not None:
        return off
    if record.get("status") != schema.PASS:
        return "not a PASS"
    if (record.get("devices_used") or 1) > 1:
        return "runs over several devices are not timed by the perf phase yet"
    if record.get("task") == schema.IMAGE_TEXT_TO_TEXT:
        return "image-text-to-text runs are not timed by the perf phase yet"
    return None


def _one_run(model, tokenizer, ids, mask, tokens: int, device, synchronize, clock) -> tuple[float, list[float]]:
    """One greedy generation of exactly ``tokens`` new tokens: (start, each token's time after a device sync), on
    ``clock`` (the adapter's own, else the host's wall clock)."""
    import torch

    timer = probe_core.StepTimer(synchronize, clock)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if synchronize:
        synchronize()
    start = clock()
    with torch.inference_mode():
        model.generate(
            input_ids=ids.to(device),  # as the verdict's generation: moved inside inference mode
            attention_mask=mask.to(device),
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=False,
            pad_token_id=pad,
            streamer=timer,
        )
    return start, timer.times


def decode_bytes_per_token(model, context: float) -> tuple[int, str]:
    """Bytes one decode step reads at ``context`` positions: every parameter once (for a mixture of experts only
    the routed experts' share: parameters under an ``experts`` module count num_experts_per_tok / num_experts
    of their bytes, the simple average over tokens) plus the KV cache (2 x layers x KV heads x head size x the
    cache's element size x positions). Returns (bytes, how: what was assumed)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    active = getattr(config, "num_experts_per_tok", None)
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    share = active / experts if active and experts else 1.0
    params = 0.0
    for name, p in model.named_parameters():
        size = p.numel() * p.element_size()
        params += size * share if share < 1.0 and ".experts." in f".{name}" else size
    how = f"parameters x {share:.3g} for the experts" if share < 1.0 else "every parameter"
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or (
        getattr(config, "hidden_size", 0) // heads if heads and getattr(config, "hidden_size", None) else None
    )
    if not (layers and kv_heads and head_dim):
        return int(params), how + ", no KV cache (the config names no layers, heads or head size)"
    element = next(model.parameters()).element_size()
    kv = 2 * layers * kv_heads * head_dim * element * context
    return int(params + kv), how + f" + KV cache at {context:g} positions"


def measure(model, tokenizer, prompt_ids: list[int], settings: dict, adapter) -> dict:
    """The perf fields of a PASS, measured on ``adapter``'s device with the verdict's ``model`` (still on it) and
    prompt (``prompt_ids``), in the probe's mode (compile: its forward compiled again, so the first call pays
    the compilation; fused: TorchTPU's deferred-and-fused eager)."""
    import torch

    tokens, repeats = int(settings["perf_tokens"]), int(settings["perf_repeats"])
    device = adapter.torch_device
    synchronize = adapter.synchronize if adapter.type != "cpu" else None
    own_clock = adapter.perf_clock()
    clock = own_clock or time.perf_counter
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    mask = torch.ones_like(ids)
    mode = settings["mode"]
    eager_forward = probe_core.compile_forward(model, adapter.compile_backend()) if mode == "compile" else None
    adapter.reset_peak_memory()
    try:
        with probe_core.execution_context(mode):
            start, times = _one_run(model, tokenizer, ids, mask, tokens, device, synchronize, clock)
            first_call = times[-1] - start
            ttft, tpot, per_s = [], [], []
            gc.collect()  # as timeit does: no collection of the verdict's garbage inside a timed repeat
            gc.disable()
            for _ in range(repeats):
                start, times = _one_run(model, tokenizer, ids, mask, tokens, device, synchronize, clock)
                ttft.append(times[0] - start)
                steps = [after - before for before, after in zip(times, times[1:])]
                tpot.append(statistics.median(steps) if steps else None)  # a stray pause moves no median
                per_s.append(len(times) / (times[-1] - start))
    finally:
        gc.enable()
        if eager_forward is not None:
            model.forward = eager_forward
    peak_mb, _ = adapter.peak_memory_mb()
    fields: dict[str, Any] = {
        **dict.fromkeys(FIELDS),
        "perf_tokens_out": tokens,
        "perf_first_call_s": first_call,
        "ttft_s": statistics.median(ttft),
        "ttft_s_repeats": ttft,
        "ttft_spread": spread(ttft),
        "perf_tokens_per_s": statistics.median(per_s),
        "perf_tokens_per_s_repeats": per_s,
        "perf_peak_device_mem_mb": peak_mb,
    }
    steps = [t for t in tpot if t is not None]
    if steps:
        fields.update(tpot_s=statistics.median(steps), tpot_s_repeats=steps, tpot_spread=spread(steps))
    notes = []
    nbytes, how = decode_bytes_per_token(model, len(prompt_ids) + tokens / 2)
    fields["decode_bytes_per_token"] = nbytes
    peak_gbs, source = adapter.peak_bandwidth_gbs()
    if peak_gbs and fields["tpot_s"]:
        fields["bandwidth_utilisation"] = nbytes / fields["tpot_s"] / (peak_gbs * 1e9)
        notes.append(f"bandwidth: {how}, against {peak_gbs:g} GB/s ({source})")
    else:
        notes.append(f"bandwidth utilisation not measured: {source}")
    timed = "on the device's own clock" if own_clock else "on the host's wall clock"
    fields["perf_note"] = f"{repeats} repeats of {tokens} tokens after a warm-up, {timed}; " + "; ".join(notes)
    return fields


def perf_fields(record: Mapping[str, Any], settings: dict, result: dict, adapter) -> dict:
    """The perf fields for ``record`` (its verdict's ``result`` holds the model, still on the device): measured
    (``measure``), or why not; a measurement that raises is a note, never a verdict change."""
    why = why_not(record, settings)
    if why is not None:
        return not_measured(why)
    if result.get("model") is None:
        return not_measured("the verdict's model was not kept")
    try:
        return measure(result["model"], result["tokenizer"], result["input_ids"], settings, adapter)
    except Exception as exc:  # noqa: BLE001 the perf phase is a measurement beside the verdict
        return not_measured(f"the perf phase raised {type(exc).__name__}: {exc}"[:2000])
