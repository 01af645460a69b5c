"""The pretend accelerator's device adapter: the generic ``AcceleratorAdapter`` (everything it does on the
device goes through ``torch.accelerator`` and its ``torch.pretend`` fallback), plus the one thing the
sweep's runner cannot learn without torch: whether the backend is switched on here. Registered through
the entry point group ``model_support.devices`` (pyproject.toml), as another package's adapter would be."""

from __future__ import annotations

import os

from model_support.probe.devices import AcceleratorAdapter

from .config import CONFIG_VAR


class PretendAdapter(AcceleratorAdapter):
    config_vars = (CONFIG_VAR,)  # the faults the stack has: a different value is a different stack

    def hardware_visible(self) -> bool:
        return CONFIG_VAR in os.environ

    def unavailable(self, elsewhere=list) -> str | None:
        if CONFIG_VAR not in os.environ:
            return (
                "Device 'pretend' was requested but the pretend accelerator is off here: set "
                f"{CONFIG_VAR} to its JSON configuration (e.g. '{{\"devices\": 2}}'), see docs/devices.md."
            )
        return super().unavailable(elsewhere)
