"""Operators on the host, for one run: a kernel per named operator, for the device's dispatch key,
that copies the operator's tensors to the CPU, runs the CPU's kernel and copies the results back
(docs/host_ops.md).

``refusals(names)`` says, before anything runs, which names cannot go to the host and why, one
sentence each; ``on_host(device_type, names)`` registers the kernels through ``torch.library`` for
the device's dispatch key, as a context manager that removes them when it ends (the library's
destruction), and counts each operator's calls (``HostOps.calls``). A registered kernel replaces the
device's own implementation of the operator, as a backend's CPU fallback would: an operator the
stack lacks, or one that crashes or is wrong there, then runs on the host. ``lacking(adapter)``
lists what the stack lacks (the setting ``missing``). Whether a device takes such kernels at all is
its adapter's to say (``Adapter.host_kernels``).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterable

#: The operators a host kernel itself moves data with (its copies to the CPU and back): on the host,
#: each would call itself.
TRANSFERS = ("aten::_to_copy", "aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize")


UNKNOWN = (
    "it is no operator torch knows (write it as 'aten::rsqrt', or 'aten::add.Tensor' for one "
    "overload)"
)


class HostOpsRefused(ValueError):
    """Some operators named cannot run on the host; the message names each, with why."""

    def __init__(self, refused: dict[str, str]):
        self.refused = dict(refused)
        super().__init__(sentence(refused))


def sentence(refused: dict[str, str]) -> str:
    """The refusal of ``refused`` ({name: why}) in words: one sentence per name."""
    return " ".join(f"{name} cannot run on the host: {why}." for name, why in refused.items())


def _operator(name: str):
    """The operator ``name`` names (``aten::rsqrt`` a packet, ``aten::add.Tensor`` one overload),
    or None."""
    import torch

    namespace, sep, rest = name.partition("::")
    base, _, overload = rest.partition(".")
    if not sep or not namespace or not base:
        return None
    try:
        packet = getattr(getattr(torch.ops, namespace), base)
        return getattr(packet, overload) if overload else packet
    except (AttributeError, RuntimeError):
        return None


@functools.cache
def _dispatched() -> frozenset[str]:
    """The dispatcher's operators, by name (``aten::rsqrt``, ``aten::add.Tensor``): a packet also
    holds TorchScript's own overloads (``aten::add.int``, on numbers), which never reach a
    backend."""
    import torch

    return frozenset(torch._C._dispatch_get_all_op_names())


def _is_out(argument) -> bool:
    """Whether schema argument ``argument`` is an ``out=`` tensor (keyword-only, written): a
    result, not an input."""
    return argument.kwarg_only and argument.alias_info is not None and argument.alias_info.is_write


def why_not(op) -> str | None:
    """Why overload ``op`` cannot run on the host, in words (the end of a sentence); None when it
    can. The classes are docs/host_ops.md's, asked in this order."""
    import torch

    has = torch._C._dispatch_has_kernel_for_dispatch_key
    name = op.name()
    if has(name, "CompositeImplicitAutograd"):
        return (
            "it is a composite that decomposes before it reaches a backend "
            "(CompositeImplicitAutograd), so no device kernel of it is ever called; name the "
            "operators it decomposes into (aten::linear reaches a backend as aten::t and "
            "aten::mm or aten::addmm)"
        )
    if name.partition(".")[0] in TRANSFERS:
        return (
            "it is one of the copies between the device and the host that a host kernel itself "
            "runs with"
        )
    if not torch._C._dispatch_has_computed_kernel_for_dispatch_key(name, "CPU"):
        return "the CPU has no kernel for it"
    if not any("Tensor" in str(a.type) and not _is_out(a) for a in op._schema.arguments):
        return (
            "it is a factory (no tensor input): it makes a tensor from nothing, which the "
            "device must do itself; made on the host it would be made there"
        )
    if torch.Tag.nondeterministic_seeded in op.tags:
        return (
            "it is a random operator: on the host it would draw from the CPU's generator, not "
            "the device's, so its numbers would not be the device's"
        )
    if op.is_view:
        return (
            "it is a view (its result aliases an input): a copy on the host is not the device "
            "tensor's data, so writes through the view would be lost"
        )
    if torch.Tag.inplace_view in op.tags:
        return (
            "it changes a tensor's metadata in place (its shape, strides or storage): the "
            "device tensor's own metadata must change, which a copy on the host cannot do"
        )
    return None


def _plan(name: str) -> tuple[list, dict[str, str], str | None]:
    """(the overloads of ``name`` that go to the host, {overload: why} of those left out, why the
    name is refused or None). A name with an overload is that one; a name without one is every
    overload of the packet that takes tensors, refused when its default overload (what a model
    calls by that name) is refused, or when all are."""
    import torch

    found = _operator(name)
    if isinstance(found, torch._ops.OpOverload):
        found = found if found.name() in _dispatched() else None
    if found is None:
        return [], {}, UNKNOWN
    if isinstance(found, torch._ops.OpOverload):
        why = why_not(found)
        return ([], {}, why) if why else ([found], {}, None)
    overloads = [getattr(found, overload) for overload in found.overloads()]
    overloads = [op for op in overloads if op.name() in _dispatched()]
    if not overloads:
        return [], {}, UNKNOWN
    verdicts = {op: why_not(op) for op in overloads}
    default = next((op for op in overloads if op._overloadname == "default"), None)
    if default is not None and verdicts[default]:
        return [], {}, verdicts[default]
    accepted = [op for op, why in verdicts.items() if why is None]
    if not accepted:
        return [], {}, verdicts[overloads[0]]
    return accepted, {op.name(): why for op, why in verdicts.items() if why}, None


def refusals(names: Iterable[str]) -> dict[str, str]:
    """{name: why} for each of ``names`` that cannot run on the host (``sentence`` words them);
    {} when every one can. Asks torch's dispatcher only: nothing is registered, nothing runs."""
    refused = {}
    for name in names:
        why = _plan(name)[2]
        if why:
            refused[name] = why
    return refused


def dispatch_key(device_type: str) -> str:
    """The dispatch key of device ``device_type`` (``PrivateUse1`` for an out-of-tree backend,
    ``CUDA``)."""
    import torch

    return torch._C._dispatch_key_for_device(device_type)


def host_kernel(op, calls: dict[str, int]):
    """A kernel for overload ``op`` on a device: its tensors copied to the CPU (a device named in
    its arguments becomes the CPU), the CPU's kernel of ``op``, then its results copied back to
    the device of its inputs (or the device it names). An argument the schema says it writes (in
    place, ``out=``) gets the CPU's result copied back into it, and a result that is such an
    argument is the original tensor. Each call counted in ``calls``."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_map

    name = op.name()
    schema = op._schema
    positions = {a.name: i for i, a in enumerate(schema.arguments)}
    writes = [a.alias_info is not None and a.alias_info.is_write for a in schema.arguments]
    cpu = torch.device("cpu")

    def kernel(*args, **kwargs):
        calls[name] = calls.get(name, 0) + 1
        leaves = tree_flatten((args, kwargs))[0]
        named = [leaf for leaf in leaves if isinstance(leaf, torch.device)]
        home = (
            named[0]
            if named
            else next(t.device for t in leaves if isinstance(t, torch.Tensor) and t.device != cpu)
        )
        # (a written argument's copy on the CPU, the original)
        written: list[tuple[torch.Tensor, torch.Tensor]] = []

        def down(leaf):
            if isinstance(leaf, torch.device):
                return cpu if leaf.type != "cpu" else leaf
            if isinstance(leaf, torch.Tensor) and leaf.device.type != "cpu":
                return leaf.cpu()
            return leaf

        def moved(value, position: int):
            copy = tree_map(down, value)
            if writes[position]:
                for original, mine in zip(
                    tree_flatten(value)[0], tree_flatten(copy)[0], strict=True
                ):
                    if isinstance(original, torch.Tensor) and mine is not original:
                        written.append((mine, original))
            return copy

        out = op(
            *[moved(value, i) for i, value in enumerate(args)],
            **{key: moved(value, positions[key]) for key, value in kwargs.items()},
        )
        for mine, original in written:
            if original.shape != mine.shape:  # an out= tensor the CPU's kernel resized
                original.resize_(mine.shape)
            original.copy_(mine)
        back = {id(mine): original for mine, original in written}

        def up(leaf):
            if not isinstance(leaf, torch.Tensor):
                return leaf
            if id(leaf) in back:
                return back[id(leaf)]
            return leaf if home.type == "cpu" else leaf.to(home)

        return tree_map(up, out)

    return kernel


class HostOps(contextlib.AbstractContextManager):
    """The host kernels of one run (``on_host``): registered on entering, removed on leaving.

    ``names``: as given; ``overloads``: the overloads registered (``aten::rsqrt``,
    ``aten::rsqrt.out``); ``left_out``: {overload: why} of packets' overloads that cannot go (the
    others of the packet went); ``calls``: {overload: calls} so far, in first-call order;
    ``key``: the dispatch key they are registered for."""

    def __init__(self, device_type: str, names: Iterable[str]):
        self.device_type = device_type
        self.names = list(dict.fromkeys(names))
        refused, self.left_out, plans = {}, {}, []
        for name in self.names:
            accepted, left_out, why = _plan(name)
            if why:
                refused[name] = why
            plans += accepted
            self.left_out.update(left_out)
        if refused:
            raise HostOpsRefused(refused)
        self._ops = list(dict.fromkeys(plans))
        self.overloads = [op.name() for op in self._ops]
        self.key = dispatch_key(device_type)
        self.calls: dict[str, int] = {}
        self._libraries: dict = {}

    def __enter__(self) -> HostOps:
        import torch
        from torch.library import _impls

        taken = [
            n
            for op, n in zip(self._ops, self.overloads, strict=True)
            if _library_key(op, self.key) in _impls
        ]
        if taken:
            raise RuntimeError(
                f"{', '.join(taken)} already {'has' if len(taken) == 1 else 'have'} a kernel "
                f"registered from Python for {self.key} (another host_ops run, or the "
                "backend's own): it cannot be put on the host again."
            )
        try:
            for op in self._ops:
                namespace = op._schema.name.split("::")[0]
                if namespace not in self._libraries:
                    self._libraries[namespace] = torch.library.Library(namespace, "IMPL")
                # a C++ backend's own kernel of it is overridden, for the run
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")
                    self._libraries[namespace].impl(op, host_kernel(op, self.calls), self.key)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Remove the kernels: the device's own implementations (or their absence) are back."""
        for library in self._libraries.values():
            library._destroy()
        self._libraries.clear()


def _library_key(op, key: str) -> str:
    """How ``torch.library`` records a kernel of ``op`` for ``key`` registered from Python
    (``Library.impl``): ``aten/rsqrt/PrivateUse1``, ``aten/add.Tensor/CUDA``."""
    return f"{op.name().replace('::', '/', 1)}/{key}"


def on_host(device_type: str, names: Iterable[str]) -> HostOps:
    """The host kernels of ``names`` for device ``device_type``, to use as ``with on_host(...) as
    hosted:``; raises ``HostOpsRefused`` (every refused name, with why) before anything is
    registered."""
    return HostOps(device_type, names)


def lacking(adapter) -> list[str]:
    """The operators the stack lacks (the setting ``missing``): every operator torch knows that
    ``adapter``'s ``op_coverage`` says is missing, by its dispatcher name."""
    from .devices import MISSING

    names = sorted(n for n in _dispatched() if n.startswith("aten::"))
    return [name for name, status in adapter.op_coverage(names).items() if status == MISSING]
