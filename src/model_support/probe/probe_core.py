"""The probe's stages, self-contained: load, template, generate, classify.

This module imports nothing from this package on purpose: its source *is* the body of every
record's ``repro_script`` (see ``repro.py``), so the script that reproduces a probe runs exactly the
code the probe ran, with plain ``python`` and no project install. Keep it to the standard library,
torch and transformers (and Pillow, which transformers' image processors need anyway).

Two tasks share the stages: ``text-generation`` (a tokenizer and ``AutoModelForCausalLM``) and
``image-text-to-text`` (a processor and ``AutoModelForImageTextToText``, with the fixed image that
``probe_image`` draws, in code, so that this script re-creates it).
"""

import contextlib
import functools
import hashlib
import time
import traceback as _traceback

PASS, FAIL_LOAD, FAIL_GEN, FAIL_OTHER = "PASS", "FAIL(load)", "FAIL(gen)", "FAIL(other)"
DEFAULT_PROMPT = "The future of AI is"
TEXT_GENERATION, IMAGE_TEXT_TO_TEXT = "text-generation", "image-text-to-text"
#: The tasks the probe runs (the Hub's pipeline_tag names); ``auto`` decides from the model.
TASKS = (TEXT_GENERATION, IMAGE_TEXT_TO_TEXT)
DEFAULT_IMAGE_PROMPT = "Describe this image."
STAGE_VERDICT = {
    "download": FAIL_LOAD,
    "compile": FAIL_GEN,
    "load": FAIL_LOAD,
    "template": FAIL_OTHER,
    "generate": FAIL_GEN,
    "runner": FAIL_OTHER,
}


class NewlyInitialisedWeights(RuntimeError):
    """The checkpoint does not cover the loaded model: some weights would be random. Not a PASS."""


class NoChatTemplate(ValueError):
    """chat_template='required' but the tokenizer has none."""


class NoImageProcessor(ValueError):
    """An image-text-to-text model whose folder has no image processor (AutoProcessor gave a tokenizer)."""


class NotAProbedTask(ValueError):
    """The model's task is neither text-generation nor image-text-to-text: no verdict, an exclusion."""


class VisionBackendMissing(RuntimeError):
    """The environment lacks a package this model's processor or the probe image needs (Pillow, a working
    torchvision, num2words): no verdict, an exclusion (the same model passes where it is installed)."""


class TooLongForPositions(ValueError):
    """The prompt plus the asked ``max_new_tokens`` do not fit the model's positions (``positions_short``): the
    length asked of it, not the model, is wrong there: excluded on the length axis, no verdict."""


#: Failures of the environment (or of what was asked), not of the model: the result carries ``exclusion_reason``
#: and no verdict.
NOT_A_VERDICT = (NotAProbedTask, VisionBackendMissing, TooLongForPositions)
#: The new tokens the verdict generates by default (``max_new_tokens``' default).
VERDICT_TOKENS = 8


def positions_of(model):
    """The positions a model can hold (its text config's ``max_position_embeddings``; gpt2's ``n_positions``, which
    transformers maps to it), or None where the config names none."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    positions = getattr(config, "max_position_embeddings", None)
    return positions if isinstance(positions, int) else None


def positions_short(model, tokens_in, max_new_tokens):
    """Why the model's positions (its text config's ``max_position_embeddings``; gpt2's ``n_positions``) cannot
    hold the prompt's ``tokens_in`` and ``max_new_tokens`` more, or None. Only the length axis excludes: a model
    that cannot hold even the prompt plus the verdict's ``VERDICT_TOKENS`` fails at any length as at the default
    (FAIL(gen), its own verdict), so it is not excluded here; one that holds those but not the asked length is."""
    positions = positions_of(model)
    need = tokens_in + max_new_tokens
    if positions is None or need <= positions:
        return None
    if tokens_in + min(max_new_tokens, VERDICT_TOKENS) > positions:  # fails at the default too: its own verdict
        return None
    return (
        f"max_position_embeddings={positions} cannot hold the prompt's {tokens_in} tokens plus max_new_tokens="
        f"{max_new_tokens} ({need} positions): excluded on the length axis (ask for at most "
        f"{positions - tokens_in} new tokens)"
    )


def is_oom(exc):
    """Out of memory, on the device or the host, whatever raised it."""
    text = f"{type(exc).__name__}: {exc}".lower()
    return (
        isinstance(exc, MemoryError) or "outofmemory" in text or "out of memory" in text or "resource_exhausted" in text
    )


def classify(stage, exc):
    """The verdict for an exception raised in ``stage`` (docs/design.md): OOM is always FAIL(other)."""
    if is_oom(exc):
        return FAIL_OTHER
    return STAGE_VERDICT.get(stage, FAIL_OTHER)


def trimmed_traceback(exc, max_lines=60):
    lines = "".join(_traceback.format_exception(type(exc), exc, exc.__traceback__)).splitlines()
    if len(lines) > max_lines:
        lines = lines[:10] + [f"... ({len(lines) - max_lines} lines trimmed) ..."] + lines[-(max_lines - 11) :]
    return "\n".join(lines)


#: ``from_pretrained``'s hub kernels stay off. transformers 5.25 turns them on by default when the ``kernels``
#: package is installed (it now requires it): layers (RMSNorm, SiLU, GELU, rotary) are swapped for compiled kernels
#: downloaded from the Hub, on the devices ``kernels`` knows, and a device it does not know (any out-of-tree
#: PrivateUse1 backend) is refused outright when the model is placed on it at load (a sharded run). Either way the
#: verdict would describe downloaded code and the network, not the stack's own kernels: like ``trust_remote_code``,
#: code from the Hub runs only when asked for. transformers 5.24 reads the same keyword, off by default.
HUB_KERNELS_OFF = {"use_kernels": False}


def quiet_loading():
    """transformers' own switch for its progress bars ("Loading weights" per checkpoint): off, since they land
    in sweep logs, notebooks and command output, where they say nothing a record or a timing does not."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def load(model_id, revision, dtype, trust_remote_code, device, info, extra=None, task=TEXT_GENERATION, on_device=None):
    """Config, tokenizer (or, for image-text-to-text, the processor) and weights, moved to ``device``. Fills
    ``info`` as it learns things, so a later failure still records the model type, architectures, task and
    size. ``task`` "auto" decides from the config (``task_of_config``). ``extra``: more keyword arguments for
    ``from_pretrained`` (a sharded run's ``distributed_config``)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    quiet_loading()
    kwargs = {"revision": revision or None, "trust_remote_code": trust_remote_code}
    if task != "auto":  # known before the config: a config that fails to load still says its task
        info["task"] = task
    config = AutoConfig.from_pretrained(model_id, **kwargs)
    info["model_type"] = getattr(config, "model_type", None)
    info["architectures"] = list(getattr(config, "architectures", None) or [])
    info["task"] = task = task_of_config(config) if task == "auto" else task
    if task == IMAGE_TEXT_TO_TEXT:
        tokenizer, model_class = load_processor(model_id, kwargs), AutoModelForImageTextToText
    else:
        tokenizer, model_class = AutoTokenizer.from_pretrained(model_id, **kwargs), AutoModelForCausalLM
    model, loading = model_class.from_pretrained(
        model_id, dtype=getattr(torch, dtype), output_loading_info=True, **HUB_KERNELS_OFF, **kwargs, **(extra or {})
    )
    info["num_params"] = sum(p.numel() for p in model.parameters())
    newly = sorted(loading.get("missing_keys") or []) + sorted(str(k) for k in (loading.get("mismatched_keys") or []))
    if newly:
        shown = ", ".join(newly[:5]) + (", ..." if len(newly) > 5 else "")
        raise NewlyInitialisedWeights(
            f"{len(newly)} weights of {type(model).__name__} are not in the checkpoint and were newly initialised: {shown}"
        )
    if not (extra or {}).get("distributed_config"):
        if on_device:  # built in host memory: from here on, the device's work
            on_device()
        model.to(device)  # a model split by a distributed_config is already on this rank's device
    model.eval()
    return model, tokenizer


def task_of_config(config):
    """``auto``'s answer from a config: image-text-to-text when transformers maps it to its image-text-to-text
    auto class (``AutoModelForImageTextToText``, checked first: Gemma 3 and Llama 4 are in both), else
    text-generation (a config that is neither then fails to load as a causal LM, as before)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    if getattr(config, "model_type", None) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return IMAGE_TEXT_TO_TEXT
    auto_map = getattr(config, "auto_map", None) or {}
    return (
        IMAGE_TEXT_TO_TEXT
        if "AutoModelForImageTextToText" in auto_map and "AutoModelForCausalLM" not in auto_map
        else TEXT_GENERATION
    )


def task_of_pipeline_tag(tag):
    """``auto``'s answer from the Hub's ``pipeline_tag``: the tag itself when the probe runs that task, None when
    the Hub does not say; a tag of another task raises NotAProbedTask (an exclusion, not a verdict)."""
    if not tag or tag in TASKS:
        return tag or None
    raise NotAProbedTask(
        f"the Hub lists this model as {tag}, not {' or '.join(TASKS)}: the probe does not run that task "
        "(set task to text-generation or image-text-to-text to probe it anyway)"
    )


def torchvision_broken():
    """Why an installed torchvision cannot be used (it does not import beside this torch: a build for another
    torch, "operator torchvision::nms does not exist"), or None when it imports or is absent. transformers
    imports it for every model once it is installed, so a broken one fails every load: the environment."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        return None
    try:
        import torchvision  # noqa: F401
    except Exception as exc:  # noqa: BLE001 whatever it raises, it does not import
        import importlib.metadata as metadata

        import torch

        try:
            version = metadata.version("torchvision")
        except metadata.PackageNotFoundError:  # importable, but installed without its metadata
            version = "(version unknown)"
        return (
            f"torchvision {version} is installed but does not import beside torch "
            f"{torch.__version__} ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            "uninstall it (pip uninstall torchvision) or install the torchvision built for this torch"
        )
    return None


#: The packages the image-text-to-text task needs beyond transformers, by the lower-cased name that transformers'
#: messages or an ImportError give them, and the name pip installs. Pillow is a dependency of this package (the
#: PIL image processors and the probe image); torchvision and num2words (the video processors) are the ``vision``
#: extra.
VISION_PACKAGES = {"torchvision": "torchvision", "num2words": "num2words", "pil": "pillow", "pillow": "pillow"}


def _missing_vision_package(exc):
    """(what needs it, package) when ``exc`` or what it was raised from says that a package the image-text-to-text
    task needs is missing or does not import ("X requires the Torchvision library", "Package `num2words` is
    required to run X", an image processor that could import neither of its backends, ``import PIL`` failing, a
    torchvision op missing from a build for another torch); else None."""
    import re

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = str(exc)
        found = re.search(r"(\w+) requires the (\w+) library", text) or re.search(
            r"Package `(\w+)` is required to run ([\w ]+)", text
        )
        if found:
            who, name = found.groups() if "requires the" in found.group(0) else found.groups()[::-1]
            if name.lower() in VISION_PACKAGES:
                return who, VISION_PACKAGES[name.lower()]
        either = re.search(
            r"Could not load any image processor class.* Missing optional dependencies: ([\w, ]+)\.", text
        )
        if either:  # neither backend of the image processor imports: Pillow is the light one (and ours)
            names = [n.strip().lower() for n in either.group(1).split(",")]
            return "this model's image processor", "pillow" if "pillow" in names else VISION_PACKAGES.get(
                names[0], names[0]
            )
        module = (getattr(exc, "name", None) or "").split(".")[0].lower() if isinstance(exc, ImportError) else ""
        if module in VISION_PACKAGES:
            return "this model's processor", VISION_PACKAGES[module]
        if "torchvision::" in text:
            return "this model's processor", "torchvision"
        exc = exc.__cause__ or exc.__context__
    return None


def vision_backend_missing(exc, who=None):
    """``VisionBackendMissing`` (the environment, one sentence naming what to install) when ``exc`` says a package
    the image-text-to-text task needs is missing or broken; else None. ``who``: what needs it, when the caller
    knows better than the message."""
    missing = _missing_vision_package(exc)
    if missing is None:
        return None
    import torch

    who, package = who or missing[0], missing[1]
    if package == "pillow":
        return VisionBackendMissing(
            f"{who} needs Pillow, and it is not installed: pip install pillow (a dependency of model-support that "
            "this environment lacks)"
        )
    problem = (torchvision_broken() if package == "torchvision" else None) or f"{package} is not installed"
    install = f"the torchvision built for torch {torch.__version__}" if package == "torchvision" else package
    return VisionBackendMissing(
        f"{who} needs {package}, and {problem}: install {install} "
        "(pip install 'model-support[vision]' where torch and torchvision come from one build, as on a TPU VM)"
    )


@contextlib.contextmanager
def vision_environment(who=None):
    """Turn an exception that says a package the image-text-to-text task needs is missing or broken into
    ``VisionBackendMissing`` (the environment: no verdict); any other passes through as it is."""
    try:
        yield
    except Exception as exc:
        missing = vision_backend_missing(exc, who)
        if missing is None:
            raise
        raise missing from exc


def load_processor(model_id, kwargs):
    """``AutoProcessor`` for an image-text-to-text model: one with an image processor. The processors of some
    models (Qwen2-VL, Qwen2.5-VL, SmolVLM) also need a video processor, and every video processor needs
    torchvision (SmolVLM's also num2words); an image processor needs Pillow or torchvision. Where one is missing
    this raises VisionBackendMissing (the environment), never a verdict."""
    from transformers import AutoProcessor

    with vision_environment():
        processor = AutoProcessor.from_pretrained(model_id, **kwargs)
    if getattr(processor, "image_processor", None) is None:
        raise NoImageProcessor(
            f"no image processor for this image-text-to-text model: AutoProcessor gave a {type(processor).__name__} "
            "(the folder lacks processor_config.json / preprocessor_config.json)"
        )
    return processor


#: The probe image's size in pixels (width, height); processors resize it to what their model takes.
PROBE_IMAGE_SIZE = (224, 224)


@functools.lru_cache(maxsize=2)  # drawn once per process: ~50 ms, and a probe builds its inputs twice
def probe_image_rgb(width=PROBE_IMAGE_SIZE[0], height=PROBE_IMAGE_SIZE[1]):
    """The probe's fixed image as raw RGB bytes, row by row: a red house with a grey roof and a brown door on
    green grass, a yellow sun in a blue sky. Drawn in integer arithmetic only, so it is the same bytes on every
    machine and every Python (this function is in every repro script; ``image_sha256`` is their hash)."""
    horizon, sun_x, sun_y, sun_r = height * 5 // 8, width * 3 // 4, height // 5, height // 9
    left, right, wall_top = width // 6, width // 6 + width * 3 // 10, horizon - height // 5
    roof_top, middle, half = wall_top - height // 8, (left + right) // 2, (right - left) // 2 + width // 40
    door_top = horizon - height // 10
    out = bytearray()
    for y in range(height):
        for x in range(width):
            if (x - sun_x) ** 2 + (y - sun_y) ** 2 <= sun_r**2:
                pixel = (250, 210, 40)  # the sun
            elif abs(x - middle) < width // 30 and door_top <= y < horizon:
                pixel = (90, 50, 20)  # the door
            elif left <= x < right and wall_top <= y < horizon:
                pixel = (200, 40, 40)  # the wall
            elif roof_top <= y < wall_top and abs(x - middle) * (wall_top - roof_top) <= (y - roof_top) * half:
                pixel = (70, 70, 80)  # the roof
            elif y >= horizon:
                pixel = (40, 170 - (y - horizon) * 60 // (height - horizon), 50)  # grass, darker below
            else:
                pixel = (90 + y * 45 // horizon, 150 + y * 30 // horizon, 235)  # sky, lighter at the horizon
            out += bytes(pixel)
    return bytes(out)


@functools.cache
def probe_image_sha256():
    """The sha256 of the probe image's RGB bytes (the record's ``image_sha256``; every repro script names it)."""
    return hashlib.sha256(probe_image_rgb()).hexdigest()


def probe_image():
    """The probe's fixed image (a PIL image) and the sha256 of its RGB bytes (the record's ``image_sha256``)."""
    with vision_environment("the probe image"):
        from PIL import Image

    return Image.frombytes("RGB", PROBE_IMAGE_SIZE, probe_image_rgb()), probe_image_sha256()


def build_inputs(tokenizer, prompt, chat_template):
    """Token ids of the prompt, through the chat template when the tokenizer has one ("auto").

    Returns (input_ids, attention_mask, chat_template_used)."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if chat_template == "required" and not has_template:
        raise NoChatTemplate("chat_template='required' but the tokenizer has no chat template")
    if has_template and chat_template in ("auto", "required"):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        encoded = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        return encoded["input_ids"], encoded["attention_mask"], True
    encoded = tokenizer(prompt, return_tensors="pt")
    return encoded["input_ids"], encoded["attention_mask"], False


def build_image_inputs(processor, prompt, chat_template, image):
    """The processor's inputs for the prompt and one image: the prompt rendered through the processor's chat
    template with an image item before the text ("auto", when it has one), else the processor's image token
    and the prompt (PaliGemma's processors have no template and take it so).

    Returns (input_ids, attention_mask, extra, chat_template_used): ``extra`` holds the image inputs the model
    takes beside the ids (pixel_values, image_grid_thw, image_sizes, token_type_ids, ...), for generate and
    for any other forward over the same prompt."""
    has_template = bool(getattr(processor, "chat_template", None))
    if chat_template == "required" and not has_template:
        raise NoChatTemplate("chat_template='required' but the processor has no chat template")
    used = has_template and chat_template in ("auto", "required")
    if used:
        content = [{"type": "image"}, {"type": "text", "text": prompt}]
        text = processor.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
    else:
        text = f"{getattr(processor, 'image_token', None) or ''}{prompt}"
    encoded = dict(
        processor(images=image, text=text, return_tensors="pt", **({"add_special_tokens": False} if used else {}))
    )
    encoded.pop("labels", None)  # PaliGemma's processor adds training labels
    input_ids, attention_mask = encoded.pop("input_ids"), encoded.pop("attention_mask")
    return input_ids, attention_mask, encoded, used


def image_token_id(model, processor):
    """The id that stands for one image position in the ids, or None: the model's config says it
    (``image_token_id``, or ``image_token_index`` in older configs), else the processor's."""
    for owner in (model.config, processor):
        for name in ("image_token_id", "image_token_index"):
            value = getattr(owner, name, None)
            if isinstance(value, int):
                return value
    return None


def on_device(extra_inputs, device, model):
    """``extra_inputs`` (the image inputs; None for text) on ``device``, floating ones in ``model``'s dtype."""
    if not extra_inputs:
        return {}
    dtype = next(model.parameters()).dtype
    return {
        key: value.to(device, dtype=dtype) if value.is_floating_point() else value.to(device)
        for key, value in extra_inputs.items()
    }


#: torch's entry-point group for out-of-tree device backends (its "autoload"); see ``load_backend``.
BACKENDS_GROUP = "torch.backends"
#: The variable that turns torch's autoload of every installed backend off ("0"), before ``import torch``.
AUTOLOAD_VAR = "TORCH_DEVICE_BACKEND_AUTOLOAD"
#: The ``torch.backends`` entry points to load beside the one named for the device (comma-separated names): a backend
#: whose entry point is not named ``<device>`` or ``torch_<device>``, which torch's autoload would have loaded.
BACKEND_ENTRY_POINTS_VAR = "MODEL_SUPPORT_BACKEND_ENTRY_POINTS"


def backend_device(entry_point_name):
    """The device a ``torch.backends`` entry point provides, by the packages' convention: torch_tpu -> tpu."""
    return entry_point_name.removeprefix("torch_")


def load_backend(device_type):
    """Register ``device_type`` with torch by calling the ``torch.backends`` entry point of the package that
    provides it, as torch's autoload does on ``import torch``, but only that one: the autoload is off in
    every process of ours (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), since it would load every installed
    backend (torch_tpu alone costs ~8 s and, on a machine with no TPU, can stall in libtpu's set-up).
    Nothing happens when torch already knows the device or no installed package provides it."""
    import importlib.metadata
    import os

    import torch

    if device_type == "cpu" or torch._C._get_privateuse1_backend_name() == device_type:
        return
    # a backend whose entry point is not named for its device (Intel Gaudi's ``device_backend`` for hpu) is named by
    # the user in BACKEND_ENTRY_POINTS_VAR (comma-separated entry point names): torch's autoload is off in our processes
    named = {n.strip() for n in os.environ.get(BACKEND_ENTRY_POINTS_VAR, "").split(",") if n.strip()}
    for entry in importlib.metadata.entry_points(group=BACKENDS_GROUP):
        if backend_device(entry.name) == device_type or entry.name in named:
            entry.load()()


def synchronizer(device_type):
    """What waits for ``device_type``'s queued work (a timing is honest only after it): torch's generic
    ``torch.accelerator.synchronize``, or the backend's own ``torch.<type>.synchronize`` where the generic
    call is refused (a backend written in Python has no streams torch knows); None on the CPU."""
    if device_type == "cpu":
        return None
    import torch

    try:
        torch.accelerator.synchronize()
        return torch.accelerator.synchronize
    except (RuntimeError, NotImplementedError):
        return getattr(torch, device_type).synchronize


def device_clock(device_type, mode="eager"):
    """The device's own clock, where its backend's device module (``torch.<type>``) offers one as ``perf_clock``
    (a ``time.perf_counter``-like function reading the device's timeline, as its event timer would), else None: the
    host's wall clock, read after a sync. A module whose clock does not see what a compiled graph runs says so
    (``perf_clock_sees_compiled = False``: a backend written in Python, whose compiled graphs run on the CPU
    underneath, past its dispatch): in mode compile, None. The perf phase (``Adapter.perf_clock``) and the repro script's timed repeats
    read the same, so ``bisect --metric`` compares like with like."""
    if device_type == "cpu":
        return None
    import torch

    module = getattr(torch, device_type, None)
    clock = getattr(module, "perf_clock", None)
    if mode == "compile" and not getattr(module, "perf_clock_sees_compiled", True):
        return None
    return clock if callable(clock) else None


class StepTimer:
    """A generate() streamer that timestamps each new token (after a device sync, so compilation and
    queued work are counted where they happen)."""

    #: A second clock to stamp each token on too: the device's own (``device_clock``), so the verdict's generation is
    #: the perf phase's first repeat on the clock the phase times on (``performance.verdict_steps``); None: none.
    device_clock = None

    def __init__(self, synchronize=None, clock=None):
        self.synchronize = synchronize
        self.clock = clock or time.perf_counter  # the device's own clock where it has one (``Adapter.perf_clock``)
        self.times = []
        self.device_times = []
        self._seen_prompt = False

    def put(self, value):
        if not self._seen_prompt:
            self._seen_prompt = True
            return
        if self.synchronize:
            self.synchronize()
        self.times.append(self.clock())
        if self.device_clock is not None:
            self.device_times.append(self.device_clock())

    def end(self):
        pass


#: How many of its best logits the device keeps for each generated step (``top_scores``), for the reference check.
TOP_K_KEPT = 32


def top_scores(step_logits, k=TOP_K_KEPT):
    """One generated step's logits as the reference check needs them (``agreement.compare``), on the host:
    the ``k`` best token ids and their logits, and the log-sum-exp over the whole vocabulary (so their
    log-probabilities are exact), in float32; the raw logits, before any logits processor."""
    logits = step_logits.reshape(-1).float()
    values, ids = logits.topk(min(k, logits.shape[-1]))
    return {"ids": ids.tolist(), "logits": values.tolist(), "logsumexp": float(logits.logsumexp(-1))}


def generate(
    model,
    tokenizer,
    input_ids,
    attention_mask,
    max_new_tokens,
    device,
    timer=None,
    cache="dynamic",
    no_grad=False,
    scores=None,
    extra_inputs=None,
):
    """Greedy generation; returns the new token ids (fewer than max_new_tokens when EOS came early).
    ``cache`` "static" asks transformers for its static KV cache (``cache_implementation="static"``).
    ``no_grad``: torch.no_grad() rather than inference_mode() (FSDP2-sharded models refuse inference tensors).
    ``scores``: a list that receives each generated step's ``top_scores``. ``extra_inputs``: an
    image-text-to-text model's image inputs (``build_image_inputs``)."""
    import torch

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    if scores is not None:
        extra.update(output_logits=True, return_dict_in_generate=True)
    with torch.no_grad() if no_grad else torch.inference_mode():
        try:
            output = model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
                streamer=timer,
                **on_device(extra_inputs, device, model),
                **extra,
            )
        except BaseException:
            # generate() ends its streamer only when it finishes: a census that stepped off torch's dispatch stack
            # mid-generation (``Census.following``) must step back on before this mode restores the dispatch state
            if timer is not None:
                timer.end()
            raise
        if scores is not None:
            scores.extend(top_scores(step[0]) for step in output.logits)
            output = output.sequences
    return output[0, input_ids.shape[1] :].tolist()


def is_compile_error(exc):
    """Raised by torch.compile's machinery (dynamo tracing, the backend compiler), not by the model's ops."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__module__.startswith(("torch._dynamo", "torch._inductor")):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


FUSED_EAGER = "torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)"
#: How a record, a repro script or the debug command says a mode does not exist on this stack.
NOT_AVAILABLE = "not available on this stack"


def fused_eager_missing(device_type):
    """Why mode "fused" (TorchTPU's deferred-and-fused eager: ops queue up and run as fused programs)
    cannot run here, or None. It exists only on a TPU, and only where torch_tpu exposes it (0.2.0 does,
    as an experimental API); elsewhere the record says so instead of failing."""
    if device_type != "tpu":
        return f"mode 'fused' is TorchTPU's deferred-and-fused eager; it runs on tpu devices only, not on {device_type}"
    import torch

    tpu = getattr(torch, "tpu", None)
    if (
        getattr(tpu, "set_eager_mode", None) is None
        or getattr(getattr(tpu, "EagerMode", None), "DEFER_AND_FUSE", None) is None
    ):
        import importlib.metadata as metadata

        try:
            version = metadata.version("torch_tpu")
        except metadata.PackageNotFoundError:
            version = "(not installed)"
        return f"torch_tpu {version} does not expose {FUSED_EAGER}"
    return None


def execution_context(mode):
    """The context generation runs in: TorchTPU's deferred-and-fused eager for mode "fused", else none
    (eager is the default; compile wraps the forward instead, ``compile_forward``)."""
    import contextlib

    if mode != "fused":
        return contextlib.nullcontext()
    import torch

    return torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)


def compile_forward(model, backend):
    """``model.forward`` through torch.compile with ``backend`` (inductor on cpu and cuda, tpu on TPU), as this
    stack's torch.compile compiles it; dynamo's counters start from zero. Returns the eager forward, to put back.

    Where that compile is static (``compile_dynamic`` False: TorchTPU patches torch.compile to ``dynamic=False`` for
    its ``tpu`` backend), the model generates with transformers' static KV cache from here on
    (``generation_config.cache_implementation``, which every later generate() of it reads: the eager rerun, the perf
    phase, the recompile check, the repro script): a dynamic cache grows by one position per token, each length is
    a new graph, and past dynamo's recompile limit (8) the forward runs eagerly, so a "compiled" run would be mostly
    eager. With a static cache the decode steps share one graph: what the mode says it compiles."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    if compile_dynamic(backend) is False:
        config = getattr(model, "generation_config", None)
        if config is not None:
            config.cache_implementation = "static"
    eager = model.forward
    model.forward = torch.compile(eager, backend=backend)
    return eager


def _never_called():
    """What ``compile_dynamic`` hands torch.compile: never traced, never run."""


def compile_dynamic(backend):
    """The ``dynamic`` this stack's torch.compile gives dynamo for ``backend`` when the caller names none: None
    (torch's default: a dimension seen with two sizes becomes symbolic), or what a backend package patched in
    (TorchTPU's torch.compile sets False for ``tpu``: every new shape a new graph). Read by handing torch.compile a
    function while dynamo's ``optimize`` is stood in for (nothing is compiled, and what setting the backend up wrote
    into ``os.environ``, inductor's cache folder, is taken back); None where that cannot be read."""
    import os

    import torch
    import torch._dynamo

    seen = []
    optimize, environ = torch._dynamo.optimize, dict(os.environ)

    def noted(*args, **kwargs):
        seen.append(kwargs.get("dynamic"))
        return lambda fn: fn

    torch._dynamo.optimize = noted
    try:
        torch.compile(_never_called, backend=backend)
    except Exception:  # noqa: BLE001 an unknown backend: torch.compile itself says so when the probe calls it
        return None
    finally:
        torch._dynamo.optimize = optimize
        for name in set(os.environ) - set(environ):
            del os.environ[name]
        os.environ.update(environ)
    return seen[0] if seen else None


def compile_settings(model, backend, cache):
    """What a compiled generation ran with: ``compile_dynamic`` (the stack's torch.compile's ``dynamic`` for
    ``backend``) and ``compile_cache`` (the KV cache it used: static where ``cache`` asked for it or the compile is
    static, ``compile_forward``)."""
    config = getattr(model, "generation_config", None)
    static = cache == "static" or getattr(config, "cache_implementation", None) == "static"
    return {"compile_dynamic": compile_dynamic(backend), "compile_cache": "static" if static else "dynamic"}


#: How dynamo says a frame hit its recompile limit (``counters["unimplemented"]``): it runs eagerly from there.
RECOMPILE_LIMIT_HIT = "Dynamo recompile limit exceeded"


def compile_counts():
    """Graphs compiled, graph breaks (and the first reasons) and recompilations, from dynamo's counters.
    Every graph beyond the first is a (re)compilation of the forward: a new shape or a failed guard.
    ``recompile_limit_hit``: a frame recompiled past dynamo's limit (``recompile_limit``, 8), and ran eagerly
    from there: compiled in name only."""
    from torch._dynamo.utils import counters

    graphs = int(counters["stats"].get("unique_graphs", 0))
    breaks = counters["graph_break"]
    return {
        "graphs": graphs,
        "recompilations": max(0, graphs - 1),
        "graph_breaks": int(sum(breaks.values())),
        "graph_break_reasons": [str(reason)[:300] for reason in list(breaks)[:3]],
        "recompile_limit_hit": any(str(k).startswith(RECOMPILE_LIMIT_HIT) for k in counters["unimplemented"]),
    }


#: The keys of ``run_stages``' result, in order (model and tokenizer only with keep_model).
RESULT_KEYS = (
    "status",
    "failure_stage",
    "exception",
    "model_type",
    "architectures",
    "num_params",
    "chat_template_used",
    "tokens_in",
    "tokens_out",
    "output_token_ids",
    "generated_text",
    "failed_step",
    "load_s",
    "first_token_s",
    "token_times",
    "generate_s",
    "decode_tokens_per_s",
    "input_ids",
    "step_scores",
    "compile_s",
    "graphs",
    "graph_breaks",
    "graph_break_reasons",
    "recompilations",
    "recompile_limit_hit",
    "compile_dynamic",
    "compile_cache",
    "matches_eager",
    "matches_eager_note",
    "task",
    "image_tokens",
    "image_sha256",
    "exclusion_reason",
    "model",
    "tokenizer",
)


class _Stage:
    """The stage running now (a failure is classified by it), announced to ``on_stage`` as it starts."""

    def __init__(self, on_stage=None):
        self.on_stage = on_stage
        self.name = None

    def enter(self, name):
        self.name = name
        if self.on_stage:
            self.on_stage(name)


def run_stages(
    model_id,
    revision="",
    dtype="bfloat16",
    prompt=DEFAULT_PROMPT,
    max_new_tokens=8,
    chat_template="auto",
    trust_remote_code=False,
    seed=0,
    device="cpu",
    synchronize=None,
    keep_model=False,
    mode="eager",
    cache="dynamic",
    compile_backend="inductor",
    load_kwargs=None,
    timer=None,
    on_stage=None,
    on_load=None,
    no_grad=False,
    task="auto",
    image_prompt=DEFAULT_IMAGE_PROMPT,
    on_device=None,
):
    """Load, template, generate, each guarded: every exception lands in the result with its stage.

    ``task``: text-generation (``prompt``), image-text-to-text (``image_prompt`` and the probe image, through
    the processor), or auto: decided from the config (``task_of_config``). A failure of the environment rather
    than the model (``NOT_A_VERDICT``: a processor that needs a missing torchvision) gives no verdict but
    ``exclusion_reason``.

    ``mode`` "compile" runs the generation through torch.compile (``compile_backend``): a failure raised
    by the compiler is stage "compile" when plain eager generates, else eager's own error at "generate"
    (dynamo's fake tensors meet a model's shape bug first, but the bug is not the compiler's); the
    first token's time carries the compilation (``compile_s``); graphs, breaks and recompilations are
    counted. ``mode`` "fused" runs it in TorchTPU's deferred-and-fused eager (``execution_context``;
    check ``fused_eager_missing`` first). In both, the same generation runs again in plain eager to say
    whether the tokens match (``matches_eager``; a rerun that raises is a note, ``matches_eager_note``).

    Hooks for a sharded rank: ``load_kwargs`` (its ``distributed_config``), ``timer`` (a StepTimer that
    also reports progress), ``on_stage(name)`` as each stage starts, ``on_load(model)`` once loaded,
    and ``no_grad`` (FSDP-sharded models refuse inference tensors).

    Returns a dict with ``RESULT_KEYS``: status, failure_stage, exception (the object), token counts
    and ids, the device's best logits per generated step (``step_scores``, for the reference check), the
    generated text, timings, and what was learned about the model."""
    result = dict.fromkeys(RESULT_KEYS)
    stage = _Stage(on_stage)
    try:
        stage.enter("load")
        model, tokenizer = _timed_load(
            result,
            model_id,
            revision,
            dtype,
            trust_remote_code,
            device,
            synchronize,
            load_kwargs,
            on_load,
            task,
            on_device,
        )
        stage.enter("template")
        tokenizer, input_ids, attention_mask, extra_inputs = _template(
            result, model, tokenizer, prompt, image_prompt, chat_template
        )
        short = positions_short(model, result["tokens_in"], max_new_tokens)
        if short:  # before generating: the length asked does not fit, an exclusion rather than a failure
            raise TooLongForPositions(short)
        stage.enter("generate")
        run = _Generation(
            model, tokenizer, input_ids, attention_mask, max_new_tokens, device, cache, seed, no_grad, extra_inputs
        )
        timer = timer or StepTimer(synchronize)
        timer.device_clock = device_clock(getattr(device, "type", str(device).split(":")[0]), mode)
        run.in_mode(result, stage, mode, compile_backend, timer)
        if mode != "eager":
            _compare_with_eager(result, run)
        result["status"] = PASS
        if keep_model:
            result["model"], result["tokenizer"] = model, tokenizer
    except NOT_A_VERDICT as exc:  # the environment, not the model: no verdict
        result["exclusion_reason"] = str(exc)
        result["exception"] = exc
    except Exception as exc:  # noqa: BLE001 every failure is the result, classified by its stage
        result["status"] = classify(stage.name, exc)
        result["failure_stage"] = stage.name
        result["exception"] = exc
    return result


def _compare_with_eager(result, run):
    """``matches_eager``: the same generation again in plain eager, a check beside the verdict, never part
    of it: a rerun that raises leaves it null with the reason in ``matches_eager_note``, and the run's
    verdict is what the run did."""
    try:
        result["matches_eager"] = run.eagerly() == result["output_token_ids"]
    except Exception as exc:  # noqa: BLE001 whatever stops the rerun, the run itself generated
        result["matches_eager_note"] = f"the plain eager rerun failed: {type(exc).__name__}: {exc}"[:2000]


def _timed_load(
    result,
    model_id,
    revision,
    dtype,
    trust_remote_code,
    device,
    synchronize,
    load_kwargs,
    on_load,
    task,
    on_device=None,
):
    """The load stage: ``load`` (the processor for an image-text-to-text model), timed to the device's sync
    (``load_s``), then ``on_load(model)``."""
    start = time.perf_counter()
    model, tokenizer = load(model_id, revision, dtype, trust_remote_code, device, result, load_kwargs, task, on_device)
    if synchronize:
        synchronize()
    result["load_s"] = time.perf_counter() - start
    if on_load:
        on_load(model)
    return model, tokenizer


def _template(result, model, tokenizer, prompt, image_prompt, chat_template):
    """The template stage (``prompt_inputs``): the prompt's token ids (``tokens_in``, ``input_ids``), and for
    an image-text-to-text model its tokenizer and image inputs."""
    tokenizer, input_ids, attention_mask, extra_inputs = prompt_inputs(
        model, tokenizer, result, prompt, image_prompt, chat_template
    )
    result["tokens_in"] = int(input_ids.shape[1])
    result["input_ids"] = input_ids[0].tolist()
    return tokenizer, input_ids, attention_mask, extra_inputs


class _Generation:
    """One prompt's greedy generation, ready to run in the probe's mode or plainly eager (seeded alike)."""

    def __init__(
        self, model, tokenizer, input_ids, attention_mask, max_new_tokens, device, cache, seed, no_grad, extra_inputs
    ):
        self.model, self.tokenizer = model, tokenizer
        self.args = (input_ids, attention_mask, max_new_tokens, device)
        self.cache, self.seed, self.no_grad, self.extra_inputs = cache, seed, no_grad, extra_inputs

    def run(self, timer=None, scores=None):
        import torch

        torch.manual_seed(self.seed)
        return generate(
            self.model, self.tokenizer, *self.args, timer, self.cache, self.no_grad, scores, self.extra_inputs
        )

    def eagerly(self):
        """The same generation in plain eager (the model's own forward), for ``matches_eager``."""
        return self.run()

    def in_mode(self, result, stage, mode, compile_backend, timer):
        """The generate stage in ``mode``: tokens, text and timings into ``result``; a compile failure
        is blamed on stage "compile" only when plain eager generates (else eager's own error is raised)."""
        eager_forward = compile_forward(self.model, compile_backend) if mode == "compile" else None
        if mode == "compile":  # the stack's dynamic setting, and the cache it made the generation use
            result.update(compile_settings(self.model, compile_backend, self.cache))
        result["step_scores"] = []  # the device's best logits per step, for the reference check
        start = time.perf_counter()
        try:
            with execution_context(mode):
                new_ids = self.run(timer, result["step_scores"])
        except Exception as exc:
            result["failed_step"] = len(timer.times)
            if mode == "compile":
                result.update(compile_counts())
                self.model.forward = eager_forward
                if is_compile_error(exc):  # the compiler's failure only if plain eager generates
                    eager_exc = self.eager_failure()
                    if eager_exc is not None:
                        raise eager_exc from None  # the model fails eagerly too: its own error, stage generate
                    stage.name = "compile"
            raise
        _outputs(result, self.tokenizer, new_ids, timer, start, time.perf_counter())
        if mode == "compile":
            result.update(compile_counts(), compile_s=result["first_token_s"])
            self.model.forward = eager_forward

    def eager_failure(self):
        """The exception plain eager generation raises, or None when it generates."""
        try:
            self.run()
        except Exception as exc:  # noqa: BLE001 whatever it is, it is the answer
            return exc
        return None


def _outputs(result, tokenizer, new_ids, timer, start, end):
    """What a generation that finished records: its tokens and text, and the timings ``timer`` saw."""
    result["output_token_ids"] = new_ids
    result["tokens_out"] = len(new_ids)
    result["generated_text"] = tokenizer.decode(new_ids, skip_special_tokens=True)
    result["generate_s"] = end - start
    if timer.times:
        # each token on the device's own clock, where it has one: the perf phase's TPOT (``performance.verdict_steps``)
        result["token_times"] = list(timer.device_times)
        result["first_token_s"] = timer.times[0] - start
        if len(timer.times) > 1 and timer.times[-1] > timer.times[0]:
            result["decode_tokens_per_s"] = (len(timer.times) - 1) / (timer.times[-1] - timer.times[0])


def prompt_inputs(model, tokenizer, result, prompt, image_prompt, chat_template):
    """The template stage for ``result["task"]`` (``load`` filled it): (tokenizer, input_ids, attention_mask,
    extra_inputs). For image-text-to-text, ``tokenizer`` comes in as the processor and goes out as its
    tokenizer, ``extra_inputs`` holds the image inputs; ``result`` gets chat_template_used, and for an image the
    probe image's hash and the image's share of the ids (``image_tokens``)."""
    if result["task"] != IMAGE_TEXT_TO_TEXT:
        input_ids, attention_mask, result["chat_template_used"] = build_inputs(tokenizer, prompt, chat_template)
        return tokenizer, input_ids, attention_mask, None
    processor = tokenizer
    image, result["image_sha256"] = probe_image()
    with vision_environment():  # a package the processor only asks for when it runs
        input_ids, attention_mask, extra_inputs, result["chat_template_used"] = build_image_inputs(
            processor, image_prompt, chat_template, image
        )
    token = image_token_id(model, processor)
    result["image_tokens"] = int((input_ids == token).sum()) if token is not None else None
    return processor.tokenizer, input_ids, attention_mask, extra_inputs
