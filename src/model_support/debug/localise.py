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

Every operator is judged or said not to be. A fused attention kernel the CPU has none of (CUDA's flash attention)
is replayed through the math attention (``op_check.replay``), its outputs no CPU attention makes named as not
judged; an operator the CPU cannot run at all (a kernel of the device's own, a dtype the CPU lacks) is "not
judged", with the reason, never counted as agreeing: with such operators and none wrong the finding says so, not
"all agree", and when some ran before the first wrong operator it says so first, since the numbers may have gone
wrong there.

``localise`` does it for one model of a sweep, on the sweep's device (the stack this environment holds, as
``model-support debug``; the sentence of ``stack.stack_difference`` when it is not the sweep's), proves the blame
(``prove``: the forward again with the wrong operator on the host, ``probe.host_ops``, and the next one found so,
up to ``MAX_ON_HOST``), stores the result beside the record (``sweeps/<id>/localised/<model>.json``) and the first
wrong operator's one-operator script (``op_repro``). ``localise_forward`` is the same on a loaded model (the debug
notebook's cell). Eager only: a compiled run's operators never pass through a dispatch mode, so a compile variant
is localised eagerly, and says so.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..ops import localised as localised_answers
from ..probe import host_ops, probe_params
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
#: The most operators the proof (``prove``) puts on the host at once: past them the next wrong operator is named,
#: not proven.
MAX_ON_HOST = 3


@dataclass
class Localised:
    """What one checked forward found: every operator flagged (in the order they ran, the first first, with its
    encoded inputs for the repro), how many were judged, those that could not be (``unjudged``), and the forward's
    own failure (``tracer``'s) if any."""

    checked: int = 0  # operators judged: their CPU replay compared with the device's output
    flagged: int = 0  # every operator flagged; ``wrong`` lists the first ``MAX_LISTED``
    wrong: list[dict] = field(default_factory=list)
    not_judged: int = 0  # operators the CPU could not replay; ``unjudged`` lists the first ``MAX_LISTED``
    unjudged: list[dict] = field(default_factory=list)
    # operator -> {"outputs": [...], "reason": ...}: outputs of judged operators that no CPU replay makes
    outputs_not_judged: dict[str, dict] = field(default_factory=dict)
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
            on_device = op_check.to_cpu(out)
            try:
                cpu_args, cpu_kwargs = op_check.place(encoded, fresh=writes)
                reference = op_check.replay(func, cpu_args, cpu_kwargs, on_device)
            except Exception as exc:  # noqa: BLE001 the CPU cannot run it (no kernel, a dtype it lacks): not judged
                self._not_judged(func, encoded, exc)
                return out
            self.found.checked += 1
            judged = op_check.judge(on_device, reference, name)
            if judged["not_judged"] and name not in self.found.outputs_not_judged:
                self.found.outputs_not_judged[name] = {
                    "outputs": list(judged["not_judged"]),
                    "reason": op_check.unjudged_outputs(judged["not_judged"]),
                }
            if judged["wrong"]:
                # the first one's inputs for its repro: copies of its own (an input on the CPU may change later)
                kept = encoded if writes or self.found.wrong else op_check.encode((args, kwargs), self.device_type)
                self._flag(func, kept, judged)
            return out

        def _entry(self, func) -> dict:
            """What names an operator in the finding: itself, its module, its place among the operators run."""
            module, module_class = self._module()
            return {
                "operator": func._schema.name,
                "overload": func._overloadname,
                "module": module,
                "module_class": module_class,
                "index": self.found.checked + self.found.not_judged - 1,
            }

        def _flag(self, func, encoded, judged: dict) -> None:
            self.found.flagged += 1
            if len(self.found.wrong) >= MAX_LISTED:
                return
            shapes, dtypes = op_check.describe(encoded)
            self.found.wrong.append(
                {
                    **self._entry(func),
                    "shapes": shapes,
                    "dtypes": dtypes,
                    **{k: judged[k] for k in ("max_abs_error", "max_rel_error", "rms_rel_error", "reason")},
                    "not_judged_before": self.found.not_judged,
                }
            )
            if self.found.first_inputs is None:
                self.found.first_inputs = encoded

        def _not_judged(self, func, encoded, exc: Exception) -> None:
            """An operator the CPU could not replay: listed with why, so that it never counts as agreeing."""
            self.found.not_judged += 1
            if len(self.found.unjudged) >= MAX_LISTED:
                return
            shapes, dtypes = op_check.describe(encoded)
            entry = {**self._entry(func), "shapes": shapes, "dtypes": dtypes, "reason": _cannot_run(exc)}
            self.found.unjudged.append(entry)

    return _OperatorCheck


def _cannot_run(exc: Exception) -> str:
    """Why an operator was not judged, in one clause: the CPU's error, its first sentence (a reader needs which
    kernel is missing, not torch's advice on custom builds)."""
    text = str(exc).strip()
    message = text.splitlines()[0].split(". ")[0].rstrip(".")[:160] if text else ""
    return f"the CPU cannot run it ({type(exc).__name__}{': ' + message if message else ''})"


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


def _named(entry: dict) -> str:
    """An operator of the finding as a reader finds it: ``aten::bmm (default) in model.layers.0.self_attn (...)``."""
    where = f" ({entry['module_class']})" if entry.get("module_class") else ""
    return f"{entry['operator']} ({entry['overload']}) in {entry['module']}{where}"


def _operators(count: int) -> str:
    """``1 operator``, ``2 operators``: a count in a sentence."""
    return f"{count} operator{'' if count == 1 else 's'}"


def summary(found: Localised, dtype: str | None = None) -> str:
    """The finding in a sentence or two; never a failure that was not found, and never "all agree" over operators
    that were not judged: those are said first when they ran before the first wrong one."""
    first = found.first
    if found.device_type == "cpu":
        return "The model ran on the CPU: there is no device to compare with the CPU, so no operator was checked."
    raised = found.forward_failure
    tail = f"; the forward then raised {raised['error_type']} in {raised['module'] or ROOT_LABEL}" if raised else ""
    within = f"within the tolerance{' of ' + dtype if dtype else ''}"
    outputs = _outputs_note(found)
    if first is None and not found.not_judged:
        return (
            f"No operator is wrong: all {found.checked} operators the forward ran on {found.device_type} agree with "
            f"the CPU's replay from the same inputs {within}{tail}.{outputs}"
        )
    if first is None:
        unjudged = found.unjudged[0]
        return (
            f"Not every operator was judged: {found.not_judged} of the {found.checked + found.not_judged} operators "
            f"the forward ran on {found.device_type} could not be replayed on the CPU, so nothing here says whether "
            f"they are right (the first: {_named(unjudged)}: {unjudged['reason']}); the other {found.checked} agree "
            f"with the CPU's replay from the same inputs {within}{tail}.{outputs}"
        )
    before = first.get("not_judged_before", 0)
    lead = ""
    if before:
        unjudged = found.unjudged[0]
        lead = (
            f"{_operators(before)} before the first wrong one could not be judged ({_named(unjudged)}"
            f"{' and others' if before > 1 else ''}: {unjudged['reason']}), so the numbers may already go wrong there. "
        )
    after = found.not_judged - before
    return (
        lead + f"The first wrong operator of {found.checked} checked is {_named(first)}: max abs error "
        f"{first['max_abs_error']:.3g}, max rel error {first['max_rel_error']:.3g} ({first['reason']}){tail}."
        + (f" {_operators(after)} after it could not be judged." if after else "")
        + outputs
    )


def _outputs_note(found: Localised) -> str:
    """The outputs of judged operators that were not compared, as a sentence (empty when there are none)."""
    if not found.outputs_not_judged:
        return ""
    parts = [f"{name}'s {note['reason']}" for name, note in found.outputs_not_judged.items()]
    return f" Outputs not judged: {'; '.join(parts)}."


# --- the blame proven: the forward again with the wrong operators on the host ---------------------------------


def prove(found: Localised, host_kernels: tuple[bool, str | None], rerun) -> dict | None:
    """Whether the first wrong operator of ``found`` is the whole fault: the forward again (``rerun(names)``: the
    checked forward with the operators ``names`` on the host, ``probe.host_ops.on_host``; returns its
    ``Localised`` and the host kernels' calls) with that operator on the host, so its CPU kernel runs in the device's
    place. The rerun *matches the reference* when its forward ran to its end, every operator it ran on the device
    was judged, and each agrees with the CPU's replay of it from the same inputs (``op_check``'s tolerance): the
    operator-level reference the localiser judges by, not the probe's tokens. Then the blame is confirmed. When the
    rerun finds another wrong operator, it is not enough: that one joins the others on the host and the forward
    runs again, up to ``MAX_ON_HOST`` operators on the host (the bound said when reached), so two wrong operators
    are both named. An operator that cannot go to the host (``host_ops.refusals``: a view, an operator the CPU has
    no kernel of...) or a device whose adapter takes no host kernels (``host_kernels``: its ``(False, why)``) ends
    the proof with a sentence saying so, by name and why. None when nothing is wrong.

    The proof, as stored: ``verdict`` (confirmed, bound, refused, no host kernels, not taken, not judged, raised),
    ``matches`` (the last rerun matched), ``chain`` (every wrong operator named, the first first, and the name each
    was put on the host as), ``on_host`` (the last rerun's), ``reruns`` (each one's operators on the host, counts,
    next wrong operator, failure, host calls), ``bound`` and ``sentences`` (what the command prints)."""
    if found.first is None:
        return None
    sentences: list[str] = []
    proof: dict = {"verdict": None, "matches": False, "bound": MAX_ON_HOST, "chain": [], "on_host": [], "reruns": []}
    proof["sentences"] = sentences
    entry = found.first
    able, why = host_kernels
    proof["chain"].append(_link(entry))
    if not able:
        sentences.append(
            f"not proven: the {found.device_type} device takes no host kernels ({why}), so {_op(entry)} cannot "
            "be put on the host and the forward run again without it"
        )
        return _ended(proof, "no host kernels")
    names: list[str] = []
    while True:
        name, refused = _host_name(entry)
        if name is None:
            sentences.append(
                f"not proven: {_op(entry)} cannot run on the host ({refused}), so no rerun can show the model "
                "right without it"
            )
            return _ended(proof, "refused")
        names.append(name)
        proof["chain"][-1]["on_host"] = name
        try:
            again, calls = rerun(list(names))
        except (host_ops.HostOpsRefused, RuntimeError) as exc:  # a kernel already registered for it, say
            sentences.append(f"not proven: {_listed(names)} could not be put on the host: {exc}")
            return _ended(proof, "refused")
        proof["on_host"] = list(names)
        proof["reruns"].append(_rerun_of(names, again, calls))
        hosted = f"with {_listed(names)} on the host"
        following = again.first
        if following is None:
            return _ended(proof, *_last_rerun(again, hosted, calls, sentences))
        if _host_name(following)[0] in names:  # hosted, and still wrong: the device never called the kernel
            sentences.append(
                f"not proven: {hosted} the forward still goes wrong at {_op(following)}: the "
                f"{found.device_type} device did not run its host kernel"
            )
            return _ended(proof, "not taken")
        proof["chain"].append(_link(following))
        total = again.checked + again.not_judged
        sentences.append(
            f"not enough: {hosted} the forward still diverges at operator #{following['index'] + 1} of {total}; "
            f"the next wrong operator is {_named(following)}, max rel error {following['max_rel_error']:.3g}"
        )
        if len(names) >= MAX_ON_HOST:
            sentences.append(
                f"the proof stops at its bound of {MAX_ON_HOST} operators on the host: {_op(following)} is named, "
                "not proven"
            )
            return _ended(proof, "bound")
        entry = following


def _op(entry: dict) -> str:
    """A wrong operator as the census and the plan name it: ``aten::rsqrt``, ``aten::mul.Tensor``."""
    return localised_answers.op_name(entry["operator"], entry.get("overload"))


def _listed(names: list[str]) -> str:
    """``aten::mul``, ``aten::mul and aten::silu``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _link(entry: dict) -> dict:
    """A wrong operator of the proof's chain, as stored (``on_host``: the name it went to the host as)."""
    keys = ("operator", "overload", "module", "module_class", "index", "max_rel_error")
    return {"name": _op(entry), **{key: entry.get(key) for key in keys}, "on_host": None}


def _host_name(entry: dict) -> tuple[str | None, str | None]:
    """(the name a wrong operator goes to the host as, None) or (None, why it cannot go). Its whole packet
    (``aten::mul``: a stack's kernel is rarely wrong in one form only) when the packet goes, else its own overload;
    refused when its own overload is."""
    operator, overload = entry["operator"], entry.get("overload") or localised_answers.DEFAULT_OVERLOAD
    own = f"{operator}.{overload}"
    refused = host_ops.refusals([own])
    if refused:
        return None, refused[own]
    return (own if host_ops.refusals([operator]) else operator), None


def _rerun_of(names: list[str], again: Localised, calls: dict) -> dict:
    """One rerun of the proof, as stored."""
    following = again.first
    failure = again.forward_failure
    return {
        "on_host": list(names),
        "ops_checked": again.checked,
        "ops_wrong": again.flagged,
        "ops_not_judged": again.not_judged,
        "next": {key: following.get(key) for key in ("operator", "overload", "module", "index", "max_rel_error")}
        if following
        else None,
        "forward_failure": {key: failure.get(key) for key in ("error_type", "module", "error_message")}
        if failure
        else None,
        "host_calls": dict(calls),
        "seconds": again.seconds,
    }


def _last_rerun(again: Localised, hosted: str, calls: dict, sentences: list[str]) -> tuple[str, bool]:
    """The sentence of a rerun that found no wrong operator: confirmed only when it matches the reference (see
    ``prove``); else why not. (verdict, matches)."""
    failure = again.forward_failure
    if failure:
        sentences.append(
            f"not proven: {hosted} no operator is wrong, but the forward raised {failure['error_type']} in "
            f"{failure['module'] or ROOT_LABEL}, so the model does not run to its end"
        )
        return "raised", False
    if again.not_judged:
        unjudged = again.unjudged[0]
        sentences.append(
            f"not proven: {hosted} no operator judged is wrong, but {again.not_judged} of the "
            f"{again.checked + again.not_judged} operators could not be judged (the first: {_named(unjudged)}: "
            f"{unjudged['reason']}), so the model is not shown to match the reference"
        )
        return "not judged", False
    ran = sum(calls.values())
    sentences.append(
        f"confirmed: {hosted} the model matches the reference: all {again.checked} operators its forward ran on "
        f"{again.device_type} agree with the CPU's replay from the same inputs, none unjudged, nothing raised "
        f"({ran} call{'' if ran == 1 else 's'} on the host)"
    )
    return "confirmed", True


def _ended(proof: dict, verdict: str, matches: bool = False) -> dict:
    proof.update(verdict=verdict, matches=matches)
    return proof


def proof_lines(proof: dict | None) -> list[str]:
    """The proof as the command prints it: one line a sentence, in the order they happened."""
    return [f"{sentence}." for sentence in (proof or {}).get("sentences", [])]


def answer_lines(result: dict) -> list[str]:
    """What ``model-support localise`` prints for a stored result: the stack's sentence (when this stack is not the
    sweep's), the finding, the first wrong operator's script, then the proof."""
    lines = [result["stack_note"]] if result.get("stack_note") else []
    lines.append(result["summary"])
    if result.get("repro"):
        lines.append(f"repro: python {result['repro']}  (input shapes {result['shapes']}, dtypes {result['dtypes']})")
    return lines + proof_lines(result.get("proof"))


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
        ops_not_judged=found.not_judged,
        not_judged_ops=[{k: u[k] for k in ("operator", "overload", "module", "reason")} for u in found.unjudged],
        outputs_not_judged=[{"operator": name, **note} for name, note in found.outputs_not_judged.items()],
        forward_failure=found.forward_failure,
        tolerance=op_check.tolerance_text(),
        device=found.device_type,
        seconds=found.seconds,
        **context,
    )
    return _json_safe(result)


def localised_dir(data_dir, sweep_id: str) -> Path:
    """A sweep's ``localised/`` folder."""
    return localised_answers.folder(data_dir, sweep_id)


def stored(data_dir, sweep_id: str, model_id: str, variant: str | None = None) -> dict | None:
    """A model's stored localisation in a sweep (``localise``'s result), or None. The porting plan reads the same
    answers (``ops.localised``): a wrong operator found here is a step of the sweep's plan."""
    return localised_answers.stored(data_dir, sweep_id, model_id, variant)


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


def _only_variant(data_dir, sweep_id: str, model_id: str) -> str | None:
    """The one variant ``model_id`` ran in, in a sweep that never ran it in the default one (a definition's
    ``max_new_tokens: 2`` makes ``eager+dynamic+2t``); None where it has no record; one sentence naming them when
    it ran in several, so --variant says which."""
    variants = sorted({r["variant"] for r in store.read_records(data_dir, sweep_id) if r["model_id"] == model_id})
    if len(variants) > 1:
        raise UserError(
            f"{model_id} ran in {len(variants)} variants of sweep {sweep_id}: say which with --variant "
            f"({', '.join(variants)})."
        )
    return variants[0] if variants else None


def localise(data_dir, sweep_id: str, model: str, variant: str | None = None) -> dict:
    """Localise MODEL (its id or a unique fragment) of a sweep on the sweep's device, on this environment's stack:
    prove the first wrong operator on the host (``prove``; the result's ``proof``); store the result as
    ``sweeps/<id>/localised/<model>.json`` (and the first wrong operator's script and inputs beside it) and return
    it (``result_of``; ``stack_note`` says when this stack is not the sweep's). Bad input
    (an unknown sweep or model, a model with no record, a sweep on the CPU) is one sentence, before anything runs."""
    from .runner import debug_parameters, resolve_model
    from .stack import stack_difference

    meta = store.read_sweep(data_dir, sweep_id)
    entry = resolve_model(meta, model)
    overrides: dict = {}
    if not variant and store.find_record(data_dir, sweep_id, entry.model_id, None) is None:
        variant = _only_variant(data_dir, sweep_id, entry.model_id)  # its one variant is the one meant
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
    proof = prove(found, adapter.host_kernels(), functools.partial(_rerun, loaded, adapter))
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
        proof=proof,
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


def _rerun(loaded: dict, adapter, names: list[str]) -> tuple[Localised, dict]:
    """The proof's rerun (``prove``): the checked forward of the loaded model again, ``names`` on the host."""
    model = loaded["model"]
    from .tracer import model_device

    with host_ops.on_host(model_device(model).type, names) as hosted:
        again = localise_forward(
            model, loaded["input_ids"], loaded["attention_mask"], loaded["extra_inputs"], adapter.synchronize
        )
    return again, dict(hosted.calls)


def localised_html(found: Localised, dtype: str | None = None) -> str:
    """The finding for the debug notebook: the sentence, every flagged operator (the first highlighted), then every
    operator that could not be judged, with why."""
    import html

    from .. import display
    from ..display import Cell, Row

    colour = "#cf222e" if found.first else "#9a6700" if found.not_judged else "#1a7f37"
    parts = [f"<p style='color:{colour}'><b>{html.escape(summary(found, dtype))}</b></p>"]
    columns = ("operator #", "operator", "overload", "module", "shapes", "dtypes")
    if found.wrong:
        rows = (
            Row(
                [*_cells(w), Cell(f"{w['max_abs_error']:.3g}"), Cell(f"{w['max_rel_error']:.3g}")],
                style="background:#ffd7d5;font-weight:bold" if w is found.first else None,
            )
            for w in found.wrong
        )
        parts.append(display.html_table((*columns, "max_abs_error", "max_rel_error"), rows))
    if found.unjudged:
        parts.append(f"<p>Not judged ({found.not_judged}): the CPU could not replay these.</p>")
        rows = (Row([*_cells(u), Cell(u["reason"])]) for u in found.unjudged)
        parts.append(display.html_table((*columns, "why"), rows))
    parts.append(f"<p><small>{html.escape(op_check.tolerance_text())}.</small></p>")
    return "".join(parts)


def _cells(entry: dict) -> list:
    """The cells that name an operator of the finding in the notebook's tables (``columns`` of ``localised_html``)."""
    from ..display import Cell

    return [
        Cell(entry["index"]),
        Cell(entry["operator"], code=True),
        Cell(entry["overload"]),
        Cell(entry["module"], code=True),
        Cell(entry["shapes"]),
        Cell(", ".join(entry["dtypes"])),
    ]
