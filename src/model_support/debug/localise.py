"""The first wrong operator: where on the device a model's numbers go wrong, down to one aten
operator.

The run is replayed on the device under a dispatch mode (``OperatorCheck``), with the tracer's
module hooks (``tracer.ModuleTracer``: the module each operator ran in): the probe's prompt, then
the run's own generated tokens fed back one decode step at a time through the KV cache (``Replay``:
``model.generate`` as the probe calls it, each step's token forced to the one the record holds,
teacher forcing with the device's tokens as the reference check does), so every step's forward is
the one the run computed, and a fault that starts at a position (a kernel wrong from 29 key
positions on, a cache that goes wrong as it grows) is met where the run met it. The prompt's forward
alone is not the run: a stack can be right over 26 positions and wrong over 29. The replay reaches
at least the step where the record says the run diverged from the CPU reference (``numerics_step`` /
``first_divergence``, or a long-text check's first disagreement where the record has one) and stops
after the first step with a wrong operator; with none wrong it runs every step the verdict judged,
and a divergence it cannot reach is said, never passed over.

The mode is the census's (``probe.census``): under inference mode composite operators reach it whole
(``scaled_dot_product_attention``, ``linear``) and it decomposes those the device has no kernel of
its own for, as the dispatcher does for a C++ backend, so a fault inside attention is named as the
``aten::bmm`` or softmax it is. Every other operator that touches the device is run there, then
replayed on the CPU from the device's own inputs copied to the CPU (clones: an in-place operator, a
cache update, writes into the copy, never into the run's tensors), and the two outputs are judged
(``op_check.judge``: a tolerance per dtype, so bf16 rounding is not a fault). Because each replay
starts from the device's inputs, an error upstream never counts against the operators after it: the
first operator flagged is where the numbers go wrong, not where the damage shows. Each is named with
the step it ran in.

Every operator is judged or said not to be. A fused attention kernel the CPU has none of (CUDA's
flash attention) is replayed through the math attention (``op_check.replay``), its outputs no CPU
attention makes named as not judged; an operator the CPU cannot run at all (a kernel of the device's
own, a dtype the CPU lacks) is "not judged", with the reason, never counted as agreeing: with such
operators and none wrong the finding says so, not "all agree", and when some ran before the first
wrong operator it says so first, since the numbers may have gone wrong there.

``localise`` does it for one model of a sweep, on the sweep's device (the stack this environment
holds, as ``model-support debug``; the sentence of ``stack.stack_difference`` when it is not the
sweep's), proves the blame (``prove``: the run replayed again with the wrong operators on the host,
``probe.host_ops``, the next one found so joining them, up to ``MAX_ON_HOST``; the last rerun judged
by ``ops.proof.rerun_wrong``, the judgement ``ops --prove`` gives a what-if run, so the two cannot
contradict each other), stores the result beside the record (``sweeps/<id>/localised/<model>.json``)
and the first wrong operator's one-operator script (``op_repro``). ``localise_forward`` checks one
forward of a loaded model (the debug notebook's cell). Eager only: a compiled run's operators never
pass through a dispatch mode, so a compile variant is localised eagerly, and says so.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..ops import localised as localised_answers
from ..probe import host_ops, probe_params
from ..record import store
from ..record.schema import DEFAULT_VARIANT
from . import op_check
from .compare import json_safe
from .findings import Localised, Replay
from .localise_proof import prove
from .localise_words import summary
from .tracer import ModuleTracer, model_device, trace_forward

#: Where a sweep keeps its localised models (results, one-operator scripts, their inputs).
LOCALISED = store.LOCALISED
#: The keys of ``--json``'s object (and of every stored result), the finding's first.
KEYS = (
    "operator",
    "overload",
    "module",
    "shapes",
    "dtypes",
    "max_abs_error",
    "max_rel_error",
    "repro",
)
#: The record's columns that say where a long-text check (``probe.long_text``, where the record has
#: one) went wrong, each a position of its text, in the order the localiser chases them: its decode
#: path diverging (replayed through the KV cache), its one prefill diverging (replayed as one
#: forward over the text up to there), its first flip.
LONG_TEXT_COLUMNS = {
    "long_text_decode_diverges_at": (
        "decode",
        "the long-text check's decode path diverged from the CPU reference",
    ),
    "long_text_prefill_diverges_at": (
        "prefill",
        "the long-text check's prefill diverged from the CPU reference",
    ),
    "long_text_first_disagreement": (
        "decode",
        "the long-text check first chose another token than the CPU",
    ),
}
#: A long text's decode steps checked, up to the one where it diverged (the steps before run
#: unchecked: hundreds of them, each a whole forward replayed on the CPU, would cost minutes for
#: what the step that diverged shows).
LONG_TEXT_CHECKED = 4


def replay_of(record: dict, tokenizer=None, positions: int | None = None) -> Replay:
    """The replay a record asks for. Its verdict's generation (its generated tokens) when its
    numerics diverge (at ``numerics_step``), or when nothing else went wrong (at its first flip,
    ``first_divergence``, if any); else a long-text check's divergence (``LONG_TEXT_COLUMNS``):
    the text's ids (``long_text.token_ids``, ``tokenizer``'s, at most ``positions``) through the
    KV cache to that position, or as one prefill up to it. A long-text divergence the replay does
    not chase, or cannot (no tokenizer, no long-text module here), is ``unreached``."""
    tokens = [int(t) for t in record.get("output_token_ids") or []]
    replay = Replay(tokens=tokens)
    if record.get("numerics") == "diverges" and record.get("numerics_step") is not None:
        replay.diverged_at, replay.how = (
            int(record["numerics_step"]),
            "the run diverged from the CPU reference",
        )
    elif record.get("first_divergence") is not None:
        replay.diverged_at, replay.how = (
            int(record["first_divergence"]),
            "the run first chose another token than the CPU",
        )
    long = next(
        (
            (record[c], *LONG_TEXT_COLUMNS[c])
            for c in LONG_TEXT_COLUMNS
            if record.get(c) is not None
        ),
        None,
    )
    if long is None:
        return replay
    position, path, how = int(long[0]), long[1], long[2]
    unreached = (
        f"{how} at position {position} of its text, which this replay of the verdict's generation "
        "does not reach"
    )
    if record.get("numerics") == "diverges":
        # the probe's own run first: its proof then says the long text is not reached
        replay.unreached = unreached
        return replay
    ids = _long_text_ids(record, tokenizer, positions)
    if ids is None or len(ids) < position + 1:
        replay.unreached = unreached + (
            " (the long text's ids are not to be had here)" if ids is None else ""
        )
        return replay
    # one forward over the text up to that position: its last row is the one that diverged
    if path == "prefill":
        return Replay(
            prompt_ids=ids[: position + 1],
            diverged_at=0,
            how=f"{how} (at position {position})",
            what=f"the long text's prefill up to position {position}",
        )
    # the forwards at positions 0..p take ids 0..p; the answer forced at p is the next id (any, past
    # the text's end)
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
    """The ids the long-text check fed (``probe.long_text.token_ids``), or None where this
    environment has no long-text module or no tokenizer is at hand."""
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


def OperatorCheck(device_type: str, tracer) -> Any:
    """The localiser's dispatch mode (``operator_check_mode.OperatorCheckMode``) over one forward
    or a replayed run."""
    # imports torch: this module imports none at its top
    from .operator_check_mode import OperatorCheckMode

    return OperatorCheckMode(device_type, tracer)


def localise_forward(
    model, input_ids, attention_mask=None, extra_inputs=None, synchronize=None
) -> Localised:
    """One forward of ``model`` (on its device) with every operator that reaches the device
    judged against the CPU's replay of it (see the module docstring): the debug notebook's cell,
    which has no run to replay (``localise`` replays the run, ``localise_run``). On the CPU there
    is nothing to compare: nothing is checked."""
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
    """The run replayed on ``model``'s device (``Replay``, the module docstring) with every
    operator judged: greedy ``model.generate`` as the probe calls it (``probe_core.generate``:
    its cache, its pad token, the image inputs), each step's token forced to the recorded one by
    a logits processor (its own operators, and the stop flag's, run unjudged: ``quiet``), so the
    KV cache holds what the run's did. ``until_wrong``: stop after the first step with a wrong
    operator (the finding needs no more, nor does a rerun that names the next one); a replay with
    none runs every step. The device's best logits per step run (``probe_core.top_scores``, as
    the probe keeps them) are in ``scores``, for the reference check (``_Reference``)."""
    import torch

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

    forcing, stopping = _forced(check, prompt, list(replay.tokens), until_wrong)

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    settings = {"cache_implementation": "static"} if cache == "static" else {}
    started = time.perf_counter()
    output, failure = None, None
    # the inputs made on the device inside it, as the probe's generate does
    with tracer, torch.inference_mode(), check:
        try:
            output = model.generate(
                input_ids=input_ids.to(device),
                attention_mask=(
                    torch.ones_like(input_ids) if attention_mask is None else attention_mask
                ).to(device),
                max_new_tokens=replay.steps,
                do_sample=False,
                pad_token_id=pad,
                output_logits=True,
                return_dict_in_generate=True,
                logits_processor=forcing,
                stopping_criteria=stopping,
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


def _forced(check, prompt: int, forced: list[int], until_wrong: bool):
    """The replay's logits processor (each step's token forced to the recorded one; none
    recorded: the device's own choice) and its stopping criterion (``until_wrong``: after the
    first step with a wrong operator), both running their own operators unjudged
    (``check.quiet``)."""
    import torch
    from transformers import (
        LogitsProcessor,
        LogitsProcessorList,
        StoppingCriteria,
        StoppingCriteriaList,
    )

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

    return LogitsProcessorList([Forced()]), StoppingCriteriaList([Stop()])


class _Reference:
    """The CPU reference's logits over the replay's tokens (``agreement.teacher_forced_logits``,
    in the dtype the probe's check uses), made once, on first need, for every run of one
    ``localise``: a run's output is judged as the probe judges its verdict, over the steps it ran
    (``agreement.compare`` called as ``reproduce.reference_check`` calls it, with the sweep's
    margin and bound; that function loads and runs the reference at each call, where one
    ``localise`` judges up to ``MAX_ON_HOST`` + 1 runs against the same logits, and it
    teacher-forces the probe's prompt, where a long text's replay has its own ids)."""

    def __init__(self, params: dict, loaded: dict, device_type: str, replay: Replay):
        self.params, self.loaded, self.device_type, self.replay = (
            params,
            loaded,
            device_type,
            replay,
        )
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
                # none recorded: the prompt's row alone (the last token never fed)
                tokens = self.replay.tokens or [0]
                extra = self.loaded["extra_inputs"] if own else None
                self._logits = agreement.teacher_forced_logits(model, prompt, tokens, extra)
            except Exception as exc:  # noqa: BLE001 the reference's failure is said, never a verdict
                message = (str(exc).strip().splitlines() or [""])[0][:160]
                self._failed = f"the CPU reference could not run ({type(exc).__name__}: {message})"
        return self._logits

    def judge(self, found: Localised) -> None:
        """``found.numerics`` (``agreement.RECORD_KEYS``) where the run ran every step, else
        ``numerics_why``."""
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


# --- the blame proven: the run again with the wrong operators on the host
# --------------------------------------


def result_of(found: Localised, repro: str | None = None, **context) -> dict:
    """The stored (and ``--json``) object: ``KEYS`` first (all null when nothing is wrong), then
    the rest: the first wrong operator's ``step``, what was replayed (``replay``: tokens, steps,
    where the run diverged, what it could not reach; ``steps_run``) and, where no operator is
    wrong, the replayed output against the CPU reference (``numerics``)."""
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
            {k: u.get(k) for k in ("operator", "overload", "module", "step", "reason")}
            for u in found.unjudged
        ],
        outputs_not_judged=[
            {"operator": name, **note} for name, note in found.outputs_not_judged.items()
        ],
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
    return json_safe(result)


def localised_dir(data_dir, sweep_id: str) -> Path:
    """A sweep's ``localised/`` folder."""
    return localised_answers.folder(data_dir, sweep_id)


def stored(data_dir, sweep_id: str, model_id: str, variant: str | None = None) -> dict | None:
    """A model's stored localisation in a sweep (``localise``'s result), or None. The porting
    plan reads the same answers (``ops.localised``): a wrong operator found here is a step of the
    sweep's plan."""
    return localised_answers.stored(data_dir, sweep_id, model_id, variant)


def _record(data_dir, sweep_id: str, model_id: str, variant: str | None) -> dict:
    path = store.find_record(data_dir, sweep_id, model_id, variant)
    if path is None:
        raise UserError(
            f"Sweep {sweep_id} has no record of "
            f"{model_id}{f' in {variant}' if variant else ''}: localise reruns a model the "
            f"sweep probed; finish the sweep first (model-support sweep --resume {sweep_id})."
        )
    record = json.loads(path.read_text())
    if record.get("exclusion_reason"):
        raise UserError(
            f"{model_id} was excluded from sweep {sweep_id} ({record['exclusion_reason']}): "
            "nothing ran to localise."
        )
    return record


def _only_variant(data_dir, sweep_id: str, model_id: str) -> str | None:
    """The one variant ``model_id`` ran in, in a sweep that never ran it in the default one (a
    definition's ``max_new_tokens: 2`` makes ``eager+dynamic+2t``); None where it has no record;
    one sentence naming them when it ran in several, so --variant says which."""
    variants = sorted(
        {r["variant"] for r in store.read_records(data_dir, sweep_id) if r["model_id"] == model_id}
    )
    if len(variants) > 1:
        raise UserError(
            f"{model_id} ran in {len(variants)} variants of sweep {sweep_id}: say which with "
            f"--variant ({', '.join(variants)})."
        )
    return variants[0] if variants else None


def localise(data_dir, sweep_id: str, model: str, variant: str | None = None) -> dict:
    """Localise MODEL (its id or a unique fragment) of a sweep on the sweep's device, on this
    environment's stack: replay its run (``replay_of`` its record: the prompt, then its generated
    tokens through the KV cache, to where it diverged and on), prove the first wrong operator on
    the host (``prove``; the result's ``proof``); store the result as
    ``sweeps/<id>/localised/<model>.json`` (and the first wrong operator's script and inputs
    beside it) and return it (``result_of``; ``stack_note`` says when this stack is not the
    sweep's). Bad input (an unknown sweep or model, a model with no record, a sweep on the CPU)
    is one sentence, before anything runs."""
    from .debug_runner import debug_parameters, resolve_model
    from .stack import stack_difference

    meta = store.read_sweep(data_dir, sweep_id)
    entry = resolve_model(meta, model)
    overrides: dict = {}
    if not variant and store.find_record(data_dir, sweep_id, entry.model_id, None) is None:
        # its one variant is the one meant
        variant = _only_variant(data_dir, sweep_id, entry.model_id)
    if variant:
        try:
            overrides = probe_params.parse_variant(variant)
            variant = probe_params.variant(overrides)
        except probe_params.ParameterError as exc:
            raise UserError(str(exc)) from None
    record = _record(data_dir, sweep_id, entry.model_id, variant)
    params = {
        **probe_params.defaults(probe_params.DEBUG_PARAMS),
        **debug_parameters(meta, entry, overrides),
    }
    device = record.get("device_type") or params.get("device") or "cpu"
    if device == "cpu":
        raise UserError(
            f"{entry.model_id} ran on the CPU in sweep {sweep_id}: the localiser compares a "
            "device's operators with the CPU's, so it needs a sweep on an accelerator."
        )
    note = stack_difference(meta, record)
    loaded, adapter = _load(params, device)
    from ..probe.probe_core import positions_of

    replay = replay_of(record, loaded["tokenizer"], positions_of(loaded["model"]))
    found = _replayed(loaded, adapter, params, replay)
    reference = _Reference(params, loaded, found.device_type or device, replay)
    if found.first is None and found.device_type != "cpu":
        # nothing wrong: does the replayed output agree with the CPU reference?
        reference.judge(found)
    proof = prove(
        found, adapter.host_kernels(), functools.partial(_rerun, loaded, adapter, params, reference)
    )
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
    """Load the model as the probe does on ``device`` (this environment's stack):
    (``load_for_debug``'s, the adapter)."""
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
    """The loaded model's run replayed with every operator checked (``localise_run``), in the
    sweep's cache."""
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


def _rerun(
    loaded: dict, adapter, params: dict, reference: _Reference, names: list[str]
) -> tuple[Localised, dict]:
    """The proof's rerun (``prove``): the loaded model's run replayed again, ``names`` on the
    host; with no operator wrong, its output judged against the CPU reference (``_Reference``,
    outside the host kernels' reach)."""
    with host_ops.on_host(model_device(loaded["model"]).type, names) as hosted:
        again = _replayed(loaded, adapter, params, reference.replay)
    if again.first is None:
        reference.judge(again)
    return again, dict(hosted.calls)
