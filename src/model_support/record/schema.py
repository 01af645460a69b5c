"""The record schema, declared once.

One probe writes one record (a JSON object); the dataset's columns are exactly the record's fields.
The probe, the store, the readers, the report and the tests all use this module, so that a field
is added in one place. Readers must accept older Parquet files that lack newer columns (see
``store.scan``): every column is nullable for that reason.
"""

from __future__ import annotations

import pyarrow as pa

#: The tasks a probe runs (``probe_core.TASKS``); a null ``task`` in older files reads as text-generation.
TEXT_GENERATION = "text-generation"
IMAGE_TEXT_TO_TEXT = "image-text-to-text"

#: The four verdicts, exactly these strings (docs/design.md).
PASS = "PASS"
FAIL_LOAD = "FAIL(load)"
FAIL_GEN = "FAIL(gen)"
FAIL_OTHER = "FAIL(other)"
VERDICTS = (PASS, FAIL_LOAD, FAIL_GEN, FAIL_OTHER)

#: The variant of a probe run with the default mode and cache (null ``variant`` in older files reads as it).
DEFAULT_VARIANT = "eager+dynamic"

#: Where a failure happened, kept beside the verdict so that no detail is lost.
STAGES = ("download", "load", "template", "compile", "generate", "reference", "runner")

STAGE_HELP = {
    "download": "the repo holds no weights transformers can load (only .gguf, onnx, ...): a real answer about the "
    "model; the network, the disk and access rights never end here (pending or excluded instead)",
    "load": "resolving, downloading or loading config, tokenizer or weights, or moving them to the device",
    "template": "rendering the prompt through the tokenizer's chat template",
    "compile": "torch.compile's machinery (dynamo tracing, the backend compiler) while generating in compile mode",
    "generate": "greedy generation on the device",
    "reference": "the CPU reference generation (never changes the verdict)",
    "runner": "the harness: device set-up, kernel death, timeout, a probe that wrote no record",
}

#: Whose failure it is (beside the verdict, never changing it): the failure rerun on the CPU reference.
ATTRIBUTIONS = ("stack", "model", "both")
ATTRIBUTION_HELP = {
    "stack": "the reference run passes: the failure belongs to the device stack (what a porting team fixes)",
    "model": "the reference run fails with the same signature: the model (config, weights, code or transformers) "
    "is broken everywhere",
    "both": "the reference run fails with a different signature (kept in reference_signature)",
}

VERDICT_HELP = {
    PASS: "loaded and generated",
    FAIL_LOAD: "an exception while loading config, tokenizer or weights, or weights left newly initialised",
    FAIL_GEN: "loaded, but generation raised",
    FAIL_OTHER: "chat-template errors, out-of-memory, kernel death, timeout, harness errors",
}

VERSIONS = pa.struct(
    [
        ("python", pa.string()),
        ("torch", pa.string()),
        ("torch_tpu", pa.string()),
        ("libtpu", pa.string()),
        ("transformers", pa.string()),
        ("tokenizers", pa.string()),
        ("accelerate", pa.string()),
        ("model_support", pa.string()),
        ("git_commit", pa.string()),
    ]
)

#: Column name -> Arrow type, in the order the dataset shows them.
FIELDS: dict[str, pa.DataType] = {
    "sweep_id": pa.string(),
    "model_id": pa.string(),
    "revision": pa.string(),
    "revision_sha": pa.string(),
    "model_type": pa.string(),
    "architectures": pa.list_(pa.string()),
    "task": pa.string(),
    "num_params": pa.int64(),
    "status": pa.string(),
    "failure_stage": pa.string(),
    "error_type": pa.string(),
    "error_message": pa.string(),
    "traceback": pa.string(),
    "failure_signature": pa.string(),
    "prompt": pa.string(),
    "image_sha256": pa.string(),
    "chat_template_used": pa.bool_(),
    "tokens_in": pa.int64(),
    "image_tokens": pa.int64(),
    "tokens_out": pa.int64(),
    "output_token_ids": pa.list_(pa.int64()),
    "generated_text": pa.string(),
    "failed_step": pa.int64(),
    "max_new_tokens": pa.int64(),
    "variant": pa.string(),
    "mode": pa.string(),
    "cache": pa.string(),
    "dtype": pa.string(),
    "seed": pa.int64(),
    "trust_remote_code": pa.bool_(),
    "device_type": pa.string(),
    "device_name": pa.string(),
    "device_count": pa.int64(),
    "download_s": pa.float64(),
    "download_bytes": pa.int64(),
    "load_s": pa.float64(),
    "first_token_s": pa.float64(),
    "generate_s": pa.float64(),
    "decode_tokens_per_s": pa.float64(),
    "compile_backend": pa.string(),
    "compile_s": pa.float64(),
    "graphs": pa.int64(),
    "graph_breaks": pa.int64(),
    "graph_break_reasons": pa.list_(pa.string()),
    "recompilations": pa.int64(),
    "matches_eager": pa.bool_(),
    "devices_used": pa.int64(),
    "parallelism": pa.string(),
    "tp_size": pa.int64(),
    "ep_size": pa.int64(),
    "memory_estimate_bytes": pa.int64(),
    "load_s_per_rank": pa.list_(pa.float64()),
    "generate_s_per_rank": pa.list_(pa.float64()),
    "peak_host_mem_mb": pa.float64(),
    "peak_device_mem_mb": pa.float64(),
    "device_mem_source": pa.string(),
    "compile_cache_hits": pa.int64(),
    "compile_cache_misses": pa.int64(),
    "reference_device": pa.string(),
    "reference_match": pa.bool_(),
    "first_divergence": pa.int64(),
    "reference_note": pa.string(),
    "attribution": pa.string(),
    "reference_signature": pa.string(),
    "versions": VERSIONS,
    "host": pa.string(),
    "started_at": pa.string(),
    "duration_s": pa.float64(),
    "notebook_path": pa.string(),
    "repro_script": pa.string(),
    "exclusion_reason": pa.string(),
    # Hub metadata (null for local folders and offline runs)
    "pipeline_tag": pa.string(),
    "library_name": pa.string(),
    "downloads": pa.int64(),
    "likes": pa.int64(),
    "trending_score": pa.int64(),
    "gated": pa.string(),
    "license": pa.string(),
    "created_at": pa.string(),
    "base_model": pa.string(),
    "hub_num_params": pa.int64(),
}

SCHEMA = pa.schema([pa.field(name, typ, nullable=True) for name, typ in FIELDS.items()])

#: Fields added after the first sweeps were published: older files lack them and read as null.
#: The Hub's metadata on a record (``hub.metadata``; the same names in ``sweep.json``'s ``hub`` dicts).
HUB_FIELDS = (
    "pipeline_tag",
    "library_name",
    "downloads",
    "likes",
    "trending_score",
    "gated",
    "license",
    "created_at",
    "base_model",
    "hub_num_params",
)

LATER_FIELDS = (
    "tokens_in",
    "tokens_out",
    "revision_sha",
    "download_s",
    "download_bytes",
    *HUB_FIELDS,
    "attribution",
    "reference_signature",
    "variant",
    "mode",
    "cache",
    "compile_backend",
    "compile_s",
    "graphs",
    "graph_breaks",
    "graph_break_reasons",
    "recompilations",
    "matches_eager",
    "devices_used",
    "parallelism",
    "tp_size",
    "ep_size",
    "memory_estimate_bytes",
    "load_s_per_rank",
    "generate_s_per_rank",
    "task",
    "image_sha256",
    "image_tokens",
)


def empty_record(**values) -> dict:
    """A record with every field present (null), then ``values`` filled in.

    Unknown keys are a programming error: refused here so a typo never becomes a silent column.
    """
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise KeyError(f"not record fields: {', '.join(unknown)}; the schema is model_support.record.schema.FIELDS")
    record = dict.fromkeys(FIELDS)
    record.update(values)
    return record


def check_record(record: dict) -> dict:
    """Refuse a record whose keys differ from the schema or whose verdict is not one of the four."""
    missing = sorted(set(FIELDS) - set(record))
    extra = sorted(set(record) - set(FIELDS))
    if missing or extra:
        raise ValueError(f"record fields differ from the schema: missing {missing}, unexpected {extra}")
    if record["status"] is not None and record["status"] not in VERDICTS:
        raise ValueError(f"status {record['status']!r} is not one of {', '.join(VERDICTS)}")
    if record["failure_stage"] is not None and record["failure_stage"] not in STAGES:
        raise ValueError(f"failure_stage {record['failure_stage']!r} is not one of {', '.join(STAGES)}")
    return record


def to_table(records: list[dict]) -> pa.Table:
    """Records -> an Arrow table with exactly ``SCHEMA``."""
    for record in records:
        check_record(record)
    return pa.Table.from_pylist(records, schema=SCHEMA)
