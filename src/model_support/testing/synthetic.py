"""Realistic synthetic sweep histories, for the report's tests and benchmarks.

``write_synthetic_history(data_dir, n_sweeps, n_models)`` writes what real sweeps leave on disk:
``results/sweep=<id>/part-0.parquet`` and ``excluded/sweep=<id>/part-0.parquet`` (exactly
``schema.SCHEMA``, written atomically as ``store.write_parquet`` does, but built column by column
because a million record dicts take minutes) and ``sweeps/<id>/sweep.json``.

What it imitates: model ids ``org-<k>/<arch>-<size>-<variant>`` over ~30 real model types and
sizes from 1M to 70B parameters; ~70% PASS; ~20 real error messages whose numbers, paths, ids and
names vary by model (so that grouping by failure signature is exercised); stack versions that
change every ~10 sweeps (torch, torch_tpu and transformers at different sweeps), each change
breaking a few models and fixing others, so pass rate moves in steps; occasional flaky runner
failures; a model list that grows over time; a CUDA sweep every tenth; models excluded before
running; timings, memory and token counts that scale with model size. Seeded: the same arguments
write the same bytes.

One piece on purpose: the tables of errors, versions and regressions and the one generator that
draws from them only make sense read together.
"""

from __future__ import annotations

import functools
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..probe.signatures import failure_signature
from ..record import schema
from ..record.sweep_meta import ModelEntry, SweepMeta

MODEL_TYPES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3",
    "phi",
    "phi3",
    "gpt2",
    "gpt_neox",
    "gptj",
    "opt",
    "bloom",
    "falcon",
    "mpt",
    "starcoder2",
    "olmo",
    "olmo2",
    "stablelm",
    "cohere",
    "deepseek_v2",
    "granite",
    "internlm2",
    "exaone",
    "smollm3",
    "mamba",
    "bert",
    "t5",
)
#: Not causal LMs: excluded before running ("not a text-generation model").
NOT_GENERATIVE = ("bert", "t5")
SIZES = (
    ("1m", 1_100_000),
    ("8m", 8_300_000),
    ("135m", 135_000_000),
    ("360m", 362_000_000),
    ("500m", 494_000_000),
    ("1b", 1_240_000_000),
    ("1.7b", 1_710_000_000),
    ("3b", 3_210_000_000),
    ("7b", 7_240_000_000),
    ("8b", 8_030_000_000),
    ("13b", 13_000_000_000),
    ("70b", 70_600_000_000),
)
SIZE_WEIGHTS = (4, 4, 10, 8, 8, 12, 8, 10, 12, 10, 4, 2)
VARIANTS = ("base", "instruct", "chat", "v2", "dpo", "sft", "it", "hf")
CHAT_VARIANTS = ("instruct", "chat", "dpo", "sft", "it")
OPS = ("_scaled_dot_product_flash_attention", "_linalg_eigh", "bincount", "_unique2", "nonzero_static")
#: Too large for the device: excluded before running.
MAX_PARAMS = 60_000_000_000

# (status, failure_stage, error_type, message template, weight). Templates see: model, arch, mt,
# n, m, hexa, gib, op, path.
ERRORS = (
    (
        schema.FAIL_LOAD,
        "load",
        "OSError",
        "{model} does not appear to have a file named model.safetensors. Checkout "
        "'https://huggingface.co/{model}/tree/main' for available files.",
        8,
    ),
    (
        schema.FAIL_LOAD,
        "load",
        "ValueError",
        "The checkpoint you are trying to load has model type `{mt}_v{m}` but Transformers does not recognize "
        "this architecture. This could be because of an issue with the checkpoint, or because your version "
        "of Transformers is out of date.",
        7,
    ),
    (
        schema.FAIL_LOAD,
        "load",
        "ValueError",
        "Unrecognized configuration class <class 'transformers.models.{mt}.configuration_{mt}.{Mt}Config'> "
        "for this kind of AutoModel: AutoModelForCausalLM.",
        5,
    ),
    (
        schema.FAIL_LOAD,
        "load",
        "ValueError",
        "The repository {model} contains custom code which must be executed to correctly load the model. "
        "You can inspect the repository content at https://hf.co/{model} .\nPlease pass the argument "
        "`trust_remote_code=True` to allow custom code to be run.",
        8,
    ),
    (
        schema.FAIL_LOAD,
        "load",
        "safetensors_rust.SafetensorError",
        "Error while deserializing header: invalid JSON in header: EOF while parsing a value at line 1 column {n}",
        3,
    ),
    (
        schema.FAIL_LOAD,
        "load",
        "RuntimeError",
        "Error(s) in loading state_dict: size mismatch for model.embed_tokens.weight: copying a param with "
        "shape torch.Size([{n}, {m}]) from checkpoint, the shape in current model is torch.Size([{n2}, {m}]).",
        3,
    ),
    (
        schema.FAIL_LOAD,
        "load",
        "NewlyInitializedWeights",
        "Some weights were not initialized from the model checkpoint at {path} and are newly initialized: "
        "['lm_head.weight', 'model.layers.{m}.mlp.gate_proj.weight']",
        5,
    ),
    (
        schema.FAIL_LOAD,
        "load",
        "OSError",
        "Can't load tokenizer for '{model}'. If you were trying to load it from 'https://huggingface.co/models', "
        "make sure you don't have a local directory with the same name.",
        4,
    ),
    (
        schema.FAIL_LOAD,
        "load",
        "huggingface_hub.errors.GatedRepoError",
        "401 Client Error. (Request ID: Root=1-{hexa}-{hexb})\n\nCannot access gated repo for url "
        "https://huggingface.co/{model}/resolve/main/config.json.",
        4,
    ),
    (schema.FAIL_GEN, "generate", "IndexError", "index {n} is out of bounds for dimension 0 with size {n}", 4),
    (
        schema.FAIL_GEN,
        "generate",
        "RuntimeError",
        "The size of tensor a ({n1}) must match the size of tensor b ({n}) at non-singleton dimension 3",
        4,
    ),
    (
        schema.FAIL_GEN,
        "generate",
        "NotImplementedError",
        "The operator 'aten::{op}' is not currently implemented for the tpu device.",
        7,
    ),
    (
        schema.FAIL_GEN,
        "generate",
        "RuntimeError",
        "torch_tpu lowering failed: unsupported dtype in {cache}/graph_{n}.mlir:{m}",
        4,
    ),
    (
        schema.FAIL_GEN,
        "generate",
        "TypeError",
        "{Arch}.forward() got an unexpected keyword argument 'cache_position'",
        4,
    ),
    (
        schema.FAIL_GEN,
        "generate",
        "RuntimeError",
        "Expected all tensors to be on the same device, but found at least two devices, tpu:0 and cpu!",
        3,
    ),
    (
        schema.FAIL_OTHER,
        "template",
        "jinja2.exceptions.TemplateError",
        "Conversation roles must alternate user/assistant/user/assistant/...",
        4,
    ),
    (
        schema.FAIL_OTHER,
        "template",
        "ValueError",
        "Cannot use chat template functions because tokenizer.chat_template is not set and no template "
        "argument was passed!",
        3,
    ),
    (
        schema.FAIL_OTHER,
        "generate",
        "torch.OutOfMemoryError",
        "TPU out of memory. Tried to allocate {gib} GiB. {gib2} GiB free of 15.75 GiB.",
        5,
    ),
    (schema.FAIL_OTHER, "runner", "TimeoutError", "probe of {model} exceeded the per-model timeout of {timeout} s", 2),
    (
        schema.FAIL_OTHER,
        "runner",
        "DeadKernelError",
        "Kernel died before replying to execute request (exit code -{sig})",
        2,
    ),
)
#: Indices into ERRORS by role in the simulation.
_TPU_ONLY = (11, 12)  # gone on a CUDA sweep
_FLAKY = (18, 19)  # one-off runner failures
_REGRESSIONS = {"torch": (9, 10, 17), "torch_tpu": (11, 12, 14), "transformers": (13, 1, 6)}
#: Each component's version changes every ``_EPOCH`` sweeps, starting at a different offset.
_EPOCH = 10
_OFFSETS = {"torch": 0, "torch_tpu": 4, "transformers": 7}

_TRACEBACK = """Traceback (most recent call last):
  File "/opt/model-support/src/model_support/probe.py", line 162, in _probe
    outcome = probe_core.run_stages(**settings)
  File "/opt/model-support/src/model_support/probe_core.py", line {line}, in {stage_fn}
    {code}
  File "/opt/venv/lib/python3.11/site-packages/{module}", line {mline}, in {func}
    raise {short}(msg)
{error_type}: {message}"""
_STAGE_CODE = {
    "load": (
        "load",
        "model = AutoModelForCausalLM.from_pretrained(model_id, **kwargs)",
        "transformers/modeling_utils.py",
        "from_pretrained",
    ),
    "generate": (
        "generate",
        "output = model.generate(input_ids, max_new_tokens=max_new_tokens)",
        "transformers/generation/utils.py",
        "generate",
    ),
    "template": (
        "build_inputs",
        "text = tokenizer.apply_chat_template(messages, tokenize=False)",
        "transformers/tokenization_utils_base.py",
        "apply_chat_template",
    ),
    "runner": ("run_stages", "outcome = executor.run(notebook)", "papermill/execute.py", "execute_notebook"),
}
_REPRO = '''"""Reproduce the probe of {model} ({sweep_id})."""
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

model_id = "{model}"
device = torch.device("{device}")
tokenizer = AutoTokenizer.from_pretrained(model_id, revision="{revision}")
model = AutoModelForCausalLM.from_pretrained(model_id, revision="{revision}", torch_dtype=torch.bfloat16).to(device)
inputs = tokenizer("The future of AI is", return_tensors="pt").to(device)
print(tokenizer.decode(model.generate(**inputs, max_new_tokens=8, do_sample=False)[0]))
'''


#: Whose failure each ERRORS kind is when the CPU reference reruns it: the device stack's for the errors
#: that name the tpu stack, the model's for the rest (its files or code fail the same way everywhere);
#: runner failures (timeout, dead kernel) have nothing to rerun.
ATTRIBUTION_OF = tuple(
    None if stage == "runner" else "stack" if "tpu" in message.lower() else "model"
    for _, stage, _, message, _ in ERRORS
)


@functools.cache
def _signature(error_type: str, message: str) -> str | None:
    return failure_signature(error_type, message)


def _versions(component: str, epoch: int) -> str:
    if component == "torch":
        return f"2.{8 + epoch // 2}.{epoch % 2}"
    if component == "torch_tpu":
        return f"0.{1 + epoch // 3}.{epoch % 3}"
    return f"4.{50 + epoch}.0"


def _epoch(component: str, sweep: int) -> int:
    return (sweep + _OFFSETS[component]) // _EPOCH


def _models(rng: np.random.Generator, n_models: int) -> dict[str, np.ndarray]:
    n_orgs = max(8, n_models // 25)
    space = n_orgs * len(MODEL_TYPES) * len(SIZES) * len(VARIANTS)
    if n_models > space:
        raise ValueError(f"n_models={n_models} exceeds the {space} distinct synthetic model ids")
    picks = rng.choice(space, size=n_models, replace=False)
    variant = picks % len(VARIANTS)
    rest = picks // len(VARIANTS)
    rest = rest // len(SIZES)  # the size is drawn separately, weighted
    mtype = rest % len(MODEL_TYPES)
    org = rest // len(MODEL_TYPES)
    weights = np.array(SIZE_WEIGHTS, dtype=float) / sum(SIZE_WEIGHTS)
    size = rng.choice(len(SIZES), size=n_models, p=weights)
    ids = []
    seen = set()
    for i in range(n_models):
        model_id = f"org-{org[i]}/{MODEL_TYPES[mtype[i]].replace('_', '-')}-{SIZES[size[i]][0]}-{VARIANTS[variant[i]]}"
        if model_id in seen:  # the weighted size can collide: the index keeps ids unique
            model_id = f"{model_id}-{i}"
        seen.add(model_id)
        ids.append(model_id)
    kinds_w = np.array([e[4] for e in ERRORS], dtype=float)
    kind = rng.choice(len(ERRORS), size=n_models, p=kinds_w / kinds_w.sum())
    failing = rng.random(n_models) < 0.27
    base = np.where(failing, kind + 1, 0)  # 0 = PASS, k = ERRORS[k - 1]
    # A third of the failures get fixed by some transformers release.
    fix_epoch = np.where(rng.random(n_models) < 0.33, rng.integers(1, 12, size=n_models), 10_000)
    return {
        "model_id": np.array(ids, dtype=object),
        "model_type": mtype,
        "size": size,
        "variant": variant,
        "base": base,
        "fix_epoch": fix_epoch,
        "n": rng.integers(512, 8192, size=n_models),
        "m": rng.integers(2, 64, size=n_models),
        "op": rng.integers(0, len(OPS), size=n_models),
        "hex": rng.integers(0, 2**63, size=n_models),
        "unknown_size": rng.random(n_models) < 0.03,
        "enter": rng.random(n_models),  # when the model joins the sweeps (0: from the start)
        "speed": rng.lognormal(0.0, 0.25, size=n_models),
    }


def _outcomes(models: dict, sweep: int, n_sweeps: int, device: str, seed: int) -> np.ndarray:
    out = models["base"].copy()
    tx_epoch = _epoch("transformers", sweep)
    out[(out > 0) & (models["fix_epoch"] <= tx_epoch)] = 0
    n = len(out)
    for component, kinds in _REGRESSIONS.items():
        epoch = _epoch(component, sweep)
        if epoch == 0:
            continue
        crng = np.random.default_rng([seed, 7, list(_OFFSETS).index(component), epoch])
        flip = crng.random(n)
        which = crng.integers(0, len(kinds), size=n)
        broken = (out == 0) & (flip < 0.02)
        out[broken] = np.array(kinds)[which[broken]] + 1
        fixed = (out > 0) & (flip > 0.97)
        out[fixed] = 0
    srng = np.random.default_rng([seed, 11, sweep])
    flaky = srng.random(n) < 0.01
    out[flaky] = np.array(_FLAKY)[srng.integers(0, len(_FLAKY), size=n)[flaky]] + 1
    if device == "cuda":
        for k in _TPU_ONLY:
            out[out == k + 1] = 0
    return out


def _message(kind: int, models: dict, i: int, model_id: str, mt: str, device: str) -> str:
    n = int(models["n"][i])
    m = int(models["m"][i])
    hexv = int(models["hex"][i])
    template = ERRORS[kind][3]
    text = template.format(
        model=model_id,
        mt=mt,
        Mt=mt.title().replace("_", ""),
        Arch=mt.title().replace("_", "") + "ForCausalLM",
        n=n,
        n1=n + 1,
        n2=n + m,
        m=m,
        hexa=f"{hexv & 0xFFFFFFFF:08x}",
        hexb=f"{hexv:016x}{m:08x}",
        gib=f"{(n % 900) / 100 + 0.5:.2f}",
        gib2=f"{(m % 90) / 100:.2f}",
        op=OPS[int(models["op"][i])],
        path=f"/tmp/hf_cache/models--{model_id.replace('/', '--')}/snapshots/{hexv:016x}",
        cache=f"/tmp/torch_tpu_cache/{hexv:016x}",
        timeout=900,
        sig=9,
    )
    if device == "cuda":
        text = text.replace("TPU out of memory", "CUDA out of memory").replace("tpu:0", "cuda:0")
    return text


def _failure(models: dict, i: int, kind: int, device: str) -> tuple[str, str, str | None, str]:
    """(error_type, error_message, failure_signature, traceback) of model ``i`` failing as ``kind``."""
    model_id = models["model_id"][i]
    mt = MODEL_TYPES[models["model_type"][i]]
    stage, error_type = ERRORS[kind][1], ERRORS[kind][2]
    message = _message(kind, models, i, model_id, mt, device)
    code = _STAGE_CODE[stage]
    traceback = _TRACEBACK.format(
        line=40 + 20 * list(_STAGE_CODE).index(stage),
        stage_fn=code[0],
        code=code[1],
        module=code[2],
        mline=int(models["n"][i]) % 4000 + 100,
        func=code[3],
        short=error_type.rsplit(".", 1)[-1],
        error_type=error_type,
        message=message,
    )
    return error_type, message, _signature(error_type, message), traceback


def _iso(times: np.ndarray) -> list[str]:
    return [s + "Z" for s in np.datetime_as_string(times, unit="s")]


def write_synthetic_history(
    data_dir: Path | str,
    n_sweeps: int,
    n_models: int,
    seed: int = 0,
    *,
    legacy_sweeps: int = 0,
    start: datetime | None = None,
) -> list[str]:
    """Write ``n_sweeps`` synthetic sweeps of up to ``n_models`` models under ``data_dir``.

    Returns the sweep ids, oldest first. The first ``legacy_sweeps`` sweeps are written as files
    from before ``schema.LATER_FIELDS`` existed (those columns absent from the Parquet files).
    Rows are built column by column (a million record dicts would take minutes) into an Arrow
    table with exactly ``schema.SCHEMA``, checked as ``schema.check_record`` would, and written
    atomically like ``store.write_parquet``. Long on purpose: each column's generator is a closure over
    the sweep being written, called at once inside the loop, so the history reads as one story.
    """
    data_dir = Path(data_dir)
    rng = np.random.default_rng(seed)
    models = _models(rng, n_models)
    start = start or datetime(2026, 1, 5, 2, 0, tzinfo=UTC)
    ids = models["model_id"]
    n = len(ids)
    mtypes = np.array(MODEL_TYPES, dtype=object)[models["model_type"]]
    params = np.array([p for _, p in SIZES], dtype=np.int64)[models["size"]]
    chat = np.isin(models["variant"], [VARIANTS.index(v) for v in CHAT_VARIANTS])
    not_generative = np.isin(mtypes, NOT_GENERATIVE)
    too_large = params > MAX_PARAMS
    excluded_model = not_generative | too_large
    reasons = np.where(not_generative, "not a text-generation model", "too large for the device")
    archs = [[t.title().replace("_", "") + "ForCausalLM"] for t in mtypes]
    num_params = [None if unknown else int(p) for unknown, p in zip(models["unknown_size"], params)]
    notebook_names = [m.replace("/", "--") + ".ipynb" for m in ids]
    tokens_in_all = np.where(chat, 18 + models["m"] % 20, 6)
    gb = params * 2 / 1e9
    failures: dict[tuple[int, int, str], tuple] = {}
    sweep_ids = []
    for sweep in range(n_sweeps):
        device = "cuda" if sweep % 10 == 9 else "tpu"
        name = "cuda-weekly" if device == "cuda" else "tpu-nightly"
        created = start + timedelta(days=sweep, minutes=int(rng.integers(0, 50)))
        sweep_id = f"{name}-{created:%Y%m%dT%H%M%SZ}-{sweep:04x}"  # the real id shape, deterministic suffix
        sweep_ids.append(sweep_id)
        versions = {
            "python": "3.11.7",
            "torch": _versions("torch", _epoch("torch", sweep)),
            "torch_tpu": _versions("torch_tpu", _epoch("torch_tpu", sweep)) if device == "tpu" else None,
            "libtpu": "0.0.21" if device == "tpu" else None,
            "transformers": _versions("transformers", _epoch("transformers", sweep)),
            "tokenizers": "0.22.1",
            "accelerate": "1.10.0",
            "model_support": "0.1.0",
            "git_commit": f"{(seed * 7919 + sweep * 104729) & 0xFFFFFFFFFFFF:012x}",
        }
        host = f"{device}-vm-{sweep % 3}"
        joined = models["enter"] <= 0.9 + 0.1 * (sweep + 1) / n_sweeps
        outcome = _outcomes(models, sweep, n_sweeps, device, seed) - 1  # -1 = PASS, k = ERRORS[k]
        srng = np.random.default_rng([seed, 13, sweep])
        jitter = srng.lognormal(0.0, 0.15, size=n)
        offsets = np.cumsum(20 * jitter).astype("timedelta64[s]")
        started = np.datetime64(created.replace(tzinfo=None), "s") + offsets
        common = {
            "revision": "main",
            "prompt": "The future of AI is",
            "max_new_tokens": 8,
            "dtype": "bfloat16",
            "seed": 0,
            "trust_remote_code": False,
            "device_type": device,
            "device_name": "TPU v6 lite" if device == "tpu" else "NVIDIA H100 80GB HBM3",
            "device_count": 1,
            "host": host,
        }

        def columns(rows: np.ndarray) -> dict[str, list]:
            k = len(rows)
            cols: dict[str, list] = {name: [value] * k for name, value in common.items()}
            cols.update(
                sweep_id=[sweep_id] * k,
                model_id=ids[rows].tolist(),
                model_type=mtypes[rows].tolist(),
                architectures=[archs[i] for i in rows],
                num_params=[num_params[i] for i in rows],
                versions=[versions] * k,
                started_at=_iso(started[rows]),
            )
            return cols

        excl_rows = np.flatnonzero(joined & excluded_model)
        excl = columns(excl_rows)
        excl["exclusion_reason"] = reasons[excl_rows].tolist()

        rows = np.flatnonzero(joined & ~excluded_model)
        res = columns(rows)
        kind = outcome[rows]
        passed = kind < 0
        stage_of = np.array([e[1] for e in ERRORS] + [None], dtype=object)
        status_of = np.array([e[0] for e in ERRORS] + [schema.PASS], dtype=object)
        stage = stage_of[kind]  # kind -1 picks the last entry: PASS, no stage
        loaded = passed | np.isin(stage, ["generate", "template"])
        speed = models["speed"][rows] * jitter[rows]
        g = gb[rows]
        big = params[rows] <= 3_500_000_000
        out = np.where((rows + sweep) % 9 != 0, 8, 3 + rows % 5)
        first = (8 + 3 * g) * speed
        decode = 8 / ((0.02 + 0.01 * g) * 7 * speed)
        load_s = np.round((0.4 + g * 2.5) * speed, 3)
        generate_s = np.round(first + (out - 1) / decode, 3)
        match = (rows * 31 + sweep) % 23 != 0
        reference = passed & big
        etype, emsg, esig, etb = [None] * len(rows), [None] * len(rows), [None] * len(rows), [None] * len(rows)
        for j in np.flatnonzero(~passed):
            key = (int(rows[j]), int(kind[j]), device)
            if key not in failures:
                failures[key] = _failure(models, key[0], key[1], device)
            etype[j], emsg[j], esig[j], etb[j] = failures[key]

        def where(mask, values, digits=None):
            values = np.round(values, digits) if digits is not None else values
            return [v if m else None for v, m in zip(values.tolist(), mask.tolist())]

        res.update(
            status=status_of[kind].tolist(),
            failure_stage=stage.tolist(),
            error_type=etype,
            error_message=emsg,
            failure_signature=esig,
            traceback=etb,
            chat_template_used=chat[rows].tolist(),
            tokens_in=where(loaded, tokens_in_all[rows]),
            tokens_out=where(passed, out),
            output_token_ids=[list(range(r % 997, r % 997 + o)) if p else None for r, o, p in zip(rows, out, passed)],
            generated_text=[
                (" a bright one, full of" if o == 8 else " bright.") if p else None for o, p in zip(out, passed)
            ],
            failed_step=where(stage == "generate", rows % 8),
            load_s=where(loaded, load_s),
            first_token_s=where(passed, first, 3),
            generate_s=where(passed, generate_s),
            decode_tokens_per_s=where(passed, decode, 2),
            peak_host_mem_mb=where(loaded, 900 + g * 1100 * jitter[rows], 1),
            peak_device_mem_mb=where(loaded, g * 1024 * 1.08 + 150, 1),
            device_mem_source=["torch.accelerator"] * len(rows),
            compile_cache_hits=where(passed & (device == "tpu"), models["m"][rows]),
            compile_cache_misses=where(passed & (device == "tpu"), np.full(len(rows), 3)),
            reference_device=["cpu" if r else None for r in reference],
            reference_match=where(reference, match),
            first_divergence=where(reference & ~match, 1 + rows % 7),
            duration_s=np.round(3 + np.where(loaded, load_s, 1.0) + np.where(passed, generate_s, 0.0), 3).tolist(),
            notebook_path=[f"sweeps/{sweep_id}/notebooks/{notebook_names[i]}" for i in rows],
            repro_script=[_REPRO.format(model=ids[i], sweep_id=sweep_id, device=device, revision="main") for i in rows],
            # the fields of later probes (dropped from legacy files): one variant on one device, and whose
            # failure it is where the CPU reference could rerun it (the device's own errors are the stack's)
            variant=["eager+dynamic"] * len(rows),
            mode=["eager"] * len(rows),
            cache=["dynamic"] * len(rows),
            devices_used=[1] * len(rows),
            parallelism=["none"] * len(rows),
            attribution=[
                None if p or not b else ATTRIBUTION_OF[k]
                for p, b, k in zip(passed.tolist(), big.tolist(), kind.tolist())
            ],
        )
        legacy = sweep < legacy_sweeps
        _write(res, data_dir / "results" / f"sweep={sweep_id}" / "part-0.parquet", legacy)
        if len(excl_rows):
            _write(excl, data_dir / "excluded" / f"sweep={sweep_id}" / "part-0.parquet", legacy)
        SweepMeta(
            sweep_id=sweep_id,
            name=name,
            created_at=created.isoformat(timespec="seconds"),
            params_file=f"params/{name}.yaml",
            timeout_s=900.0,
            probe={
                "device": device,
                "dtype": "bfloat16",
                "prompt": "The future of AI is",
                "max_new_tokens": 8,
                "reference": "cpu",
                "reference_max_params": 3_500_000_000,
            },
            models=[ModelEntry(m) for m in ids[np.flatnonzero(joined)].tolist()],
            description=f"synthetic history, seed {seed}",
            versions=versions,
            host=host,
        ).write(data_dir / "sweeps" / sweep_id)
    return sweep_ids


def _write(columns: dict[str, list], path: Path, legacy: bool) -> None:
    """Columns -> one Parquet file with exactly ``schema.SCHEMA`` (less ``LATER_FIELDS`` for a
    legacy file), written atomically like ``store.write_parquet``."""
    length = len(columns["sweep_id"])
    arrays = [pa.array(columns.get(name, [None] * length), type=typ) for name, typ in schema.FIELDS.items()]
    table = pa.Table.from_arrays(arrays, schema=schema.SCHEMA)
    statuses = set(pc.unique(table["status"]).to_pylist()) - {None}
    stages = set(pc.unique(table["failure_stage"]).to_pylist()) - {None}
    if statuses - set(schema.VERDICTS) or stages - set(schema.STAGES):
        raise ValueError(f"synthetic rows with unknown verdicts {statuses} or stages {stages}")
    if legacy:
        table = table.drop_columns(list(schema.LATER_FIELDS))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
