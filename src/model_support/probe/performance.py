"""How fast a PASS runs on its device: the perf phase, repeated, after the verdict's generation.

Why: the verdict's generation times 8 tokens once, compilation included; a team porting a stack asks how
fast a model decodes in steady state and whether that moved. So, in the device phase, after the verdict and
before the device is released (``run.py``), the same model generates ``perf_tokens`` greedy tokens from the
probe's own prompt once as a warm-up (``perf_first_call_s``: compilation and first-call costs included), then
``perf_repeats`` more times, each timed per token after a device sync (``probe_core.StepTimer``): TTFT (the
prompt's prefill and first token), TPOT (the median of the seconds between tokens after it: a pause of the
host on one token moves no median, where it would move a mean) and tokens/s over the whole generation, with their medians, their per-repeat values (the gate's noise estimate, ``analysis.decision``) and their spread
((max - min) / median). End of sequence is suppressed (``min_new_tokens``) so every repeat decodes as many
tokens. The model bandwidth utilisation (MBU) is the bytes a decode step reads (the parameters, only the
active experts' share of a mixture of experts, plus the KV cache at the mean position) over TPOT, against the
peak bandwidth the device adapter declares (``peak_bandwidth_gbs``; none on the CPU).

With ``perf_trace`` on, one more generation after the timed repeats (so the profiler slows none of them) runs
under torch.profiler with the activities the adapter offers (``Adapter.profiler_activities``, as the compiled runs'
``instruments.profiled``); its Chrome trace (Perfetto opens it), gzipped, is kept beside the record and named by
``perf_trace_path``. A stack whose adapter offers no profiler keeps none, and the note says so.

A measurement that cannot run, or raises, is a note (``perf_note``), never a verdict change; so is a trace that
could not be kept. The fields are the record's group ``perf`` (``record.schema``).
"""

from __future__ import annotations

import gc
import gzip
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..fileio import atomic_write_bytes
from ..record import schema, store
from . import probe_core
from .instruments import profiled

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


def trace_keeper(
    record: Mapping[str, Any], settings: dict, adapter
) -> tuple[Callable[[bytes], str] | None, str | None]:
    """(keep, None): how to keep a trace (``perf_trace`` on: ``keep_trace``); (None, why): asked for, but no trace
    can be made or kept; (None, None): not asked for."""
    if not settings.get("perf_trace"):
        return None, None
    if not tuple(adapter.profiler_activities):
        return None, f"the {adapter.type} adapter offers no profiler"
    if not settings.get("record_path"):
        return None, "the probe keeps no files without a record_path"
    return (lambda data: keep_trace(data, record.get("sweep_id"), settings["record_path"])), None


def keep_trace(data: bytes, sweep_id: str | None, record_path: str) -> str:
    """Keep a trace's gzipped ``data`` beside the record (``store.TRACES/<sha256>.json.gz`` in ``record_path``'s
    folder: a sweep's driver copies it into the sweep's folder, ``store.keep_traces``); returns its path relative to
    the data folder in a sweep (``store.trace_relpath``), else relative to the record's folder."""
    name = store.trace_name(data)
    atomic_write_bytes(Path(record_path).parent / store.TRACES / name, data)
    return store.trace_relpath(sweep_id, name) if sweep_id else f"{store.TRACES}/{name}"


def chrome_trace(run: Callable[[], Any], activities) -> bytes:
    """``run`` (one generation) under torch.profiler with the adapter's ``activities`` (no shapes, stacks or memory):
    its Chrome trace JSON, gzipped (tiny-gpt2's 4 tokens on the CPU: 450 KB of JSON, 31 KB gzipped). torch's exporter
    writes a file itself: it goes to a temporary folder outside the data folder, whose writes are ``fileio``'s."""
    from torch.profiler import profile

    with profile(activities=profiled.activities(activities)) as prof:
        run()
    with tempfile.TemporaryDirectory(prefix="perf-trace-") as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        return gzip.compress(path.read_bytes(), mtime=0)  # mtime 0: the same trace, the same bytes and name


def _traced(run: Callable[[], Any], adapter, keep: Callable[[bytes], str]) -> tuple[str | None, str]:
    """(path, note) of the perf phase's profiled generation; a profiler or a write that fails is a note."""
    activities = tuple(adapter.profiler_activities)
    try:
        path = keep(chrome_trace(run, activities))
    except Exception as exc:  # noqa: BLE001 the trace is a measurement beside the timed repeats
        return None, f"no profiler trace: {type(exc).__name__}: {exc}"[:500]
    return path, f"one more generation profiled ({', '.join(activities)}) after the timed ones: {path}"


def measure(
    model, tokenizer, prompt_ids: list[int], settings: dict, adapter, keep: Callable[[bytes], str] | None = None
) -> dict:
    """The perf fields of a PASS, measured on ``adapter``'s device with the verdict's ``model`` (still on it) and
    prompt (``prompt_ids``), in the probe's mode (compile: its forward compiled again, so the first call pays
    the compilation; fused: TorchTPU's deferred-and-fused eager). ``keep``: profile one more generation after the
    timed ones and keep its trace so (``trace_keeper``)."""
    import torch

    tokens, repeats = int(settings["perf_tokens"]), int(settings["perf_repeats"])
    device = adapter.torch_device
    synchronize = adapter.synchronize if adapter.type != "cpu" else None
    own_clock = adapter.perf_clock(settings["mode"])
    clock = own_clock or time.perf_counter
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    mask = torch.ones_like(ids)
    mode = settings["mode"]
    eager_forward = probe_core.compile_forward(model, adapter.compile_backend()) if mode == "compile" else None
    adapter.reset_peak_memory()
    trace: tuple[str | None, str] | None = None  # the profiled generation's (path, note), when kept
    try:
        with probe_core.execution_context(mode):
            # the warm-up on the host's wall clock: compilation is the host's work, which no device timeline shows
            began = time.perf_counter()
            _one_run(model, tokenizer, ids, mask, tokens, device, synchronize, clock)
            first_call = time.perf_counter() - began
            ttft, tpot, per_s = [], [], []
            gc.collect()  # as timeit does: no collection of the verdict's garbage inside a timed repeat
            gc.disable()
            for _ in range(repeats):
                start, times = _one_run(model, tokenizer, ids, mask, tokens, device, synchronize, clock)
                ttft.append(times[0] - start)
                steps = [after - before for before, after in zip(times, times[1:])]
                tpot.append(statistics.median(steps) if steps else None)  # a stray pause moves no median
                per_s.append(len(times) / (times[-1] - start))
            gc.enable()
            if keep is not None:  # after the timed repeats: the profiler slows none of them
                trace = _traced(
                    lambda: _one_run(model, tokenizer, ids, mask, tokens, device, synchronize, clock), adapter, keep
                )
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
    if trace is not None:
        fields["perf_trace_path"], said = trace
        notes.append(said)
    timed = f"on the device's own clock (torch.{adapter.type}.perf_clock)" if own_clock else "on the host's wall clock"
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
    positions, need = probe_core.positions_of(result["model"]), len(result["input_ids"]) + int(settings["perf_tokens"])
    if positions is not None and need > positions:  # as the length axis checks max_new_tokens
        return not_measured(
            f"max_position_embeddings={positions} cannot hold the prompt's {len(result['input_ids'])} tokens plus "
            f"perf_tokens={settings['perf_tokens']} (ask for at most {positions - len(result['input_ids'])})"
        )
    keep, no_trace = trace_keeper(record, settings, adapter)
    try:
        fields = measure(result["model"], result["tokenizer"], result["input_ids"], settings, adapter, keep)
    except Exception as exc:  # noqa: BLE001 the perf phase is a measurement beside the verdict
        return not_measured(f"the perf phase raised {type(exc).__name__}: {exc}"[:2000])
    if no_trace:
        fields["perf_note"] += f"; no profiler trace: {no_trace}"
    return fields
