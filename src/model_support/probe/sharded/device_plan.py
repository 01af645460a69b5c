"""How many devices a model needs and how transformers splits it over them: parameter and memory
estimates (``estimate_params``, ``memory_estimate_bytes``), the device count (``plan_devices``), the
parallelism (``parallelism_for``) and its ``DistributedConfig`` keyword arguments
(``distributed_config``), and ``plan_run``, which fills a run's result with all of it."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from .. import probe_core

#: Bytes per parameter of the dtypes a model is loaded in.
DTYPE_BYTES = {
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float32": 4,
    "float": 4,
    "float64": 8,
    "double": 8,
}
#: On top of the weights, for activations, the KV cache of a short greedy generation, buffers and
#: the parts a plan replicates on every rank (norms, routers): 20%.
DEFAULT_MARGIN = 0.2


class DoesNotFit(ValueError):
    """Even every device present cannot hold the model; the message is one sentence saying so."""


class NoParallelPlan(RuntimeError):
    """The model needs more than one device but has neither a tensor nor an expert parallel plan."""


# --- how many devices ----------------------------------------------------------------------------


def dtype_bytes(dtype: str) -> int:
    """Bytes per parameter of ``dtype`` (a torch dtype name such as "bfloat16")."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise ValueError(f"Unknown dtype {dtype!r}: expected one of {', '.join(DTYPE_BYTES)}.")
    return DTYPE_BYTES[name]


def memory_estimate_bytes(num_params: int, dtype: str, margin: float = DEFAULT_MARGIN) -> int:
    """Device memory the whole model needs: parameters x dtype bytes x (1 + margin)."""
    return math.ceil(num_params * dtype_bytes(dtype) * (1 + margin))


def plan_devices(
    num_params: int,
    dtype: str,
    device_memory_bytes: int,
    devices_present: int,
    margin: float = DEFAULT_MARGIN,
) -> int:
    """The fewest devices, a power of two up to ``devices_present``, whose memory holds the
    model.

    The model needs ``num_params x dtype bytes x (1 + margin)`` bytes (``margin``: activations,
    the KV cache, replicated parts; 20% by default), split evenly over the devices. Raises
    ``DoesNotFit`` with one sentence when even every device present (the largest power of two of
    them) cannot."""
    if devices_present < 1:
        raise ValueError(f"devices_present must be at least 1, not {devices_present}.")
    if device_memory_bytes <= 0:
        raise ValueError(f"device_memory_bytes must be positive, not {device_memory_bytes}.")
    need = memory_estimate_bytes(num_params, dtype, margin)
    count = 1
    while count <= devices_present:
        if need / count <= device_memory_bytes:
            return count
        count *= 2
    largest = count // 2
    raise DoesNotFit(
        f"The model needs about {need / 2**30:.3g} GiB ({num_params} parameters in {dtype}, "
        f"+{margin:.0%}), more than {largest} device(s) of {device_memory_bytes / 2**30:.3g} "
        f"GiB hold ({largest * device_memory_bytes / 2**30:.3g} GiB)."
    )


def _safetensors_files(folder: Path) -> list[Path] | None:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map") or {}
        return [folder / name for name in sorted(set(weight_map.values()))]
    single = folder / "model.safetensors"
    return [single] if single.is_file() else None


def safetensors_params(folder: str | Path) -> int | None:
    """Parameters in a folder's safetensors checkpoint, from the files' headers only (no tensor
    read); None when it has none. Tied weights are stored once, as the model counts them."""
    files = _safetensors_files(Path(folder))
    if not files:
        return None
    total = 0
    for path in files:
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        total += sum(
            math.prod(entry["shape"]) for key, entry in header.items() if key != "__metadata__"
        )
    return total


def config_params(model: str, revision: str, trust_remote_code: bool) -> int:
    """Parameters of the model built from its config on the meta device (no memory, no weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(
        model, revision=revision or None, trust_remote_code=trust_remote_code
    )
    image_text = probe_core.task_of_config(config) == probe_core.IMAGE_TEXT_TO_TEXT
    with torch.device("meta"):
        auto = AutoModelForImageTextToText if image_text else AutoModelForCausalLM
        built = auto.from_config(config, trust_remote_code=trust_remote_code)
    return sum(p.numel() for p in built.parameters())


def estimate_params(model: str, revision: str = "", trust_remote_code: bool = False) -> int:
    """The model's parameter count without loading it: the safetensors headers of a local folder,
    the Hub's safetensors metadata (header ranges only) for a Hub id, else the model built from
    its config on the meta device."""
    if Path(model).is_dir():
        counted = safetensors_params(model)
        if counted is not None:
            return counted
    else:
        try:
            from huggingface_hub import get_safetensors_metadata

            metadata = get_safetensors_metadata(model, revision=revision or None)
            return int(sum(metadata.parameter_count.values()))
        except Exception:  # noqa: BLE001 no safetensors on the Hub, offline, gated: count from the config
            pass
    return config_params(model, revision, trust_remote_code)


# --- how to split it
# ---------------------------------------------------------------------------------


def _config_and_model_class(obj):
    """(config or config class, model class or None) for a config, a config class, a model or a
    model class."""
    from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

    if isinstance(obj, PreTrainedModel):
        return obj.config, type(obj)
    if isinstance(obj, type) and issubclass(obj, PreTrainedModel):
        return obj.config_class, obj
    config_class = type(obj) if isinstance(obj, PretrainedConfig) else obj
    if not (isinstance(config_class, type) and issubclass(config_class, PretrainedConfig)):
        raise TypeError(f"Expected a transformers config or model (or their class), not {obj!r}.")
    model_class = AutoModelForCausalLM._model_mapping.get(config_class, None)
    if (
        model_class is None
        and isinstance(obj, PretrainedConfig)
        and getattr(obj, "architectures", None)
    ):
        import transformers

        model_class = getattr(transformers, obj.architectures[0], None)
    return obj, model_class


def _shards_layers(plan) -> bool:
    """A tensor plan that splits more than the LM head (a head-only plan leaves every layer
    whole)."""
    return bool(plan) and any(not key.startswith("lm_head") for key in plan)


def parallelism_for(config_or_model_class) -> tuple[str | None, dict]:
    """How transformers can split this model over several devices: ("tp" | "ep" | None, details).

    ``tp``: a tensor plan (``base_model_tp_plan`` on its config, or a ``_tp_plan`` on the model
    class that shards more than the LM head) and no expert plan. ``ep``: an expert plan (MoE):
    experts whole per rank, the dense layers by the tensor plan when there is one
    (``details["dense"] == "tp"``), else FSDP-sharded (``"fsdp"``). None: neither. ``details``
    names the model class, what plans it has, and the ``DistributedConfig`` keyword arguments for
    N devices (``distributed_config(kind, details, N)``)."""
    config, model_class = _config_and_model_class(config_or_model_class)
    class_plan = getattr(model_class, "_tp_plan", None) if model_class is not None else None
    # a vision-language model is split by its language model's plan (transformers gathers the
    # sub-models') (a config class, given with a model class, has its plans as class attributes and
    # no text config to ask)
    text = config if isinstance(config, type) else config.get_text_config()
    tp_plan = (
        getattr(config, "base_model_tp_plan", None)
        or getattr(text, "base_model_tp_plan", None)
        or {}
    )
    ep_plan = (
        getattr(config, "base_model_ep_plan", None)
        or getattr(text, "base_model_ep_plan", None)
        or getattr(model_class, "_ep_plan", None)
        or {}
    )
    has_tp = _shards_layers(tp_plan) or _shards_layers(class_plan)
    details = {
        "model_class": model_class.__name__ if model_class is not None else None,
        "model_type": getattr(config, "model_type", None),
        "tp_plan": has_tp,
        "ep_plan": bool(ep_plan),
        "dense": None,
    }
    if ep_plan:
        details["dense"] = "tp" if has_tp else "fsdp"
        return "ep", details
    if has_tp:
        details["dense"] = "tp"
        return "tp", details
    return None, details


def distributed_config(kind: str | None, dense: str | None, world_size: int) -> dict | None:
    """The ``DistributedConfig`` keyword arguments that split a model ``kind``-parallel over
    ``world_size`` ranks (None for one rank). ``dense``: how an ``ep`` model's dense layers are
    split, "tp" or "fsdp"."""
    if world_size == 1:
        return None
    if kind == "tp":
        return {"tp_size": world_size}
    if kind == "ep":
        return {"fsdp_size" if dense == "fsdp" else "tp_size": world_size, "ep_size": world_size}
    raise ValueError(f"No way to split a model {kind!r}-parallel; expected 'tp' or 'ep'.")


def no_plan_sentence(model_class: str | None, world_size: int) -> str:
    name = model_class or "This model"
    return (
        f"{name} has no tensor or expert parallel plan, and needs {world_size} devices: it cannot "
        "run here as shipped"
    )


def plan_run(settings: dict, world_size: int, result: dict) -> tuple[str | None, dict | None]:
    """Fill what the plan says (parallelism, sizes, memory estimate); returns (kind,
    DistributedConfig kwargs). A config that cannot be loaded is the probe's load failure, as it
    would be in probe_core.load."""
    model = settings["model"]
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(
        model,
        revision=settings["revision"] or None,
        trust_remote_code=settings["trust_remote_code"],
    )
    result["model_type"] = getattr(config, "model_type", None)
    result["architectures"] = list(getattr(config, "architectures", None) or [])
    kind, details = parallelism_for(config)
    try:
        count = estimate_params(model, settings["revision"], settings["trust_remote_code"])
        result["num_params_estimate"] = count
        result["memory_estimate_bytes"] = memory_estimate_bytes(count, settings["dtype"])
        result["memory_per_device_bytes"] = math.ceil(result["memory_estimate_bytes"] / world_size)
    except Exception:  # noqa: BLE001 the estimate is informative only
        pass
    if settings["parallelism"] != "auto":
        kind = settings["parallelism"]
    if kind == "ep" and settings["ep_dense"] != "auto":
        details = {**details, "dense": settings["ep_dense"]}
    dense = details.get("dense")
    result["parallelism_details"] = details
    if world_size == 1:
        return kind, None
    if kind is None:
        return None, None
    kwargs = distributed_config(kind, dense if kind == "ep" else None, world_size)
    assert kwargs is not None  # a plan over several devices always has its config
    result.update(
        parallelism=kind,
        distributed_config=kwargs,
        tp_size=kwargs.get("tp_size", 1),
        ep_size=kwargs.get("ep_size", 1),
        fsdp_size=kwargs.get("fsdp_size", 1),
    )
    return kind, kwargs
