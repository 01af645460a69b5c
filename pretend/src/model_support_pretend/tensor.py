"""Tensors on the pretend device: CPU tensors underneath, every operator through one Python
function.

A ``PretendTensor`` is a wrapper subclass (``torch.Tensor._make_wrapper_subclass``): it reports the
device ``pretend:<i>`` and holds the real data as a CPU tensor. Every operator on it reaches
``__torch_dispatch__``, and operators that create tensors on the device from nothing (``empty``,
``empty_strided``, the factories built on them) reach the PrivateUse1 fallback: both go through
``run``, which acts out the configured faults, runs the operator on the CPU data, and wraps the
results again, counting each new storage against the device's memory (``Ledger``). A clean run is
therefore bit for bit the CPU's in the same dtype: the same kernels, in the same order.

A kernel registered through ``torch.library`` for the device's dispatch key (PrivateUse1,
``register_kernel(op, "pretend", fn)``) replaces the backend's own implementation of that operator,
as the dispatcher makes it for a C++ backend: ``run`` calls it instead (``hosted``), and the
operator's configured faults no longer apply; its calls are counted as CPU fallbacks (a host kernel,
``model_support.probe.host_ops``, copies its inputs to the CPU and back).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import NamedTuple

import torch
from torch._subclasses.fake_tensor import is_fake
from torch.library import _impls as _REGISTERED
from torch.utils._pytree import tree_flatten, tree_map

from .attention import KERNELS as FUSED
from .clock import DeviceClock
from .config import FALLBACK_S, MATMUL_OPS, NAME, Config
from .counters import Counters


class Ledger:
    """One device's memory: bytes held by live storages, the peak, and the limit (None: no
    limit)."""

    def __init__(self, index: int, physical: int, limit: int | None):
        self.index, self.physical, self.limit = index, physical, limit
        self.allocated = 0
        self.peak = 0
        self.storages: dict[int, list[int]] = {}  # storage address -> [bytes, live wrappers]
        self.lock = threading.Lock()

    def hold(self, key: int, nbytes: int) -> None:
        """Count one more wrapper of the storage at ``key``; a new storage's bytes may not pass
        the limit."""
        with self.lock:
            entry = self.storages.get(key)
            if entry is None:
                if self.limit is not None and self.allocated + nbytes > self.limit:
                    raise torch.OutOfMemoryError(oom_message(self, nbytes))
                self.storages[key] = [nbytes, 1]
                self.allocated += nbytes
                self.peak = max(self.peak, self.allocated)
            else:
                entry[1] += 1

    def release(self, key: int) -> None:
        with self.lock:
            entry = self.storages.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:
                del self.storages[key]
                self.allocated -= entry[0]


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


def oom_message(ledger: Ledger, nbytes: int) -> str:
    """Worded as CUDA's allocator words it, so that every out-of-memory check recognises it."""
    assert ledger.limit is not None, "only a device with a memory limit runs out of it"
    free = max(0, ledger.limit - ledger.allocated)
    return (
        f"{NAME} out of memory. Tried to allocate {_mib(nbytes)}. Device {ledger.index} has a "
        f"total capacity of {_mib(ledger.limit)} of which {_mib(free)} is free. Of the "
        f"allocated memory {_mib(ledger.allocated)} is allocated by tensors on the device."
    )


class Faults(NamedTuple):
    """The faults the configuration gives one operator, under either of its names (``_names``)."""

    names: tuple[str, str]
    crash: bool
    slow: tuple[float, ...]  # seconds to stall, per name that ``slow_ops`` gives
    fallback: bool
    missing: bool
    wrong: bool
    off_by: float | None  # a relative error (``wrong_ops`` given as a mapping) rather than a bug
    # ``wrong_past_length``: wrong once its sequence axis reaches this many positions
    past_length: int | None = None
    # ``matmul_noise``: a matrix product off by up to this much, like rounding (no fault)
    noise: float | None = None


class State:
    """The backend's process-wide state: its configuration, the current device, one ledger per
    device."""

    def __init__(self, config: Config):
        self.config = config
        self.current = 0
        self.ledgers = [Ledger(i, p, config.memory_bytes) for i, p in enumerate(config.visible)]
        self._faults: dict = {}  # operator -> its Faults, worked out on its first call
        # this process's turn among those calling a ``flaky_ops`` operator
        self._turn: int | None = None
        self.counters = Counters()  # its syncs and fallbacks, for the adapter's ``host_counters``
        self.clock = DeviceClock(
            config.launch_us * 1e-6,
            config.bandwidth_gbs,
            config.clock_jitter,
            queued=config.clock == "host",
        )
        # [the crashed operator, operators left before the abort is reported]
        self.doomed: list | None = None
        # ``matmul_noise``'s draws: seeded, so a process that runs the same operators is off the
        # same way each run
        self.noise = torch.Generator().manual_seed(0)

    def sync(self, made=None) -> None:
        """A device-to-host synchronisation (a sync, a copy to the host): the host waits for the
        queued work (``clock.wait``: only with ``clock: host``), and it is counted
        (``counters``)."""
        self.clock.wait()
        self.counters.sync(made)

    def stall(self, seconds: float) -> None:
        """The device stalls (a slow operator, a fallback's round trip): slept, so the host waits
        as it would, and counted whole on its clock."""
        # queued (``clock: host``), the host waits for it at the next sync instead
        if not self.clock.queued:
            time.sleep(seconds)
        self.clock.stall(seconds)

    def crash(self, name: str) -> None:
        """Operator ``name`` crashed: the runtime aborts now, or ``crash_after`` operators later
        (reported late, as an asynchronous runtime reports it; at once under ``BLOCKING_VAR``)."""
        if self.doomed is None:
            self.doomed = [name, 0 if self.config.blocking else self.config.crash_after]
        self.count_down()

    def count_down(self) -> None:
        """One more operator since the crash: the abort, when its turn has come."""
        assert self.doomed is not None
        if self.doomed[1] <= 0:
            if self.config.crash_message:
                os.write(2, f"{NAME} runtime: fatal error in {self.doomed[0]}; aborting\n".encode())
            os.abort()  # as a device runtime abort does: the process dies with SIGABRT
        self.doomed[1] -= 1

    def faults(self, func) -> Faults:
        """What the configuration does to operator ``func`` (asked on every call: worked out
        once)."""
        known = self._faults.get(func)
        if known is None:
            config, names = self.config, _names(func)
            known = self._faults[func] = Faults(
                names,
                crash=any(n in config.crash_ops for n in names),
                # once per name given (a default overload's two names are one: ``aten::rsqrt``
                # stalls once a call)
                slow=tuple(
                    config.slow_ops[n] for n in dict.fromkeys(names) if n in config.slow_ops
                ),
                fallback=any(n in config.fallback_ops for n in names),
                missing=any(n in config.missing_ops for n in names) or self._flaky(names),
                wrong=any(n in config.wrong_ops for n in names),
                off_by=next((config.wrong_by[n] for n in names if n in config.wrong_by), None),
                past_length=config.wrong_past_length.get(names[0]),
                noise=config.matmul_noise if names[0] in MATMUL_OPS else None,
            )
        return known

    def _flaky(self, names: tuple[str, str]) -> bool:
        """Whether a ``flaky_ops`` operator is missing in this process: its turn (drawn from
        ``flaky_file`` once, at the first call of any of them) is the 1st, (N+1)th, (2N+1)th...
        of the processes that called one."""
        periods = [self.config.flaky_ops[n] for n in names if n in self.config.flaky_ops]
        if not periods:
            return False
        if self._turn is None:
            # parse requires it with flaky_ops
            self._turn = _draw_turn(self.config.flaky_file or "")
        return (self._turn - 1) % periods[0] == 0

    def device(self, index: int | None = None) -> torch.device:
        return torch.device(NAME, self.current if index is None else index)

    def ledger(self, device) -> Ledger:
        index = torch.device(device).index
        index = self.current if index is None else index
        if not 0 <= index < len(self.ledgers):
            raise RuntimeError(
                f"{NAME} device {index} is not visible here: this process sees "
                f"{len(self.ledgers)} device(s)."
            )
        return self.ledgers[index]


STATE: State | None = None  # set by ``backend.register``


def _draw_turn(path: str) -> int:
    """The next turn in the counter file ``path`` (1 for the first process), under an exclusive
    lock: every process (each probe attempt is a new kernel) counts once, in order, whatever runs
    beside it."""
    import fcntl

    with open(path, "a+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        turn = int(handle.read().strip() or 0) + 1
        handle.seek(0)
        handle.truncate()
        handle.write(str(turn))
        handle.flush()
        return turn


def _state() -> State:
    """The backend's state; an operator can only reach this module once ``backend.register`` set
    it."""
    assert STATE is not None, "the pretend backend is not registered"
    return STATE


class PretendTensor(torch.Tensor):
    """A tensor on ``pretend:<i>`` whose data is the CPU tensor ``_data``."""

    _data: torch.Tensor

    @staticmethod
    def __new__(cls, data: torch.Tensor, device: torch.device):
        tensor = torch.Tensor._make_wrapper_subclass(
            cls,
            data.size(),
            strides=data.stride(),
            storage_offset=data.storage_offset(),
            dtype=data.dtype,
            layout=data.layout,
            device=device,
            requires_grad=data.requires_grad,
        )
        tensor._data = data
        return tensor

    def __repr__(self, *, tensor_contents=None):
        return (
            repr(self._data).replace("tensor(", "PretendTensor(", 1)[:-1]
            + f", device='{self.device}')"
        )

    # torch refuses tolist() on subclasses; a device tensor copies its values to the host
    def tolist(self):
        _state().sync()
        return self._data.tolist()

    def __tensor_flatten__(self):
        return ["_data"], {"device": self.device}

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return PretendTensor(inner["_data"], meta["device"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return run(func, args, kwargs or {})


#: The types of a CPU tensor holding real data (a trace's fake tensors, and other wrappers, are
#: subclasses).
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def wrap(data: torch.Tensor, device: torch.device) -> PretendTensor:
    """``data`` as a tensor on ``device``: refused for a dtype the device lacks, counted against
    its memory."""
    config = _state().config
    dtype = str(data.dtype).removeprefix("torch.")
    if dtype in config.unsupported_dtypes:
        raise TypeError(
            f"Cannot convert a {NAME} Tensor to {dtype} dtype as the {NAME} backend doesn't "
            f"support {dtype}. Please use another dtype."
        )
    ledger = _state().ledger(device)
    device = torch.device(NAME, ledger.index)
    if type(data) not in _PLAIN or is_fake(data):
        # torch.compile's fake tensors (nothing allocated) and other wrappers (a collective's result
        # waiting for its data): counted, if at all, where their data are
        return PretendTensor(data, device)
    storage = data.untyped_storage()
    key, nbytes = storage.data_ptr(), storage.nbytes()
    if nbytes:
        ledger.hold(key, nbytes)
    # on the CPU data, not the wrapper: module.to() swaps wrappers, which refuses weak references
    if nbytes:
        weakref.finalize(data, ledger.release, key)
    return PretendTensor(data, device)


def _names(func) -> tuple[str, str]:
    name = func._schema.name
    overload = func._overloadname
    return name, f"{name}.{overload}" if overload and overload != "default" else name


def _cpu_fallback_on() -> bool:
    """The TPU contract's switch (``no_fallback``): ``torch.pretend.enable_cpu_fallback``, False
    until a user sets it, as TorchTPU's ``enable_cpu_fallback`` (read from ``torch.pretend``, the
    device module ``backend.register`` installs: this module imports none of it)."""
    return bool(getattr(torch, NAME).enable_cpu_fallback)


def act_out_faults(func) -> Faults:
    """What the configured faults do before ``func`` runs: crash, stall, or have no kernel; its
    ``Faults``."""
    state = _state()
    # an earlier operator crashed: reported now, or some operators later
    if state.doomed is not None:
        state.count_down()
    faults = state.faults(func)
    if faults.crash:
        state.crash(faults.names[0])
    for seconds in faults.slow:
        state.stall(seconds)
    # the TPU contract: it raises
    if faults.fallback and state.config.no_fallback and not _cpu_fallback_on():
        raise NotImplementedError(
            f"'{faults.names[0]}' is not implemented for {NAME}. Please file a feature request"
        )
    if faults.fallback:  # no kernel, a CPU fallback: correct, and slow
        state.counters.fallback(faults.names[1])
        state.stall(FALLBACK_S)
    if faults.missing:
        raise NotImplementedError(
            f"Could not run '{faults.names[0]}' with arguments from the '{NAME}' backend. This "
            "could be because the operator doesn't exist for this backend, or was omitted "
            "during the selective/custom build process (if using custom build)."
        )
    return faults


def _wrong(tensor: torch.Tensor) -> None:
    """Make ``tensor`` silently wrong, deterministically, in place: floating values reversed
    along the last dimension and negated (a kernel with a layout and sign bug); integers off by
    one; booleans flipped."""
    if tensor.is_floating_point() or tensor.is_complex():
        bad = -(tensor.flip(-1) if tensor.dim() else tensor)
    elif tensor.dtype == torch.bool:
        bad = ~tensor
    else:
        bad = tensor + 1
    tensor.copy_(bad)


def sequence_length(name: str, args, kwargs) -> int:
    """The length of the sequence axis operator ``name`` works over (``config.PAST_LENGTH_AXES``
    says which, and parse allows no other): a softmax's ``dim``; ``aten::bmm``'s contraction,
    mat1's last dimension."""
    if name == "aten::bmm":
        return int(args[0].shape[-1])
    dim = args[1] if len(args) > 1 else kwargs["dim"]
    return int(args[0].shape[dim])


def _off_by(tensor: torch.Tensor, relative: float) -> None:
    """Make ``tensor``'s floating values off by ``relative`` each, in place, with a random sign
    (a fixed seed: the same call is off the same way every time); other dtypes are left exact."""
    if not tensor.is_floating_point() or not tensor.numel():
        return
    signs = torch.randint(0, 2, tensor.shape, generator=torch.Generator().manual_seed(0)) * 2 - 1
    tensor.copy_(tensor.double() * (1 + relative * signs))


def _noisy(tensor: torch.Tensor, relative: float, generator: torch.Generator) -> None:
    """Put a rounding-like error on ``tensor``'s floating values, in place: each times 1 + u, u
    drawn uniformly from [-relative, relative] (``matmul_noise``). Unlike ``_off_by`` (a fault:
    every value off by the whole error, the same pattern each call) it is drawn afresh each call,
    as rounding errors fall: a healthy stack's imprecision."""
    if not tensor.is_floating_point() or not tensor.numel():
        return
    u = torch.rand(tensor.shape, generator=generator, dtype=torch.float64) * 2 - 1
    tensor.copy_(tensor.double() * (1 + relative * u))


def _target_device(leaves: list) -> torch.device | None:
    """Where the results live: the device an argument names (``device=``, ``to(device)``) when
    there is one, else the pretend device of the inputs (``leaves``: the operator's arguments,
    flattened)."""
    named = [leaf for leaf in leaves if isinstance(leaf, torch.device)]
    if named:
        return named[0]
    found = {leaf.device for leaf in leaves if isinstance(leaf, PretendTensor)}
    if len(found) > 1:
        first, second = sorted(found, key=str)[:2]
        raise RuntimeError(
            "Expected all tensors to be on the same device, but found at least two devices, "
            f"{first} and {second}!"
        )
    return found.pop() if found else None


_CPU = torch.device("cpu")
#: ``.item()`` and ``bool()`` of a device tensor end here; ``copy_`` into a host tensor copies out
#: too.
_SCALAR, _COPY = torch.ops.aten._local_scalar_dense.default, torch.ops.aten.copy_.default


def _on_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """The CPU tensor an operator runs on: a device tensor's data; a fake tensor that
    torch.compile made for the device (a plain tensor claiming the device) moved, in metadata
    only."""
    if isinstance(tensor, PretendTensor):
        return tensor._data
    if tensor.device.type == NAME:
        return tensor.to(_CPU)
    return tensor


#: Per operator: whether it has a ``CompositeImplicitAutograd`` kernel (``composite``), asked once
#: each.
_COMPOSITE: dict = {}


def composite(func) -> bool:
    """Whether ``func`` is one a compiled backend never sees whole: an operator with a
    ``CompositeImplicitAutograd`` kernel (``aten::linear``, ``aten::matmul``,
    ``aten::scaled_dot_product_attention``) reaches a C++ backend as the operators it decomposes
    into, in every mode, unless the backend registers the composite itself. Under
    ``torch.inference_mode()`` it reaches a Python backend whole instead (the autograd keys that
    would decompose it are skipped)."""
    known = _COMPOSITE.get(func)
    if known is None:
        known = _COMPOSITE[func] = torch._C._dispatch_has_kernel_for_dispatch_key(
            func.name(), "CompositeImplicitAutograd"
        )
    return known


#: The device's dispatch key, for which ``torch.library`` registers a kernel of this device
#: (``hosted``).
KEY = "PrivateUse1"
_DISPATCH_KEY = getattr(torch._C.DispatchKey, KEY)
#: Per operator: the key under which ``torch.library`` records a kernel of it registered from Python
#: for ``KEY`` (in ``_REGISTERED``: ``Library.impl`` adds the key, the library's destruction removes
#: it); None for the backend's own kernels (``FACTORIES``, ``_copy_from``), which call ``run``.
#: Kernels compiled into torch for every device (c10d's collectives) are not there: the backend runs
#: those on its CPU data, as it always did.
_HOSTED: dict = {}


def hosted(func) -> bool:
    """Whether a kernel registered through ``torch.library`` for the device's dispatch key
    replaces the backend's own ``func``, as the dispatcher would call it for a C++ backend. Asked
    on every call: one set lookup, nothing cached goes stale."""
    key = _HOSTED.get(func, False)
    if key is False:
        key = _HOSTED[func] = None if func in _OWN else f"{func.name().replace('::', '/', 1)}/{KEY}"
    return key is not None and key in _REGISTERED


def host_kernel(func, args, kwargs):
    """``func`` by the kernel registered for the device's dispatch key, counted as a CPU
    fallback; the kernel's own operators (its copies to the CPU and back) come through ``run`` as
    any other."""
    _state().counters.fallback(_names(func)[1])
    return func._op_dk(_DISPATCH_KEY, *args, **kwargs)


_MOVABLE = (torch.Tensor, torch.device)


def _leaves(tree, into: list) -> list:
    """The leaves of an operator's arguments or results (tuples, lists and dicts of tensors,
    devices, numbers), in pytree's order. Hand-walked: ``tree_flatten`` on every call was most of
    a generation's time here."""
    kind = type(tree)
    if kind is tuple or kind is list:
        for item in tree:
            _leaves(item, into)
    elif kind is dict:
        for item in tree.values():
            _leaves(item, into)
    # a named tuple or another container: pytree knows it
    elif isinstance(tree, tuple | list | dict):
        into.extend(tree_flatten(tree)[0])
    else:
        into.append(tree)
    return into


def _map(fn, tree):
    """``tree`` with every tensor and device in it replaced by ``fn`` of it (``_leaves``' walk)."""
    kind = type(tree)
    if kind is tuple or kind is list:
        return kind(_map(fn, item) for item in tree)
    if kind is dict:
        return {key: _map(fn, item) for key, item in tree.items()}
    if isinstance(tree, _MOVABLE):
        return fn(tree)
    if isinstance(tree, tuple | list | dict):
        return tree_map(lambda leaf: fn(leaf) if isinstance(leaf, _MOVABLE) else leaf, tree)
    return tree


def _to_cpu(leaf):
    """An argument as the CPU kernel takes it: a tensor's CPU data (``_on_cpu``), the CPU for the
    device."""
    if isinstance(leaf, torch.Tensor):
        return _on_cpu(leaf)
    return _CPU if leaf.type == NAME else leaf


def run(func, args, kwargs):
    """One operator on the pretend device (see the module docstring). A composite operator runs
    as its parts (``composite``), each of them through here with its own faults, as a C++ backend
    receives it. A kernel registered for the device's dispatch key runs instead of all that
    (``hosted``)."""
    if hosted(func):
        return host_kernel(func, args, kwargs)
    if composite(func):
        out = func.decompose(*args, **kwargs)
        if out is not NotImplemented:
            return out
    faults = act_out_faults(func)
    leaves = _leaves(kwargs, _leaves(args, []))
    target = _target_device(leaves)
    inputs = {id(t._data): t for t in leaves if isinstance(t, PretendTensor)}
    plain = {
        id(t) for t in leaves if isinstance(t, torch.Tensor) and not isinstance(t, PretendTensor)
    }
    # a fused kernel the CPU has none of (``attention.KERNELS``) does its work on the CPU data by
    # its own code
    out = FUSED.get(func, func)(*_map(_to_cpu, args), **_map(_to_cpu, kwargs))
    results = _leaves(out, [])
    if not func.is_view:  # a view launches nothing: it is the same data, described again
        nbytes = _nbytes(leaves + results)
        # None: torch.compile tracing with symbolic shapes, nothing runs on the device
        if nbytes is not None:
            _state().clock.kernel(nbytes)
    if (
        faults.past_length is not None
        and sequence_length(faults.names[0], args, kwargs) >= faults.past_length
    ):
        for tensor in results:  # a KV-cache or long-context bug: wrong from that length on
            if isinstance(tensor, torch.Tensor):
                _wrong(tensor)
    if faults.wrong:
        for tensor in results:
            if isinstance(tensor, torch.Tensor) and faults.off_by is not None:
                _off_by(tensor, faults.off_by)
            elif isinstance(tensor, torch.Tensor):
                _wrong(tensor)
    # not while torch.compile traces
    if faults.noise is not None and _nbytes(leaves + results) is not None:
        for tensor in results:
            if isinstance(tensor, torch.Tensor):
                _noisy(tensor, faults.noise, _state().noise)
    if target is None or target.type != NAME:
        if inputs:  # a copy to the host: the host waits for the device's data
            _state().sync(out)
        return out  # a copy to the CPU, or no tensor on the device at all
    # .item(); a copy into a host tensor
    if func is _SCALAR or (func is _COPY and inputs and id(args[0]) in plain):
        _state().sync()

    def back(leaf):
        if not isinstance(leaf, torch.Tensor):
            return leaf
        if id(leaf) in inputs:  # in place: the input itself
            return inputs[id(leaf)]
        if id(leaf) in plain:  # an input that is not on the device (copy_ into a CPU tensor)
            return leaf
        return wrap(leaf, target)

    return _map(back, out)


def _nbytes(leaves: list) -> int | None:
    """The bytes of the tensors among ``leaves``: what a kernel taking or making them reads or
    writes; None where a tensor is a trace's fake one (torch.compile at work: nothing runs on the
    device)."""
    total = 0
    for t in leaves:
        if isinstance(t, torch.Tensor):
            n = t.numel()
            data = t._data if isinstance(t, PretendTensor) else t
            # a plain tensor is never fake
            if type(n) is not int or (type(data) not in _PLAIN and is_fake(data)):
                return None
            total += n * t.element_size()
    return total


def device_kernel(op):
    """The PrivateUse1 kernel of ``op``, for calls that reach the device with no device tensor
    among their inputs: the factories (``empty``, ``empty_strided``) asked for
    ``device='pretend'``."""

    def kernel(*args, **kwargs):
        return run(op, args, kwargs)

    return kernel


def copy_from(src, dst, non_blocking=False):
    """``aten::_copy_from``: a copy into or out of the device that bypassed Python dispatch
    (``torch.tensor(..., device=...)`` does). The faults of ``aten::copy_`` apply."""
    act_out_faults(torch.ops.aten.copy_.default)
    _state().clock.kernel(2 * src.numel() * src.element_size())
    if isinstance(src, PretendTensor) and not isinstance(dst, PretendTensor):
        _state().sync()
    source = src._data if isinstance(src, PretendTensor) else src
    target = dst._data if isinstance(dst, PretendTensor) else dst
    target.copy_(source, non_blocking)
    return dst


#: Operators the device runs without a device tensor among their inputs (see ``device_kernel``).
FACTORIES = (torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default)
COPY_FROM = torch.ops.aten._copy_from.default
#: The operators whose kernels for the device's dispatch key are the backend's own
#: (``backend.register``): never ``hosted``.
_OWN = frozenset((*FACTORIES, COPY_FROM))
