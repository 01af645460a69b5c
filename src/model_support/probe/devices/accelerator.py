"""The generic adapter: any backend that ``torch.accelerator`` reports, by its name.

Built on ``torch.accelerator`` alone (device count, synchronize, memory counters, device selection),
with the backend's own module ``torch.<name>`` as the fallback where a generic call is missing or
raises: a backend whose allocator is not a ``DeviceAllocator`` (torch_tpu's, any backend written in
Python) fails torch's generic memory counters with an internal assert, and its own module is where
the numbers are. cuda, tpu, xpu, mps and PrivateUse1 backends (torch_npu, a test double written in
Python) all take this path; a backend's own adapter (``cuda``, ``tpu``) adds only what is its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .base import FALLBACK, IMPLEMENTED, MISSING, UNKNOWN, Adapter, DeviceUnavailable

#: What a backend's generic call raises when the backend does not back it.
REFUSALS = (RuntimeError, AttributeError, NotImplementedError, TypeError)


class AcceleratorAdapter(Adapter):
    """Any ``torch.accelerator`` backend; see the module docstring."""

    #: The variable that lists the devices a process may see; the generic convention is
    #: ``<NAME>_VISIBLE_DEVICES`` (a backend's adapter names its own: CUDA_VISIBLE_DEVICES,
    #: TPU_VISIBLE_CHIPS).
    visible_var: str | None = None
    #: Ray has resources for some accelerators only (their adapters name them): none here.
    ray_resource: str | None = None
    #: No profiler is read for a backend in general (its adapter names one it offers: cuda's).
    profiler_activities: tuple[str, ...] = ()

    def host_kernels(self) -> tuple[bool, str | None]:
        """Yes: torch's dispatcher calls a kernel registered for a device's dispatch key
        (``CUDA``, ``PrivateUse1`` for an out-of-tree backend such as TorchTPU) instead of the
        backend's own, for any backend built on it. Tested here only on a backend written in
        Python that honours such kernels as the dispatcher would (docs/host_ops.md); on CUDA and
        TPU hardware it is untested."""
        return True, None

    def packages(self) -> tuple[str, ...]:
        """What its adapter declares (``backend_packages``), else the distributions whose
        ``torch.backends`` entry point provides the device (an out-of-tree backend served by this
        adapter: its package); none for the backends torch ships (xpu, mps)."""
        from .backends import backend_distributions

        return self.backend_packages or backend_distributions(self.type)

    def _module(self):
        import torch

        return getattr(torch, self.type, None)

    def ask(self, name: str, *args):
        """(value, source) of ``torch.accelerator.<name>(*args)``, else of
        ``torch.<type>.<name>(*args)``; (None, None) when neither answers."""
        import torch

        for owner, where in (
            (torch.accelerator, "torch.accelerator"),
            (self._module(), f"torch.{self.type}"),
        ):
            call = getattr(owner, name, None)
            if call is None:
                continue
            try:
                return call(*args), f"{where}.{name}"
            except REFUSALS:
                continue
        return None, None

    def unavailable(self, elsewhere: Callable[[], list[str]] = list) -> str | None:
        """Why this device cannot be used here (one sentence), or None; loads its backend first.
        ``elsewhere``: the accelerators the sentence may name instead
        (``resolve.auto_candidates``)."""
        import torch

        from .backends import load_backend

        load_backend(self.type)
        current = torch.accelerator.current_accelerator()
        if current is None or current.type != self.type:
            here = [current.type] if current is not None else elsewhere()
            there = (
                f"the accelerators here: {', '.join(here)}"
                if here
                else "torch reports no accelerator"
            )
            return (
                f"Device {self.type!r} was requested but this machine has no such accelerator "
                f"({there}); use cpu, auto or the name of the accelerator torch reports."
            )
        if not torch.accelerator.is_available():
            return (
                f"Device {self.type!r} was requested but torch.accelerator.is_available() is False "
                "here."
            )
        if self.device_count() < 1:
            return (
                f"Device {self.type!r} was requested but none is visible to this process (device "
                "count 0)."
            )
        return None

    def synchronize(self) -> None:
        if getattr(self, "_synchronize", None) is None:
            from ..probe_backend import synchronizer

            self._synchronize = synchronizer(self.type)
        self._synchronize()

    def perf_clock(self, mode: str = "eager"):
        """The backend's own timeline where its device module offers one for ``mode``
        (``probe_core.device_clock``: the repro script times on the same), else None: the host's
        wall clock, after a sync."""
        from ..probe_core import device_clock

        return device_clock(self.type, mode)

    synchronous_ops = False  # a device queues its operators: a call returns before its work is done

    def reset_peak_memory(self) -> None:
        self.ask("reset_peak_memory_stats")

    def peak_memory_mb(self) -> tuple[float | None, str | None]:
        peak, source = self.ask("max_memory_allocated")
        # A zero after running a model is not a measurement (a backend that does not count):
        # unknown, not 0.
        if not peak:
            return None, None
        return peak / 2**20, source

    def device_name(self) -> str:
        name, _ = self.ask("get_device_name")
        return str(name) if name else self.type

    def device_count(self) -> int:
        count, _ = self.ask("device_count")
        return int(count or 0)

    def devices_present(self) -> int:
        return self.device_count()

    def device_memory_bytes(self) -> int:
        properties, _ = self.ask("get_device_properties")
        total = getattr(properties, "total_memory", None)
        if not total:
            info, _ = self.ask("get_memory_info")
            total = info[1] if info else None
        if not total:
            raise DeviceUnavailable(
                f"The {self.type} backend does not tell its memory per device; set "
                "device_memory_gb for devices=auto."
            )
        return int(total)

    def compile_backend(self) -> str:
        """inductor for the devices torch generates code for; aot_eager (dynamo's graphs run
        eagerly through AOTAutograd, on any device) for an out-of-tree backend (PrivateUse1),
        whose own compiler, when it has one, its adapter names (the tpu adapter says tpu)."""
        import torch

        return "aot_eager" if self.type == torch._C._get_privateuse1_backend_name() else "inductor"

    def op_coverage(self, ops: Iterable[str]) -> dict[str, str]:
        """What the backend registered with the dispatcher for its dispatch key
        (``dispatch_coverage``), with what its boxed fallback does here (``fallback_applied``: an
        operator only that fallback catches is ``missing`` where the fallback raises, TorchTPU's
        by default)."""
        return self.coverage_with_notes(ops)[0]

    def coverage_with_notes(self, ops: Iterable[str]) -> tuple[dict[str, str], dict[str, str]]:
        """``op_coverage`` with the note on each operator only the boxed fallback catches, where
        a switch of the stack decides what that fallback does (``fallback_runs``); a subclass's
        own ``op_coverage`` is its answer."""
        if type(self).op_coverage is not AcceleratorAdapter.op_coverage:
            return super().coverage_with_notes(ops)
        from ..census import dispatch_key

        return self.fallback_applied(dispatch_coverage(ops, dispatch_key(self.type)))

    def distributed_backend(self) -> str:
        """The process-group backend torch.distributed has registered for this device, with gloo for
        the CPU tensors a run also holds."""
        import torch.distributed as dist

        registered = dist.Backend.default_device_backend_map.get(self.type)
        if registered is None:
            raise DeviceUnavailable(
                f"torch.distributed has no process-group backend registered for {self.type} "
                "devices, so a probe cannot run over several of them."
            )
        return f"cpu:gloo,{self.type}:{registered}"

    def rank_device(self, local_rank: int):
        """Every rank sees the probe's devices and takes device ``local_rank`` (transformers'
        convention for a sharded model on any accelerator but a TPU)."""
        return self.select(local_rank)

    def select(self, index: int):
        """Make device ``index`` the current one (the backend's own ``set_device`` where the generic
        call has no effect) and return it."""
        import torch

        self.ask("set_device_index", index)
        current, _ = self.ask("current_device_index")
        if current != index:
            module = self._module()
            if getattr(module, "set_device", None) is not None:
                module.set_device(index)
        return torch.device(self.type, index)

    # --- in the sweep's runner (nothing imported)
    # --------------------------------------------------

    @property
    def visibility_variable(self) -> str:
        return self.visible_var or f"{self.type.upper()}_VISIBLE_DEVICES"

    def hardware_visible(self) -> bool | None:
        return None

    def ray_resources(self, need: int) -> dict | None:
        """One CPU for the probe and ``need`` of the adapter's Ray resource, or None where Ray
        has none."""
        if self.ray_resource is None:
            return None
        if self.ray_resource == "GPU":  # Ray's own keyword for its GPUs
            return {"num_cpus": 1, "num_gpus": need}
        return {"num_cpus": 1, "resources": {self.ray_resource: need}}

    def pinning_env(self, ids: Iterable[int]) -> dict:
        ids = tuple(ids)
        if not ids:
            raise ValueError(f"A {self.type} probe must be pinned to at least one device.")
        return {self.visibility_variable: ",".join(str(i) for i in ids)}


def _out_variants(name: str) -> list[str]:
    """The out= overloads a structured operator's functional and in-place forms run through
    (``aten::add.Tensor`` and ``aten::add_.Tensor`` through ``aten::add.out``;
    ``aten::pow.Tensor_Scalar`` through ``aten::pow.Tensor_Scalar_out``)."""
    base, _, overload = name.partition(".")
    base = base.removesuffix("_")
    return [f"{base}.{overload}_out", f"{base}.out"] if overload else [f"{base}.out"]


def dispatch_coverage(ops: Iterable[str], key: str) -> dict[str, str]:
    """Each operator's status on the backend whose kernels are registered under dispatch key
    ``key``, read from the dispatcher (``torch._C._dispatch_has_kernel_for_dispatch_key``,
    ``_dispatch_has_backend_fallback``):

    - ``implemented``: a kernel for ``key``; a structured operator's default kernel whose out=
      variant has one (what ``aten::rsqrt`` runs through on torch_tpu); a composite
      (CompositeImplicitAutograd or CompositeExplicitAutograd) kernel, which runs the operator as
      others the backend receives;
    - ``fallback``: none of those, and the backend registered a boxed fallback for its key (the
      registrations cannot say what a fallback does: torch_xla's runs the operator on the CPU,
      torch_tpu's raises unless its CPU fallback is switched on; the adapter's
      ``fallback_applied`` says which);
    - ``missing``: nothing at all (the dispatcher's "Could not run ... with arguments from the
      ... backend");
    - ``unknown``: the dispatcher does not know the operator (a library that is not loaded here),
      or a structured operator whose out= variant cannot be found.

    A backend written in Python (a tensor subclass, as the test double of docs/devices.md)
    registers almost nothing: its adapter answers instead. ``DeviceUnavailable`` when nothing at
    all is registered for ``key`` (a CPU-only torch asked about cuda)."""
    import torch

    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if not has("aten::empty.memory_format", key):  # what every backend registers first
        raise DeviceUnavailable(
            f"torch {torch.__version__} here registers no kernels for dispatch key {key}: this "
            "machine has no such stack to read (install its backend, or run where it is)."
        )
    known = set(torch._C._dispatch_get_all_op_names())
    fallback = torch._C._dispatch_has_backend_fallback(getattr(torch._C.DispatchKey, key))
    coverage = {}
    for name in ops:
        if name not in known:
            coverage[name] = UNKNOWN
        elif (
            has(name, key)
            or has(name, "CompositeImplicitAutograd")
            or has(name, "CompositeExplicitAutograd")
        ):
            coverage[name] = IMPLEMENTED
        elif has(name, "CompositeExplicitAutogradNonFunctional"):
            outs = [out for out in _out_variants(name) if out in known]
            coverage[name] = (
                UNKNOWN
                if not outs
                else IMPLEMENTED
                if any(has(out, key) for out in outs)
                else FALLBACK
                if fallback
                else MISSING
            )
        else:
            coverage[name] = FALLBACK if fallback else MISSING
    return coverage
