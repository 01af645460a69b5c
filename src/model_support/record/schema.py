"""The record, declared once (``Record``: per field its type, group, version and doc).

One probe writes one record (a JSON object); the dataset's columns are exactly the record's fields.
The Arrow schema, the field groups (``HUB_FIELDS``, ``SHARDED_FIELDS``, ...), the dataset card's
field table and what older files read as all derive from the declaration, so a field is added in one
line. Readers must accept older Parquet files that lack newer columns (see ``store.scan``): every
column is nullable for that reason.
"""

from __future__ import annotations

import numbers
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

import pyarrow as pa

#: The tasks a probe runs (``probe_core.TASKS``); a null ``task`` in older files reads as
#: text-generation.
TEXT_GENERATION = "text-generation"
IMAGE_TEXT_TO_TEXT = "image-text-to-text"

#: The four verdicts, exactly these strings (docs/design.md).
PASS = "PASS"
FAIL_LOAD = "FAIL(load)"
FAIL_GEN = "FAIL(gen)"
FAIL_OTHER = "FAIL(other)"
VERDICTS = (PASS, FAIL_LOAD, FAIL_GEN, FAIL_OTHER)

#: The variant of a probe run with the default mode and cache (null ``variant`` in older files reads
#: as it).
DEFAULT_VARIANT = "eager+dynamic"

#: Where a failure happened, kept beside the verdict so that no detail is lost.
STAGES = ("download", "load", "template", "compile", "generate", "runner")

STAGE_HELP = {
    "download": "the repo holds no weights transformers can load (only .gguf, onnx, ...): a real answer "
    "about the model; the network, the disk and access rights never end here (pending or "
    "excluded instead)",
    "load": "resolving, downloading or loading config, tokenizer or weights, or moving them to the "
    "device",
    "template": "rendering the prompt through the tokenizer's chat template",
    "compile": "torch.compile's machinery (dynamo tracing, the backend compiler) while generating in "
    "compile mode",
    "generate": "greedy generation on the device",
    "runner": "the harness: device set-up, kernel death, timeout, a probe that wrote no record",
}

#: Whose failure it is (beside the verdict, never changing it): the failure rerun on the CPU
#: reference.
ATTRIBUTIONS = ("stack", "model", "both")
ATTRIBUTION_HELP = {
    "stack": "the reference run passes: the failure belongs to the device stack (what a porting team "
    "fixes)",
    "model": "the reference run fails with the same signature: the model (config, weights, code or "
    "transformers) is broken everywhere",
    "both": "the reference run fails with a different signature (kept in reference_signature)",
}

VERDICT_HELP = {
    PASS: "loaded and generated",
    FAIL_LOAD: "an exception while loading config, tokenizer or weights, or weights left newly "
    "initialised",
    FAIL_GEN: "loaded, but generation raised",
    FAIL_OTHER: "chat-template errors, out-of-memory, kernel death, timeout, harness errors",
}
#: One colour per verdict (and for excluded rows), everywhere: the probe summary, the report, the
#: explorer.
VERDICT_COLORS = {
    PASS: "#2e7d32",
    FAIL_LOAD: "#ef6c00",
    FAIL_GEN: "#c62828",
    FAIL_OTHER: "#6a1b9a",
    "excluded": "#757575",
    "not probed": "#9e9e9e",
}


def verdict_color(status: str | None) -> str:
    return VERDICT_COLORS.get(status or "", "#555555")


class Versions(TypedDict):
    """The stack a record ran on (``provenance.versions``): one Arrow struct column."""

    python: str | None
    torch: str | None
    torch_tpu: str | None
    libtpu: str | None
    transformers: str | None
    tokenizers: str | None
    accelerate: str | None
    model_support: str | None
    git_commit: str | None


@dataclass(frozen=True)
class Col:
    """What the record's declaration says of a field besides its name and type: its ``group``
    (one of ``GROUPS``), the record version it appeared in (``since``; files from before read it
    as null, or as ``older`` when that says what those rows meant) and a one-line ``doc`` (the
    dataset card's field table)."""

    group: str
    since: int
    doc: str
    older: Any = None


#: Groups of fields, in the order the dataset card lists them; code asks for a group by name
#: (``names_in``).
GROUPS = {
    "identity": "which run a row is",
    "model": "what was learned about the model",
    "verdict": "the outcome, and the error behind a failure",
    "generation": "the prompt and what came out",
    "settings": "the probe settings the run used",
    "device": "where it ran",
    "download": "the download stage (Hub models)",
    "timing": "how long each stage took",
    "compile": "execution modes: torch.compile's accounting, agreement with eager",
    "sharded": "runs over more than one device",
    "memory": "peak memory",
    "reference": "the CPU reference check and whose failure it is",
    "numerics": "is a PASS right: agreement with the reference on logits, and the fluency judge",
    "provenance": "the stack, the host, and how to see or reproduce the run",
    "hub": "the Hub's metadata (null for local folders)",
    "ops": "the operators the probe dispatched to its device (its census) and what the stack lacks "
    "of them",
    "perf": "how fast a PASS runs on its device: repeats after the verdict, compile apart, bandwidth "
    "utilisation",
    "host": "what a PASS costs the host: device-to-host syncs and CPU fallbacks per decode token, as "
    "the stack counts them",
    "what_if": "a what-if run: operators the device lacks or gets wrong run on the host's CPU kernels "
    "(host_ops)",
}

#: The record's current version: the highest ``since`` (raise it when adding fields, and give them
#: that ``since``). 1: the first fields; 2: token counts; 3: downloads and Hub metadata; 4:
#: attribution; 5: variants and execution modes; 6: runs over several devices; 7: what each rank of
#: such a run said; 8: where the run's notebook and log are published; 9: whether a PASS is right
#: (logit agreement, fluency judge); 10: the task (image-text-to-text beside text-generation); 11:
#: the repro script's settings and body hash (the body stored once, ``repro/<sha256>.py``); 12: why
#: a compiled run was not compared with eager; 13: the operator census and the stack's coverage of
#: it; 14: the whole installed stack's hash (``stack_sha``; the list in sweep.json); 15: torch's CPU
#: threads where the model ran (``cpu_threads``: the timings depend on it); 16: performance measured
#: over repeats in the device phase (TTFT, TPOT, tokens/s, their spread, bandwidth utilisation,
#: per-operator device time); 17: where the numbers go wrong (the operator a silent crash died in,
#: host syncs and CPU fallbacks per token, recompiles across prompt lengths); 18: attempts (a
#: changed verdict rerun before it counts, ``flaky``) and the stack a row ran on in a sweep of
#: several (``stack_name``); 19: the perf phase's profiler trace (``perf_trace_path``); 20: the
#: device backend a row ran on, as its adapter declares it (``backend_versions``: its packages and
#: runtime; ``backend_config``: its settings); 21: how the perf phase sized itself
#: (``perf_repeats_run``, ``perf_stop``) and its device seconds (``perf_device_s``). 22: what-if
#: runs (``what_if``, ``host_ops`` and what ran on the host, ``probe.host_ops``). 23: what a
#: compiled run ran as (``compile_dynamic``, ``compile_cache``, ``recompile_limit_hit``: TorchTPU
#: compiles with dynamic=False, so a compiled run takes the static KV cache) and its recompiles
#: counted on the probe's own backend (``recompiles_backend``). 24: agreement over a long real text
#: (``long_text_*``: top-1 and top-5 per path, where it diverges, the gated rate). 24 also: which
#: measure judged a PASS's numerics (``numerics_measure``) and the scale-free one
#: (``reference_logit_error``).
VERSION = 24


class Record(TypedDict):
    """One probe's record, declared once: each field's type (the Arrow type follows from it,
    ``arrow_type``), group, version and doc. The Arrow schema, the field groups, the dataset
    card's field table and what older files read as all derive from it. Adding a field is one
    line here (every field is nullable)."""

    sweep_id: Annotated[str | None, Col("identity", 1, "the sweep: <name>-<UTC time>-<4 hex>")]
    model_id: Annotated[str | None, Col("identity", 1, "the Hub id, or local:<folder name>")]
    revision: Annotated[
        str | None, Col("identity", 1, "the revision asked for (null: the default branch)")
    ]
    revision_sha: Annotated[
        str | None, Col("download", 3, "the commit the files were downloaded at")
    ]
    model_type: Annotated[str | None, Col("model", 1, "config.model_type")]
    architectures: Annotated[list[str] | None, Col("model", 1, "config.architectures")]
    task: Annotated[
        str | None,
        Col(
            "model",
            10,
            "text-generation or image-text-to-text: what the probe ran",
            older=TEXT_GENERATION,
        ),
    ]
    num_params: Annotated[int | None, Col("model", 1, "parameters of the loaded model")]
    status: Annotated[
        str | None,
        Col("verdict", 1, "PASS, FAIL(load), FAIL(gen) or FAIL(other); null when excluded"),
    ]
    failure_stage: Annotated[str | None, Col("verdict", 1, "where it failed (STAGES)")]
    error_type: Annotated[str | None, Col("verdict", 1, "the exception's class name")]
    error_message: Annotated[str | None, Col("verdict", 1, "the exception's message")]
    traceback: Annotated[str | None, Col("verdict", 1, "the traceback, trimmed")]
    failure_signature: Annotated[
        str | None, Col("verdict", 1, "the error with volatile parts replaced, @ where")
    ]
    prompt: Annotated[str | None, Col("generation", 1, "the prompt before the chat template")]
    image_sha256: Annotated[
        str | None,
        Col("generation", 10, "sha256 of the probe image's RGB bytes (image-text-to-text)"),
    ]
    chat_template_used: Annotated[
        bool | None, Col("generation", 1, "whether the chat template rendered it")
    ]
    tokens_in: Annotated[int | None, Col("generation", 2, "prompt tokens, after the chat template")]
    image_tokens: Annotated[
        int | None, Col("generation", 10, "the image's share of tokens_in (image-text-to-text)")
    ]
    tokens_out: Annotated[int | None, Col("generation", 2, "tokens generated beyond the input")]
    output_token_ids: Annotated[list[int] | None, Col("generation", 1, "the generated token ids")]
    generated_text: Annotated[str | None, Col("generation", 1, "the generated tokens, decoded")]
    failed_step: Annotated[
        int | None, Col("generation", 1, "new tokens generated before generation raised")
    ]
    max_new_tokens: Annotated[int | None, Col("settings", 1, "greedy new tokens asked for")]
    variant: Annotated[
        str | None, Col("identity", 5, "mode+cache[+<n>t][@<stack>]", older=DEFAULT_VARIANT)
    ]
    stack_name: Annotated[
        str | None,
        Col(
            "identity", 18, "the stack it ran on in a sweep of several (`stacks:`); null: one stack"
        ),
    ]
    mode: Annotated[str | None, Col("settings", 5, "eager, fused or compile")]
    cache: Annotated[str | None, Col("settings", 5, "the KV cache: dynamic or static")]
    dtype: Annotated[str | None, Col("settings", 1, "the dtype the model was loaded in")]
    seed: Annotated[int | None, Col("settings", 1, "torch seed before generation")]
    trust_remote_code: Annotated[
        bool | None, Col("settings", 1, "whether the model's own code was allowed")
    ]
    device_type: Annotated[str | None, Col("device", 1, "cpu, cuda, tpu, ...")]
    device_name: Annotated[str | None, Col("device", 1, "the device's name")]
    device_count: Annotated[
        int | None, Col("device", 1, "devices of that kind visible to the probe")
    ]
    download_s: Annotated[float | None, Col("download", 3, "seconds downloading")]
    download_bytes: Annotated[int | None, Col("download", 3, "bytes downloaded")]
    load_s: Annotated[float | None, Col("timing", 1, "seconds loading from the local files")]
    first_token_s: Annotated[
        float | None, Col("timing", 1, "seconds to the first new token (compilation included)")
    ]
    generate_s: Annotated[float | None, Col("timing", 1, "seconds generating")]
    decode_tokens_per_s: Annotated[
        float | None, Col("timing", 1, "new tokens per second after the first")
    ]
    cpu_threads: Annotated[
        int | None,
        Col(
            "timing",
            15,
            "torch's CPU threads where the model ran (each rank's, sharded): timings depend on it",
        ),
    ]
    compile_backend: Annotated[
        str | None, Col("compile", 5, "torch.compile's backend (inductor, tpu)")
    ]
    compile_s: Annotated[float | None, Col("compile", 5, "the first forward, compilation included")]
    graphs: Annotated[int | None, Col("compile", 5, "graphs compiled")]
    graph_breaks: Annotated[int | None, Col("compile", 5, "graph breaks")]
    graph_break_reasons: Annotated[
        list[str] | None, Col("compile", 5, "the first graph break reasons")
    ]
    recompilations: Annotated[int | None, Col("compile", 5, "graphs beyond the first")]
    recompile_limit_hit: Annotated[
        bool | None,
        Col(
            "compile",
            23,
            "a frame recompiled past dynamo's recompile limit: it ran eagerly from there",
        ),
    ]
    compile_dynamic: Annotated[
        bool | None,
        Col(
            "compile",
            23,
            "torch.compile's dynamic as the stack sets it for its backend (false: TorchTPU's; "
            "null: auto)",
        ),
    ]
    compile_cache: Annotated[
        str | None,
        Col(
            "compile", 23, "the KV cache the compiled run used (static where the compile is static)"
        ),
    ]
    recompile_lengths: Annotated[
        list[int] | None,
        Col(
            "compile",
            17,
            "recompile_check: the prompt lengths generated from (the verdict's first)",
        ),
    ]
    recompiles_static: Annotated[
        list[int] | None,
        Col("compile", 17, "recompiles at each of those lengths, automatic dynamic shapes off"),
    ]
    recompiles_dynamic: Annotated[
        list[int] | None,
        Col("compile", 17, "recompiles at each of those lengths, automatic dynamic shapes on"),
    ]
    recompile_flag: Annotated[
        str | None,
        Col(
            "compile",
            17,
            "per length and/or per token: the last length recompiled with dynamic shapes on; "
            "null: no",
        ),
    ]
    recompile_guard: Annotated[
        str | None,
        Col(
            "compile",
            17,
            "the guard behind the flag (else the first that failed), as dynamo says it",
        ),
    ]
    recompiles_backend: Annotated[
        list[int] | None,
        Col(
            "compile",
            23,
            "recompiles at each of those lengths on the probe's own backend, as the probe compiles",
        ),
    ]
    recompile_note: Annotated[
        str | None, Col("compile", 17, "how the recompiles were counted, or why not")
    ]
    matches_eager: Annotated[
        bool | None, Col("compile", 5, "compile or fused: the same tokens as plain eager")
    ]
    matches_eager_note: Annotated[
        str | None, Col("compile", 12, "why matches_eager is null: the eager rerun failed")
    ]
    devices_used: Annotated[int | None, Col("sharded", 6, "devices the probe ran on", older=1)]
    parallelism: Annotated[str | None, Col("sharded", 6, "none, tp or ep", older="none")]
    tp_size: Annotated[int | None, Col("sharded", 6, "tensor parallel degree")]
    ep_size: Annotated[int | None, Col("sharded", 6, "expert parallel degree")]
    memory_estimate_bytes: Annotated[
        int | None, Col("sharded", 6, "weights x dtype bytes x margin")
    ]
    load_s_per_rank: Annotated[list[float] | None, Col("sharded", 6, "load seconds, per rank")]
    generate_s_per_rank: Annotated[
        list[float] | None, Col("sharded", 6, "generate seconds, per rank")
    ]
    peak_device_mem_mb_per_rank: Annotated[
        list[float] | None, Col("sharded", 7, "peak device memory, per rank")
    ]
    ranks_agree: Annotated[bool | None, Col("sharded", 7, "every rank generated the same tokens")]
    rank_errors: Annotated[
        list[str] | None, Col("sharded", 7, "what each rank that raised said, one line each")
    ]
    rank_log_tail: Annotated[
        str | None, Col("sharded", 7, "the end of the failed ranks' stderr (stacks of a hang)")
    ]
    peak_host_mem_mb: Annotated[
        float | None, Col("memory", 1, "peak host memory of the probe process, in MiB")
    ]
    peak_device_mem_mb: Annotated[
        float | None, Col("memory", 1, "peak device memory (the most of any rank), in MiB")
    ]
    device_mem_source: Annotated[
        str | None, Col("memory", 1, "where the device memory figure comes from")
    ]
    compile_cache_hits: Annotated[
        int | None, Col("device", 1, "the device's compilation cache hits")
    ]
    compile_cache_misses: Annotated[
        int | None, Col("device", 1, "the device's compilation cache misses")
    ]
    reference_device: Annotated[str | None, Col("reference", 1, "cpu:<dtype> of the reference run")]
    reference_match: Annotated[
        bool | None, Col("reference", 1, "the same greedy tokens as the reference")
    ]
    first_divergence: Annotated[int | None, Col("reference", 1, "the first new token that differs")]
    reference_note: Annotated[
        str | None, Col("reference", 1, "why the reference or attribution did not run")
    ]
    attribution: Annotated[str | None, Col("reference", 4, "whose failure: stack, model or both")]
    reference_signature: Annotated[
        str | None, Col("reference", 4, "the reference's own signature (both)")
    ]
    numerics: Annotated[
        str | None,
        Col("numerics", 9, "a PASS's logits against the reference: match, ties or diverges"),
    ]
    numerics_step: Annotated[
        int | None, Col("numerics", 9, "the step it rests on: the first that diverges, else flips")
    ]
    numerics_note: Annotated[
        str | None, Col("numerics", 9, "what happened at that step, or why no reference ran")
    ]
    reference_agreement: Annotated[
        float | None, Col("numerics", 9, "the share of steps whose top token agrees")
    ]
    reference_max_kl: Annotated[
        float | None, Col("numerics", 9, "the largest KL(reference || device), nats (top-k)")
    ]
    reference_flip_margin: Annotated[
        float | None, Col("numerics", 9, "the largest flip's margin below the best, nats")
    ]
    numerics_measure: Annotated[
        str | None,
        Col(
            "numerics",
            24,
            "what judged numerics: logit error (every step, with KL and flips), the "
            "measure(s) that diverged, or KL alone (too flat); null: no reference, or a row "
            "from before (KL and the flip margin alone)",
        ),
    ]
    reference_logit_error: Annotated[
        float | None,
        Col(
            "numerics",
            24,
            "the largest per step: the device's top-k logits off the reference's (RMS, a "
            "shift aside) over the reference's spread across the vocabulary; scale-free",
        ),
    ]
    fluent: Annotated[
        bool | None, Col("numerics", 9, "the fluency judge's verdict on the generated text")
    ]
    fluency_score: Annotated[
        float | None, Col("numerics", 9, "the judge's mean log-probability per token")
    ]
    fluency_note: Annotated[
        str | None, Col("numerics", 9, "the repetition measure, or why the judge did not run")
    ]
    long_text_tokens: Annotated[
        int | None, Col("numerics", 24, "long text: positions compared with the reference")
    ]
    long_text_text: Annotated[
        str | None, Col("numerics", 24, "long text: which text, name:sha256 (two_cities:...)")
    ]
    long_text_prefill_top1: Annotated[
        float | None,
        Col("numerics", 24, "long text, one prefill: share of positions whose top token agrees"),
    ]
    long_text_prefill_top5: Annotated[
        float | None,
        Col(
            "numerics",
            24,
            "long text, one prefill: share whose top token is in the reference's top 5",
        ),
    ]
    long_text_decode_top1: Annotated[
        float | None,
        Col("numerics", 24, "long text, token by token through the KV cache: top-1 agreement"),
    ]
    long_text_decode_top5: Annotated[
        float | None,
        Col("numerics", 24, "long text, token by token through the KV cache: top-5 agreement"),
    ]
    long_text_first_disagreement: Annotated[
        int | None,
        Col("numerics", 24, "long text: the first position whose top token differs (either path)"),
    ]
    long_text_prefill_diverges_at: Annotated[
        int | None,
        Col("numerics", 24, "long text, prefill: first position beyond the margin or the top 5"),
    ]
    long_text_decode_diverges_at: Annotated[
        int | None,
        Col(
            "numerics",
            24,
            "long text, decode: the step where it first diverges (localise replays it)",
        ),
    ]
    long_text_rate: Annotated[
        float | None,
        Col(
            "numerics",
            24,
            "long text: lowest agreement within the margin over 128-position windows (gated)",
        ),
    ]
    long_text_device_s: Annotated[
        float | None, Col("numerics", 24, "long text: the device's seconds, both paths")
    ]
    long_text_note: Annotated[
        str | None, Col("numerics", 24, "long text: what it found, or why it did not run")
    ]
    versions: Annotated[
        Versions | None, Col("provenance", 1, "python, torch, torch_tpu, libtpu, transformers, ...")
    ]
    stack_sha: Annotated[
        str | None,
        Col(
            "provenance", 14, "sha256 (16 hex) of every installed distribution: sweep.json's stack"
        ),
    ]
    backend_versions: Annotated[
        list[str] | None,
        Col(
            "provenance",
            20,
            "the device backend's own packages, then its toolkit or runtime, as its adapter "
            "declares them (`torch_tpu 0.2.0`, `cuda-toolkit 12.8`); empty: torch alone (the "
            "CPU)",
        ),
    ]
    backend_config: Annotated[
        str | None,
        Col(
            "provenance",
            20,
            "JSON: the device backend's own settings as the probe ran (its adapter's "
            "variables; a value not safe to show, by its fingerprint); null: none set",
        ),
    ]
    host: Annotated[str | None, Col("provenance", 1, "the host's name")]
    ray_node: Annotated[
        str | None, Col("provenance", 24, "under Ray: the id of the node the probe ran on")
    ]
    reran_after: Annotated[
        str | None,
        Col(
            "provenance",
            24,
            "why the probe ran a second time: its first run told nothing (a lost node)",
        ),
    ]
    started_at: Annotated[str | None, Col("provenance", 1, "UTC, ISO 8601")]
    duration_s: Annotated[float | None, Col("timing", 1, "the whole probe, in seconds")]
    notebook_path: Annotated[
        str | None, Col("provenance", 1, "the executed notebook, relative to the data folder")
    ]
    notebook_url: Annotated[
        str | None, Col("provenance", 8, "the executed notebook where `push --logs` published it")
    ]
    log_url: Annotated[
        str | None, Col("provenance", 8, "the probe's log where `push --logs` published it")
    ]
    repro_script: Annotated[
        str | None,
        Col(
            "provenance",
            1,
            "older files: the whole standalone script (now: repro_settings + repro_sha256)",
        ),
    ]
    repro_settings: Annotated[
        str | None,
        Col(
            "provenance",
            11,
            "JSON: the probe's settings as it ran them, the repro script's SETTINGS",
        ),
    ]
    repro_sha256: Annotated[
        str | None,
        Col("provenance", 11, "the repro script's body, `repro/<sha256>.py` beside the data"),
    ]
    exclusion_reason: Annotated[
        str | None, Col("verdict", 1, "why the row has no verdict (excluded)")
    ]
    attempts: Annotated[
        str | None,
        Col(
            "verdict",
            18,
            "JSON list, first first: each attempt's status, suspect, failure_signature, "
            "started_at, duration_s (a verdict that differed from the baseline's, rerun "
            "before it counts); null: run once",
        ),
    ]
    flaky: Annotated[
        bool | None,
        Col(
            "verdict",
            18,
            "an attempt passed and one did not: the record is the first that did not pass",
        ),
    ]
    pipeline_tag: Annotated[str | None, Col("hub", 3, "the Hub's pipeline tag")]
    library_name: Annotated[str | None, Col("hub", 3, "the Hub's library name")]
    downloads: Annotated[int | None, Col("hub", 3, "downloads (last 30 days)")]
    likes: Annotated[int | None, Col("hub", 3, "likes")]
    trending_score: Annotated[int | None, Col("hub", 3, "trending score")]
    gated: Annotated[str | None, Col("hub", 3, "auto, manual, or null")]
    license: Annotated[str | None, Col("hub", 3, "the license the card names")]
    created_at: Annotated[str | None, Col("hub", 3, "when the repo was created")]
    base_model: Annotated[str | None, Col("hub", 3, "the base model the card names")]
    hub_num_params: Annotated[
        int | None, Col("hub", 3, "parameters, from the Hub's safetensors metadata")
    ]
    ops: Annotated[
        list[str] | None,
        Col(
            "ops",
            13,
            "operators dispatched to the device (composites decomposed), first call first",
        ),
    ]
    ops_stages: Annotated[
        list[str] | None, Col("ops", 13, "the stage of each operator's first call")
    ]
    ops_calls: Annotated[
        list[int] | None, Col("ops", 13, "how often each operator was called in the probe")
    ]
    ops_source: Annotated[
        str | None,
        Col("ops", 13, "where the census came from: run, reference (the run stopped) or partial"),
    ]
    ops_missing: Annotated[
        list[str] | None, Col("ops", 13, "census operators the device's stack lacks")
    ]
    ops_fallback: Annotated[
        list[str] | None, Col("ops", 13, "census operators the stack runs on the CPU (fallback)")
    ]
    ops_unknown: Annotated[
        list[str] | None, Col("ops", 13, "census operators the device adapter cannot judge")
    ]
    ops_device_s: Annotated[
        list[float] | None,
        Col("ops", 16, "seconds each census operator took in the verdict's generation"),
    ]
    ops_time_source: Annotated[
        str | None,
        Col(
            "ops",
            16,
            "how ops_device_s was timed, or why not (not measured: compile, async device)",
        ),
    ]
    ops_sig_ops: Annotated[
        list[str] | None,
        Col(
            "ops",
            17,
            "per (operator, dtype signature), first call first: its operator (parallel "
            "ops_sig_* lists)",
        ),
    ]
    ops_sig_dtypes: Annotated[
        list[str] | None,
        Col(
            "ops",
            17,
            "its dtype signature: the tensor arguments' dtypes in order, ->dtype if named "
            "(bf16->f32)",
        ),
    ]
    ops_sig_calls: Annotated[list[int] | None, Col("ops", 17, "its calls in the probe")]
    ops_sig_min_rank: Annotated[
        list[int] | None, Col("ops", 17, "the lowest rank it was called with")
    ]
    ops_sig_max_rank: Annotated[
        list[int] | None, Col("ops", 17, "the highest rank it was called with")
    ]
    ops_sig_device_s: Annotated[
        list[float] | None,
        Col("ops", 17, "its seconds in the verdict's generation (as ops_device_s)"),
    ]
    profiled_ops: Annotated[
        list[str] | None,
        Col(
            "ops",
            17,
            "a compiled run's aten operators and compiled graph regions as its profiler saw them",
        ),
    ]
    profiled_ops_calls: Annotated[
        list[int] | None, Col("ops", 17, "each profiled_ops entry's calls in the generation")
    ]
    profiled_ops_s: Annotated[
        list[float] | None,
        Col("ops", 17, "each profiled_ops entry's self seconds (device time where profiled)"),
    ]
    perf_tokens_out: Annotated[
        int | None, Col("perf", 16, "new tokens per perf repeat (perf_tokens)")
    ]
    perf_first_call_s: Annotated[
        float | None,
        Col(
            "perf",
            16,
            "the first generation of the model as timed (the verdict's, or in compile mode "
            "the phase's warm-up), compilation and first calls included (host clock)",
        ),
    ]
    perf_repeats_run: Annotated[
        int | None, Col("perf", 21, "timed repeats the perf phase ran itself (each a warm TTFT)")
    ]
    perf_stop: Annotated[
        str | None,
        Col(
            "perf",
            21,
            "why the repeats stopped: spread (reached perf_spread), budget, cap "
            "(perf_repeats), time (the probe's limit)",
        ),
    ]
    perf_device_s: Annotated[
        float | None,
        Col(
            "perf",
            21,
            "the perf phase's seconds on the device (warm-up, repeats, trace), host clock",
        ),
    ]
    ttft_s: Annotated[
        float | None,
        Col("perf", 16, "time to first token, prefill of the prompt, median of repeats"),
    ]
    ttft_s_repeats: Annotated[list[float] | None, Col("perf", 16, "ttft_s of each repeat")]
    ttft_spread: Annotated[float | None, Col("perf", 16, "(max - min) / median of ttft_s_repeats")]
    tpot_s: Annotated[
        float | None,
        Col("perf", 16, "seconds per output token after the first, median of its samples"),
    ]
    tpot_s_repeats: Annotated[
        list[float] | None,
        Col(
            "perf",
            16,
            "TPOT's samples: each timed generation's median step (the verdict's after its "
            "first, the repeats'), or the verdict's steps where only it decoded",
        ),
    ]
    tpot_spread: Annotated[float | None, Col("perf", 16, "(max - min) / median of tpot_s_repeats")]
    perf_tokens_per_s: Annotated[
        float | None,
        Col("perf", 16, "new tokens per second over a whole generation, median of repeats"),
    ]
    perf_tokens_per_s_repeats: Annotated[
        list[float] | None, Col("perf", 16, "perf_tokens_per_s of each repeat")
    ]
    perf_peak_device_mem_mb: Annotated[
        float | None, Col("perf", 16, "peak device memory over the perf phase, MiB")
    ]
    decode_bytes_per_token: Annotated[
        int | None,
        Col(
            "perf",
            16,
            "bytes a decode step reads: parameters (active experts) + KV cache at mid-run",
        ),
    ]
    bandwidth_utilisation: Annotated[
        float | None,
        Col(
            "perf", 16, "decode_bytes_per_token / tpot_s over the device's declared peak bandwidth"
        ),
    ]
    perf_note: Annotated[str | None, Col("perf", 16, "what was measured and how, or why not")]
    perf_trace_path: Annotated[
        str | None,
        Col(
            "perf",
            19,
            "perf_trace: one more generation's profiler trace (.json.gz), kept in the data "
            "folder, unpublished",
        ),
    ]
    crash_operator: Annotated[
        str | None,
        Col(
            "verdict",
            17,
            "a dead kernel: the operator it died in, by the flight recorder (aten::mm)",
        ),
    ]
    crash_operator_args: Annotated[
        str | None, Col("verdict", 17, "that operator's tensor arguments as dtype[shape], in order")
    ]
    crash_operator_note: Annotated[
        str | None,
        Col(
            "verdict",
            17,
            "how crash_operator was found (last operator, synchronous rerun), or why not",
        ),
    ]
    host_syncs_per_token: Annotated[
        float | None,
        Col(
            "host",
            17,
            "device-to-host syncs (.item(), copies to the host) per decode token, harness apart",
        ),
    ]
    harness_syncs_per_token: Annotated[
        float | None,
        Col(
            "host",
            17,
            "the probe's own syncs per decode token (its timer's sync, its streamer's copy)",
        ),
    ]
    prefill_host_syncs: Annotated[
        int | None, Col("host", 17, "device-to-host syncs of the prompt's prefill")
    ]
    fallback_calls_per_token: Annotated[
        float | None,
        Col("host", 17, "calls of operators that ran on the CPU (fallbacks) per decode token"),
    ]
    fallback_ops: Annotated[
        list[str] | None,
        Col("host", 17, "operators that fell back to the CPU in the generation, first first"),
    ]
    fallback_op_calls: Annotated[
        list[int] | None,
        Col("host", 17, "each fallback operator's calls in the generation (prefill and decode)"),
    ]
    host_cost_note: Annotated[
        str | None, Col("host", 17, "how the host cost was counted, or why not")
    ]
    what_if: Annotated[
        bool | None,
        Col(
            "what_if",
            22,
            "operators ran on the host (host_ops): kept in the what_if config, never a stack "
            "verdict",
        ),
    ]
    host_ops: Annotated[
        str | None,
        Col("what_if", 22, "the host_ops setting: the operators asked on the host, or missing"),
    ]
    host_ops_run: Annotated[
        list[str] | None,
        Col("what_if", 22, "the operator forms registered on the host for the run"),
    ]
    host_ops_note: Annotated[
        str | None, Col("what_if", 22, "what host_ops put on the host, what it could not and why")
    ]
    host_op_names: Annotated[
        list[str] | None, Col("what_if", 22, "the host operators called, first first")
    ]
    host_op_calls: Annotated[
        list[int] | None, Col("what_if", 22, "each host_op_names entry's calls in the run")
    ]
    host_op_calls_per_token: Annotated[
        float | None,
        Col("what_if", 22, "host operator calls per generated token (prefill included)"),
    ]


_SCALARS: dict[type, pa.DataType] = {
    str: pa.string(),
    int: pa.int64(),
    float: pa.float64(),
    bool: pa.bool_(),
}


def arrow_type(annotation: Any) -> pa.DataType:
    """The Arrow type of a declared Python type: str, int, float, bool, a list of one of them, or a
    TypedDict of them (a struct); ``X | None`` is X (every column is nullable)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        (annotation,) = args
        return arrow_type(annotation)
    if typing.get_origin(annotation) is list:
        return pa.list_(arrow_type(args[0]))
    if typing.is_typeddict(annotation):
        return pa.struct([(k, arrow_type(v)) for k, v in typing.get_type_hints(annotation).items()])
    return _SCALARS[annotation]


@dataclass(frozen=True)
class Field:
    """One declared field, as the code reads it."""

    name: str
    type: pa.DataType
    group: str
    since: int
    doc: str
    older: Any = None


def _declared() -> tuple[Field, ...]:
    fields = []
    for name, hint in typing.get_type_hints(Record, include_extras=True).items():
        python, col = typing.get_args(hint)
        if col.group not in GROUPS or not 1 <= col.since <= VERSION:
            raise ValueError(
                f"record field {name}: group {col.group!r} or since {col.since} is not declared"
            )
        fields.append(Field(name, arrow_type(python), col.group, col.since, col.doc, col.older))
    return tuple(fields)


#: Every field, in the order the dataset shows them.
DECLARATION: tuple[Field, ...] = _declared()
#: Column name -> Arrow type.
FIELDS: dict[str, pa.DataType] = {f.name: f.type for f in DECLARATION}
SCHEMA = pa.schema([pa.field(f.name, f.type, nullable=True) for f in DECLARATION])


def names_in(group: str) -> tuple[str, ...]:
    """The fields of one group, in declaration order."""
    if group not in GROUPS:
        raise KeyError(f"no field group {group!r}; the groups are {', '.join(GROUPS)}")
    return tuple(f.name for f in DECLARATION if f.group == group)


#: The Hub's metadata on a record (``hub.metadata``; the same names in ``sweep.json``'s ``hub``
#: dicts).
HUB_FIELDS = names_in("hub")
#: What the download stage adds (``hub_fetch.fetch``).
DOWNLOAD_FIELDS = names_in("download")
#: Execution modes: what a compiled (or fused) run records beyond an eager one.
COMPILE_FIELDS = names_in("compile")
#: A run over several devices (``sharded.run_sharded``'s result keeps them under these names).
SHARDED_FIELDS = names_in("sharded")
#: Whether a PASS is right (docs/numerics.md): the reference's verdict on the device's logits, the
#: judge's on its text.
NUMERICS_FIELDS = names_in("numerics")
#: Fields added after the first sweeps were published: older files lack them.
LATER_FIELDS = tuple(f.name for f in DECLARATION if f.since > 1)
#: What a row written before a field existed means, where that is not null (``frames.older_col``).
OLDER_DEFAULTS = {f.name: f.older for f in DECLARATION if f.older is not None}


def flaky(outcomes: typing.Iterable[tuple[str | None, bool]]) -> bool:
    """Flaky means it passed once: among a rerun's attempts, each (status, suspect), at least one
    a clean PASS and at least one not. Attempts that fail differently (FAIL(load) then FAIL(gen))
    are no flake: the worse failure counts. The one rule of the record's ``flaky``, the rerun
    screen (``sweep.reruns``) and the gate (``analysis.decision``)."""
    clean = [status == PASS and not suspect for status, suspect in outcomes]
    return any(clean) and not all(clean)


def empty_record(**values: Any) -> Record:
    """A record with every field present (null), then ``values`` filled in.

    Unknown keys are a programming error: refused here so a typo never becomes a silent column.
    """
    return fill(typing.cast(Record, dict.fromkeys(FIELDS)), values)


def fill(record: Record, values: typing.Mapping[str, Any]) -> Record:
    """``values`` set on ``record`` (a group of fields at once); a name that is no field is
    refused."""
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise KeyError(
            f"not record fields: {', '.join(unknown)}; the schema is "
            "model_support.record.schema.FIELDS"
        )
    typing.cast(dict, record).update(values)
    return record


def check_record(record: Record) -> Record:
    """Refuse a record whose keys differ from the schema, whose verdict is not one of the four,
    or whose field holds a value of another type than its declaration's (``wrong_type``): said
    where the record is made and stored, naming the field, rather than by Arrow at compaction
    ("Expected bytes, got a 'int' object")."""
    missing = sorted(set(FIELDS) - set(record))
    extra = sorted(set(record) - set(FIELDS))
    if missing or extra:
        raise ValueError(
            f"record fields differ from the schema: missing {missing}, unexpected {extra}"
        )
    if record["status"] is not None and record["status"] not in VERDICTS:
        raise ValueError(f"status {record['status']!r} is not one of {', '.join(VERDICTS)}")
    if record["failure_stage"] is not None and record["failure_stage"] not in STAGES:
        raise ValueError(
            f"failure_stage {record['failure_stage']!r} is not one of {', '.join(STAGES)}"
        )
    for name, arrow in FIELDS.items():
        wrong = wrong_type(record[name], arrow)
        if wrong:
            raise ValueError(f"record of {record['model_id']!r}: field {name}{wrong}")
    return record


#: What each Arrow type of the declaration holds, in words, and the Python values it takes (bool is
#: no number).
_TYPE_WORDS = {
    pa.string(): "text",
    pa.int64(): "an integer",
    pa.float64(): "a number",
    pa.bool_(): "true or false",
}
_INT64 = range(-(2**63), 2**63)


def _fits(value: Any, arrow: pa.DataType) -> bool:
    """Whether ``value`` (not None) is what a column of type ``arrow`` holds (a number of numpy's
    too, as Arrow takes it; a bool is no number)."""
    if arrow == pa.string():
        return isinstance(value, str)
    if arrow == pa.bool_():
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if arrow == pa.int64():
        return isinstance(value, numbers.Integral) and int(value) in _INT64
    if arrow == pa.float64():
        return isinstance(value, numbers.Real)
    return False


def wrong_type(value: Any, arrow: pa.DataType) -> str | None:
    """Why ``value`` does not fit a field of Arrow type ``arrow`` (the rest of a sentence after
    the field's name: " must be ..., not ...", ".python must be ...", " has an item that must be
    ..."), or None: null fits every field; a list's items and a struct's fields are checked as
    fields are."""
    if value is None:
        return None
    if pa.types.is_list(arrow):
        if not isinstance(value, list | tuple):
            return f" must be a list, not {type(value).__name__} {value!r:.80}."
        inner = next((w for w in (wrong_type(item, arrow.value_type) for item in value) if w), None)
        return f" has an item that{inner}" if inner else None
    if pa.types.is_struct(arrow):
        if not isinstance(value, dict):
            return f" must be a mapping, not {type(value).__name__} {value!r:.80}."
        for child in arrow:
            inner = wrong_type(value.get(child.name), child.type)
            if inner:
                return f".{child.name}{inner}"
        return None
    if _fits(value, arrow):
        return None
    return (
        f" must be {_TYPE_WORDS.get(arrow, str(arrow))} ({arrow}), not {type(value).__name__} "
        f"{value!r:.80}."
    )


def to_table(records: list[Record]) -> pa.Table:
    """Records -> an Arrow table with exactly ``SCHEMA``."""
    for record in records:
        check_record(record)
    return pa.Table.from_pylist(records, schema=SCHEMA)
