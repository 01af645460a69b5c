"""The image-text-to-text probe's parts, self-contained (part of every repro script's body, as
``probe_core``): its image, drawn in code so a script re-creates it, its processor and inputs,
and the vision packages a model needs, said as the environment's, never the model's failure."""

import contextlib
import functools
import hashlib

from .probe_failures import NoChatTemplate, NoImageProcessor, VisionBackendMissing


def torchvision_broken():
    """Why an installed torchvision cannot be used (it does not import beside this torch: a build
    for another torch, "operator torchvision::nms does not exist"), or None when it imports or is
    absent. transformers imports it for every model once it is installed, so a broken one fails
    every load: the environment."""
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
            f"{torch.__version__} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); uninstall it (pip uninstall "
            "torchvision) or install the torchvision built for this torch"
        )
    return None


#: The packages the image-text-to-text task needs beyond transformers, by the lower-cased name that
#: transformers' messages or an ImportError give them, and the name pip installs. Pillow is a
#: dependency of this package (the PIL image processors and the probe image); torchvision and
#: num2words (the video processors) are the ``vision`` extra.
VISION_PACKAGES = {
    "torchvision": "torchvision",
    "num2words": "num2words",
    "pil": "pillow",
    "pillow": "pillow",
}


def _missing_vision_package(exc):
    """(what needs it, package) when ``exc`` or what it was raised from says that a package the
    image-text-to-text task needs is missing or does not import ("X requires the Torchvision
    library", "Package `num2words` is required to run X", an image processor that could import
    neither of its backends, ``import PIL`` failing, a torchvision op missing from a build for
    another torch); else None."""
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
            r"Could not load any image processor class.* Missing optional dependencies: ([\w, ]+)\.",
            text,
        )
        # neither backend of the image processor imports: Pillow is the light one (and ours)
        if either:
            names = [n.strip().lower() for n in either.group(1).split(",")]
            return (
                "this model's image processor",
                "pillow" if "pillow" in names else VISION_PACKAGES.get(names[0], names[0]),
            )
        module = (
            (getattr(exc, "name", None) or "").split(".")[0].lower()
            if isinstance(exc, ImportError)
            else ""
        )
        if module in VISION_PACKAGES:
            return "this model's processor", VISION_PACKAGES[module]
        if "torchvision::" in text:
            return "this model's processor", "torchvision"
        exc = exc.__cause__ or exc.__context__
    return None


def vision_backend_missing(exc, who=None):
    """``VisionBackendMissing`` (the environment, one sentence naming what to install) when
    ``exc`` says a package the image-text-to-text task needs is missing or broken; else None.
    ``who``: what needs it, when the caller knows better than the message."""
    missing = _missing_vision_package(exc)
    if missing is None:
        return None
    import torch

    who, package = who or missing[0], missing[1]
    if package == "pillow":
        return VisionBackendMissing(
            f"{who} needs Pillow, and it is not installed: pip install pillow (a dependency of "
            "model-support that this environment lacks)"
        )
    problem = (
        torchvision_broken() if package == "torchvision" else None
    ) or f"{package} is not installed"
    install = (
        f"the torchvision built for torch {torch.__version__}"
        if package == "torchvision"
        else package
    )
    return VisionBackendMissing(
        f"{who} needs {package}, and {problem}: install {install} (pip install "
        "'model-support[vision]' where torch and torchvision come from one build, as on a TPU "
        "VM)"
    )


@contextlib.contextmanager
def vision_environment(who=None):
    """Turn an exception that says a package the image-text-to-text task needs is missing or
    broken into ``VisionBackendMissing`` (the environment: no verdict); any other passes through
    as it is."""
    try:
        yield
    except Exception as exc:
        missing = vision_backend_missing(exc, who)
        if missing is None:
            raise
        raise missing from exc


def load_processor(model_id, kwargs):
    """``AutoProcessor`` for an image-text-to-text model: one with an image processor. The
    processors of some models (Qwen2-VL, Qwen2.5-VL, SmolVLM) also need a video processor, and
    every video processor needs torchvision (SmolVLM's also num2words); an image processor needs
    Pillow or torchvision. Where one is missing this raises VisionBackendMissing (the
    environment), never a verdict."""
    from transformers import AutoProcessor

    with vision_environment():
        processor = AutoProcessor.from_pretrained(model_id, **kwargs)
    if getattr(processor, "image_processor", None) is None:
        raise NoImageProcessor(
            "no image processor for this image-text-to-text model: AutoProcessor gave a "
            f"{type(processor).__name__} (the folder lacks processor_config.json / "
            "preprocessor_config.json)"
        )
    return processor


#: The probe image's size in pixels (width, height); processors resize it to what their model takes.
PROBE_IMAGE_SIZE = (224, 224)


# drawn once per process: ~50 ms, and a probe builds its inputs twice
@functools.lru_cache(maxsize=2)
def probe_image_rgb(width=PROBE_IMAGE_SIZE[0], height=PROBE_IMAGE_SIZE[1]):
    """The probe's fixed image as raw RGB bytes, row by row: a red house with a grey roof and a
    brown door on green grass, a yellow sun in a blue sky. Drawn in integer arithmetic only, so
    it is the same bytes on every machine and every Python (this function is in every repro
    script; ``image_sha256`` is their hash)."""
    horizon, sun_x, sun_y, sun_r = height * 5 // 8, width * 3 // 4, height // 5, height // 9
    left, right, wall_top = width // 6, width // 6 + width * 3 // 10, horizon - height // 5
    roof_top, middle, half = (
        wall_top - height // 8,
        (left + right) // 2,
        (right - left) // 2 + width // 40,
    )
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
            elif (
                roof_top <= y < wall_top
                and abs(x - middle) * (wall_top - roof_top) <= (y - roof_top) * half
            ):
                pixel = (70, 70, 80)  # the roof
            elif y >= horizon:
                # grass, darker below
                pixel = (40, 170 - (y - horizon) * 60 // (height - horizon), 50)
            else:
                # sky, lighter at the horizon
                pixel = (90 + y * 45 // horizon, 150 + y * 30 // horizon, 235)
            out += bytes(pixel)
    return bytes(out)


@functools.cache
def probe_image_sha256():
    """The sha256 of the probe image's RGB bytes (the record's ``image_sha256``; every repro
    script names it)."""
    return hashlib.sha256(probe_image_rgb()).hexdigest()


def probe_image():
    """The probe's fixed image (a PIL image) and the sha256 of its RGB bytes (the record's
    ``image_sha256``)."""
    with vision_environment("the probe image"):
        from PIL import Image

    return Image.frombytes("RGB", PROBE_IMAGE_SIZE, probe_image_rgb()), probe_image_sha256()


def build_image_inputs(processor, prompt, chat_template, image):
    """The processor's inputs for the prompt and one image: the prompt rendered through the
    processor's chat template with an image item before the text ("auto", when it has one), else
    the processor's image token and the prompt (PaliGemma's processors have no template and take
    it so).

    Returns (input_ids, attention_mask, extra, chat_template_used): ``extra`` holds the image
    inputs the model takes beside the ids (pixel_values, image_grid_thw, image_sizes,
    token_type_ids, ...), for generate and for any other forward over the same prompt."""
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
        processor(
            images=image,
            text=text,
            return_tensors="pt",
            **({"add_special_tokens": False} if used else {}),
        )
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
