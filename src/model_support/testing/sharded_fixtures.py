"""Offline fixtures for the probe over several devices (``model_support.probe.sharded``): models that one
small device cannot hold, so that ``devices: auto`` must pick 2.

The numbers: a device of ``DEVICE_MEMORY_GB`` = 0.001 GB (1,000,000 bytes). Each model has about
0.55 to 0.75 million parameters, 1.1 to 1.5 MB of bf16 weights; with the 20% margin that
``sharded.plan_devices`` adds for activations and the KV cache, 1.3 to 1.8 MB: more than one device,
at most 0.9 MB on each of 2. Every builder checks this on the folder it wrote (from the safetensors
headers, as the probe estimates it), so a size change cannot silently make a fixture fit one device
or need 4.

- ``sharded-llama``: a dense llama, which has a tensor-parallel plan: runs tensor parallel (``tp``).
- ``sharded-mixtral``: a Mixtral MoE (4 experts, top-2), which has an expert plan: runs expert
  parallel (``ep``), 2 whole experts per rank.
- ``sharded-gpt2``: a gpt2, which has neither plan (``base_model_tp_plan`` is None): it cannot run on
  2 devices; the probe says so in one sentence (``FAIL(other)``).

Builders only (``build_x(folder, final, ctx) -> dict``, as in ``builders.py``); ``SHARDED_FIXTURES``
lists what each is for and what the probe must report, for whoever registers them in ``fixtures.py``.
"""

from __future__ import annotations

from pathlib import Path

from .tiny import MAX_NEW_TOKENS, SEED, _Context, _seeded_until, _tiny_model

#: The device memory, in GB (10**9 bytes), that makes each fixture need 2 devices.
DEVICE_MEMORY_GB = 0.001
DEVICE_MEMORY_BYTES = int(DEVICE_MEMORY_GB * 10**9)
#: Devices the builders check against: 2 must be the fewest that hold each model, out of up to 8.
EXPECTED_DEVICES = 2

#: name -> (model_type, config sizes, the parallelism ``sharded.parallelism_for`` must pick).
SHARDED_ARCHS: dict[str, tuple[str, dict, str | None]] = {
    "sharded-llama": (
        "llama",
        dict(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,  # divisible by 2 ranks: the k/v projections split by head
            head_dim=32,
            max_position_embeddings=256,
        ),
        "tp",
    ),
    "sharded-mixtral": (
        "mixtral",
        dict(
            hidden_size=128,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            max_position_embeddings=256,
            num_local_experts=4,  # 2 whole experts per rank on 2 ranks
            num_experts_per_tok=2,
        ),
        "ep",
    ),
    "sharded-gpt2": ("gpt2", dict(n_embd=128, n_inner=256, n_layer=4, n_head=4, n_positions=256), None),
}


def _check_needs_two(folder: Path, model_type: str, parallelism: str | None) -> dict:
    """The folder as written: its parameter count (safetensors headers), 2 devices, the expected plan."""
    from transformers import AutoConfig

    from ..probe import sharded

    params = sharded.safetensors_params(folder)
    if params is None:
        raise RuntimeError(f"{folder.name}: no safetensors checkpoint was written")
    devices = sharded.plan_devices(params, "bfloat16", DEVICE_MEMORY_BYTES, 8)
    if devices != EXPECTED_DEVICES:
        raise RuntimeError(
            f"{folder.name}: {params} parameters need {devices} device(s) of {DEVICE_MEMORY_GB} GB, "
            f"not {EXPECTED_DEVICES}: change its sizes"
        )
    kind, _ = sharded.parallelism_for(AutoConfig.from_pretrained(folder))
    if kind != parallelism:
        raise RuntimeError(f"{folder.name}: transformers gives {model_type} the plan {kind!r}, not {parallelism!r}")
    return {
        "num_params": params,
        "weights_bf16_bytes": params * 2,
        "memory_estimate_bytes": sharded.memory_estimate_bytes(params, "bfloat16"),
        "device_memory_gb": DEVICE_MEMORY_GB,
        "expected_devices": devices,
        "parallelism": parallelism,
    }


def sharded_builder(name: str):
    """A seeded model of ``SHARDED_ARCHS[name]`` that generates 8 tokens without EOS in bf16 and float32."""
    model_type, sizes, parallelism = SHARDED_ARCHS[name]

    def build(folder: Path, final: Path, ctx: _Context) -> dict:
        eos = ctx.tokenizer().eos_token_id

        def all_8_no_eos(bf16, fp32):
            return len(bf16) == len(fp32) == MAX_NEW_TOKENS and eos not in bf16 + fp32

        seed, tokens = _seeded_until(
            ctx,
            folder,
            lambda s: _tiny_model(ctx, model_type, sizes, s),
            all_8_no_eos,
            base=SEED + 5000 + 100 * list(SHARDED_ARCHS).index(name),
        )
        return {"seed": seed, "expected_token_ids": tokens, **_check_needs_two(folder, model_type, parallelism)}

    build.__doc__ = f"A {model_type} that needs {EXPECTED_DEVICES} devices of {DEVICE_MEMORY_GB} GB ({parallelism})."
    build.__name__ = f"build_{name.replace('-', '_')}"
    return build


build_sharded_llama = sharded_builder("sharded-llama")
build_sharded_mixtral = sharded_builder("sharded-mixtral")
build_sharded_gpt2 = sharded_builder("sharded-gpt2")

#: For registration in fixtures.FIXTURES: name, builder, status, stage, tokens_out, purpose, and the
#: probe settings that make it a 2-device run (device count "auto" over small devices).
SHARDED_OVERRIDES = {"devices": "auto", "device_memory_gb": DEVICE_MEMORY_GB}
SHARDED_FIXTURES = [
    {
        "name": "sharded-llama",
        "build": build_sharded_llama,
        "status": "PASS",
        "stage": None,
        "tokens_out": MAX_NEW_TOKENS,
        "purpose": f"A llama too big for one {DEVICE_MEMORY_GB} GB device: tensor parallel over 2.",
        "overrides": SHARDED_OVERRIDES,
    },
    {
        "name": "sharded-mixtral",
        "build": build_sharded_mixtral,
        "status": "PASS",
        "stage": None,
        "tokens_out": MAX_NEW_TOKENS,
        "purpose": f"A Mixtral MoE too big for one {DEVICE_MEMORY_GB} GB device: expert parallel over 2.",
        "overrides": SHARDED_OVERRIDES,
    },
    {
        "name": "sharded-gpt2",
        "build": build_sharded_gpt2,
        "status": "FAIL(other)",
        "stage": "load",
        "tokens_out": None,
        "purpose": f"A gpt2 too big for one {DEVICE_MEMORY_GB} GB device, with no parallel plan: cannot run as shipped.",
        "overrides": SHARDED_OVERRIDES,
    },
]
