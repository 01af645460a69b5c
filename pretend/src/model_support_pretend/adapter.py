"""The pretend accelerator's device adapter: the generic ``AcceleratorAdapter`` (everything it does on the
device goes through ``torch.accelerator`` and its ``torch.pretend`` fallback), plus the one thing the
sweep's runner cannot learn without torch: whether the backend is switched on here, and what its stack
implements (``op_coverage``: from its configuration, since a backend written in Python registers almost
nothing with the dispatcher). Registered through
the entry point group ``model_support.devices`` (pyproject.toml), as another package's adapter would be."""

from __future__ import annotations

import os
from collections.abc import Iterable

from model_support.probe.devices import FALLBACK, IMPLEMENTED, MISSING, AcceleratorAdapter

from .config import CONFIG_VAR, from_environment


class PretendAdapter(AcceleratorAdapter):
    config_vars = (CONFIG_VAR,)  # the faults the stack has: a different value is a different stack
    #: Its devices as a Ray custom resource: a local Ray that a sweep starts is given this host's (Ray finds none).
    ray_resource = "pretend"

    def hardware_visible(self) -> bool:
        return CONFIG_VAR in os.environ

    def unavailable(self, elsewhere=list) -> str | None:
        if CONFIG_VAR not in os.environ:
            return (
                "Device 'pretend' was requested but the pretend accelerator is off here: set "
                f"{CONFIG_VAR} to its JSON configuration (e.g. '{{\"devices\": 2}}'), see docs/devices.md."
            )
        return super().unavailable(elsewhere)

    def op_coverage(self, ops: Iterable[str]) -> dict[str, str]:
        """From the configuration: ``missing_ops`` are missing, ``fallback_ops`` fall back to the CPU, every other
        operator is implemented (a name without an overload covers all of them, as the faults do)."""
        config = from_environment()
        if config is None:
            return {}

        def status(name: str) -> str:
            names = {name, name.partition(".")[0]}
            if names & config.missing_ops:
                return MISSING
            return FALLBACK if names & config.fallback_ops else IMPLEMENTED

        return {name: status(name) for name in ops}
