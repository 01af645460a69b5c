"""The first wrong operator: where on the device a model's numbers go wrong, down to one aten operator.

One forward pass of the probe's prompt runs on the device under a dispatch mode (``OperatorCheck``), with the
tracer's module hooks (``tracer.ModuleTracer``: the module each operator ran in). The mode is the census's
(``probe.census``): under inference mode composite operators reach it whole (``scaled_dot_product_attention``,
``linear``) and it decomposes those the device has no kernel of its own for, as the dispatcher does for a C++
backend, so a fault inside attention is named as the ``aten::bmm`` or softmax it is. Every other operator that
touches the device is run there, then replayed on the CPU from the device's own inputs copied to the CPU (clones:
an in-place operator, a cache update, writes into the copy, never into the run's tensors), and the two outputs
are judged (``op_check.judge``: a tolerance per dtype, so bf16 rounding is not a fault). Because each replay
starts from the device's inputs, an error upstream never counts against the operators after it: the first
operator flagged is where the numbers go wrong, not where the damage shows.

``localise`` does it for one model of a sweep, on the sweep's device (the stack this environment holds, as
``model-support debug``; the sentence of ``stack.stack_difference`` when it is not the sweep's), stores the result
beside the record (``sweeps/<id>/localised/<model>.json``) and the first wrong operator's one-operator script
(``op_repro``). ``localise_forward`` is the same on a loaded model (the debug notebook's cell). Eager only:
a compiled run's operators never pass through a dispatch mode, so a compile variant is localised eagerly, and
says so.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..probe import probe_params
from ..record import store
from ..record.schema import DEFAULT_VARIANT
from . import op_check
from .compare import _json_safe
from .tracer import ROOT_LABEL, trace_forward

#: Where a sweep keeps its localised models (results, one-operator scripts, their inputs).
LOCALISED = store.LOCALISED
#: The flagged operators a result lists, the first first (the rest are counted, ``ops_wrong``).
MAX_LISTED = 20
#: The keys of ``--json``'s object (and of every stored result), the finding's first.
KEYS = ("operator", "overload", "module", "shapes", "dtypes", "max_abs_error", "max_rel_error", "repro")


@dataclass
class Localised:
    """What one checked forward found: every operator flagged (in the order they ran, the first first, with its
    encoded inputs for the repro), how many were checked, and the forward's own failure (``tracer``'s) if any."""

    checked: int = 0
    flagged: int = 0  # every operator flagged; ``wrong`` lists the first ``MAX_LISTED``
    wrong: list[dict] = field(default_factory=list)
    first_inputs: tuple | None = None  # (args, kwargs) of the first wrong operator, ``op_check.encode``d
    forward_failure: dict | None = None
    device_type: str | None = None
    seconds: float | None = None

    @property
    def first(self) -> dict | None:
        return self.wrong[0] if self.wrong else None


def OperatorCheck(device_type: str, tracer) -> Any:
    """The localiser's dispatch mode over one forward (see the module docstring): ``tracer`` is the forward's
    ``ModuleTracer``, whose stack names the module each operator runs in."""
    return _check_class()(device_type, tracer)


@functools.cache
def _check_class():
    """Made on first use, on the census's class (made on first use too: importing this imports no torch)."""
    from ..probe import census

    class _OperatorCheck(census._census_class()):
        def __init__(self, device_type: str, tracer):
            super().__init__(device_type)
            self.tracer = tracer
            self.found = Localised(device_type=device_type)

        def __enter__(self):
            super().__enter__()
            self.enter("forward")  # the census's own switch: on the dispatch stack from here
            return self

        def _module(self) -> tuple[str, str | None]:
            if not self.tracer.stack:
                return "(outside the model)", None
            top = self.tracer.stack[-1]
            return top["name"] or ROOT_LABEL, type(top["module"]).__name__

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if self._composite(func) or not self._reaches_device(args, kwargs):
                return super().__torch_dispatch__(func, types, args, kwargs)  # decomposed: its parts come back here
            name = func._schema.name
            if name in op_check.NOT_REPLAYED:
                return super().__torch_dispatch__(func, types, args, kwargs)
            writes = func._schema.is_mutable  # in place (a cache update): its inputs kept before it writes them
            encoded = op_check.encode((args, kwargs), self.device_type, copy=writes)
            out = super().__torch_dispatch__(func, types, args, kwargs)  # the census counts it, the device runs it
            self.found.checked += 1
            try:
                cpu_args, cpu_kwargs = op_check.place(encoded, fresh=writes)
                reference = func(*cpu_args, **cpu_kwargs)
            except Exception:  # noqa: BLE001 the CPU has no kernel for it (a dtype it lacks): nothing to judge by
                return out
            judged = op_check.judge(op_check.to_cpu(out), reference, name)
            if judged["wrong"]:
                # the first one's inputs for its repro: copies of its own (an input on the CPU may change later)
                kept = encoded if writes or self.found.wrong else op_check.encode((args, kwargs), self.device_type)
                self._flag(func, kept, judged)
            return out

        def _flag(self, func, encoded, judged: dict) -> None:
            self.found.flagged += 1
            if len(self.found.wrong) >= MAX_LISTED:
                return
            module, module_class = self._module()
            shapes, dtypes = op_check.describe(encoded)
            self.found.wrong.append(
                {
                    "operator": func._schema.name,
                    "overload": func._overloadname,
                    "module": module,
                    "module_class": module_class,
                    "index": self.found.checked - 1,
                    "shapes": shapes,
                    "dtypes": dtypes,
                    **{k: judged[k] for k in ("max_abs_error", "max_rel_error", "rms_rel_error", "reason")},
                }
            )
            if self.found.first_inputs is None:
                self.found.first_inputs = encoded

    return _OperatorCheck


def localise_forward(model, input_ids, attention_mask=None, extra_inputs=None, synchronize=None) -> Localised:
    """One forward of ``model`` (on its device) with every operator that reaches the device judged against the
    CPU's replay of it (see the module docstring). On the CPU there is nothing to compare: nothing is checked."""
    from .tracer import model_device

    device_type = model_device(model).type
    if device_type == "cpu":
        return Localised(device_type="cpu")
    checks: list = []

    def within(tracer):
        checks.append(OperatorCheck(device_type, tracer))
        return checks[0]

    started = time.perf_counter()
    trace = trace_forward(
        model,
        input_ids,
        attention_mask,
        capture=False,
        synchronize=synchronize,
        extra_inputs=extra_inputs,
        within=within,
    )
    found = checks[0].found
    found.forward_failure = trace.failure
    found.seconds = round(time.perf_counter() - started, 3)
    return found


def summary(found: Localised, dtype: str | None = None) -> str:
    """The finding in one sentence; never a failure that was not found."""
    first = found.first
    if found.device_type == "cpu":
        return "The model ran on the CPU: there is no device to compare with the CPU, so no operator was checked."
    raised = found.forward_failure
    tail = f"; the forward then raised {raised['error_type']} in {raised['module'] or ROOT_LABEL}" if raised else ""
    if first is None:
        return (
            f"No operator is wrong: all {found.checked} operators the forward ran on {found.device_type} agree with "
            f"the CPU's replay from the same inputs within the tolerance{' of ' + dtype if dtype else ''}{tail}."
        )
    return (
        f"The first wrong operator of {found.checked} checked is {first['operator']} ({first['overload']}) in "
        f"{first['module']}"
        + (f" ({first['module_class']})" if first["module_class"] else "")
        + f": max abs error {first['max_abs_error']:.3g}, max rel error {first['max_rel_error']:.3g} "
        f"({first['reason']}){tail}."
    )


def result_of(found: Localised, repro: str | None = None, **context) -> dict:
    """The stored (and ``--json``) object: ``KEYS`` first (all null when nothing is wrong), then the rest."""
    first = found.first or {}
    result = {key: first.get(key) for key in KEYS}
    result["repro"] = repro
    result.update(
        module_class=first.get("module_class"),
        rms_rel_error=first.get("rms_rel_error"),
        reason=first.get("reason"),
        summary=summary(found, context.get("dtype")),
        ops_checked=found.checked,
        ops_wrong=found.flagged,
        wrong_ops=[{k: w[k] for k in ("operator", "overload", "module", "max_rel_error")} for w in found.wrong],
        forward_failure=found.forward_failure,
        tolerance=op_check.tolerance_text(),
        device=found.device_type,
        seconds=found.seconds,
        **context,
    )
    return _json_safe(result)


def localised_dir(data_dir, sweep_id: str) -> Path:
    """A sweep's ``localised/`` folder."""
    return store.sweep_dir(data_dir, sweep_id) / LOCALISED


def stored(data_dir, sweep_id: str, model_id: str, variant: str | None = None) -> dict | None:
    """A model's stored localisation in a sweep (``localise``'s result), or None."""
    path = localised_dir(data_dir, sweep_id) / f"{store.stem(model_id, variant)}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _record(data_dir, sweep_id: str, model_id: str, variant: str | None) -> dict:
    path = store.find_record(data_dir, sweep_id, model_id, variant)
    if path is None:
        raise UserError(
            f"Sweep {sweep_id} has no record of {model_id}{f' in {variant}' if variant else ''}: localise reruns a "
            f"model the sweep probed; finish the sweep first (model-support sweep --resume {sweep_id})."
        )
    record = json.loads(path.read_text())
    if record.get("exclusion_reason"):
        raise UserError(
            f"{model_id} was excluded from sweep {sweep_id} ({record['exclusion_reason']}): nothing ran to localise."
        )
    return record


def localise(data_dir, sweep_id: str, model: str, variant: str | None = None) -> dict:
    """Localise MODEL (its id or a unique fragment) of a sweep on the sweep's device, on this environment's stack:
    store the result as ``sweeps/<id>/localised/<model>.json`` (and the first wrong operator's script and inputs
    beside it) and return it (``result_of``; ``stack_note`` says when this stack is not the sweep's). Bad input
    (an unknown sweep or model, a model with no record, a sweep on the CPU) is one sentence, before anything runs."""
    from .runner import debug_parameters, resolve_model
    from .stack import stack_difference

    meta = store.read_sweep(data_dir, sweep_id)
    entry = resolve_model(meta, model)
    overrides: dict = {}
    if variant:
        try:
            overrides = probe_params.parse_variant(variant)
            variant = probe_params.variant(overrides)
        except probe_params.ParameterError as exc:
            raise UserError(str(exc)) from None
    record = _record(data_dir, sweep_id, entry.model_id, variant)
    params = {**probe_params.defaults(probe_params.DEBUG_PARAMS), **debug_parameters(meta, entry, overrides)}
    device = record.get("device_type") or params.get("device") or "cpu"
    if device == "cpu":
        raise UserError(
            f"{entry.model_id} ran on the CPU in sweep {sweep_id}: the localiser compares a device's operators with "
            "the CPU's, so it needs a sweep on an accelerator."
        )
    note = stack_difference(meta, record)
    found, loaded, adapter = _run(params, device)
    folder = localised_dir(data_dir, sweep_id)
    name = store.stem(entry.model_id, variant)
    repro = None
    if found.first is not None and found.first_inputs is not None:
        from . import op_repro

        first = found.first
        settings = {
            "model_id": entry.model_id,
            "device": adapter.type,
            "device_config": adapter.configuration(shown_only=True) or None,
            **{k: first[k] for k in ("operator", "overload", "module", "shapes", "dtypes")},
        }
        args, kwargs = found.first_inputs
        repro = str(op_repro.write(folder, name, settings, args, kwargs, sweep_id))
    result = result_of(
        found,
        repro,
        sweep_id=sweep_id,
        model_id=entry.model_id,
        variant=variant or DEFAULT_VARIANT,
        status=record.get("status"),
        dtype=params.get("dtype"),
        tokens_in=loaded["tokens_in"],
        mode_note="a compiled run is localised eagerly (a dispatch mode sees eager runs only)"
        if params.get("mode") == "compile"
        else None,
        stack_note=note,
    )
    from .. import fileio

    fileio.atomic_write_json(folder / f"{name}.json", result)
    return result


def _run(params: dict, device: str):
    """Load the model as the probe does on ``device`` (this environment's stack) and localise its forward."""
    from ..probe import devices

    devices.prepare_environment(device)  # before torch: only this device's backend loads
    try:
        adapter = devices.resolve(device)
    except devices.DeviceUnavailable as exc:
        raise UserError(str(exc)) from None
    from ..probe.probe_core import VisionBackendMissing
    from .compare import load_for_debug

    try:
        loaded = load_for_debug(
            params["model_id"],
            params["revision"],
            params["dtype"],
            params["trust_remote_code"],
            adapter.torch_device,
            params["prompt"],
            params["chat_template"],
            params["task"],
            params["image_prompt"],
        )
    except VisionBackendMissing as exc:  # the environment, not the model: what to install
        raise UserError(str(exc)) from None
    found = localise_forward(
        loaded["model"], loaded["input_ids"], loaded["attention_mask"], loaded["extra_inputs"], adapter.synchronize
    )
    return found, loaded, adapter


def localised_html(found: Localised, dtype: str | None = None) -> str:
    """The finding for the debug notebook: the sentence, then every flagged operator (the first highlighted)."""
    import html

    from .. import display
    from ..display import Cell, Row

    colour = "#cf222e" if found.first else "#1a7f37"
    head = f"<p style='color:{colour}'><b>{html.escape(summary(found, dtype))}</b></p>"
    if not found.wrong:
        return head + f"<p><small>{html.escape(op_check.tolerance_text())}.</small></p>"
    columns = ("operator #", "operator", "overload", "module", "shapes", "dtypes", "max_abs_error", "max_rel_error")
    rows = (
        Row(
            [
                Cell(w["index"]),
                Cell(w["operator"], code=True),
                Cell(w["overload"]),
                Cell(w["module"], code=True),
                Cell(w["shapes"]),
                Cell(", ".join(w["dtypes"])),
                Cell(f"{w['max_abs_error']:.3g}"),
                Cell(f"{w['max_rel_error']:.3g}"),
            ],
            style="background:#ffd7d5;font-weight:bold" if w is found.first else None,
        )
        for w in found.wrong
    )
    return head + display.html_table(columns, rows) + f"<p><small>{html.escape(op_check.tolerance_text())}.</small></p>"
