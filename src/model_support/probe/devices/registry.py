"""Which adapter serves which device name: a registry, not an if-chain.

A backend's own adapter registers itself with ``@register("<name>")`` in its module (``cuda``,
``tpu``, imported by this package), or, from another package, through the entry point group
``model_support.devices`` (``<name> = "package.module:AdapterClass"``). Every other name is served
by the generic ``AcceleratorAdapter``, and ``cpu`` by the base ``Adapter``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib.metadata import entry_points

from .accelerator import AcceleratorAdapter
from .base import Adapter

ENTRY_POINT_GROUP = "model_support.devices"
ADAPTERS: dict[str, type[Adapter]] = {}
_plugins_loaded = False


def register(name: str):
    """Class decorator: ``cls`` is the adapter of device ``name``."""

    def decorate(cls: type[Adapter]) -> type[Adapter]:
        ADAPTERS[name] = cls
        return cls

    return decorate


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        ADAPTERS.setdefault(entry.name, entry.load())


def registered() -> dict[str, type[Adapter]]:
    """Every backend that has an adapter of its own, by name, in registration order."""
    _load_plugins()
    return dict(ADAPTERS)


def adapter_class(name: str) -> type[Adapter]:
    if name == "cpu":
        return Adapter
    return registered().get(name, AcceleratorAdapter)


def adapter_for(name: str) -> Adapter:
    """The adapter of device ``name`` (nothing imported, nothing checked: ``resolve`` checks)."""
    return adapter_class(name)(name)


def stack_configuration(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The device backends' own configuration in ``environ`` (default: this process's): every registered
    adapter's ``config_vars`` that are set, by name. Nothing is imported or loaded."""
    environ = os.environ if environ is None else environ
    names = [var for cls in registered().values() for var in cls.config_vars]
    return {var: environ[var] for var in dict.fromkeys(names) if var in environ}
