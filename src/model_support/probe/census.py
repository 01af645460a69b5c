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

Per operator the census also keeps its **dtype signatures** (``ops_sig_*``: one entry per operator and signature, in
the order of first call) with their calls, the range of ranks they were called with, and their seconds where timed:
a stack's kernel may exist for float32 and not for bfloat16, or for 2-d inputs only. A signature is written
``dtype_signature``'s way: the dtypes of the call's tensor arguments in order, short names (``bf16``, ``f32``,
``i64``, ``bool``; others as torch names them), a list of tensors as the distinct dtypes of its tensors in brackets
(``aten::cat``'s ``[bf16]``), then ``->`` and the output dtype where the call names one (``dtype=``: ``aten::_to_copy``
from bfloat16 to float32 is ``bf16->f32``) or has no tensor argument (a factory: ``aten::arange`` of int64 is
``->i64``, the dtype of what it made). The rank is the highest of the tensor arguments' (a broadcast's output rank),
or a factory's output's; null where neither is known (a factory that raised, whose signature is then ``""``).
Counting costs one hand walk over the call's arguments (``_inputs``) and one dictionary update per call.

**Sampled** (the probe's default, ``census`` sampled): most of a census' cost is not its bookkeeping but being a
Python dispatch mode at all (about 6 us an operator on this machine, its own counting under 1 us), and every decode
step after the first dispatches the same operators. So the probe hands the census its generation's token streamer
(``following``): the census counts the load, the prompt's prefill and the decode steps until ``ALIKE_STEPS`` in a
row dispatched the same (operator, signature) calls, then steps off torch's dispatch stack, and steps back on for the
generation's last token and what follows it (each step's logits read back). The steps it skipped are added as
copies of the last one it counted, calls and seconds (``EXTRAPOLATED`` says so in ``ops_time_source``): the
operators, signatures and ranks are the full census's, and the calls too where every decode step is alike
(``tests/test_census_sampled.py`` checks it on the text fixtures), but for a generation that stopped early at its
end-of-sequence token after the census stepped off: its last step's stop check (``aten::max``, ``aten::eq``, the
``aten::_local_scalar_dense`` that reads it) is one call short. A step that differs (a cache that changes shape at a
window) keeps the census counting until two are alike again; one that first differs after the census stepped off (a
sliding window first reached past the steps counted) is not seen: ``census: full`` counts such a model whole.
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
#: The record's per-(operator, dtype signature) fields, parallel lists in the order of first call (``fields``).
SIG_FIELDS = ("ops_sig_ops", "ops_sig_dtypes", "ops_sig_calls", "ops_sig_min_rank", "ops_sig_max_rank")
#: The record's census fields, in order (``fields``).
FIELDS = ("ops", "ops_stages", "ops_calls", "ops_source", *SIG_FIELDS)
#: The stages whose calls a census times (``timed``): the verdict's generation, the figure a slowdown moves.
TIMED_STAGES = ("generate", "compile")
#: ``ops_time_source`` of a census timed on the host clock.
HOST_CLOCK = "host clock around each call in the generation (the device's operators finish before they return)"
#: ``ops_time_source`` of a census timed on the device's own clock (``Adapter.perf_clock``).
DEVICE_CLOCK = "the device's own clock around each call in the generation (its timeline, as the perf phase reads it)"
#: The probe's ``census`` setting: sampled (the later decode steps extrapolated), full (every step counted), off.
SAMPLED, FULL, OFF = "sampled", "full", "off"
#: A sampled census steps out once this many decode steps in a row dispatched the same calls.
ALIKE_STEPS = 2
#: Said in ``ops_time_source`` (``times``, ``not_timed``) when a sampled census extrapolated any step: the same
#: words for every such run, so two sweeps' times still compare (``analysis.perf``).
EXTRAPOLATED = (
    "census sampled: decode steps counted until two in a row dispatched the same operators, the later ones' calls and "
    "seconds extrapolated from the last counted (a generation that stopped early at its end-of-sequence token misses "
    "its last stop check's)"
)


def dispatch_key(device_type: str) -> str:
    """The dispatch key a device's kernels are registered under: the device type upper-cased where torch has such
    a key (``CPU``, ``CUDA``, ``XPU``, ``MPS``), else ``PrivateUse1`` (an out-of-tree backend: tpu, npu)."""
    import torch

    key = device_type.upper()
    if device_type == torch._C._get_privateuse1_backend_name() or not hasattr(torch._C.DispatchKey, key):
        return "PrivateUse1"  # an out-of-tree backend (torch_tpu before its device is registered: no chip here)
    return key


def Census(device_type: str, timed: bool = False, clock=None) -> Any:
    """A census of the operators that reach ``device_type`` (a ``TorchDispatchMode``, see the module docstring):
    hold it (``with``) over the stages, pass its ``enter`` as their ``on_stage`` hook, read ``fields(source)``.
    ``timed``: also the seconds each operator's calls take in the generation (``TIMED_STAGES``), on the host
    clock, or on ``clock`` (the device's own, ``Adapter.perf_clock``): only true where a call returns once its work
    is done (the adapter's ``synchronous_ops``). Sampled: hand the generation its ``following(timer)``."""
    return _census_class()(device_type, timed, clock)


class _Following:
    """A generation's token streamer (``probe_core.StepTimer``) that tells its census of each token first
    (``Census.following``); everything else is the streamer's own (``times``)."""

    def __init__(self, counted, timer):
        self._counted, self._timer = counted, timer

    def put(self, value) -> None:
        self._counted.token()
        self._timer.put(value)

    def end(self) -> None:
        self._counted.tokens_end()
        self._timer.end()

    def __getattr__(self, name: str):
        return getattr(self._timer, name)

    def __setattr__(self, name: str, value) -> None:  # the streamer's settings (its device clock) are the streamer's
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._timer, name, value)


#: (operator, dispatch key) -> whether the device gets the operator's parts (``composite_on``).
_COMPOSITE: dict[tuple, bool] = {}


def composite_on(func, key: str) -> bool:
    """Whether the dispatcher hands the device of dispatch ``key`` ``func``'s parts: a CompositeImplicitAutograd
    kernel and no kernel of the device's own (torch_tpu registers ``aten::linear`` itself, the CPU does not). Shared
    by every dispatch mode that watches the device, so each sees the operators the census counts."""
    known = _COMPOSITE.get((func, key))
    if known is None:
        import torch

        has = torch._C._dispatch_has_kernel_for_dispatch_key
        name = func.name()
        known = _COMPOSITE[(func, key)] = has(name, "CompositeImplicitAutograd") and not has(name, key)
    return known


def decompose_through(mode, func, args, kwargs):
    """``func`` run as its parts, each dispatched back through ``mode`` (a dispatch mode watching the device, off
    torch's stack while its own ``__torch_dispatch__`` runs); NotImplemented where the operator has no parts."""
    from torch.utils._python_dispatch import TorchDispatchMode

    TorchDispatchMode.__enter__(mode)
    try:
        return func.decompose(*args, **kwargs)
    finally:
        TorchDispatchMode.__exit__(mode, None, None, None)


def names_device(tree, device_type: str) -> bool:
    """Whether a tensor on ``device_type``, or that device itself, is among ``tree``'s leaves (an operator's
    arguments). Shared by every dispatch mode that watches the device (the census, the flight recorder)."""
    return _device_walker()(tree, device_type)


@functools.cache
def _device_walker():
    """``names_device``'s walk, made on first use (torch imported once, not per call). Hand-walked over the tuples,
    lists and dicts operators take: ``tree_flatten`` on every call cost a third of a census."""
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
        if isinstance(tree, tuple | list | dict):  # a named tuple or another container: pytree knows it
            return any(walk(leaf, device_type) for leaf in tree_flatten(tree)[0])
        return False

    return walk


@functools.cache
def _census_class():
    """The mode's class, made on first use: importing this module imports no torch (the sweep's runner does)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Census(TorchDispatchMode):
        def __init__(self, device_type: str, timed: bool = False, clock=None):
            super().__init__()
            self.device_type = device_type
            self.timed = timed
            self.clock = clock or time.perf_counter
            self.time_source = DEVICE_CLOCK if clock else HOST_CLOCK
            # (name, input dtypes, output dtype) -> [calls, min rank, max rank, seconds in the timed stages]
            self.sigs: dict[tuple, list] = {}
            self.key = dispatch_key(device_type)
            self.on_cpu = device_type == "cpu"
            self.stage: str | None = None
            self.recording = not self.on_cpu
            self.active = False  # on torch's dispatch stack
            self.seen: dict[str, list[Any]] = {}  # name -> [first stage, calls], in the order of first call
            # sampling (``following``): tokens streamed so far (the prompt's first), the token to step back on at
            # (the generation's last), each signature's (calls, seconds) at the last token, the last decode step's
            # calls and seconds per signature, the steps run off the stack not yet added, and those added
            self.tokens = 0
            self.last_token: int | None = None  # the streamer's token at which the census steps back on
            self.mark: dict[tuple, tuple] | None = None
            self.step: dict[tuple, tuple] | None = None
            self.out, self.sampled, self.skipped, self.extrapolated, self.stepped = False, False, 0, 0, False
            self.steps_alike = 0  # decode steps in a row alike, the last counted among them

        # Held with ``with``, the mode goes onto torch's dispatch stack only once a stage it counts begins (on the
        # CPU the generation: the weights' loading then pays nothing), and comes off at the end of the block.
        def __enter__(self):
            self.active = False
            return self

        def __exit__(self, *exc):
            if self.active:
                self.active = False
                TorchDispatchMode.__exit__(self, *exc)
            self.out = False

        def following(self, timer, max_new_tokens: int | None = None):
            """``timer`` (the verdict's generation's streamer), telling this census of each token: it then counts
            the decode steps until ``ALIKE_STEPS`` in a row are alike and extrapolates the rest (sampled, see the
            module docstring); ``max_new_tokens``: it steps back on at the last one."""
            self.sampled = True
            self.last_token = max_new_tokens + 1 if max_new_tokens else None  # the prompt is the first
            return _Following(self, timer)

        def token(self) -> None:
            """A token was streamed (the prompt's first, then each new one): a decode step ended."""
            self.tokens += 1
            if self.out:
                self.skipped += 1
                if self.last_token is not None and self.tokens >= self.last_token:
                    self._step_on()
                return
            if not self.sampled or not self.active or self.stage not in TIMED_STAGES:
                return
            mark = {key: (sig[0], sig[3]) for key, sig in self.sigs.items()}
            if self.mark is not None and self.tokens >= 3:  # the prefill's token was the second: a decode step
                step = {
                    key: (calls - self.mark.get(key, (0, 0.0))[0], seconds - self.mark.get(key, (0, 0.0))[1])
                    for key, (calls, seconds) in mark.items()
                    if calls != self.mark.get(key, (0, 0.0))[0]
                }
                alike = self.step is not None and _calls(step) == _calls(self.step)
                self.step = step
                if alike and self.steps_alike + 1 >= ALIKE_STEPS:
                    self._step_off()
                self.steps_alike = self.steps_alike + 1 if alike else 1
            self.mark = mark

        def tokens_end(self) -> None:
            """The generation ended: back on the stack for what follows (its logits read back), the rest added."""
            if self.out:
                self._step_on()
            self.sampled = False  # one generation sampled: any other (fused mode's eager rerun) counted whole

        def _step_off(self) -> None:
            if self.last_token is not None and self.tokens >= self.last_token:
                return  # that was the last token: nothing left to skip
            from torch.utils._python_dispatch import _get_current_dispatch_mode

            if _get_current_dispatch_mode() is not self:  # another mode above it: it cannot come off alone
                return
            TorchDispatchMode.__exit__(self, None, None, None)
            self.active, self.out, self.stepped = False, True, True

        def _step_on(self) -> None:
            self._settle()
            self.out = False
            if self.recording and not self.active:
                self.active = True
                TorchDispatchMode.__enter__(self)

        def _settle(self) -> None:
            """The decode steps run off the stack, added as copies of the last one counted."""
            if not self.skipped or self.step is None:
                return
            n, self.skipped = self.skipped, 0
            self.extrapolated += n
            for key, (calls, seconds) in self.step.items():
                sig = self.sigs[key]
                sig[0] += n * calls
                sig[3] += n * seconds
                self.seen[key[0]][1] += n * calls

        def note(self, text: str) -> str:
            """``text`` (``ops_time_source``), with ``EXTRAPOLATED`` where this census stepped off the stack."""
            self._settle()
            return f"{text}; {EXTRAPOLATED}" if self.stepped else text

        def not_timed(self, why: str) -> dict:
            """``not_timed(why)``, saying what was extrapolated (a run that failed after its census stepped off)."""
            fields = not_timed(why)
            return {**fields, "ops_time_source": self.note(fields["ops_time_source"])}

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
            return names_device(tree, self.device_type)

        def _composite(self, func) -> bool:
            return composite_on(func, self.key)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if not self.recording or not self._reaches_device(args, kwargs):
                return func(*args, **kwargs)
            if self._composite(func):
                out = decompose_through(self, func, args, kwargs)  # its parts come back through the census
                if out is not NotImplemented:
                    return out
            name = func.name()  # aten::add.Tensor; aten::rsqrt for the default overload
            entry = self.seen.get(name)
            if entry is None:
                self.seen[name] = [self.stage, 1]
            else:
                entry[1] += 1
            dtypes, rank = _inputs(args, kwargs)
            named = kwargs.get("dtype")
            timing = self.timed and self.stage in TIMED_STAGES
            began = self.clock() if timing else 0.0
            out: Any = None
            try:
                out = func(*args, **kwargs)
            finally:
                if rank < 0 and isinstance(out, torch.Tensor):  # a factory: the dtype and rank of what it made
                    named, rank = out.dtype if named is None else named, out.dim()
                sig = self.sigs.get((name, dtypes, named))
                if sig is None:
                    sig = self.sigs[(name, dtypes, named)] = [0, rank, rank, 0.0]
                sig[0] += 1
                if rank >= 0:
                    if rank < sig[1] or sig[1] < 0:
                        sig[1] = rank
                    if rank > sig[2]:
                        sig[2] = rank
                if timing:
                    sig[3] += self.clock() - began
            return out

        def fields(self, source: str) -> dict:
            """The record's census: ``ops`` in the order of first call, the stage of each first call, the
            calls of each, and where it came from."""
            self._settle()
            sigs = list(self.sigs.items())
            return {
                "ops": list(self.seen),
                "ops_stages": [stage or "load" for stage, _ in self.seen.values()],
                "ops_calls": [calls for _, calls in self.seen.values()],
                "ops_source": source,
                "ops_sig_ops": [name for (name, _, _), _ in sigs],
                "ops_sig_dtypes": [dtype_signature(dtypes, out) for (_, dtypes, out), _ in sigs],
                "ops_sig_calls": [entry[0] for _, entry in sigs],
                "ops_sig_min_rank": [entry[1] if entry[1] >= 0 else None for _, entry in sigs],
                "ops_sig_max_rank": [entry[2] if entry[2] >= 0 else None for _, entry in sigs],
            }

        def times(self) -> dict:
            """``ops_device_s`` (each census operator's seconds in the generation, in ``ops`` order) and
            ``ops_time_source``; null, saying why, for a census not timed (an asynchronous device)."""
            if not self.timed:
                return self.not_timed(f"{self.device_type} queues its operators asynchronously (no profiler read)")
            self._settle()
            per_op = dict.fromkeys(self.seen, 0.0)
            for (name, _, _), entry in self.sigs.items():
                per_op[name] += entry[3]
            return {
                "ops_device_s": list(per_op.values()),
                "ops_sig_device_s": [entry[3] for entry in self.sigs.values()],
                "ops_time_source": self.note(self.time_source),
            }

    def _calls(step: dict) -> dict:
        return {key: calls for key, (calls, _) in step.items()}

    def _inputs(args, kwargs) -> tuple[tuple, int]:
        """The dtypes of a call's tensor arguments in order (a list of tensors as the tuple of its distinct dtypes)
        and their highest rank (-1: no tensor): hand-walked, one level deep, as operators take them (cheap)."""
        dtypes: list = []
        rank = -1
        for arg in (*args, *kwargs.values()) if kwargs else args:
            if isinstance(arg, torch.Tensor):
                dtypes.append(arg.dtype)
                if arg.dim() > rank:
                    rank = arg.dim()
            elif (type(arg) is list or type(arg) is tuple) and arg:
                inner = []
                for item in arg:
                    if isinstance(item, torch.Tensor):
                        if item.dtype not in inner:
                            inner.append(item.dtype)
                        if item.dim() > rank:
                            rank = item.dim()
                if inner:
                    dtypes.append(tuple(inner))
        return tuple(dtypes), rank

    return _Census


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
    """The canonical signature (see the module docstring) of a call whose tensor arguments have ``dtypes`` (a tuple
    per list argument) and whose output dtype is named ``out`` (None: not named)."""
    parts = ["[" + ",".join(map(short_dtype, d)) + "]" if isinstance(d, tuple) else short_dtype(d) for d in dtypes]
    return ",".join(parts) + (f"->{short_dtype(out)}" if out is not None else "")


def not_timed(why: str) -> dict:
    """The per-operator time fields of a run whose operators were not timed, with the reason."""
    return {"ops_device_s": None, "ops_sig_device_s": None, "ops_time_source": f"not measured: {why}"}


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
    return {
        "ops": ops,
        "ops_stages": stages,
        "ops_calls": calls,
        "ops_source": REFERENCE,
        **_completed_sigs(partial, reference),
    }


def _completed_sigs(partial: Mapping[str, Any], reference: Mapping[str, Any]) -> dict:
    """``completed``'s signatures: the stopped run's, then those only the reference called; a shared (operator,
    signature) keeps the larger count and the widest range of ranks. A run from before signatures has none."""
    if partial.get("ops_sig_ops") is None or reference.get("ops_sig_ops") is None:
        return dict.fromkeys(SIG_FIELDS)
    rows = {(op, sig): [calls, low, high] for op, sig, calls, low, high in zip(*(partial[f] for f in SIG_FIELDS))}
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
