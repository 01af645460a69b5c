"""Which adapter serves which device name: a registry, not an if-chain.

A backend's own adapter registers itself with ``@register("<name>")`` in its module (``cuda``,
``tpu``, imported by this package), or, from another package, through the entry point group
``model_support.devices`` (``<name> = "package.module:AdapterClass"``). Every other name is served
by the generic ``AcceleratorAdapter``, and ``cpu`` by the base ``Adapter``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib.metadata import entry_points

from ...errors import UserError
from .accelerator import AcceleratorAdapter
from .base import Adapter

ENTRY_POINT_GROUP = "model_support.devices"
ADAPTERS: dict[str, type[Adapter]] = {}
#: Entry points that did not import, by device name: what went wrong (said when that device is asked
#: for).
BROKEN: dict[str, str] = {}
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
        if entry.name in ADAPTERS:
            continue
        try:
            ADAPTERS[entry.name] = entry.load()
        except Exception as exc:  # noqa: BLE001 another package's broken plugin must not stop every other device
            package = entry.dist.name if entry.dist else "its package"
            BROKEN[entry.name] = (
                f"{entry.value} (from {package}) does not import: {type(exc).__name__}: {exc}"
            )


def registered() -> dict[str, type[Adapter]]:
    """Every backend that has an adapter of its own, by name, in registration order."""
    _load_plugins()
    return dict(ADAPTERS)


def adapter_class(name: str) -> type[Adapter]:
    """The adapter of ``name``; a device whose registered adapter does not import is one
    sentence, never the generic adapter in its place (it would judge the stack without what its
    own adapter knows)."""
    if name == "cpu":
        return Adapter
    adapters = registered()
    if name not in adapters and name in BROKEN:
        raise UserError(
            f"The device adapter of {name!r}, {BROKEN[name]}; reinstall that package, or "
            "uninstall it to use the generic adapter."
        )
    return adapters.get(name, AcceleratorAdapter)


def adapter_for(name: str) -> Adapter:
    """The adapter of device ``name`` (nothing imported, nothing checked: ``resolve`` checks)."""
    return adapter_class(name)(name)


def stack_configuration(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The device backends' own configuration in ``environ`` (default: this process's): every
    registered adapter's ``configuration`` (its ``config_vars`` that are set; a value its adapter
    does not declare safe to show as a fingerprint). Nothing is imported or loaded."""
    found: dict[str, str] = {}
    for cls in registered().values():
        found.update(cls.configuration(environ))
    return dict(sorted(found.items()))


def backend_identity(device: str, environ: Mapping[str, str] | None = None) -> dict:
    """The record's fields that say which backend ``device`` is: ``backend_versions`` (its
    adapter's packages and runtime versions, ``Adapter.backend_versions``) and ``backend_config``
    (JSON: its adapter's configuration variables set in ``environ``, default this process's, a
    value not declared safe to show by its fingerprint; null when none is set). {} for ``auto``
    (no device yet: the probe says once it has resolved one) and for a device whose adapter does
    not import. Nothing is imported or loaded."""
    if device == "auto":
        return {}
    try:
        adapter = adapter_for(device)
    except UserError:
        return {}
    config = adapter.configuration(environ)
    return {
        "backend_versions": adapter.backend_versions(),
        "backend_config": json.dumps(config, sort_keys=True) if config else None,
    }
