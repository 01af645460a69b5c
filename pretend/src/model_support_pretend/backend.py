"""Registering the pretend accelerator with torch: PrivateUse1 renamed ``pretend``, its device
module (``torch.pretend``), the kernels that create tensors on it, and a process-group backend
for its collectives (gloo underneath: the data are CPU tensors)."""

from __future__ import annotations

import sys

import torch

from . import attention as _attention
from . import device as _device_module
from . import tensor as _tensor
from .config import NAME, Config

_LIBRARY = None  # the torch.library registration, kept alive for the life of the process


def operator(name: str):
    """The operator ``name`` names (``"aten::rsqrt"``, ``"aten::add.Tensor"``), or None when
    torch has none."""
    namespace, _, rest = name.partition("::")
    base, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, namespace), base)
        return getattr(packet, overload or "default") if overload else packet
    except (AttributeError, RuntimeError):
        return None


def _never_reaches_a_backend(op) -> bool:
    """``op`` (its default overload, for a name without one: what models call) is composite
    (``tensor.composite``): a backend receives its parts instead, so a fault on it would never
    happen."""
    # the packet's first form on tensors, its default where that is
    if not isinstance(op, torch._ops.OpOverload):
        # one (aten::add's and aten::mul's "default" are TorchScript's sums of scalars, which no
        # kernel serves)
        forms = [
            getattr(op, name)
            for name in dict.fromkeys(("default", *op.overloads()))
            if name in op.overloads()
        ]
        op = next(f for f in forms if any("Tensor" in str(a.type) for a in f._schema.arguments))
    return _tensor.composite(op)


def _check_ops(config: Config) -> None:
    """Every operator a fault names must exist: a typo would otherwise be a fault that never
    happens."""
    from .config import CONFIG_VAR, PretendConfigError

    for key in ("missing_ops", "wrong_ops", "crash_ops", "slow_ops", "fallback_ops", "flaky_ops"):
        for name in getattr(config, key):
            if "::" not in name or operator(name) is None:
                raise PretendConfigError(
                    f"{CONFIG_VAR}: {key} names {name!r}, which is no operator torch knows; "
                    "write it as 'aten::rsqrt' (or 'aten::add.Tensor' for one overload)."
                )
            if _never_reaches_a_backend(operator(name)):
                raise PretendConfigError(
                    f"{CONFIG_VAR}: {key} names {name!r}, which no backend receives: it "
                    "reaches a backend as the operators it decomposes into (aten::linear as "
                    "aten::mm or aten::addmm); name one of those."
                )


def register(config: Config) -> None:
    """Make ``pretend`` a device of this process (once)."""
    global _LIBRARY
    if _tensor.STATE is not None:
        return
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _check_ops(config)
    config = _launched(config)
    _tensor.STATE = _tensor.State(config)
    _setup_privateuseone_for_python_backend(NAME, backend_module=_device_module)
    sys.modules[f"torch.{NAME}"] = _device_module
    _LIBRARY = torch.library.Library("aten", "IMPL")
    for op in _tensor.FACTORIES:
        _LIBRARY.impl(op, _tensor.device_kernel(op), _tensor.KEY)
    _LIBRARY.impl(_tensor.COPY_FROM, _tensor.copy_from, _tensor.KEY)
    _attention.install(config.sdpa_kernel)
    _register_process_group()
    if config.compile_static:
        _play_static_compile()


def _launched(config: Config) -> Config:
    """The TPU contract's distributed clauses (``launch.rank_view``): a rank without its launch
    environment does not start; a rank opens its one device."""
    import os

    from .launch import rank_view

    return rank_view(config, os.environ)


def _gloo(store, rank, size, timeout):
    import torch.distributed as dist

    return dist.ProcessGroupGloo(store, rank, size, timeout)


def _register_process_group() -> None:
    """``torch.distributed``'s backend for the device: gloo, since every collective reaches it
    with the CPU tensors underneath (``tensor.run`` unwraps them before the collective runs)."""
    import torch.distributed as dist

    if dist.is_available() and NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(NAME, _gloo, devices=[NAME])


def _static_backend(graph_module, example_inputs, **kwargs):
    """The TPU contract's compile backend (``compile_static``): aot_eager underneath (its graphs
    run through AOTAutograd on the device's tensors), refusing dynamic shapes as TorchTPU's
    ``tpu`` backend does."""
    from torch._dynamo.backends.registry import lookup_backend

    if not torch._dynamo.config.assume_static_by_default:
        raise NotImplementedError(
            f"{NAME} backend does not support torch.compile(..., dynamic=True, ...): run it "
            "with dynamic=None or False."
        )
    return lookup_backend("aot_eager")(graph_module, example_inputs, **kwargs)


def _play_static_compile() -> None:
    """The TPU contract's ``compile_static`` clause, as TorchTPU does it for ``tpu`` (its
    ``_loader``): a torch.compile backend named after the device, and torch.compile patched to
    give it ``dynamic=False`` unless the caller says otherwise (every new shape is a new graph; a
    dynamic KV cache recompiles at every decode length)."""
    import functools

    from torch._dynamo.backends.registry import register_backend

    register_backend(compiler_fn=_static_backend, name=NAME)
    original = torch.compile

    @functools.wraps(original)
    def static_compile(*args, **kwargs):
        if "dynamic" not in kwargs and kwargs.get("backend") == NAME:
            kwargs["dynamic"] = False
        return original(*args, **kwargs)

    torch.compile = static_compile  # as torch_tpu assigns its own
