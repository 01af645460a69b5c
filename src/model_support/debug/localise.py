"""The first wrong operator: where on the device a model's numbers go wrong, down to one aten operator.

The run is replayed on the device under a dispatch mode (``OperatorCheck``), with the tracer's module hooks
(``tracer.ModuleTracer``: the module each operator ran in): the probe's prompt, then the run's own generated tokens fed
back one decode step at a time through the KV cache (``Replay``: ``model.generate`` as the probe calls it, each step's
token forced to the one the record holds, teacher forcing with the device's tokens as the reference check does), so
every step's forward is the one the run computed, and a fault that starts at a position (a kernel wrong from 29 key
positions on, a cache that goes wrong as it grows) is met where the run met it. The prompt's forward alone is not the
run: a stack can be right over 26 positions and wrong over 29. The replay reaches at least the step where the record
says the run diverged from the CPU reference (``numerics_step`` / ``first_divergence``, or a long-text check's first
disagreement where the record has one) and stops after the first step with a wrong operator; with none wrong it
runs every step the verdict judged, and a divergence it cannot reach is said, never passed over.

The mode is the census's (``probe.census``): under inference mode composite operators reach it whole
(``scaled_dot_product_attention``, ``linear``) and it decomposes those the device has no kernel of its own for, as the
dispatcher does for a C++ backend, so a fault inside attention is named as the ``aten::bmm`` or softmax it is. Every
other operator that touches the device is run there, then replayed on the CPU from the device's own inputs copied to
the CPU (clones: an in-place operator, a cache update, writes into the copy, never into the run's tensors), and the two
outputs are judged (``op_check.judge``: a tolerance per dtype, so bf16 rounding is not a fault). Because each replay
starts from the device's inputs, an error upstream never counts against the operators after it: the first operator
flagged is where the numbers go wrong, not where the damage shows. Each is named with the step it ran in.

Every operator is judged or said not to be. A fused attention kernel the CPU has none of (CUDA's flash attention)
is replayed through the math attention (``op_check.replay``), its outputs no CPU attention makes named as not
judged; an operator the CPU cannot run at all (a kernel of the device's own, a dtype the CPU lacks) is "not
judged", with the reason, never counted as agreeing: with such operators and none wrong the finding says so, not
"all agree", and when some ran before the first wrong operator it says so first, since the numbers may have gone
wrong there.

``localise`` does it for one model of a sweep, on the sweep's device (the stack this environment holds, as
``model-support debug``; the sentence of ``stack.stack_difference`` when it is not the sweep's), proves the blame
(``prove``: the run replayed again with the wrong operators on the host, ``probe.host_ops``, the next one found so
joining them, up to ``MAX_ON_HOST``; the last rerun judged by ``ops.proof.rerun_wrong``, the judgement ``ops --prove``
gives a what-if run, so the two cannot contradict each other), stores the result beside the record
(``sweeps/<id>/localised/<model>.json``) and the first wrong operator's one-operator script (``op_repro``).
``localise_forward`` checks one forward of a loaded model (the debug notebook's cell). Eager only: a compiled run's
operators never pass through a dispatch mode, so a compile variant is localised eagerly, and says so.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..ops import localised as localised_answers
from ..ops import proof as proof_judgement
from ..probe import host_ops, probe_params
from ..record import store
from ..record.schema import DEFAULT_VARIANT
from . import op_check
from .compare import _json_safe
from .tracer import ROOT_LABEL, ModuleTracer, model_device, trace_forward

#: Where a sweep keeps its localised models (results, one-operator scripts, their inputs).
LOCALISED = store.LOCALISED
#: The flagged operators a result lists, the first first (the rest are counted, ``ops_wrong``).
MAX_LISTED = 20
#: The keys of ``--json``'s object (and of every stored result), the finding's first.
KEYS = ("operator", "overload", "module", "shapes", "dtypes", "max_abs_error", "max_rel_error", "repro")
#: The most operators the proof (``prove``) puts on the host at once: past them the next wrong operator is named,
#: not proven.
MAX_ON_HOST = 3
#: The record's columns that say where a long-text check (``probe.long_text``, where the record has one) went wrong,
#: each a position of its text, in the order the localiser chases them: its decode path diverging (replayed through
#: the KV cache), its one prefill diverging (replayed as one forward over the text up to there), its first flip.
LONG_TEXT_COLUMNS = {
    "long_text_decode_diverges_at": ("decode", "the long-text check's decode path diverged from the CPU reference"),
    "long_text_prefill_diverges_at": ("prefill", "the long-text check's prefill diverged from the CPU reference"),
    "long_text_first_disagreement": ("decode", "the long-text check first chose another token than the CPU"),
}
#: A long text's decode steps checked, up to the one where it diverged (the steps before run unchecked: hundreds of
#: them, each a whole forward replayed on the CPU, would cost minutes for what the step that diverged shows).
LONG_TEXT_CHECKED = 4


@dataclass
class Replay:
    """What the localiser runs on the device (see the module docstring): a prompt (``prompt_ids``; None: the probe's),
    then ``tokens`` forced one decode step at a time through the KV cache (step ``s``'s forward is the one that
    answered with token ``s``: the record's ``output_token_ids``, or a long text's next tokens); none: the prompt's
    forward and the one token it gives. ``diverged_at``: the step where the record says it first went wrong, and
    ``how`` (in words); ``unreached``: a divergence this replay cannot reach, in words (a long-text position when the
    verdict's own generation is the one chased), which keeps any proof from saying the model matches; ``check_from``:
    the steps before it run unchecked (a long text's, filling the cache); ``what``: what is replayed, in words, and
    ``unit``: what its steps are called (a long text's are its positions)."""

    tokens: list[int] = field(default_factory=list)
    diverged_at: int | None = None
    how: str | None = None
    unreached: str | None = None
    prompt_ids: list[int] | None = None
    check_from: int = 0
    what: str = "the run"
    unit: str = "step"

    @property
    def steps(self) -> int:
        """The forwards the whole replay runs: one per forced token (the last one's answer needs no forward)."""
        return max(len(self.tokens), 1)

    def as_json(self) -> dict:
        return {
            "what": self.what,
            "tokens": len(self.tokens),
            "steps": self.steps,
            "prompt_tokens": len(self.prompt_ids) if self.prompt_ids is not None else None,
            "check_from": self.check_from,
            "diverged_at": self.diverged_at,
            "how": self.how,
            "unreached": self.unreached,
        }


def replay_of(record: dict, tokenizer=None, positions: int | None = None) -> Replay:
    """The replay a record asks for. Its verdict's generation (its generated tokens) when its numerics diverge (at
    ``numerics_step``), or when nothing else went wrong (at its first flip, ``first_divergence``, if any); else a
    long-text check's divergence (``LONG_TEXT_COLUMNS``): the text's ids (``long_text.token_ids``, ``tokenizer``'s,
    at most ``positions``) through the KV cache to that position, or as one prefill up to it. A long-text divergence
    the replay does not chase, or cannot (no tokenizer, no long-text module here), is ``unreached``."""
    tokens = [int(t) for t in record.get("output_token_ids") or []]
    replay = Replay(tokens=tokens)
    if record.get("numerics") == "diverges" and record.get("numerics_step") is not None:
        replay.diverged_at, replay.how = int(record["numerics_step"]), "the run diverged from the CPU reference"
    elif record.get("first_divergence") is not None:
        replay.diverged_at, replay.how = (
            int(record["first_divergence"]),
            "the run first chose another token than the CPU",
        )
    long = next(((record[c], *LONG_TEXT_COLUMNS[c]) for c in LONG_TEXT_COLUMNS if record.get(c) is not None), None)
    if long is None:
        return replay
    position, path, how = int(long[0]), long[1], long[2]
    unreached = (
        f"{how} at position {position} of its text, which this replay of the verdict's generation does not reach"
    )
    if record.get("numerics") == "diverges":
        replay.unreached = unreached  # the probe's own run first: its proof then says the long text is not reached
        return replay
    ids = _long_text_ids(record, tokenizer, positions)
    if ids is None or len(ids) < position + 1:
        replay.unreached = unreached + (" (the long text's ids are not to be had here)" if ids is None else "")
        return replay
    if path == "prefill":  # one forward over the text up to that position: its last row is the one that diverged
        return Replay(
            prompt_ids=ids[: position + 1],
            diverged_at=0,
            how=f"{how} (at position {position})",
            what=f"the long text's prefill up to position {position}",
        )
    # the forwards at positions 0..p take ids 0..p; the answer forced at p is the next id (any, past the text's end)
    return Replay(
        prompt_ids=ids[:1],
        tokens=[*ids[1 : position + 1], ids[min(position + 1, len(ids) - 1)]],
        diverged_at=position,
        how=how,
        check_from=max(0, position + 1 - LONG_TEXT_CHECKED),
        what="the long text's decode path",
        unit="position",
    )


def _long_text_ids(record: dict, tokenizer, positions: int | None) -> list[int] | None:
    """The ids the long-text check fed (``probe.long_text.token_ids``), or None where this environment has no
    long-text module or no tokenizer is at hand."""
    if tokenizer is None:
        return None
    try:
        from ..probe import long_text
    except ImportError:
        return None
    token_ids = getattr(long_text, "token_ids", None)
    if token_ids is None:
        return None
    default: int = getattr(long_text, "DEFAULT_TOKENS", 1024)
    asked = int(record.get("long_text_tokens") or default)
    return list(token_ids(tokenizer, asked, positions))


@dataclass
class Localised:
    """What one checked run found: every operator flagged (in the order they ran, the first first, with the step it
    ran in and its encoded inputs for the repro), how many were judged, those that could not be (``unjudged``), the
    run's own failure (``tracer``'s) if any, how far the replay went (``steps_run`` of ``replay.steps``; ``replay``
    None: one forward, ``localise_forward``), and its output judged against the CPU reference (``numerics``:
    ``agreement.compare``'s keys; None with ``numerics_why``)."""

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
    replay: Replay | None = None
    steps_run: int = 1  # the forwards run (the prompt's, then one per decode step)
    tokens_in: int | None = None
    numerics: dict | None = None
    numerics_why: str | None = None
    scores: list = field(default_factory=list, repr=False)  # the device's ``top_scores`` per step run

    @property
    def first(self) -> dict | None:
        return self.wrong[0] if self.wrong else None

    @property
    def whole(self) -> bool:
        """The replay ran every step it was asked to (it did not stop at a wrong one, nothing raised)."""
        return self.replay is None or (self.steps_run >= self.replay.steps and self.forward_failure is None)


def OperatorCheck(device_type: str, tracer) -> Any:
    """The localiser's dispatch mode over one forward, or a replayed run (see the module docstring): ``tracer`` is
    its ``ModuleTracer``, whose stack names the module each operator runs in and whose root calls count the steps."""
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
            self.hushed = 0
            self.check_from = 0  # the steps before it run unchecked (``Replay.check_from``)
            self.replaying = False  # a replayed run (``localise_run``): each operator named with its step
            self.step_starts: dict[int, int] = {}  # step -> the index of its first operator

        def __enter__(self):
            super().__enter__()
            self.enter("forward")  # the census's own switch: on the dispatch stack from here
            return self

        @contextlib.contextmanager
        def quiet(self):
            """The localiser's own operators on the device (forcing a token, the stop flag): run, never judged."""
            self.hushed += 1
            try:
                yield
            finally:
                self.hushed -= 1

        def _module(self) -> tuple[str, str | None]:
            if not self.tracer.stack:
                return "(outside the model)", None
            top = self.tracer.stack[-1]
            return top["name"] or ROOT_LABEL, type(top["module"]).__name__

        def current_step(self) -> int:
            """The step an operator runs in: the forwards begun before it, less one (the generation's own operators
            after a forward are that step's; those before the first, the prompt's)."""
            return max(self.tracer.root_calls - 1, 0)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if self.hushed or (self.check_from and self.current_step() < self.check_from):
                return func(*args, **kwargs)
            if self._composite(func) or not self._reaches_device(args, kwargs):
                return super().__torch_dispatch__(func, types, args, kwargs)  # decomposed: its parts come back here
            name = func._schema.name
            if name in op_check.NOT_REPLAYED:
                return super().__torch_dispatch__(func, types, args, kwargs)
            self.step_starts.setdefault(self.current_step(), self.found.checked + self.found.not_judged)
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
            """What names an operator in the finding: itself, its module, its place among the operators run (in
            the whole run, ``index``, and in its step's forward, ``step_index``), its step."""
            module, module_class = self._module()
            index = self.found.checked + self.found.not_judged - 1
            entry = {
                "operator": func._schema.name,
                "overload": func._overloadname,
                "module": module,
                "module_class": module_class,
                "index": index,
            }
            if self.replaying:
                step = self.current_step()
                entry.update(step=step, step_index=index - self.step_starts.get(step, 0))
            return entry

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
    CPU's replay of it (see the module docstring): the debug notebook's cell, which has no run to replay (``localise``
    replays the run, ``localise_run``). On the CPU there is nothing to compare: nothing is checked."""
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
    found.tokens_in = int(input_ids.shape[1])
    found.seconds = round(time.perf_counter() - started, 3)
    return found


def localise_run(
    model,
    tokenizer,
    input_ids,
    attention_mask=None,
    extra_inputs=None,
    synchronize=None,
    *,
    replay: Replay,
    cache: str = "dynamic",
    until_wrong: bool = True,
) -> Localised:
    """The run replayed on ``model``'s device (``Replay``, the module docstring) with every operator judged: greedy
    ``model.generate`` as the probe calls it (``probe_core.generate``: its cache, its pad token, the image inputs),
    each step's token forced to the recorded one by a logits processor (its own operators, and the stop flag's, run
    unjudged: ``quiet``), so the KV cache holds what the run's did. ``until_wrong``: stop after the first step with
    a wrong operator (the finding needs no more, nor does a rerun that names the next one); a replay with none runs
    every step. The device's best logits per step run (``probe_core.top_scores``, as the probe keeps them) are in
    ``scores``, for the reference check (``_Reference``)."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

    from ..probe import probe_core

    device = model_device(model)
    if device.type == "cpu":
        return Localised(device_type="cpu", replay=replay)
    if replay.prompt_ids is not None:  # a long text's: its own ids, no image, no padding
        input_ids = torch.tensor([replay.prompt_ids])
        attention_mask, extra_inputs = torch.ones_like(input_ids), None
    tracer = ModuleTracer(model, capture=False)
    check = OperatorCheck(device.type, tracer)
    check.check_from, check.replaying = replay.check_from, True
    prompt = int(input_ids.shape[1])
    forced = list(replay.tokens)

    class Forced(LogitsProcessor):
        def __call__(self, ids, scores):
            step = ids.shape[1] - prompt
            if step >= len(forced):  # none recorded: the device's own choice
                return scores
            with check.quiet():
                chosen = torch.full_like(scores, float("-inf"))
                chosen[:, forced[step]] = 0.0
            return chosen

    class Stop(StoppingCriteria):
        def __call__(self, ids, scores, **kwargs):
            stop = until_wrong and check.found.flagged > 0
            with check.quiet():
                return torch.full((ids.shape[0],), stop, dtype=torch.bool, device=ids.device)

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    settings = {"cache_implementation": "static"} if cache == "static" else {}
    started = time.perf_counter()
    output, failure = None, None
    with tracer, torch.inference_mode(), check:  # the inputs made on the device inside it, as the probe's generate does
        try:
            output = model.generate(
                input_ids=input_ids.to(device),
                attention_mask=(torch.ones_like(input_ids) if attention_mask is None else attention_mask).to(device),
                max_new_tokens=replay.steps,
                do_sample=False,
                pad_token_id=pad,
                output_logits=True,
                return_dict_in_generate=True,
                logits_processor=LogitsProcessorList([Forced()]),
                stopping_criteria=StoppingCriteriaList([Stop()]),
                **probe_core.on_device(extra_inputs, device, model),
                **settings,
            )
            if synchronize:
                synchronize()
        except Exception as exc:  # noqa: BLE001 the model's failure is the finding, recorded with its module
            failure = tracer.failure_from(exc)
    found = check.found
    found.replay, found.forward_failure, found.tokens_in = replay, failure, prompt
    found.steps_run = max(tracer.root_calls, 1)
    if output is not None:
        found.scores = [probe_core.top_scores(step[0]) for step in output.logits]
    found.seconds = round(time.perf_counter() - started, 3)
    return found


class _Reference:
    """The CPU reference's logits over the replay's tokens (``agreement.teacher_forced_logits``, in the dtype the probe's
    check uses), made once, on first need, for every run of one ``localise``: a run's output is judged as the probe
    judges its verdict, over the steps it ran (``agreement.compare`` called as ``reproduce.reference_check`` calls
    it, with the sweep's margin and bound; that function loads and runs the reference at each call, where one
    ``localise`` judges up to ``MAX_ON_HOST`` + 1 runs against the same logits, and it teacher-forces the probe's
    prompt, where a long text's replay has its own ids)."""

    def __init__(self, params: dict, loaded: dict, device_type: str, replay: Replay):
        self.params, self.loaded, self.device_type, self.replay = params, loaded, device_type, replay
        self._logits = None
        self._failed: str | None = None

    def logits(self):
        if self._logits is None and self._failed is None:
            from ..probe import agreement
            from .compare import load_reference

            try:
                model = load_reference(
                    self.params["model_id"],
                    self.params["revision"],
                    agreement.reference_dtype(self.device_type, self.params["dtype"]),
                    self.params["trust_remote_code"],
                    self.params["task"],
                )
                own = self.replay.prompt_ids is None
                prompt = self.loaded["input_ids"][0].tolist() if own else self.replay.prompt_ids
                tokens = self.replay.tokens or [0]  # none recorded: the prompt's row alone (the last token never fed)
                extra = self.loaded["extra_inputs"] if own else None
                self._logits = agreement.teacher_forced_logits(model, prompt, tokens, extra)
            except Exception as exc:  # noqa: BLE001 the reference's failure is said, never a verdict
                message = (str(exc).strip().splitlines() or [""])[0][:160]
                self._failed = f"the CPU reference could not run ({type(exc).__name__}: {message})"
        return self._logits

    def judge(self, found: Localised) -> None:
        """``found.numerics`` (``agreement.RECORD_KEYS``) where the run ran every step, else ``numerics_why``."""
        if not found.whole or not found.scores:
            found.numerics_why = "the replay did not run every step"
            return
        logits = self.logits()
        if logits is None:
            found.numerics_why = self._failed
            return
        from ..probe import agreement

        tokenizer = self.loaded.get("tokenizer")
        judged = agreement.compare(
            found.scores,
            logits[: len(found.scores)],
            margin=float(self.params.get("numerics_margin") or agreement.DEFAULT_MARGIN),
            bound=float(self.params.get("numerics_bound") or agreement.DEFAULT_BOUND),
            decode=getattr(tokenizer, "decode", None),
            dtype=self.params.get("dtype"),
        )
        found.numerics = {key: judged.get(key) for key in agreement.RECORD_KEYS}


def _named(entry: dict) -> str:
    """An operator of the finding as a reader finds it: ``aten::bmm (default) in model.layers.0.self_attn (...)``."""
    where = f" ({entry['module_class']})" if entry.get("module_class") else ""
    return f"{entry['operator']} ({entry['overload']}) in {entry['module']}{where}"


def _operators(count: int) -> str:
    """``1 operator``, ``2 operators``: a count in a sentence."""
    return f"{count} operator{'' if count == 1 else 's'}"


def _scope(found: Localised) -> str:
    """What ran, as the subject of "ran on the device": ``the forward`` (``localise_forward``), ``the prompt's forward``,
    ``the run's 4 forwards (the prompt's, then 3 decode steps through the KV cache; steps 0-3 of its 8)``, ``the long
    text's 40 decode steps through the KV cache (positions 36-39 checked; the 36 before ran unchecked, ...)``."""
    replay = found.replay
    if replay is None:
        return "the forward"
    n, total, unit = found.steps_run, replay.steps, replay.unit
    if replay.prompt_ids is not None and not replay.tokens:
        return f"the forward over the long text's first {len(replay.prompt_ids)} positions"
    if replay.prompt_ids is not None:
        c = min(replay.check_from, n)
        checked = (
            f"{unit}s {c}-{n - 1} checked; the {c} before ran unchecked, filling the cache as the check's did"
            if c
            else "every one checked"
        )
        return f"{n} decode steps of {replay.what} through the KV cache ({checked})"
    of = f"{unit} 0 of the run's {total}" if n == 1 else f"{unit}s 0-{n - 1} of its {total}"
    if n == 1:
        return f"the prompt's forward{f' ({of})' if total > 1 else ''}"
    decode = f"{n - 1} decode step{'' if n == 2 else 's'} through the KV cache"
    return f"the run's {n} forwards (the prompt's, then {decode}{'; ' + of if n < total else ''})"


def _at(entry: dict, found: Localised) -> str:
    """Where in the run an operator ran: `` at step 3 (a decode step over 29 positions; the run diverged from the
    CPU reference there)``; empty for one forward (``localise_forward``)."""
    replay = found.replay
    if replay is None or entry.get("step") is None:
        return ""
    step, unit = entry["step"], replay.unit
    if step:
        what = "a decode step"
    else:
        what = "the prompt's forward" if replay.prompt_ids is None else "the forward over the text"
    positions = f" over {found.tokens_in + step} positions" if found.tokens_in else ""
    there = ""
    if replay.diverged_at is not None:
        there = f"; {replay.how} {'there' if replay.diverged_at == step else f'at {unit} {replay.diverged_at}'}"
    return f" at {unit} {step} ({what}{positions}{there})"


def _reached(found: Localised) -> str:
    """For a replay with no wrong operator: whether it reached the step where the run went wrong, and what it could
    not reach ("" for none, or one forward)."""
    replay = found.replay
    if replay is None:
        return ""
    said = ""
    if replay.diverged_at is not None:
        last, unit = found.steps_run - 1, replay.unit
        reach = (
            "which the replay reached"
            if last >= replay.diverged_at
            else f"which the replay did not reach (it stopped at {unit} {last})"
        )
        how = replay.how or "the run went wrong"
        said = f" {how[0].upper()}{how[1:]} at {unit} {replay.diverged_at}, {reach}."
    if replay.unreached:
        said += f" Not reached: {replay.unreached}."
    return said


def _output(found: Localised) -> str:
    """The replayed run's output against the CPU reference, as a sentence ("" where it was not judged)."""
    numerics = found.numerics
    if not numerics or not numerics.get("numerics"):
        return ""
    verdict = numerics["numerics"]
    note = f" ({numerics['numerics_note']})" if numerics.get("numerics_note") else ""
    if verdict == "match":
        return f" Replayed so, its output agrees with the CPU reference at every step (numerics {verdict})."
    return f" Replayed so, its output does not agree with the CPU reference all the same: numerics {verdict}{note}."


def summary(found: Localised, dtype: str | None = None) -> str:
    """The finding in a sentence or two: the first wrong operator and the step it ran in, or what the replay ran and
    how far it reached; never a failure that was not found, and never "all agree" over operators that were not
    judged: those are said first when they ran before the first wrong one."""
    first = found.first
    if found.device_type == "cpu":
        return "The model ran on the CPU: there is no device to compare with the CPU, so no operator was checked."
    raised = found.forward_failure
    tail = f"; the forward then raised {raised['error_type']} in {raised['module'] or ROOT_LABEL}" if raised else ""
    within = f"within the tolerance{' of ' + dtype if dtype else ''}"
    outputs = _outputs_note(found)
    scope = _scope(found)
    if first is None and not found.not_judged:
        return (
            f"No operator is wrong: all {found.checked} operators {scope} ran on {found.device_type} agree with "
            f"the CPU's replay from the same inputs {within}{tail}.{outputs}{_reached(found)}{_output(found)}"
        )
    if first is None:
        unjudged = found.unjudged[0]
        return (
            f"Not every operator was judged: {found.not_judged} of the {found.checked + found.not_judged} operators "
            f"{scope} ran on {found.device_type} could not be replayed on the CPU, so nothing here says whether "
            f"they are right (the first: {_named(unjudged)}: {unjudged['reason']}); the other {found.checked} agree "
            f"with the CPU's replay from the same inputs {within}{tail}.{outputs}{_reached(found)}{_output(found)}"
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
    ran = "" if found.replay is None else f" Checked: {scope}."
    return (
        lead
        + f"The first wrong operator of {found.checked} checked is {_named(first)}{',' if found.replay else ''}{_at(first, found)}: max abs "
        f"error {first['max_abs_error']:.3g}, max rel error {first['max_rel_error']:.3g} ({first['reason']}){tail}."
        + (f" {_operators(after)} after it could not be judged." if after else "")
        + ran
        + outputs
    )


def _outputs_note(found: Localised) -> str:
    """The outputs of judged operators that were not compared, as a sentence (empty when there are none)."""
    if not found.outputs_not_judged:
        return ""
    parts = [f"{name}'s {note['reason']}" for name, note in found.outputs_not_judged.items()]
    return f" Outputs not judged: {'; '.join(parts)}."


# --- the blame proven: the run again with the wrong operators on the host --------------------------------------


def prove(found: Localised, host_kernels: tuple[bool, str | None], rerun) -> dict | None:
    """Whether the first wrong operator of ``found`` is the whole fault: the run again (``rerun(names)``: the checked
    replay with the operators ``names`` on the host, ``probe.host_ops.on_host``; returns its ``Localised``, its output
    judged against the CPU reference where no operator is wrong, and the host kernels' calls) with that operator on
    the host, so its CPU kernel runs in the device's place. When the rerun finds another wrong operator, it is not
    enough: that one joins the others on the host and the run replays again, up to ``MAX_ON_HOST`` operators on the
    host (the bound said when reached), so a chain of wrong operators (silu wrong in the MLP, a softmax wrong from
    38 key positions on) is named whole, each where it first goes wrong. A rerun with none wrong is judged as
    ``ops --prove`` judges a what-if run (``ops.proof.rerun_wrong``: it ran to its end and its output matches the
    CPU reference, over every step of the run), so the two never contradict each other: confirmed, for the whole
    chain at once; else "not confirmed" with why. A divergence the replay cannot reach (``Replay.unreached``) is never
    confirmed. An operator that cannot go to the host (``host_ops.refusals``: a view, an operator the CPU has no
    kernel of...) or a device whose adapter takes no host kernels (``host_kernels``: its ``(False, why)``) ends the
    proof with a sentence saying so, by name and why. None when nothing is wrong.

    The proof, as stored: ``verdict`` (confirmed, not confirmed, not reached, bound, refused, no host kernels, not
    taken, raised), ``matches`` (the last rerun matched), ``chain`` (every wrong operator named, the first first, the
    step it went wrong at and the name each was put on the host as), ``on_host`` (the last rerun's), ``reruns`` (each
    one's operators on the host, counts, steps run, next wrong operator, numerics, failure, host calls), ``bound`` and
    ``sentences`` (what the command prints)."""
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
            "be put on the host and the run replayed without it"
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
                f"not proven: {hosted} the run still goes wrong at {_op(following)}: the "
                f"{found.device_type} device did not run its host kernel"
            )
            return _ended(proof, "not taken")
        proof["chain"].append(_link(following))
        sentences.append(
            f"not enough: {hosted} {_still(following, again)}; the next wrong operator is {_named(following)}, max "
            f"rel error {following['max_rel_error']:.3g}"
        )
        if len(names) >= MAX_ON_HOST:
            sentences.append(
                f"the proof stops at its bound of {MAX_ON_HOST} operators on the host: {_op(following)} is named, "
                "not proven"
            )
            return _ended(proof, "bound")
        entry = following


def _still(entry: dict, again: Localised) -> str:
    """Where a rerun still goes wrong: ``the forward still diverges at operator #125 of 263`` (one forward), ``the
    run still goes wrong at step 3 (a decode step over 38 positions), operator #40 of that step's forward``."""
    if again.replay is None or entry.get("step") is None:
        return f"the forward still diverges at operator #{entry['index'] + 1} of {again.checked + again.not_judged}"
    return (
        f"the run still goes wrong{_at(entry, again)}, at operator #{entry.get('step_index', entry['index']) + 1} of "
        "that step's forward"
    )


def _op(entry: dict) -> str:
    """A wrong operator as the census and the plan name it: ``aten::rsqrt``, ``aten::mul.Tensor``."""
    return localised_answers.op_name(entry["operator"], entry.get("overload"))


def _listed(names: list[str]) -> str:
    """``aten::mul``, ``aten::mul and aten::silu``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _link(entry: dict) -> dict:
    """A wrong operator of the proof's chain, as stored (``on_host``: the name it went to the host as)."""
    keys = ("operator", "overload", "module", "module_class", "index", "step", "max_rel_error")
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
    keys = ("operator", "overload", "module", "index", "step", "max_rel_error")
    return {
        "on_host": list(names),
        "ops_checked": again.checked,
        "ops_wrong": again.flagged,
        "ops_not_judged": again.not_judged,
        "steps_run": again.steps_run,
        "next": {key: following.get(key) for key in keys} if following else None,
        "numerics": (again.numerics or {}).get("numerics"),
        "numerics_note": (again.numerics or {}).get("numerics_note") or again.numerics_why,
        "forward_failure": {key: failure.get(key) for key in ("error_type", "module", "error_message")}
        if failure
        else None,
        "host_calls": dict(calls),
        "seconds": again.seconds,
    }


def _steps(found: Localised) -> str:
    """The steps a rerun's output was judged over: ``at each of the 8 steps of the run``, ``at the run's one step``,
    ``at each of the 40 positions of the long text's decode path``."""
    n = len(found.scores) or found.steps_run
    replay = found.replay or Replay()
    return f"at {replay.what}'s one {replay.unit}" if n == 1 else f"at each of the {n} {replay.unit}s of {replay.what}"


def _last_rerun(again: Localised, hosted: str, calls: dict, sentences: list[str]) -> tuple[str, bool]:
    """The sentence of a rerun that found no wrong operator, and (verdict, matches). Raised: the run did not reach
    its end. Else the one judgement ``ops --prove`` gives a what-if run (``ops.proof.rerun_wrong``): confirmed when
    its output matches the CPU reference over every step it ran (and the replay reached every divergence the record
    names); operators that could not be judged are said, not counted as agreeing."""
    failure = again.forward_failure
    if failure:
        sentences.append(
            f"not proven: {hosted} no operator is wrong, but the run raised {failure['error_type']} in "
            f"{failure['module'] or ROOT_LABEL}, so the model does not run to its end"
        )
        return "raised", False
    numerics = again.numerics or {}
    judged = f"{again.checked} operators judged" if again.not_judged else f"all {again.checked} operators"
    unjudged = ""
    if again.not_judged:
        first = again.unjudged[0]
        unjudged = (
            f"; {again.not_judged} of the {again.checked + again.not_judged} operators could not be judged (the "
            f"first: {_named(first)}: {first['reason']})"
        )
    why = proof_judgement.rerun_wrong(True, numerics.get("numerics"))
    if why is not None:
        detail = numerics.get("numerics_note") or again.numerics_why
        sentences.append(
            f"not confirmed: {hosted} no operator judged is wrong, but {why}{f' ({detail})' if detail else ''}"
            f"{unjudged}"
        )
        return "not confirmed", False
    unreached = again.replay.unreached if again.replay is not None else None
    if unreached:
        sentences.append(f"not proven: {hosted} the replayed run matches the reference, but {unreached}{unjudged}")
        return "not reached", False
    ran = sum(calls.values())
    replay, n = again.replay, again.steps_run
    scope = "it ran"
    if replay is not None and replay.check_from:
        c = min(replay.check_from, n)
        scope = f"its {replay.unit}s {c}-{n - 1} ran (the {c} before ran unchecked)"
    sentences.append(
        f"confirmed: {hosted} the model matches the reference: its output agrees with the CPU reference "
        f"{_steps(again)} (numerics {numerics.get('numerics')}), {judged} {scope} on {again.device_type} agree with "
        f"the CPU's replay from the same inputs{unjudged}, nothing raised ({ran} call{'' if ran == 1 else 's'} on the "
        "host)"
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
    """The stored (and ``--json``) object: ``KEYS`` first (all null when nothing is wrong), then the rest: the first
    wrong operator's ``step``, what was replayed (``replay``: tokens, steps, where the run diverged, what it could not
    reach; ``steps_run``) and, where no operator is wrong, the replayed output against the CPU reference
    (``numerics``)."""
    first = found.first or {}
    result = {key: first.get(key) for key in KEYS}
    result["repro"] = repro
    listed = ("operator", "overload", "module", "step", "max_rel_error")
    result.update(
        module_class=first.get("module_class"),
        step=first.get("step"),
        rms_rel_error=first.get("rms_rel_error"),
        reason=first.get("reason"),
        summary=summary(found, context.get("dtype")),
        ops_checked=found.checked,
        ops_wrong=found.flagged,
        wrong_ops=[{k: w.get(k) for k in listed} for w in found.wrong],
        ops_not_judged=found.not_judged,
        not_judged_ops=[
            {k: u.get(k) for k in ("operator", "overload", "module", "step", "reason")} for u in found.unjudged
        ],
        outputs_not_judged=[{"operator": name, **note} for name, note in found.outputs_not_judged.items()],
        forward_failure=found.forward_failure,
        replay=found.replay.as_json() if found.replay is not None else None,
        steps_run=found.steps_run,
        numerics=(found.numerics or {}).get("numerics"),
        numerics_note=(found.numerics or {}).get("numerics_note") or found.numerics_why,
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
    replay its run (``replay_of`` its record: the prompt, then its generated tokens through the KV cache, to where it
    diverged and on), prove the first wrong operator on the host (``prove``; the result's ``proof``); store the result as
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
    loaded, adapter = _load(params, device)
    from ..probe.probe_core import positions_of

    replay = replay_of(record, loaded["tokenizer"], positions_of(loaded["model"]))
    found = _replayed(loaded, adapter, params, replay)
    reference = _Reference(params, loaded, found.device_type or device, replay)
    if found.first is None and found.device_type != "cpu":
        reference.judge(found)  # nothing wrong: does the replayed output agree with the CPU reference?
    proof = prove(found, adapter.host_kernels(), functools.partial(_rerun, loaded, adapter, params, reference))
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


def _load(params: dict, device: str):
    """Load the model as the probe does on ``device`` (this environment's stack): (``load_for_debug``'s, the adapter)."""
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
    return loaded, adapter


def _replayed(loaded: dict, adapter, params: dict, replay: Replay) -> Localised:
    """The loaded model's run replayed with every operator checked (``localise_run``), in the sweep's cache."""
    return localise_run(
        loaded["model"],
        loaded["tokenizer"],
        loaded["input_ids"],
        loaded["attention_mask"],
        loaded["extra_inputs"],
        adapter.synchronize,
        replay=replay,
        cache=params.get("cache") or "dynamic",
    )


def _rerun(loaded: dict, adapter, params: dict, reference: _Reference, names: list[str]) -> tuple[Localised, dict]:
    """The proof's rerun (``prove``): the loaded model's run replayed again, ``names`` on the host; with no operator
    wrong, its output judged against the CPU reference (``_Reference``, outside the host kernels' reach)."""
    with host_ops.on_host(model_device(loaded["model"]).type, names) as hosted:
        again = _replayed(loaded, adapter, params, reference.replay)
    if again.first is None:
        reference.judge(again)
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
        Cell(entry["index"] if entry.get("step") is None else f"{entry['index']} (step {entry['step']})"),
        Cell(entry["operator"], code=True),
        Cell(entry["overload"]),
        Cell(entry["module"], code=True),
        Cell(entry["shapes"]),
        Cell(", ".join(entry["dtypes"])),
    ]
