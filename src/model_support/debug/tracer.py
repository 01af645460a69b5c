"""Which module raises: forward hooks on every module of a model, and one traced forward pass.

Pre-hooks push each module (with its input shapes and dtypes) on a stack, exit hooks pop it, so
when the forward raises, the innermost module entered but not exited is the culprit
(``ForwardTrace.failure``, see ``ModuleTracer``). With ``capture=True`` each module's output (the
first tensor of a tuple, dict or dataclass output) is kept on the CPU in float32 for comparison.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..probe import probe_core

ROOT_LABEL = "(model)"


# --- looking inside module inputs and outputs ----------------------------------------------------


def first_tensor(obj, _depth: int = 0):
    """The first tensor in a module's output: the tensor itself, else the first one found (depth
    first) in a tuple, list, dict, ``ModelOutput`` or dataclass; None when there is none."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj
    if _depth > 4 or obj is None:
        return None
    if isinstance(obj, Mapping):
        values = list(obj.values())
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        values = [getattr(obj, f.name, None) for f in dataclasses.fields(obj)]
    elif isinstance(obj, (tuple, list)):
        values = list(obj)
    else:
        return None
    for value in values:
        found = first_tensor(value, _depth + 1)
        if found is not None:
            return found
    return None


def describe_tensor(tensor) -> dict:
    return {"shape": list(tensor.shape), "dtype": str(tensor.dtype), "device": str(tensor.device)}


def describe_inputs(args: tuple, kwargs: dict | None = None) -> list[dict]:
    """Shape, dtype and device of every tensor argument (also inside tuples and lists, one
    level)."""
    import torch

    described = []

    def add(label, value):
        if isinstance(value, torch.Tensor):
            described.append({"arg": label, **describe_tensor(value)})
        elif isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                if isinstance(item, torch.Tensor):
                    described.append({"arg": f"{label}[{i}]", **describe_tensor(item)})

    for i, value in enumerate(args):
        add(f"args[{i}]", value)
    for key, value in (kwargs or {}).items():
        add(key, value)
    return described


def _class_path(module) -> str:
    return f"{type(module).__module__}.{type(module).__qualname__}"


def _module_summary(module) -> str:
    try:
        text = module.extra_repr()
    except Exception:  # noqa: BLE001 a broken extra_repr must not hide the real failure
        text = ""
    return text[:300]


# --- the tracer
# ------------------------------------------------------------------------------------


@dataclasses.dataclass
class ForwardTrace:
    """What one traced forward pass saw.

    ``calls``: one dict per completed module call, in completion order (forward hooks): index, name
    (qualified; "" is the model itself), class, call (n-th call of that module in this pass), and,
    when captured, shape, dtype, inf and nan counts of its first output tensor. ``outputs``:
    (name, call) -> that tensor on the CPU in float32 (``capture=True`` only). ``failure``: None, or
    the innermost module entered but not exited when the forward raised (see ``ModuleTracer``).
    """

    calls: list[dict]
    outputs: dict
    failure: dict | None
    dtype: str | None = None
    device: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


class ModuleTracer:
    """Forward hooks on every module of ``model``, as a context manager: who raised, what ran.

    A forward pre-hook pushes each module (with its input shapes and dtypes) on ``stack`` as it is
    entered; a forward hook registered with ``always_call=True`` pops it as it exits, normally or by
    an exception (torch runs such hooks on the exception path too, before re-raising). A module that
    exits by an exception is recorded in ``raised`` with the modules entered around it at that
    moment and the exception itself. So the culprit of the exception that finally escapes is the
    innermost module entered but not exited when it was raised: the first one recorded with that
    exception (or one it was chained from), even when the model caught an earlier exception of
    another module and carried on (``failure_from``).

    A plain forward hook, run only on a normal exit, records each completed call in ``calls`` (and,
    with ``capture``, its first output tensor, on the CPU in float32).
    """

    def __init__(self, model, capture: bool = False):
        self.model = model
        self.capture = capture
        self.names = {id(module): name for name, module in model.named_modules()}
        self.stack: list[dict] = []
        self.raised: list[dict] = []
        self.calls: list[dict] = []
        self.outputs: dict = {}
        self.root_calls = 0
        self._counts: dict[str, int] = {}
        self._handles: list = []

    def __enter__(self):
        for _, module in self.model.named_modules():
            self._handles.append(module.register_forward_pre_hook(self._enter, with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._completed, with_kwargs=True))
            self._handles.append(
                module.register_forward_hook(self._exit, with_kwargs=True, always_call=True)
            )
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        return False

    def _enter(self, module, args, kwargs):
        name = self.names.get(id(module), "?")
        if name == "":
            self.root_calls += 1
        self.stack.append(
            {"module": module, "name": name, "inputs": describe_inputs(args, kwargs), "done": False}
        )
        return None

    def _top_entry(self, module) -> int | None:
        for depth in range(len(self.stack) - 1, -1, -1):
            if self.stack[depth]["module"] is module:
                return depth
        return None

    def _completed(self, module, args, kwargs, output):
        depth = self._top_entry(module)
        if depth is not None:
            self.stack[depth]["done"] = True
        name = self.names.get(id(module), "?")
        call = self._counts.get(name, 0)
        self._counts[name] = call + 1
        entry = {
            "index": len(self.calls),
            "name": name,
            "class": type(module).__name__,
            "call": call,
        }
        if self.capture:
            tensor = first_tensor(output)
            if tensor is not None:
                import torch

                copy = tensor.detach().to("cpu")
                copy = (
                    copy.to(torch.float32)
                    if not copy.is_complex()
                    else copy.abs().to(torch.float32)
                )
                entry.update(
                    shape=list(tensor.shape),
                    dtype=str(tensor.dtype),
                    inf=int(torch.isinf(copy).sum()),
                    nan=int(torch.isnan(copy).sum()),
                )
                self.outputs[(name, call)] = copy
        self.calls.append(entry)
        return None

    def _exit(self, module, args, kwargs, output):
        import sys

        depth = self._top_entry(module)
        if depth is None:
            return None
        entry = self.stack[depth]
        if not entry["done"]:  # exited by an exception: we are on torch's exception path
            self.raised.append(
                {
                    "entry": entry,
                    "stack": [e["name"] for e in self.stack[: depth + 1]],
                    "exception": sys.exc_info()[1],
                }
            )
        del self.stack[depth:]
        return None

    def culprit(self, exc: BaseException) -> tuple[dict | None, list[str]]:
        """(stack entry, names of the modules entered around it) of the innermost module that raised
        ``exc`` or an exception it was chained from; (None, []) when no module raised it."""
        chain, seen = [], set()
        current: BaseException | None = exc
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            chain.append(current)
            current = current.__cause__ or current.__context__
        for candidate in reversed(chain):  # the original cause first
            for record in self.raised:
                if record["exception"] is candidate:
                    return record["entry"], record["stack"]
        if self.stack:  # raised while the hooks could not see the exit (should not happen)
            return self.stack[-1], [e["name"] for e in self.stack]
        return None, []

    def failure_from(self, exc: BaseException) -> dict:
        """The culprit of ``exc`` (None fields when no module was running), with its input shapes
        and dtypes, the chain of modules around it (outer to inner), and the exception."""
        culprit, stack = self.culprit(exc)
        return {
            "module": culprit["name"] if culprit else None,
            "class": type(culprit["module"]).__name__ if culprit else None,
            "class_path": _class_path(culprit["module"]) if culprit else None,
            "module_summary": _module_summary(culprit["module"]) if culprit else None,
            "inputs": culprit["inputs"] if culprit else [],
            "stack": stack,
            "error_type": type(exc).__name__,
            "error_message": str(exc)[:4000],
            "traceback": probe_core.trimmed_traceback(exc),
        }


def model_device(model):
    import torch

    for parameter in model.parameters():
        return parameter.device
    return torch.device("cpu")


def model_dtype(model) -> str | None:
    for parameter in model.parameters():
        return str(parameter.dtype).removeprefix("torch.")
    return None


def trace_forward(
    model,
    input_ids,
    attention_mask=None,
    capture: bool = True,
    synchronize=None,
    extra_inputs=None,
    within=None,
) -> ForwardTrace:
    """One forward pass of ``model`` (inputs moved to its device) with every module hooked: for
    an image-text-to-text model, with its image inputs (``extra_inputs``), so the vision tower
    and the projector run, and are traced, too.

    Never raises for the model's own exception: it is ``ForwardTrace.failure``. ``synchronize``
    (the device adapter's) runs after the pass, so an asynchronous device error surfaces here
    too. Capturing copies every module's output to the CPU, which also forces each one to be
    computed on lazy backends: pass ``capture=False`` to find where a forward raises without
    that. ``within``: a function of the tracer giving a context to hold around the pass, inside
    the inference mode (the localiser's dispatch mode, which reads the tracer's module stack)."""
    import contextlib

    import torch

    device = model_device(model)
    tracer = ModuleTracer(model, capture=capture)
    failure = None
    watch = within(tracer) if within is not None else contextlib.nullcontext()
    # the inputs made on the device inside it, as the probe's generate does
    with tracer, torch.inference_mode(), watch:
        kwargs = {
            "input_ids": input_ids.to(device),
            **probe_core.on_device(extra_inputs, device, model),
        }
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask.to(device)
        try:
            model(**kwargs)
            if synchronize:
                synchronize()
        except Exception as exc:  # noqa: BLE001 the model's failure is the finding, recorded with its module
            failure = tracer.failure_from(exc)
    return ForwardTrace(
        calls=tracer.calls,
        outputs=tracer.outputs,
        failure=failure,
        dtype=model_dtype(model),
        device=str(device),
    )
