"""The operator census: which operators a probe dispatches to its device, at the level a compiled backend
receives them.

A ``Census`` is a ``TorchDispatchMode`` held over the probe's stages. Every operator that touches the
probe's device passes through it: one with a ``CompositeImplicitAutograd`` kernel and no kernel of the
device's own (``aten::linear``, ``aten::scaled_dot_product_attention``, ``aten::matmul``) is decomposed
with ``func.decompose`` (its parts come back through the census), as the dispatcher decomposes it for a
C++ backend; every other operator is counted, under its overload name (``aten::add.Tensor``; the default
overload as ``aten::rsqrt``), with the stage it was first called in and how often, then run unchanged.
So the census lists what the stack must implement, in the order a run needs it: the first missing one is
the operator a run on that stack stops at, and its stage is the stage it fails in.

On the CPU there is no device apart from the host: the census counts the generation (stage ``generate``)
only, since the weights' loading and the prompt's tokenisation happen on the host on every stack. On an
accelerator it counts every operator that names or touches the device, from the weights' copy on. A run
that stopped early (its first missing operator) has a partial census; when its CPU reference rerun completes,
what the reference alone called is added after it (``completed``, ``ops_source`` ``reference``): the device's
own operators stay, the one that stopped the run first among them (the CPU calls other kernels: its attention
is not the math path's ``aten::bmm``). docs/ops.md says how a CPU census can differ from a device's.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Mapping
from typing import Any

from ..record.ops_table import FALLBACK, MISSING, UNKNOWN

#: Where a row's census came from (``ops_source``): the run's own (complete); the run's up to where it stopped,
#: then what its CPU reference rerun alone called (the rerun completed); the run's up to where it stopped.
RUN, REFERENCE, PARTIAL = "run", "reference", "partial"
#: The stages a CPU census counts (the generation; a compile failure is the generation's too).
CPU_STAGES = ("generate", "compile")
#: The record's census fields, in order (``fields``).
FIELDS = ("ops", "ops_stages", "ops_calls", "ops_source")
#: The stages whose calls a census times (``timed``): the verdict's generation, the figure a slowdown moves.
TIMED_STAGES = ("generate", "compile")
#: ``ops_time_source`` of a census timed on the host clock.
HOST_CLOCK = "host clock around each call in the generation (the device's operators finish before they return)"


def dispatch_key(device_type: str) -> str:
    """The dispatch key a device's kernels are registered under: the device type upper-cased where torch has such
    a key (``CPU``, ``CUDA``, ``XPU``, ``MPS``), else ``PrivateUse1`` (an out-of-tree backend: tpu, npu)."""
    import torch

    key = device_type.upper()
    if device_type == torch._C._get_privateuse1_backend_name() or not hasattr(torch._C.DispatchKey, key):
        return "PrivateUse1"  # an out-of-tree backend (torch_tpu before its device is registered: no chip here)
    return key


def Census(device_type: str, timed: bool = False) -> Any:
    """A census of the operators that reach ``device_type`` (a ``TorchDispatchMode``, see the module docstring):
    hold it (``with``) over the stages, pass its ``enter`` as their ``on_stage`` hook, read ``fields(source)``.
    ``timed``: also the seconds each operator's calls take in the generation (``TIMED_STAGES``), on the host
    clock: only true where a call returns once its work is done (the adapter's ``synchronous_ops``)."""
    return _census_class()(device_type, timed)


@functools.cache
def _census_class():
    """The mode's class, made on first use: importing this module imports no torch (the sweep's runner does)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    has = torch._C._dispatch_has_kernel_for_dispatch_key

    class _Census(TorchDispatchMode):
        def __init__(self, device_type: str, timed: bool = False):
            super().__init__()
            self.device_type = device_type
            self.timed = timed
            self.seconds: dict[str, float] = {}  # name -> seconds in the timed stages
            self.key = dispatch_key(device_type)
            self.on_cpu = device_type == "cpu"
            self.stage: str | None = None
            self.recording = not self.on_cpu
            self.active = False  # on torch's dispatch stack
            self.seen: dict[str, list[Any]] = {}  # name -> [first stage, calls], in the order of first call
            self._decomposes: dict[Any, bool] = {}

        # Held with ``with``, the mode goes onto torch's dispatch stack only once a stage it counts begins (on the
        # CPU the generation: the weights' loading then pays nothing), and comes off at the end of the block.
        def __enter__(self):
            self.active = False
            return self

        def __exit__(self, *exc):
            if self.active:
                self.active = False
                TorchDispatchMode.__exit__(self, *exc)

        def enter(self, stage: str) -> None:
            self.stage = stage
            if self.on_cpu:
                self.recording = stage in CPU_STAGES
            if self.recording and not self.active:
                self.active = True
                TorchDispatchMode.__enter__(self)

        def _reaches_device(self, args, kwargs) -> bool:
            return self.on_cpu or self._names_device(args) or self._names_device(kwargs)

        def _names_device(self, tree) -> bool:
            """Whether a tensor on the device, or the device itself, is among ``tree``'s leaves. Hand-walked over
            the tuples, lists and dicts operators take: ``tree_flatten`` on every call cost a third of a census."""
            kind = type(tree)
            if kind is tuple or kind is list:
                return any(self._names_device(item) for item in tree)
            if kind is dict:
                return any(self._names_device(item) for item in tree.values())
            if isinstance(tree, torch.Tensor):
                return tree.device.type == self.device_type
            if isinstance(tree, torch.device):
                return tree.type == self.device_type
            if isinstance(tree, tuple | list | dict):  # a named tuple or another container: pytree knows it
                return any(self._names_device(leaf) for leaf in tree_flatten(tree)[0])
            return False

        def _composite(self, func) -> bool:
            """Whether the dispatcher hands the device ``func``'s parts: a CompositeImplicitAutograd kernel and no
            kernel of the device's own (torch_tpu registers ``aten::linear`` itself, the CPU does not)."""
            known = self._decomposes.get(func)
            if known is None:
                name = func.name()
                known = self._decomposes[func] = has(name, "CompositeImplicitAutograd") and not has(name, self.key)
            return known

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if not self.recording or not self._reaches_device(args, kwargs):
                return func(*args, **kwargs)
            if self._composite(func):
                TorchDispatchMode.__enter__(self)  # its parts come back through the census
                try:
                    out = func.decompose(*args, **kwargs)
                finally:
                    TorchDispatchMode.__exit__(self, None, None, None)
                if out is not NotImplemented:
                    return out
            name = func.name()  # aten::add.Tensor; aten::rsqrt for the default overload
            entry = self.seen.get(name)
            if entry is None:
                self.seen[name] = [self.stage, 1]
            else:
                entry[1] += 1
            if not self.timed or self.stage not in TIMED_STAGES:
                return func(*args, **kwargs)
            began = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - began

        def fields(self, source: str) -> dict:
            """The record's census: ``ops`` in the order of first call, the stage of each first call, the
            calls of each, and where it came from."""
            return {
                "ops": list(self.seen),
                "ops_stages": [stage or "load" for stage, _ in self.seen.values()],
                "ops_calls": [calls for _, calls in self.seen.values()],
                "ops_source": source,
            }

        def times(self) -> dict:
            """``ops_device_s`` (each census operator's seconds in the generation, in ``ops`` order) and
            ``ops_time_source``; null, saying why, for a census not timed (an asynchronous device)."""
            if not self.timed:
                return not_timed(f"{self.device_type} queues its operators asynchronously (no profiler read)")
            return {"ops_device_s": [self.seconds.get(op, 0.0) for op in self.seen], "ops_time_source": HOST_CLOCK}

    return _Census


def not_timed(why: str) -> dict:
    """The per-operator time fields of a run whose operators were not timed, with the reason."""
    return {"ops_device_s": None, "ops_time_source": f"not measured: {why}"}


def takes_census(mode: str, sharded: bool = False) -> bool:
    """Whether a probe in ``mode`` takes its census: eager and fused eager do; torch.compile traces the forward
    with its own dispatch machinery (a mode held over it would change what it traces), and a sharded run's
    ranks are other processes: none there (null ``ops``)."""
    return mode != "compile" and not sharded


def completed(partial: Mapping[str, Any], reference: Mapping[str, Any]) -> dict:
    """The census of a run that stopped, completed by its CPU reference rerun's (both ``fields``): the device's
    operators first, in their order, with their stages (the operator that stopped the run among them: counted
    before it ran), then the operators only the reference called. A shared operator's calls are the larger count
    (the stopped run's are cut short). ``ops_source`` is ``reference``."""
    ops = list(partial["ops"])
    stages, calls = list(partial["ops_stages"]), list(partial["ops_calls"])
    index = {op: i for i, op in enumerate(ops)}
    for op, stage, count in zip(reference["ops"], reference["ops_stages"], reference["ops_calls"]):
        if op in index:
            calls[index[op]] = max(calls[index[op]], count)
        else:
            ops.append(op)
            stages.append(stage)
            calls.append(count)
    return {"ops": ops, "ops_stages": stages, "ops_calls": calls, "ops_source": REFERENCE}


#: An operator's name in an error message (``Could not run 'aten::bmm' with arguments from ...``; a runtime's "fatal
#: error in aten::relu"); C++ namespaces that name no operator are left out.
_OPERATOR = re.compile(r"\b([A-Za-z_]\w*)::([A-Za-z_]\w*(?:\.\w+)?)")
_NOT_OPERATORS = frozenset({"c10", "at", "std", "torch", "caffe2", "c10d", "pybind11"})


def operator_named(message: str | None, among: list[str] | None = None) -> str | None:
    """The first operator ``message`` names (within ``among``, a census, when given): the operator that stopped a
    run whose failure is the stack's, by the words of its error."""
    for found in _OPERATOR.finditer(message or ""):
        name = f"{found[1]}::{found[2]}".rstrip(".")
        if found[1] not in _NOT_OPERATORS and (among is None or name in among):
            return name
    return None


def stopped_by(record: Mapping[str, Any]) -> str | None:
    """The operator that stopped a run whose failure is the stack's (``attribution`` ``stack``: the CPU reference
    passes), as its error names it; None for any other row."""
    if record.get("attribution") != "stack":
        return None
    return operator_named(record.get("error_message"))


#: How a census asks a stack about a dtype (``dtype::bfloat16``): beside the operators, since a stack that refuses
#: a dtype fails every model run in it, at the weights' copy.
DTYPE_NAMESPACE = "dtype::"


def dtype_name(dtype: str | None) -> str | None:
    """``dtype::bfloat16`` for a run in bfloat16 (the name an adapter's ``op_coverage`` is asked); None without one."""
    return f"{DTYPE_NAMESPACE}{dtype}" if dtype else None


def coverage_fields(ops: list[str] | None, coverage: dict[str, str], stopped: str | None = None) -> dict:
    """``ops_missing``, ``ops_fallback`` and ``ops_unknown`` of a census, from the device adapter's
    ``op_coverage`` (operator -> implemented / fallback / missing / unknown), each in census order; all null
    without a census. ``stopped``: the operator that stopped the run, the stack's failure (``stopped_by``), is
    missing whatever the adapter reads (a registered kernel that raised; one the census did not reach)."""
    if ops is None:
        return {"ops_missing": None, "ops_fallback": None, "ops_unknown": None}
    if stopped is not None:
        coverage = {**coverage, stopped: MISSING}
    fields = {
        f"ops_{status}": [op for op in ops if coverage.get(op) == status] for status in (MISSING, FALLBACK, UNKNOWN)
    }
    if stopped is not None and stopped not in ops:
        fields["ops_missing"].insert(0, stopped)
    return fields
