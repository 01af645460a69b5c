"""From a device name to its adapter: in the probe (``resolve``: the backend loaded and checked) and
in the sweep's runner (``facts``: kind, count and memory, asked once of a short-lived child process,
so that the runner never holds a TPU chip nor creates a CUDA context)."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from ... import backend_env
from ...engine import children
from ...errors import UserError
from .backends import backend_devices
from .base import Adapter, DeviceUnavailable
from .registry import adapter_for, registered


def resolve(device: str) -> Adapter:
    """The adapter for ``device`` (``cpu``, ``auto`` or an accelerator's name), its backend loaded;
    ``DeviceUnavailable`` (one sentence) when this machine does not have it."""
    if device == "cpu":
        return Adapter("cpu")
    if device == "auto":
        return _auto()
    adapter = adapter_for(device)
    problem = adapter.unavailable(auto_candidates)
    if problem:
        raise DeviceUnavailable(problem)
    return adapter


def auto_candidates() -> list[str]:
    """The accelerators ``auto`` may find, without importing torch: every backend with an adapter
    of its own or an installed out-of-tree package, except those whose adapter sees no hardware."""
    names = [n for n in dict.fromkeys([*registered(), *backend_devices()]) if n != "cpu"]
    return [n for n in names if adapter_for(n).hardware_visible() is not False]


def _auto() -> Adapter:
    """The current accelerator, else the first candidate whose backend loads and reports itself,
    else the CPU."""
    import torch

    current = torch.accelerator.current_accelerator()
    if current is not None and torch.accelerator.is_available():
        return resolve(current.type)
    for name in auto_candidates():
        try:
            return resolve(name)
        except DeviceUnavailable:
            continue
    return Adapter("cpu")


@dataclass(frozen=True)
class DeviceFacts:
    """What the sweep's runner knows of a device: its kind, how many, memory per device (None:
    unknown), or why it cannot be used (``problem``)."""

    type: str
    count: int = 1
    memory_bytes: int | None = None
    problem: str | None = None


def _cpu_facts() -> DeviceFacts:
    import psutil

    return DeviceFacts("cpu", 1, psutil.virtual_memory().total)


def facts(device: str) -> DeviceFacts:
    """``device``'s facts for the runner. The CPU, and ``auto`` where no accelerator can be
    there, are answered here; any other device by a child process that resolves it (``python -m
    model_support.probe.devices DEVICE``), once per device and environment."""
    if device == "cpu" or (device == "auto" and not auto_candidates()):
        return _cpu_facts()
    return _facts_from_child(device, tuple(sorted(backend_env.child_environ().items())))


#: How long the child that checks a device may take (loading a backend and asking it takes seconds;
#: a hung driver or runtime would otherwise hold the sweep's start forever).
FACTS_TIMEOUT_S = 300.0


@functools.lru_cache(maxsize=16)
def _facts_from_child(device: str, environ: tuple) -> DeviceFacts:
    env = dict(environ)  # backend_env.child_environ: the autoload off
    argv = [sys.executable, "-m", "model_support.probe.devices", device]
    try:
        return DeviceFacts(
            **children.last_json(
                argv, "asking it for its kind, count and memory", FACTS_TIMEOUT_S, env=env
            )
        )
    except children.ChildFailed as exc:
        hint = (
            " (a hung driver or runtime?); check it with `python -m "
            f"model_support.probe.devices {device}`"
            if exc.timed_out
            else ""
        )
        return DeviceFacts(
            device,
            0,
            None,
            f"Device {device!r} could not be checked: {str(exc).rstrip('.')}{hint}.",
        )
    except TypeError as exc:  # an answer that is no device's facts
        return DeviceFacts(device, 0, None, f"Device {device!r} could not be checked: {exc}.")


def describe(device: str) -> DeviceFacts:
    """In the child: resolve ``device`` and say what it is."""
    try:
        adapter = resolve(device)
    # no such device here; its adapter does not import
    except (DeviceUnavailable, UserError) as exc:
        return DeviceFacts(device, 0, None, str(exc))
    if adapter.type == "cpu":
        return _cpu_facts()
    try:
        memory = adapter.device_memory_bytes()
    except DeviceUnavailable:
        memory = None
    return DeviceFacts(adapter.type, adapter.device_count(), memory)


def check_available(device: str) -> str | None:
    """None when ``device`` can be used here, else the one sentence a probe would record
    (``auto`` always can: it falls back to the CPU)."""
    if device == "auto":
        return None
    return facts(device).problem


def pinning_env(kind: str, ids: Iterable[int]) -> dict:
    """Environment variables that pin a probe process to the devices ``ids`` of kind ``kind``."""
    return adapter_for(kind).pinning_env(ids)


def main(argv: list[str]) -> None:
    """``python -m model_support.probe.devices DEVICE``: one JSON line, the device's facts."""
    print(json.dumps(asdict(describe(argv[0]))))


#: torch's own accelerators, whose stack a machine can read when its torch build has their kernels.
TORCH_ACCELERATORS = ("cuda", "xpu", "mps", "hpu")


def readable_stacks() -> list[str]:
    """The devices whose stacks this machine can read (in a child that loads them): the CPU, the
    adapters' and installed backends' devices torch has kernels for here or whose backend is
    installed."""
    import torch

    installed = backend_devices()

    def readable(name: str) -> bool:
        if name in installed:
            return True
        try:
            return torch._C._dispatch_has_kernel_for_dispatch_key(
                "aten::empty.memory_format", name.upper()
            )
        except RuntimeError:  # no dispatch key of that name in this torch
            return False

    built_in = [
        n
        for n in dict.fromkeys([*TORCH_ACCELERATORS, *registered()])
        if n not in installed and n != "cpu"
    ]
    return list(dict.fromkeys(["cpu", *(n for n in built_in if readable(n)), *installed]))


def known_device(device: str) -> bool:
    """Whether ``device`` names a device at all here: one torch knows, an installed backend's, or
    an adapter's."""
    import torch

    if device in backend_devices() or device in registered():
        return True
    try:
        torch.device(device)
    except RuntimeError:
        return False
    return device != "privateuseone"


def unknown_device(device: str) -> str:
    """The sentence for a device name nothing here knows: what the user may have meant (an
    adapter's ``aliases``: "gpu"), and the stacks this machine can read."""
    hints = [
        hint
        for cls in registered().values()
        for alias, hint in cls.aliases.items()
        if alias == device.lower()
    ]
    hint = f" ({hints[0]})" if hints else ""
    return (
        f"There is no device {device!r} here{hint}; this machine can read the stacks of: "
        f"{', '.join(readable_stacks())}."
    )
