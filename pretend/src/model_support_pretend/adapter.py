"""The pretend accelerator's device adapter: the generic ``AcceleratorAdapter`` (everything it
does on the device goes through ``torch.accelerator`` and its ``torch.pretend`` fallback), plus
the one thing the sweep's runner cannot learn without torch: whether the backend is switched on
here, and what its stack implements (``op_coverage``: from its configuration, since a backend
written in Python registers almost nothing with the dispatcher). Registered through the entry
point group ``model_support.devices`` (pyproject.toml), as another package's adapter would be."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from model_support.probe.devices import (
    CRASHES,
    FALLBACK,
    IMPLEMENTED,
    MISSING,
    WRONG,
    AcceleratorAdapter,
    DeviceUnavailable,
)

from .config import BLOCKING_VAR, CONFIG_VAR, NAME, VISIBLE_VAR, Config, from_environment

#: The TPU contract's CPU fallback switch (``no_fallback``), as a user sets it:
#: ``device.enable_cpu_fallback``.
FALLBACK_SWITCH = f"torch.{NAME}.enable_cpu_fallback"


class PretendAdapter(AcceleratorAdapter):
    config_vars = (CONFIG_VAR,)  # the faults the stack has: a different value is a different stack
    config_shown = config_vars
    # the backend is this distribution: its version is its build
    backend_packages = ("model-support-pretend",)
    #: Its devices as a Ray custom resource: a local Ray that a sweep starts is given this host's
    #: (Ray finds none).
    ray_resource = "pretend"

    def hardware_visible(self) -> bool:
        return CONFIG_VAR in os.environ

    def unavailable(self, elsewhere=list) -> str | None:
        if CONFIG_VAR not in os.environ:
            return (
                "Device 'pretend' was requested but the pretend accelerator is off here: set "
                f"{CONFIG_VAR} to its JSON configuration (e.g. '{{\"devices\": 2}}'), see "
                "docs/devices.md."
            )
        return super().unavailable(elsewhere)

    # its operators run in Python, on the CPU underneath: done when the call returns
    synchronous_ops = True
    #: What makes its runtime report a crash at the operator that caused it (``crash_after``
    #: ignored).
    blocking_env = {BLOCKING_VAR: "1"}

    def host_kernels(self) -> tuple[bool, str | None]:
        """Yes: a kernel registered through ``torch.library`` for its dispatch key (PrivateUse1)
        replaces its own implementation of the operator, as the dispatcher makes it for a C++
        backend (``tensor.hosted``)."""
        return True, None

    def host_counters(self):
        """The backend's own counts of syncs and CPU fallbacks (``counters.Counters``)."""
        from . import tensor

        return tensor.STATE.counters if tensor.STATE is not None else None

    def peak_bandwidth_gbs(self) -> tuple[float | None, str]:
        """What its configuration declares (``bandwidth_gbs``), or that it declares none."""
        config = from_environment()
        if config is None or config.bandwidth_gbs is None:
            return (
                None,
                "the pretend device declares no peak memory bandwidth (set bandwidth_gbs in "
                f"{CONFIG_VAR})",
            )
        return config.bandwidth_gbs, f"bandwidth_gbs in {CONFIG_VAR}"

    def op_coverage(self, ops: Iterable[str]) -> dict[str, str]:
        """From the configuration, every fault the stack has: ``missing_ops`` are missing,
        ``crash_ops`` crash (the runtime aborts), ``wrong_ops`` are wrong, ``fallback_ops`` fall
        back to the CPU, every other operator is implemented (a name without an overload covers
        all of them, as the faults do); ``dtype::float64`` is missing when ``unsupported_dtypes``
        lists float64. The backend off here is one sentence, never an empty answer (which would
        predict every model PASS)."""
        return self.coverage_with_notes(ops)[0]

    def coverage_with_notes(self, ops: Iterable[str]) -> tuple[dict[str, str], dict[str, str]]:
        """``op_coverage``, with its ``fallback_ops`` missing while the TPU contract's
        ``no_fallback`` holds and its CPU fallback is off (``fallback_runs``), each noted with
        the switch (``fallback_applied``)."""
        config = from_environment()
        if config is None:
            raise DeviceUnavailable(
                "The pretend stack's coverage cannot be read: the pretend accelerator is off "
                f"here (set {CONFIG_VAR})."
            )
        return self.fallback_applied({name: _status(config, name) for name in ops})

    def fallback_runs(self) -> tuple[bool, str | None]:
        """Its ``fallback_ops`` run on the CPU, unless the TPU contract's ``no_fallback`` holds:
        then only while ``torch.pretend.enable_cpu_fallback`` is True (False until a user sets
        it, as TorchTPU's switch)."""
        config = from_environment()
        if config is None or not config.no_fallback:
            return True, None
        from . import device

        return bool(device.enable_cpu_fallback), f"{FALLBACK_SWITCH} = True"

    def compile_backend(self) -> str:
        """The TPU contract's own compile backend (``compile_static``: named after the device,
        dynamic=False by default), else the generic adapter's (aot_eager)."""
        config = from_environment()
        if config is not None and config.compile_static:
            return NAME
        return super().compile_backend()

    # --- the TPU contract's distributed clauses (``launch``): one device per rank, the launch
    # environment --------

    def launch_env(self, world_size: int) -> dict:
        """Under ``launch_env``: what its ranks need set in their parent (``launch.launch_env``,
        as torch_tpu's ``set_tpu_launch_env``), made once per run in this process; {} otherwise."""
        config = from_environment()
        if config is None or not config.launch_env:
            return {}
        from .launch import launch_env

        key = (world_size, os.environ.get(VISIBLE_VAR, ""))
        if key not in _LAUNCHED:
            _LAUNCHED[key] = launch_env(world_size)
        return dict(_LAUNCHED[key])

    def rank_env(self, local_rank: int, world_size: int, environ: Mapping[str, str]) -> dict:
        """Under ``one_device``: the rank's one device of the probe's grant
        (``PRETEND_VISIBLE_DEVICES``, else 0..world_size-1) as a single id, and the run's launch
        environment (``environ``'s, else the one this process made for the run); as the tpu
        adapter gives a TPU rank its chip. And ``LOCAL_RANK=0``, the index of its one device:
        transformers binds a rank to its current device when the device is named tpu, and to
        device LOCAL_RANK otherwise, which a process with one device does not have. Otherwise
        nothing: every rank sees every device and takes device ``local_rank``."""
        config = from_environment(environ)
        if config is None or not config.one_device:
            return {}
        from .launch import LAUNCH_VARS

        granted = list(config.visible)
        if len(granted) < world_size:
            raise ValueError(f"{world_size} {NAME} ranks need {world_size} devices, got {granted}.")
        launch = {n: environ[n] for n in LAUNCH_VARS if n in environ} or _LAUNCHED.get(
            (world_size, environ.get(VISIBLE_VAR, ""))
        )
        return {VISIBLE_VAR: str(granted[local_rank]), "LOCAL_RANK": "0", **(launch or {})}

    def rank_device(self, local_rank: int):
        """Under ``one_device``: the one device its rank's process opened, at index 0; otherwise
        device ``local_rank``."""
        config = from_environment()
        if config is None or not config.one_device:
            return super().rank_device(local_rank)
        return self.select(0)


#: The launch environment this process made for a run (``PretendAdapter.launch_env``), by (ranks,
#: grant).
_LAUNCHED: dict[tuple, dict[str, str]] = {}


def _status(config: Config, name: str) -> str:
    """What the configured stack does with operator (or ``dtype::<dtype>``) ``name``; the fault
    that strikes first wins, as in the backend (a crash before anything else, then a missing
    kernel); a wrong result says more than a slow one."""
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
