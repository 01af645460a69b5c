"""The operator census: which operators a probe dispatches to its device, at the level a compiled
backend receives them.

A ``Census`` is a ``TorchDispatchMode`` held over the probe's stages. Every operator that touches
the probe's device passes through it: one with a ``CompositeImplicitAutograd`` kernel and no kernel
of the device's own (``aten::linear``, ``aten::scaled_dot_product_attention``, ``aten::matmul``) is
decomposed with ``func.decompose`` (its parts come back through the census), as the dispatcher
decomposes it for a C++ backend; every other operator is counted, under its overload name
(``aten::add.Tensor``; the default overload as ``aten::rsqrt``), with the stage it was first called
in and how often, then run unchanged. So the census lists what the stack must implement, in the
order a run needs it: the first missing one is the operator a run on that stack stops at, and its
stage is the stage it fails in.

On the CPU there is no device apart from the host: the census counts the generation (stage
``generate``) only, since the weights' loading and the prompt's tokenisation happen on the host on
every stack. On an accelerator it counts every operator that names or touches the device, from the
weights' copy on. A run that stopped early (its first missing operator) has a partial census; when
its CPU reference rerun completes, what the reference alone called is added after it (``completed``,
``ops_source`` ``reference``): the device's own operators stay, the one that stopped the run first
among them (the CPU calls other kernels: its attention is not the math path's ``aten::bmm``).
docs/ops.md says how a CPU census can differ from a device's.

Per operator the census also keeps its **dtype signatures** (``ops_sig_*``: one entry per operator
and signature, in the order of first call) with their calls, the range of ranks they were called
with, and their seconds where timed: a stack's kernel may exist for float32 and not for bfloat16, or
for 2-d inputs only. A signature is written ``dtype_signature``'s way: the dtypes of the call's
tensor arguments in order, short names (``bf16``, ``f32``, ``i64``, ``bool``; others as torch names
them), a list of tensors as the distinct dtypes of its tensors in brackets (``aten::cat``'s
``[bf16]``), then ``->`` and the output dtype where the call names one (``dtype=``:
``aten::_to_copy`` from bfloat16 to float32 is ``bf16->f32``) or has no tensor argument (a factory:
``aten::arange`` of int64 is ``->i64``, the dtype of what it made). The rank is the highest of the
tensor arguments' (a broadcast's output rank), or a factory's output's; null where neither is known
(a factory that raised, whose signature is then ``""``). Counting costs one hand walk over the
call's arguments (``_inputs``) and one dictionary update per call.

**Sampled** (the probe's default, ``census`` sampled): most of a census' cost is not its bookkeeping
but being a Python dispatch mode at all (about 6 us an operator on this machine, its own counting
under 1 us), and every decode step after the first dispatches the same operators. So the probe hands
the census its generation's token streamer (``following``): the census counts the load, the prompt's
prefill and the decode steps until ``ALIKE_STEPS`` in a row dispatched the same (operator,
signature) calls, then steps off torch's dispatch stack, and steps back on for the generation's last
token and what follows it (each step's logits read back). The steps it skipped are added as copies
of the last one it counted, calls and seconds (``EXTRAPOLATED`` says so in ``ops_time_source``): the
operators, signatures and ranks are the full census's, and the calls too where every decode step is
alike (``tests/test_census_sampled.py`` checks it on the text fixtures), but for a generation that
stopped early at its end-of-sequence token after the census stepped off: its last step's stop check
(``aten::max``, ``aten::eq``, the ``aten::_local_scalar_dense`` that reads it) is one call short. A
step that differs (a cache that changes shape at a window) keeps the census counting until two are
alike again; one that first differs after the census stepped off (a sliding window first reached
past the steps counted) is not seen: ``census: full`` counts such a model whole.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

from ..record.ops_table import FALLBACK, MISSING, UNKNOWN

#: Where a row's census came from (``ops_source``): the run's own (complete); the run's up to where
#: it stopped, then what its CPU reference rerun alone called (the rerun completed); the run's up to
#: where it stopped.
RUN, REFERENCE, PARTIAL = "run", "reference", "partial"
#: The stages a CPU census counts (the generation; a compile failure is the generation's too).
CPU_STAGES = ("generate", "compile")
#: The record's per-(operator, dtype signature) fields, parallel lists in the order of first call
#: (``fields``).
SIG_FIELDS = (
    "ops_sig_ops",
    "ops_sig_dtypes",
    "ops_sig_calls",
    "ops_sig_min_rank",
    "ops_sig_max_rank",
)
#: The record's census fields, in order (``fields``).
FIELDS = ("ops", "ops_stages", "ops_calls", "ops_source", *SIG_FIELDS)
#: The stages whose calls a census times (``timed``): the verdict's generation, the figure a
#: slowdown moves.
TIMED_STAGES = ("generate", "compile")
#: ``ops_time_source`` of a census timed on the host clock.
HOST_CLOCK = (
    "host clock around each call in the generation (the device's operators finish before they "
    "return)"
)
#: ``ops_time_source`` of a census timed on the device's own clock (``Adapter.perf_clock``).
DEVICE_CLOCK = (
    "the device's own clock around each call in the generation (its timeline, as the perf phase "
    "reads it)"
)
#: The probe's ``census`` setting: sampled (the later decode steps extrapolated), full (every step
#: counted), off.
SAMPLED, FULL, OFF = "sampled", "full", "off"
#: A sampled census steps out once this many decode steps in a row dispatched the same calls.
ALIKE_STEPS = 2
#: Said in ``ops_time_source`` (``times``, ``not_timed``) when a sampled census extrapolated any
#: step: the same words for every such run, so two sweeps' times still compare (``analysis.perf``).
EXTRAPOLATED = (
    "census sampled: decode steps counted until two in a row dispatched the same operators, "
    "the later ones' calls and seconds extrapolated from the last counted (a generation that "
    "stopped early at its end-of-sequence token misses its last stop check's)"
)


def dispatch_key(device_type: str) -> str:
    """The dispatch key a device's kernels are registered under: the device type upper-cased
    where torch has such a key (``CPU``, ``CUDA``, ``XPU``, ``MPS``), else ``PrivateUse1`` (an
    out-of-tree backend: tpu, npu)."""
    import torch

    key = device_type.upper()
    if device_type == torch._C._get_privateuse1_backend_name() or not hasattr(
        torch._C.DispatchKey, key
    ):
        # an out-of-tree backend (torch_tpu before its device is registered: no chip here)
        return "PrivateUse1"
    return key


#: (operator, dispatch key) -> whether the device gets the operator's parts (``composite_on``).
_COMPOSITE: dict[tuple, bool] = {}


def composite_on(func, key: str) -> bool:
    """Whether the dispatcher hands the device of dispatch ``key`` ``func``'s parts: a
    CompositeImplicitAutograd kernel and no kernel of the device's own (torch_tpu registers
    ``aten::linear`` itself, the CPU does not). Shared by every dispatch mode that watches the
    device, so each sees the operators the census counts."""
    known = _COMPOSITE.get((func, key))
    if known is None:
        import torch

        has = torch._C._dispatch_has_kernel_for_dispatch_key
        name = func.name()
        known = _COMPOSITE[(func, key)] = has(name, "CompositeImplicitAutograd") and not has(
            name, key
        )
    return known


def decompose_through(mode, func, args, kwargs):
    """``func`` run as its parts, each dispatched back through ``mode`` (a dispatch mode watching
    the device, off torch's stack while its own ``__torch_dispatch__`` runs); NotImplemented
    where the operator has no parts."""
    from torch.utils._python_dispatch import TorchDispatchMode

    TorchDispatchMode.__enter__(mode)
    try:
        return func.decompose(*args, **kwargs)
    finally:
        TorchDispatchMode.__exit__(mode, None, None, None)


def names_device(tree, device_type: str) -> bool:
    """Whether a tensor on ``device_type``, or that device itself, is among ``tree``'s leaves (an
    operator's arguments). Shared by every dispatch mode that watches the device (the census, the
    flight recorder)."""
    return _device_walker()(tree, device_type)


@functools.cache
def _device_walker():
    """``names_device``'s walk, made on first use (torch imported once, not per call).
    Hand-walked over the tuples, lists and dicts operators take: ``tree_flatten`` on every call
    cost a third of a census."""
    import torch
    from torch.utils._pytree import tree_flatten

    def walk(tree, device_type: str) -> bool:
        kind = type(tree)
        if kind is tuple or kind is list:
            return any(walk(item, device_type) for item in tree)
        if kind is dict:
            return any(walk(item, device_type) for item in tree.values())
        if isinstance(tree, torch.Tensor):
            return tree.device.type == device_type
        if isinstance(tree, torch.device):
            return tree.type == device_type
        # a named tuple or another container: pytree knows it
        if isinstance(tree, tuple | list | dict):
            return any(walk(leaf, device_type) for leaf in tree_flatten(tree)[0])
        return False

    return walk


#: Short names of the common dtypes in a signature; any other is torch's name without ``torch.``.
_SHORT = {
    "float32": "f32",
    "bfloat16": "bf16",
    "float16": "f16",
    "float64": "f64",
    "int64": "i64",
    "int32": "i32",
    "int16": "i16",
    "int8": "i8",
    "uint8": "u8",
}


def short_dtype(dtype: Any) -> str:
    """``bf16`` for torch.bfloat16 (or "bfloat16"): a signature's name of a dtype."""
    name = str(dtype).removeprefix("torch.")
    return _SHORT.get(name, name)


#: A signature's short names back to torch's (``dtype::float32`` is what an adapter is asked).
_LONG = {short: long for long, short in _SHORT.items()}


def signature_dtypes(signature: str) -> list[str]:
    """The dtypes a signature names, as torch names them, once each: ``bf16,[f32]->i64`` ->
    ``["bfloat16", "float32", "int64"]`` (what a stack must hold for the call to run)."""
    names = re.split(r"[,\[\]]|->", signature)
    return list(dict.fromkeys(_LONG.get(n, n) for n in names if n))


def dtype_signature(dtypes: tuple, out: Any = None) -> str:
    """The canonical signature (see the module docstring) of a call whose tensor arguments have
    ``dtypes`` (a tuple per list argument) and whose output dtype is named ``out`` (None: not
    named)."""
    parts = [
        "[" + ",".join(map(short_dtype, d)) + "]" if isinstance(d, tuple) else short_dtype(d)
        for d in dtypes
    ]
    return ",".join(parts) + (f"->{short_dtype(out)}" if out is not None else "")


def not_timed(why: str) -> dict:
    """The per-operator time fields of a run whose operators were not timed, with the reason."""
    return {
        "ops_device_s": None,
        "ops_sig_device_s": None,
        "ops_time_source": f"not measured: {why}",
    }


def takes_census(mode: str, sharded: bool = False) -> bool:
    """Whether a probe in ``mode`` takes its census: eager and fused eager do; torch.compile
    traces the forward with its own dispatch machinery (a mode held over it would change what it
    traces), and a sharded run's ranks are other processes: none there (null ``ops``)."""
    return mode != "compile" and not sharded


def completed(partial: Mapping[str, Any], reference: Mapping[str, Any]) -> dict:
    """The census of a run that stopped, completed by its CPU reference rerun's (both
    ``fields``): the device's operators first, in their order, with their stages (the operator
    that stopped the run among them: counted before it ran), then the operators only the
    reference called. A shared operator's calls are the larger count (the stopped run's are cut
    short). ``ops_source`` is ``reference``."""
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
    return {
        "ops": ops,
        "ops_stages": stages,
        "ops_calls": calls,
        "ops_source": REFERENCE,
        **_completed_sigs(partial, reference),
    }


def _completed_sigs(partial: Mapping[str, Any], reference: Mapping[str, Any]) -> dict:
    """``completed``'s signatures: the stopped run's, then those only the reference called; a
    shared (operator, signature) keeps the larger count and the widest range of ranks. A run from
    before signatures has none."""
    if partial.get("ops_sig_ops") is None or reference.get("ops_sig_ops") is None:
        return dict.fromkeys(SIG_FIELDS)
    rows = {
        (op, sig): [calls, low, high]
        for op, sig, calls, low, high in zip(*(partial[f] for f in SIG_FIELDS))
    }
    for op, sig, calls, low, high in zip(*(reference[f] for f in SIG_FIELDS)):
        row = rows.get((op, sig))
        if row is None:
            rows[(op, sig)] = [calls, low, high]
            continue
        row[0] = max(row[0], calls)
        row[1] = min((r for r in (row[1], low) if r is not None), default=None)
        row[2] = max((r for r in (row[2], high) if r is not None), default=None)
    keys = list(rows)
    return {
        "ops_sig_ops": [op for op, _ in keys],
        "ops_sig_dtypes": [sig for _, sig in keys],
        "ops_sig_calls": [rows[k][0] for k in keys],
        "ops_sig_min_rank": [rows[k][1] for k in keys],
        "ops_sig_max_rank": [rows[k][2] for k in keys],
    }


#: An operator's name in an error message (``Could not run 'aten::bmm' with arguments from ...``; a
#: runtime's "fatal error in aten::relu"); C++ namespaces that name no operator are left out.
_OPERATOR = re.compile(r"\b([A-Za-z_]\w*)::([A-Za-z_]\w*(?:\.\w+)?)")
_NOT_OPERATORS = frozenset({"c10", "at", "std", "torch", "caffe2", "c10d", "pybind11"})


def operator_named(message: str | None, among: list[str] | None = None) -> str | None:
    """The first operator ``message`` names (within ``among``, a census, when given): the
    operator that stopped a run whose failure is the stack's, by the words of its error."""
    for found in _OPERATOR.finditer(message or ""):
        name = f"{found[1]}::{found[2]}".rstrip(".")
        if found[1] not in _NOT_OPERATORS and (among is None or name in among):
            return name
    return None


def stopped_by(record: Mapping[str, Any]) -> str | None:
    """The operator that stopped a run whose failure is the stack's (``attribution`` ``stack``:
    the CPU reference passes), as its error names it; None for any other row."""
    if record.get("attribution") != "stack":
        return None
    return operator_named(record.get("error_message"))


#: How a census asks a stack about a dtype (``dtype::bfloat16``): beside the operators, since a stack that refuses
#: a dtype fails every model run in it, at the weights' copy.
DTYPE_NAMESPACE = "dtype::"


def dtype_name(dtype: str | None) -> str | None:
    """``dtype::bfloat16`` for a run in bfloat16 (the name an adapter's ``op_coverage`` is
    asked); None without one."""
    return f"{DTYPE_NAMESPACE}{dtype}" if dtype else None


def coverage_fields(
    ops: list[str] | None, coverage: dict[str, str], stopped: str | None = None
) -> dict:
    """``ops_missing``, ``ops_fallback`` and ``ops_unknown`` of a census, from the device
    adapter's ``op_coverage`` (operator -> implemented / fallback / missing / unknown), each in
    census order; all null without a census. ``stopped``: the operator that stopped the run, the
    stack's failure (``stopped_by``), is missing whatever the adapter reads (a registered kernel
    that raised; one the census did not reach)."""
    if ops is None:
        return {"ops_missing": None, "ops_fallback": None, "ops_unknown": None}
    if stopped is not None:
        coverage = {**coverage, stopped: MISSING}
    fields = {
        f"ops_{status}": [op for op in ops if coverage.get(op) == status]
        for status in (MISSING, FALLBACK, UNKNOWN)
    }
    if stopped is not None and stopped not in ops:
        fields["ops_missing"].insert(0, stopped)
    return fields
