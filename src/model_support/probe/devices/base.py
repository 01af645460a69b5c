"""The adapter interface, and the CPU's adapter (the base every other one extends).

Everything device-specific the probe needs goes through an adapter: the torch device to move to,
synchronize (so timings are honest), peak device memory (with the source it came from, or null when
nothing trustworthy exists), the device's name, count and memory, the compile backend, the process
group backend and the device of a sharded run's rank, and, as class methods that import nothing (the
sweep's runner calls them), whether the hardware is there and the environment that pins a process to
some of the devices. Creating an adapter imports nothing; only its probe-side methods import torch.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from packaging.utils import canonicalize_name

# What a stack does with an operator (``Adapter.op_coverage``): the words are declared once, in
# ``record.ops_table``.
from ... import backend_env
from ...record.ops_table import CRASHES, FALLBACK, IMPLEMENTED, MISSING, OP_STATUSES, UNKNOWN, WRONG  # noqa: F401

#: The execution modes every backend may have (``Adapter.offers``); any other is a backend's own
#: (``own_modes``).
COMMON_MODES = ("eager", "compile")


class DeviceUnavailable(RuntimeError):
    """The requested device cannot be used here; the message is one sentence saying why."""


class Adapter:
    """The interface every backend implements; the CPU's adapter is the base."""

    #: Whether a probe on several devices must own an aligned block of them (TPU slices), for the
    #: scheduler.
    aligned_blocks = False
    #: Whether processes may share one device (a sweep with more workers than devices lays them
    #: round robin over the devices: 4 probes on one GPU); False where a device is one process's (a
    #: TPU chip).
    shared_devices = True
    #: The Ray resource that holds one of these devices and pins a task to it (Ray sets the
    #: visibility variable), for ``--executor ray``; None where Ray has none. The CPU's cores are
    #: Ray's CPUs.
    ray_resource: str | None = "CPU"
    #: The environment variables that configure the backend itself (what it is told to be, beyond
    #: which of its devices a process sees): part of the stack, as its versions are. A sweep records
    #: the ones set (sweep.json's ``device_config``, ``registry.stack_configuration``);
    #: ``model-support debug`` says when the environment it runs in holds others. Names, or prefixes
    #: ending in ``*`` (``TPU_*``).
    config_vars: tuple[str, ...] = ()
    #: Of those, the ones whose values may be stored and shown (names or prefixes): any other is
    #: recorded by its fingerprint only (``<not shown: sha256 …>``), so a changed value still shows
    #: as a change, never the value.
    config_shown: tuple[str, ...] = ()
    #: Variables matching ``config_vars`` that the harness itself sets per probe (pinning, a rank's
    #: place): not the stack's configuration.
    harness_vars: tuple[str, ...] = ()
    #: Variables matching ``config_vars`` that describe the host, not the stack (names or prefixes:
    #: a TPU VM's worker id and topology, what Ray writes for a task's chips): neither recorded, nor
    #: carried to a Ray task, nor unset on a node (review: a node's own were removed, and two hosts'
    #: records read as two stacks).
    node_vars: tuple[str, ...] = ()
    #: Names users give this device that no backend answers to, each with the sentence that says
    #: what it is here ({"gpu": "an NVIDIA or AMD GPU is cuda"}): said when such a name is refused.
    aliases: dict[str, str] = {}
    #: The distributions that make up this backend beside torch (names, or prefixes ending in
    #: ``*``): what two builds of it differ by. Their installed versions, then ``runtime_versions``,
    #: are the backend's identity (``backend_versions``): recorded on every row, the stack the
    #: support card and the history group by. The CPU's backend is torch itself: none.
    backend_packages: tuple[str, ...] = ()
    #: The execution modes this backend may offer beyond ``COMMON_MODES`` (a mode of its own, as
    #: TorchTPU's fused eager): a mode the device's adapter does not offer is refused before
    #: anything runs (``offers``); whether the stack here has it is ``mode_unavailable``'s to say.
    own_modes: tuple[str, ...] = ()

    @classmethod
    def config_names(cls, environ: Mapping[str, str] | None = None) -> list[str]:
        """The backend configuration variables set in ``environ`` (default: this process's as the
        user and the project set it, never what a backend package wrote for itself:
        ``backend_env.user_environ``), sorted."""
        environ = backend_env.user_environ() if environ is None else environ
        skip = {*cls.harness_vars, getattr(cls, "visible_var", None)}
        return sorted(
            n
            for n in environ
            if n not in skip and _matches(n, cls.config_vars) and not _matches(n, cls.node_vars)
        )

    @classmethod
    def configuration(
        cls, environ: Mapping[str, str] | None = None, shown_only: bool = False
    ) -> dict[str, str]:
        """This backend's configuration in ``environ``: each declared variable set there, with
        its value where the adapter declares it safe to show, else its fingerprint (left out with
        ``shown_only``: what a repro script can set)."""
        import hashlib

        environ = backend_env.user_environ() if environ is None else environ
        found = {}
        for name in cls.config_names(environ):
            if _matches(name, cls.config_shown):
                found[name] = environ[name]
            elif not shown_only:
                found[name] = (
                    f"<not shown: sha256 {hashlib.sha256(environ[name].encode()).hexdigest()[:12]}>"
                )
        return found

    @classmethod
    def offers(cls, mode: str) -> bool:
        """Whether this backend can have execution ``mode`` at all (``COMMON_MODES``, and its
        ``own_modes``)."""
        return mode in COMMON_MODES or mode in cls.own_modes

    def packages(self) -> tuple[str, ...]:
        """The distributions of this backend beside torch (``backend_packages``)."""
        return self.backend_packages

    def runtime_versions(self) -> dict[str, str]:
        """The backend's toolkit or runtime versions that no installed distribution states
        (CUDA's toolkit and driver), by name, read without importing torch (a sweep's worker asks
        too); {} where it has none."""
        return {}

    def backend_versions(self) -> list[str]:
        """The backend's identity: ``name version`` of each of its installed distributions
        (``packages``; a name as the adapter declares it, a prefix's matches by their canonical
        names), then of each ``runtime_versions``; [] where the backend is torch alone (the CPU).
        Reads package metadata only."""
        from ..provenance import stack

        installed = stack()
        found = []
        for pattern in self.packages():
            if pattern.endswith("*"):
                prefix = canonicalize_name(pattern[:-1])
                found += [
                    f"{name} {version}"
                    for name, version in installed.items()
                    if name.startswith(prefix)
                ]
            elif canonicalize_name(pattern) in installed:
                found.append(f"{pattern} {installed[canonicalize_name(pattern)]}")
        return found + [f"{name} {version}" for name, version in self.runtime_versions().items()]

    def __init__(self, type: str = "cpu"):
        self.type = type

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.type!r})"

    # --- in the probe process (torch imported) ---------------------------------------------------

    def unavailable(self, elsewhere=list) -> str | None:
        """Why this device cannot be used here (the one sentence a probe records), or None."""
        return None

    @property
    def torch_device(self):
        import torch

        return torch.device(self.type)

    def synchronize(self) -> None:
        pass

    def reset_peak_memory(self) -> None:
        pass

    def peak_memory_mb(self) -> tuple[float | None, str | None]:
        """(peak MiB, where the number came from); (None, None) when nothing trustworthy exists."""
        return None, None

    def peak_bandwidth_gbs(self) -> tuple[float | None, str]:
        """(the device's peak memory bandwidth in GB/s, where that figure comes from), or (None,
        why there is none): the denominator of a decode step's bandwidth utilisation
        (``performance``)."""
        return None, f"the {self.type} adapter declares no peak memory bandwidth"

    #: Whether an operator's work is done when its call returns (the CPU; a backend that runs it in
    #: Python), so the census can time each call on the host clock; an asynchronous device queues it
    #: (no time without a sync).
    synchronous_ops = True
    #: The environment that makes the runtime report an error at the operator that caused it, not at
    #: a later call (``CUDA_LAUNCH_BLOCKING=1``): a silent abort is rerun once with it, so the
    #: flight recorder names the operator (``probe.instruments.flight_recorder``). {}: the stack has
    #: none (nothing is rerun).
    blocking_env: dict[str, str] = {}

    #: The torch.profiler activities (``cpu``, ``cuda``) that read a compiled run on this stack,
    #: where no dispatch mode sees (``probe.instruments.profiled``: its per-operator time and host
    #: syncs); () where the stack offers no profiler (they read "not measured"). The CPU's:
    #: torch.profiler's CPU activity.
    profiler_activities: tuple[str, ...] = ("cpu",)

    def perf_clock(self, mode: str = "eager"):
        """The clock the perf phase times tokens on (a ``time.perf_counter``-like function), or
        None for the host's wall clock (``performance``). A device with a clock of its own
        (events on the device's timeline) gives it, so other processes competing for the host's
        cores do not move its figures."""
        return None

    def host_kernels(self) -> tuple[bool, str | None]:
        """Whether this backend takes host kernels (``probe.host_ops``: a kernel registered
        through ``torch.library`` for its dispatch key that runs one operator on the CPU and
        copies the results back), as (True, None), or (False, why not) in one sentence. Declared,
        torch not imported. The CPU is the host: there is nowhere to move an operator to."""
        return False, f"the {self.type} device is the host: its operators already run on the CPU"

    def host_counters(self):
        """The backend's own counts of device-to-host syncs and CPU fallbacks (the
        ``HostCounters`` protocol of ``probe.instruments.host_cost``), or None where the stack
        keeps none (the host cost is then not measured, never guessed). The CPU is the host:
        nothing to count."""
        return None

    def device_name(self) -> str:
        import platform

        return platform.processor() or platform.machine() or "cpu"

    def device_count(self) -> int:
        return 1

    def compile_cache_stats(self) -> tuple[int | None, int | None]:
        return None, None

    def compile_backend(self) -> str:
        """torch.compile's backend for this device: inductor on the CPU."""
        return "inductor"

    def mode_unavailable(self, mode: str) -> str | None:
        """Why this stack cannot run the probe in ``mode``, or None. Only ``fused`` (TorchTPU's
        deferred-and-fused eager, the tpu adapter's ``own_modes``) can be missing: a TPU with a
        torch_tpu that exposes it runs it."""
        if mode != "fused":
            return None
        from ..probe_compile import fused_eager_missing

        return fused_eager_missing(self.type)

    def op_coverage(self, ops: Iterable[str]) -> dict[str, str]:
        """What this stack does with each operator (``aten::add.Tensor``): ``implemented``,
        ``fallback`` (it runs, on the CPU underneath, slowly), ``missing`` or ``unknown`` (the
        adapter cannot judge it); an adapter that knows its stack's faults may also say
        ``crashes`` or ``wrong`` (``record.ops_table.OP_STATUSES``). A name ``dtype::<dtype>``
        asks whether the stack holds tensors of that dtype (``missing`` when it refuses them). An
        operator only the stack's boxed fallback catches is ``fallback`` where that fallback runs
        it and ``missing`` where it raises (``fallback_applied``; ``coverage_with_notes`` says
        which, naming the switch). The CPU runs every operator a CPU census saw."""
        return dict.fromkeys(ops, IMPLEMENTED)

    def coverage_with_notes(self, ops: Iterable[str]) -> tuple[dict[str, str], dict[str, str]]:
        """``op_coverage``, and per operator whose status a switch of its stack decides, the
        sentence that says so (``fallback_applied``): what ``model-support ops --on`` shows
        beside the status. An adapter whose statuses a switch decides overrides both (its
        ``op_coverage`` is this answer's first part); by default, no notes."""
        return self.op_coverage(ops), {}

    def fallback_runs(self) -> tuple[bool, str | None]:
        """(whether an operator the stack has no kernel for, caught by its boxed CPU fallback,
        runs there rather than raising; the switch that turns that fallback on, as a user writes
        it, or None where the stack has no such switch). Default: the fallback runs (torch_xla's
        does), no switch. TorchTPU's is off by default
        (``torch_tpu._internal.execution_mode.enable_cpu_fallback``): its adapter says so."""
        return True, None

    def fallback_applied(
        self, coverage: Mapping[str, str]
    ) -> tuple[dict[str, str], dict[str, str]]:
        """``coverage`` as the stack's registrations read (``fallback``: only its boxed fallback
        catches the operator) with what that fallback does here (``fallback_runs``): each such
        operator stays ``fallback`` where the fallback runs, else it is ``missing`` (the operator
        raises, "not implemented for" the device); and, where the stack has a switch for it, a
        note per such operator naming the switch and its state."""
        runs, switch = self.fallback_runs()
        caught = [op for op, status in coverage.items() if status == FALLBACK]
        judged = {**coverage, **dict.fromkeys(caught, FALLBACK if runs else MISSING)}
        if switch is None:
            return judged, {}
        return judged, dict.fromkeys(caught, fallback_note(self.type, runs, switch))

    def devices_present(self) -> int:
        """How many devices a sharded probe may use: the accelerators; on the CPU one rank per
        core."""
        return max(1, os.cpu_count() or 1)

    def device_memory_bytes(self) -> int:
        """Memory of one device (the host's, shared by the ranks, on the CPU)."""
        import psutil

        return psutil.virtual_memory().total // self.devices_present()

    def distributed_backend(self) -> str:
        """torch.distributed's backend for a sharded run's process group."""
        return "gloo"

    def rank_device(self, local_rank: int):
        """The device of a sharded run's rank ``local_rank`` (after ``rank_env`` pinned its
        process)."""
        import torch

        return torch.device("cpu")

    # --- in the sweep's runner (nothing imported)
    # --------------------------------------------------

    def hardware_visible(self) -> bool | None:
        """Whether this machine has the device, told without importing torch; None: only torch
        can tell."""
        return True

    def pinning_env(self, ids: Iterable[int]) -> dict:
        """Environment variables that pin a probe process to the devices ``ids``."""
        return {}

    def rank_env(self, local_rank: int, world_size: int, environ: Mapping[str, str]) -> dict:
        """Environment variables that give rank ``local_rank`` of a sharded run its device, set
        before torch is imported; ``environ`` is the probe's own (pinned to the probe's devices)."""
        return {}

    def ray_resources(self, need: int) -> dict | None:
        """What a probe on ``need`` of these devices asks of Ray (``remote.options``), None where
        Ray cannot hold them (``ray_resource``): on the CPU one core per rank, the ranks being
        processes."""
        return {"num_cpus": need}


def fallback_note(device: str, runs: bool, switch: str) -> str:
    """The note on an operator only a stack's boxed fallback catches: missing while its CPU
    fallback is off, with the switch that would make it a fallback; a fallback while that switch
    is on."""
    if runs:
        return f"a CPU fallback: the {device} stack's CPU fallback is on ({switch})"
    return (
        f"missing while the {device} stack's CPU fallback is off: {switch} makes it a CPU fallback"
    )


def _matches(name: str, patterns: Iterable[str]) -> bool:
    """Whether ``name`` is one of ``patterns`` (a name, or a prefix ending in ``*``)."""
    return any(name.startswith(p[:-1]) if p.endswith("*") else name == p for p in patterns)
