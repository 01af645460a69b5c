"""Offline fixtures for image-text-to-text: tiny random vision-language models, each with a tokenizer built
in memory (the shared one plus the architecture's image tokens, their ids inside its small vocabulary) and a
processor with a chat template that puts an image item before the text.

What builds here, and how (transformers 5.24, the CPU build of torch, no torchvision):

- ``tiny-llava``, ``tiny-llava-next`` (CLIP vision tower), ``tiny-idefics3``, ``tiny-gemma3``, ``tiny-paligemma``
  (SigLIP): processors with their PIL image processors, saved and loaded by ``AutoProcessor`` as any user
  would. Each is seeded until bf16 and float32 generate the same 8 new tokens without EOS, and checked to look
  at the image: the first forward's logits differ between the probe image and a plain grey one (Gemma 3's
  projector starts at zero, so a random one would ignore the image: it is re-initialised).
- ``tiny-qwen2-vl``, ``tiny-qwen2.5-vl``, ``tiny-smolvlm``: their processors need a video processor, and every
  video processor needs torchvision, which does not import beside the CPU build of torch (see docs/tasks.md).
  Their ``processor_config.json`` is written by hand (what ``save_pretrained`` writes), and the weights are
  checked by generating from inputs built here with the PIL image processor and the processor's own token
  expansion. Where torchvision is missing the probe records no verdict but an exclusion saying what to
  install (``probe_core.VisionBackendMissing``); with torch and torchvision from one build they PASS.

Failure fixtures that fail for real: ``fail-vlm-image-tokens`` (a processor whose patch size disagrees with the
vision tower's: the ids hold fewer image tokens than the tower yields features, and the first forward raises)
and ``fail-vlm-no-processor`` (a llava folder with a tokenizer and no processor: no image processor to load).

Builders only (``build(folder, final, ctx) -> dict``, as in ``builders.py``); ``VLM_FIXTURES`` says what each
is for and what the probe must report, for ``fixtures.py`` to register.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..probe import probe_core
from .tiny import CHAT_TEMPLATE, MAX_NEW_TOKENS, SEED, TINY_LLAMA, _Context

PROMPT = probe_core.DEFAULT_IMAGE_PROMPT


def chat_template(image: str) -> str:
    """The tiny text models' chat template (``tiny.CHAT_TEMPLATE``), with ``image`` written where a message's
    content has an image item (content given as a list of items, as processors take it)."""
    items = (
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        "{% for item in message['content'] %}{% if item['type'] == 'image' %}" + image + "{% elif item['type'] == "
        "'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    )
    return CHAT_TEMPLATE.replace("{{ message['content'] }}", items)


#: The language model of every tiny VLM: tiny-llama's sizes (~64 wide, 2 layers), positions for the image too.
TEXT = {**TINY_LLAMA[1], "max_position_embeddings": 512}
#: Vision towers: 32 wide, 2 layers, 32x32 pixels in 8x8 patches (16 patches).
_TOWER = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8
)
CLIP = dict(model_type="clip_vision_model", **_TOWER)
SIGLIP = dict(model_type="siglip_vision_model", **_TOWER)
#: Qwen2-VL's image processor, at the tiny towers' patch size: the probe image becomes 4x4 merged patches.
QWEN_PIXELS = dict(min_pixels=32 * 32, max_pixels=32 * 32, patch_size=8, merge_size=2, temporal_patch_size=2)
QWEN_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
#: What Qwen2-VL and Qwen2.5-VL share: the image placeholder, the token ids in the config, the language model's
#: multimodal rope (sections summing to half the head size), the video processor.
QWEN_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
QWEN_CONFIG = dict(
    image_token_id="<|image_pad|>",
    video_token_id="<|video_pad|>",
    vision_start_token_id="<|vision_start|>",
    vision_end_token_id="<|vision_end|>",
)
QWEN: dict[str, Any] = dict(
    tokens=QWEN_TOKENS,
    text=dict(rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3]}),
    video_processor=dict(video_processor_type="Qwen2VLVideoProcessor", **QWEN_PIXELS),
)
IDEFICS_TOKENS = ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>")
#: Idefics3's and SmolVLM's image processors: the image as one 32x32 tile, no splitting; 4 tokens after the
#: tower's pixel shuffle (scale factor 2: 16 patches / 2^2).
IDEFICS_PIXELS = dict(size={"longest_edge": 32}, max_image_size={"longest_edge": 32}, do_image_splitting=False)
IDEFICS_CONFIG = dict(image_token_id="<image>", scale_factor=2)


@dataclass(frozen=True)
class VlmArch:
    """How to build one tiny vision-language model. Class paths are under ``transformers.models``; a config
    value written ``<token>`` is that token's id in the fixture's tokenizer."""

    model_type: str
    text_type: str
    vision: dict
    image_processor: str
    image_processor_kwargs: dict
    processor: str
    image: str | None  # what the chat template writes for an image item; None: no chat template
    config: dict
    processor_kwargs: dict = field(default_factory=dict)
    tokens: tuple = ()  # special tokens added to the tokenizer
    named_tokens: dict = field(default_factory=dict)  # special tokens the processor reads by name
    text: dict = field(default_factory=dict)
    video_processor: dict | None = None  # the processor needs one (and torchvision): written by hand
    zero_projector: str | None = None  # a submodule whose all-zero weights are re-initialised


VLM_ARCHS: dict[str, VlmArch] = {
    "tiny-llava": VlmArch(
        "llava",
        "llama",
        CLIP,
        "llava.image_processing_pil_llava.LlavaImageProcessorPil",
        dict(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
        "llava.processing_llava.LlavaProcessor",
        "<image>",
        dict(image_token_id="<image>", vision_feature_select_strategy="default"),
        dict(patch_size=8, vision_feature_select_strategy="default", num_additional_image_tokens=1),
        tokens=("<image>",),
    ),
    "tiny-llava-next": VlmArch(
        "llava_next",
        "llama",
        CLIP,
        "llava_next.image_processing_pil_llava_next.LlavaNextImageProcessorPil",
        dict(
            size={"shortest_edge": 32},
            crop_size={"height": 32, "width": 32},
            image_grid_pinpoints=[[32, 32], [32, 64], [64, 32]],
        ),
        "llava_next.processing_llava_next.LlavaNextProcessor",
        "<image>",
        dict(image_token_id="<image>", image_grid_pinpoints=[[32, 32], [32, 64], [64, 32]]),
        dict(patch_size=8, vision_feature_select_strategy="default", num_additional_image_tokens=1),
        tokens=("<image>",),
    ),
    "tiny-idefics3": VlmArch(
        "idefics3",
        "llama",
        dict(_TOWER, model_type="idefics3_vision"),
        "idefics3.image_processing_pil_idefics3.Idefics3ImageProcessorPil",
        IDEFICS_PIXELS,
        "idefics3.processing_idefics3.Idefics3Processor",
        "<image>",
        IDEFICS_CONFIG,
        dict(image_seq_len=4),
    ),
    "tiny-gemma3": VlmArch(
        "gemma3",
        "gemma3_text",
        SIGLIP,
        "gemma3.image_processing_pil_gemma3.Gemma3ImageProcessorPil",
        dict(size={"height": 32, "width": 32}),
        "gemma3.processing_gemma3.Gemma3Processor",
        "<start_of_image>",
        dict(
            image_token_id="<image_soft_token>",
            boi_token_id="<start_of_image>",
            eoi_token_id="<end_of_image>",
            mm_tokens_per_image=4,
        ),
        dict(image_seq_length=4),
        named_tokens={
            "image_token": "<image_soft_token>",
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
        },
        # one sliding, one global layer: with only sliding ones the last token never sees the image's positions
        text=dict(sliding_window=16, layer_types=["sliding_attention", "full_attention"]),
        zero_projector="model.multi_modal_projector",
    ),
    "tiny-paligemma": VlmArch(
        "paligemma",
        "gemma",
        SIGLIP,
        "siglip.image_processing_pil_siglip.SiglipImageProcessorPil",
        dict(size={"height": 32, "width": 32}, image_seq_length=16),
        "paligemma.processing_paligemma.PaliGemmaProcessor",
        None,  # PaliGemma has no chat template: the image token, then the prompt
        dict(image_token_id="<image>", projection_dim=64),
    ),
    "tiny-qwen2-vl": VlmArch(
        "qwen2_vl",
        "qwen2_vl_text",
        dict(depth=2, embed_dim=32, hidden_size=64, num_heads=4, mlp_ratio=2, patch_size=8, spatial_merge_size=2),
        "qwen2_vl.image_processing_pil_qwen2_vl.Qwen2VLImageProcessorPil",
        QWEN_PIXELS,
        "Qwen2VLProcessor",
        QWEN_IMAGE,
        QWEN_CONFIG,
        **QWEN,
    ),
    "tiny-qwen2.5-vl": VlmArch(
        "qwen2_5_vl",
        "qwen2_5_vl_text",
        dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            out_hidden_size=64,
            num_heads=4,
            patch_size=8,
            spatial_merge_size=2,
            fullatt_block_indexes=[1],
            window_size=32,
        ),
        "qwen2_vl.image_processing_pil_qwen2_vl.Qwen2VLImageProcessorPil",
        QWEN_PIXELS,
        "Qwen2_5_VLProcessor",
        QWEN_IMAGE,
        QWEN_CONFIG,
        **QWEN,
    ),
    "tiny-smolvlm": VlmArch(
        "smolvlm",
        "llama",
        dict(_TOWER, model_type="smolvlm_vision"),
        "smolvlm.image_processing_pil_smolvlm.SmolVLMImageProcessorPil",
        IDEFICS_PIXELS,
        "SmolVLMProcessor",
        "<image>",
        IDEFICS_CONFIG,
        dict(image_seq_len=4),
        tokens=IDEFICS_TOKENS,
        video_processor=dict(video_processor_type="SmolVLMVideoProcessor", **IDEFICS_PIXELS),
    ),
}
#: The packages (of the ``vision`` extra) a processor with a video processor needs: torchvision, and for
#: SmolVLM's also num2words.
NEEDS = {"tiny-smolvlm": ("torchvision", "num2words")}


def _class(path: str):
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(f"transformers.models.{module}"), name)


def _tokenizer(ctx: _Context, arch: VlmArch):
    """The shared tokenizer plus the architecture's image tokens (named ones as the processor reads them)."""
    from transformers import PreTrainedTokenizerFast

    kwargs: dict[str, Any] = {"extra_special_tokens": dict(arch.named_tokens)} if arch.named_tokens else {}
    ctx.tokenizer()  # trained once, cached in the models folder
    tokenizer = PreTrainedTokenizerFast.from_pretrained(ctx.models_dir / ".tokenizer", **kwargs)
    added = [*arch.tokens, *arch.named_tokens.values()]
    if added:
        tokenizer.add_special_tokens({"extra_special_tokens": added}, replace_extra_special_tokens=False)
    return tokenizer


def _processor_and_tokenizer(ctx: _Context, arch: VlmArch):
    """(processor or None when it needs torchvision, the tokenizer with every token the processor adds)."""
    tokenizer = _tokenizer(ctx, arch)
    if arch.video_processor:
        tokenizer.chat_template = chat_template(arch.image or "")
        return None, tokenizer
    image_processor = _class(arch.image_processor)(**arch.image_processor_kwargs)
    processor = _class(arch.processor)(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=chat_template(arch.image) if arch.image else None,
        **arch.processor_kwargs,
    )
    return processor, processor.tokenizer


def _model(arch: VlmArch, tokenizer, seed: int):
    """A seeded random VLM whose vocabulary and token ids are ``tokenizer``'s."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    ids["pad_token_id"] = tokenizer.pad_token_id
    text = dict(TEXT, **arch.text, model_type=arch.text_type, vocab_size=len(tokenizer), **ids)
    tokens = {k: tokenizer.convert_tokens_to_ids(v) if str(v).startswith("<") else v for k, v in arch.config.items()}
    config = AutoConfig.for_model(arch.model_type, text_config=text, vision_config=arch.vision, **tokens, **ids)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    if arch.zero_projector:  # a projector that starts at zero ignores the image: give it random weights
        with torch.no_grad():
            for parameter in model.get_submodule(arch.zero_projector).parameters():
                if parameter.dim() > 1 and not parameter.any():
                    parameter.normal_(0.0, 0.5)
    return model


def _save(folder: Path, arch: VlmArch, model, processor, tokenizer) -> None:
    """Weights and processor, as ``save_pretrained`` writes them; a processor that needs torchvision cannot
    be built here, so its ``processor_config.json`` and chat template are written as it would write them."""
    model.save_pretrained(folder)
    if processor is not None:
        processor.save_pretrained(folder)
        return
    tokenizer.save_pretrained(folder)
    image_processor = _class(arch.image_processor)(**arch.image_processor_kwargs)
    settings = {
        "image_processor": image_processor.to_dict(),
        "video_processor": arch.video_processor,
        "processor_class": arch.processor,
        **arch.processor_kwargs,
    }
    (folder / "processor_config.json").write_text(json.dumps(settings, indent=2) + "\n")


def _expand_by_hand(arch: VlmArch, tokenizer, text: str, pixels: dict) -> str:
    """The image placeholder expanded as the (torchvision-bound) processor would: Qwen's pads, one per merged
    patch; SmolVLM's global image between its wrapper tokens."""
    if arch.model_type.startswith("qwen"):
        count = int(pixels["image_grid_thw"][0].prod()) // QWEN_PIXELS["merge_size"] ** 2
        return text.replace("<|image_pad|>", "<|image_pad|>" * count)
    wrapped = "<fake_token_around_image><global-img>" + "<image>" * arch.processor_kwargs["image_seq_len"]
    return text.replace("<image>", wrapped + "<fake_token_around_image>")


def model_inputs(folder: Path, arch: VlmArch, image) -> dict:
    """What the probe feeds the model for ``PROMPT`` and ``image``: through the saved processor as the probe
    does (``probe_core.build_image_inputs``), or built by hand where the processor needs torchvision."""
    from transformers import AutoTokenizer

    if not arch.video_processor:
        processor = probe_core.load_processor(str(folder), {})
        ids, mask, extra, _ = probe_core.build_image_inputs(processor, PROMPT, "auto", image)
        return {"input_ids": ids, "attention_mask": mask, **extra}
    tokenizer = AutoTokenizer.from_pretrained(folder)
    image_processor = _class(arch.image_processor)(**arch.image_processor_kwargs)
    pixels = dict(image_processor(images=[[image]] if "smolvlm" in arch.model_type else image, return_tensors="pt"))
    pixels.pop("rows", None), pixels.pop("cols", None)
    content: Any = [{"type": "image"}, {"type": "text", "text": PROMPT}]
    text: Any = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    encoded = tokenizer(_expand_by_hand(arch, tokenizer, text, pixels), return_tensors="pt", add_special_tokens=False)
    if arch.model_type.startswith("qwen"):  # which ids are image positions, for Qwen's multimodal rope (1: image)
        image_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
        encoded["mm_token_type_ids"] = (encoded["input_ids"] == image_id).long()
    return {**encoded, **pixels}


def _greedy_and_logits(folder: Path, arch: VlmArch, dtype: str, images: list) -> tuple[list[int], list]:
    """The saved model in ``dtype``: its greedy new tokens for the probe image, and the first forward's last
    logits (float32) for each of ``images``."""
    import torch
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()
    logits = []
    with torch.inference_mode():
        for image in images:
            inputs = model_inputs(folder, arch, image)
            inputs = {k: v.to(model.dtype) if v.is_floating_point() else v for k, v in inputs.items()}
            logits.append(model(**inputs).logits[0, -1].float())
        inputs = model_inputs(folder, arch, images[0])
        inputs = {k: v.to(model.dtype) if v.is_floating_point() else v for k, v in inputs.items()}
        out = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    return out[0, inputs["input_ids"].shape[1] :].tolist(), logits


def vlm_builder(name: str) -> Callable:
    """A seeded tiny VLM of one architecture: the same 8 new tokens, no EOS, in bf16 and float32 (so the CPU
    reference agrees), and logits that change with the image."""
    arch = VLM_ARCHS[name]

    def build(folder: Path, final: Path, ctx: _Context) -> dict:
        from PIL import Image

        probe, _ = probe_core.probe_image()
        grey = Image.new("RGB", probe.size, (128, 128, 128))
        eos = ctx.tokenizer().eos_token_id
        for seed in range(SEED + 7000, SEED + 7100):
            processor, tokenizer = _processor_and_tokenizer(ctx, arch)
            _save(folder, arch, _model(arch, tokenizer, seed), processor, tokenizer)
            bf16, _ = _greedy_and_logits(folder, arch, "bfloat16", [probe])
            fp32, (with_probe, with_grey) = _greedy_and_logits(folder, arch, "float32", [probe, grey])
            if bf16 == fp32 and len(bf16) == MAX_NEW_TOKENS and eos not in bf16:  # so the CPU reference agrees
                break
        else:
            raise RuntimeError(f"{name}: no seed in 100 generated the same 8 tokens, no EOS, in bf16 and float32")
        looks = float((with_probe - with_grey).abs().max())
        if looks < 1e-4:
            raise RuntimeError(f"{name}: the logits do not depend on the image (max difference {looks:g})")
        image_id = tokenizer.convert_tokens_to_ids(arch.config["image_token_id"])
        count = int((model_inputs(folder, arch, probe)["input_ids"] == image_id).sum())
        return {
            "seed": seed,
            "expected_token_ids": bf16,
            "image_tokens": count,
            "image_logit_difference": looks,
        }

    build.__doc__ = f"Tiny random {arch.model_type} (image-text-to-text)."
    return build


def build_image_token_mismatch(folder: Path, final: Path, ctx: _Context) -> dict:
    """A tiny llava whose processor says patch size 16 where its vision tower has 8: the processor writes
    (32/16)^2 = 4 image tokens, the tower yields 16 features per image, and the first forward raises (the
    model's own check, "Image features and image tokens do not match") inside generate."""
    extra = vlm_builder("tiny-llava")(folder, final, ctx)
    path = folder / "processor_config.json"
    settings = json.loads(path.read_text())
    path.write_text(json.dumps({**settings, "patch_size": 16}, indent=2) + "\n")
    result = probe_core.run_stages(str(folder), device="cpu", task=probe_core.IMAGE_TEXT_TO_TEXT)
    if result["failure_stage"] != "generate" or "do not match" not in str(result["exception"]):
        raise RuntimeError(f"fail-vlm-image-tokens: expected a mismatch in generate, got {result['exception']!r}")
    return {"seed": extra["seed"], "image_tokens": result["image_tokens"], "tower_features": 16}


def build_no_processor(folder: Path, final: Path, ctx: _Context) -> dict:
    """A tiny llava's weights, tokenizer and chat template, and no processor: nothing to turn the image into
    pixels (``AutoProcessor`` finds no image processor)."""
    vlm_builder("tiny-llava")(folder, final, ctx)
    (folder / "processor_config.json").unlink()
    result = probe_core.run_stages(str(folder), device="cpu", task="auto")
    if result["failure_stage"] != "load":
        raise RuntimeError(f"fail-vlm-no-processor: expected a load failure, got {result['exception']!r}")
    return {"error": f"{type(result['exception']).__name__}: {result['exception']}"[:300]}


#: For registration in fixtures.FIXTURES (name, builder, status, stage, tokens_out, purpose, attribution).
#: The torchvision-bound architectures' status depends on the environment: see ``fixtures.expectation``.
VLM_FIXTURES: list[dict[str, Any]] = [
    *[
        {
            "name": name,
            "build": vlm_builder(name),
            "status": "PASS",
            "stage": None,
            "tokens_out": MAX_NEW_TOKENS,
            "purpose": f"Tiny random {arch.model_type} (image-text-to-text, "
            + ("processor needs torchvision: excluded without it" if arch.video_processor else "PIL image processor")
            + "): the probe image through its processor's chat template.",
            "attribution": None,
            "needs": NEEDS.get(name, ("torchvision",)) if arch.video_processor else (),
        }
        for name, arch in VLM_ARCHS.items()
    ],
    {
        "name": "fail-vlm-image-tokens",
        "build": build_image_token_mismatch,
        "status": "FAIL(gen)",
        "stage": "generate",
        "tokens_out": None,
        "purpose": "Tiny llava whose processor's patch size disagrees with its vision tower: 4 image tokens in the "
        "ids, 16 image features, the first forward raises.",
        "attribution": "model",
        "needs": (),
    },
    {
        "name": "fail-vlm-no-processor",
        "build": build_no_processor,
        "status": "FAIL(load)",
        "stage": "load",
        "tokens_out": None,
        "purpose": "Tiny llava with a tokenizer and no processor: no image processor to load.",
        "attribution": "model",
        "needs": (),
    },
]
