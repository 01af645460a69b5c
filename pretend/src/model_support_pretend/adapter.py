"""The pretend accelerator's device adapter: the generic ``AcceleratorAdapter`` (everything it does on the
device goes through ``torch.accelerator`` and its ``torch.pretend`` fallback), plus the one thing the
sweep's runner cannot learn without torch: whether the backend is switched on here, and what its stack
implements (``op_coverage``: from its configuration, since a backend written in Python registers almost
nothing with the dispatcher). Registered through
the entry point group ``model_support.devices`` (pyproject.toml), as another package's adapter would be."""

from __future__ import annotations

import os
from collections.abc import Iterable

from model_support.probe.devices import (
    CRASHES,
    FALLBACK,
    IMPLEMENTED,
    MISSING,
    WRONG,
    AcceleratorAdapter,
    DeviceUnavailable,
)

from .config import BLOCKING_VAR, CONFIG_VAR, Config, from_environment


class PretendAdapter(AcceleratorAdapter):
    config_vars = (CONFIG_VAR,)  # the faults the stack has: a different value is a different stack
    config_shown = config_vars
    backend_packages = ("model-support-pretend",)  # the backend is this distribution: its version is its build
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

    synchronous_ops = True  # its operators run in Python, on the CPU underneath: done when the call returns
    #: What makes its runtime report a crash at the operator that caused it (``crash_after`` ignored).
    blocking_env = {BLOCKING_VAR: "1"}

    def host_kernels(self) -> tuple[bool, str | None]:
        """Yes: a kernel registered through ``torch.library`` for its dispatch key (PrivateUse1) replaces its own
        implementation of the operator, as the dispatcher makes it for a C++ backend (``tensor.hosted``)."""
        return True, None

    def host_counters(self):
        """The backend's own counts of syncs and CPU fallbacks (``counters.Counters``)."""
        from . import tensor

        return tensor.STATE.counters if tensor.STATE is not None else None

    def peak_bandwidth_gbs(self) -> tuple[float | None, str]:
        """What its configuration declares (``bandwidth_gbs``), or that it declares none."""
        config = from_environment()
        if config is None or config.bandwidth_gbs is None:
            return None, f"the pretend device declares no peak memory bandwidth (set bandwidth_gbs in {CONFIG_VAR})"
        return config.bandwidth_gbs, f"bandwidth_gbs in {CONFIG_VAR}"

    def op_coverage(self, ops: Iterable[str]) -> dict[str, str]:
        """From the configuration, every fault the stack has: ``missing_ops`` are missing, ``crash_ops`` crash (the
        runtime aborts), ``wrong_ops`` are wrong, ``fallback_ops`` fall back to the CPU, every other operator is
        implemented (a name without an overload covers all of them, as the faults do); ``dtype::float64`` is missing
        when ``unsupported_dtypes`` lists float64. The backend off here is one sentence, never an empty answer
        (which would predict every model PASS)."""
        config = from_environment()
        if config is None:
            raise DeviceUnavailable(
                f"The pretend stack's coverage cannot be read: the pretend accelerator is off here (set {CONFIG_VAR})."
            )
        return {name: _status(config, name) for name in ops}


def _status(config: Config, name: str) -> str:
    """What the configured stack does with operator (or ``dtype::<dtype>``) ``name``; the fault that strikes
    first wins, as in the backend (a crash before anything else, then a missing kernel); a wrong result says more
    than a slow one."""
    namespace, _, rest = name.partition("::")
    if namespace == "dtype":
        return MISSING if rest in config.unsupported_dtypes else IMPLEMENTED
    names = {name, name.partition(".")[0]}
    for faults, status in (
        (config.crash_ops, CRASHES),
        (config.missing_ops, MISSING),
        (config.wrong_ops, WRONG),
        (config.fallback_ops, FALLBACK),
    ):
        if names & faults:
            return status
    return IMPLEMENTED
