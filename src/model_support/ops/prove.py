"""The plan proven by running (``model-support ops SWEEP --prove``) and the census completed
(``--complete``).

**--prove.** For each step of the sweep's plan, in order, a what-if sweep (the probe setting
``host_ops``: the operators on the host of the sweep's device, ``probe.what_if``) runs the models
the step is predicted to unlock, and only those (the models whose prediction changes there: at most
one probe per model per step), with the step's operators *and every earlier step's* on the host. The
step is confirmed when each of them PASSes and agrees with the CPU reference (``proof.judge``);
otherwise not, each model said with why: "tiny-llama then fails at aten::bmm, which the census did
not see", a PASS whose output diverges or was not checked, a failure no operator on the host fixes.
An operator a model then stopped at becomes its blocker (``proof.learned``, read back by
``coverage.sweep_models``) and the rest of the plan is planned again from there
(``plan.porting_plan``'s ``fixed``: the steps run so far), so the proven plan names it, at the step
that gives it. An operator that cannot run on the host (``host_ops.refusals``: a view, a factory, an
operator the CPU has no kernel for) or a dtype the stack refuses makes its step "not proven", and no
model needing it is run. A step whose models already ran with exactly its operators (an earlier
``--prove``) is read, not run again; a what-if sweep that was interrupted is resumed.

**--complete.** One what-if sweep with ``host_ops: missing`` over the models stopped by an operator
the stack lacks (their census is their run up to it, then the CPU reference's, which can differ: the
math attention's ``aten::bmm``): each runs to its end and its census lists every operator the stack
lacks, which the plan then uses.

The sweeps are created and run by the caller (``Sweeps``: the CLI's, through the sweep runner, so
their workers, executors and ``--resume`` are a sweep's; this room sits below the sweep's). They are
named ``<name>-what-if``, with a description naming the stack's sweep and the step, and listed in
the stack's sweep's ``proof.json`` (``ops.proof``); the stack's own records are never changed, and
no what-if row is ever a verdict of the stack's (the ``what_if`` config).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from ..errors import UserError
from ..probe import census, probe_params
from ..probe.model_ids import display_name
from ..record import store
from ..record.sweep_meta import ModelEntry, SweepMeta
from . import plan as plan_mod
from . import proof
from .coverage import ModelOps, predict, sweep_models

#: A proof stops after this many steps (each adds at least one operator: it ends before).
MAX_STEPS = 60
#: The what-if sweeps' name: the stack's sweep's, and this.
SUFFIX = "-what-if"


class Sweeps(Protocol):
    """What runs the what-if sweeps (the CLI's: ``sweep.runner``)."""

    def create(self, name: str, entries: list[ModelEntry], probe: dict, description: str) -> str:
        """Write a new sweep (sweep.json) of ``entries`` with the probe settings ``probe``; its
        id."""
        ...

    def run(self, sweep_id: str) -> None:
        """Run (or finish) the sweep ``sweep_id``: its models without a record."""
        ...


def check(meta: SweepMeta) -> None:
    """One sentence where a sweep's plan cannot be run on the host: several stacks, or a device
    that takes no host kernels (the CPU: the host is the device)."""
    if meta.probe.get("host_ops"):
        raise UserError(
            f"Sweep {meta.sweep_id} is a what-if sweep (host_ops={meta.probe['host_ops']!r}): "
            "prove the plan of the stack's own sweep."
        )
    if meta.stacks:
        raise UserError(
            f"Sweep {meta.sweep_id} ran {len(meta.stacks)} stacks (stacks:): --prove and "
            "--complete run one, this environment's; prove a sweep of one stack."
        )
    from ..probe import devices

    adapter = devices.resolve(meta.probe.get("device", "auto"))
    takes, why = adapter.host_kernels()
    if not takes:
        raise UserError(
            f"Sweep {meta.sweep_id} ran on {adapter.type}, which takes no operators on the "
            f"host ({why}): nothing to prove there; predict another stack with --on DEVICE."
        )


def what_if_words(data_dir: Path, sweep_id: str, host_ops: str) -> dict:
    """What ``model-support ops`` says of a what-if sweep ``sweep_id`` (``host_ops``: its
    setting), which has no plan of its own (its runs are no verdict of the stack): {"sweep_id",
    "what_if": true, "host_ops", "proves": the stack's sweep it was run for
    (``proof.proven_sweeps``) or None, "said": one sentence saying what it is and where its
    answers are}."""
    proves = proof.proven_sweeps(data_dir, [sweep_id]).get(sweep_id)
    hosted = (
        "every operator the stack lacks"
        if host_ops.strip() == proof.MISSING_SETTING
        else ", ".join(op.strip() for op in host_ops.split(",") if op.strip())
    )
    own = f"its own runs are in its report (`model-support report {sweep_id}`)"
    if proves:
        said = (
            f"Sweep {sweep_id} is a what-if run of {proves} with {hosted} on the host, no "
            "verdict of the stack and no plan of its own: its answers are in the plan it "
            f"proves (`model-support ops {proves}` lists the proof) and {own}."
        )
    else:
        said = (
            f"Sweep {sweep_id} is a what-if run with {hosted} on the host, no verdict of the "
            f"stack and no plan of its own: {own}, and a plan is a stack sweep's "
            "(`model-support ops SWEEP` of one)."
        )
    return {
        "sweep_id": sweep_id,
        "what_if": True,
        "host_ops": host_ops,
        "proves": proves,
        "said": said,
    }


def entries(meta: SweepMeta, models: list[ModelOps]) -> list[list[ModelEntry]]:
    """The sweep's entries of ``models``, each with its variant's settings as overrides, in
    rounds with each model once (a sweep lists a model once: two variants of one model run in two
    sweeps)."""
    by_id = {e.model_id: e for e in meta.models}
    rounds: list[list[ModelEntry]] = []
    for m in models:
        entry = by_id.get(m.model_id or "")
        if entry is None:
            continue
        combo = next(
            (
                c
                for c in probe_params.combinations(meta.matrix, meta.stacks)
                if probe_params.variant({**meta.probe, **entry.overrides, **c}) == m.variant
            ),
            {},
        )
        made = ModelEntry(
            entry.model_id,
            entry.source,
            {**entry.overrides, **combo},
            entry.timeout_s,
            dict(entry.hub),
        )
        free = next((r for r in rounds if all(e.model_id != made.model_id for e in r)), None)
        if free is None:
            rounds.append(free := [])
        free.append(made)
    return rounds


def _probe(meta: SweepMeta, setting: str) -> dict:
    """A what-if sweep's probe settings: the stack's, its operators on the host, checked against
    the CPU reference (a step is confirmed by numbers that agree, so they must be checked)."""
    return {**meta.probe, "host_ops": setting, "reference": "cpu"}


def _run(
    data_dir: Path,
    meta: SweepMeta,
    sweeps: Sweeps,
    record: dict,
    todo: list[ModelOps],
    setting: str,
    purpose: str,
) -> list[str]:
    """The what-if sweeps that run ``todo`` with ``setting`` on the host: an interrupted one of
    the same setting and models resumed, else new ones (named in ``proof.json`` before they run).
    Their ids."""
    keys = {m.key for m in todo}
    ran = []
    for known in record["runs"]:
        if known.get("host_ops") == setting and keys & set(known.get("models") or []):
            if not (store.sweep_dir(data_dir, known["sweep_id"]) / "sweep.json").is_file():
                continue
            if not proof.is_evidence(meta, proof.sweep_meta(data_dir, known["sweep_id"])):
                # not a what-if sweep of this stack (another device configuration): run it anew
                continue
            mine = [m for m in todo if m.key in known["models"]]
            if any(all(r.sweep_id != known["sweep_id"] for r in m.runs) for m in mine):
                # an interrupted one (a model without its row): finished, compacted
                sweeps.run(known["sweep_id"])
            ran.append(known["sweep_id"])
            keys -= set(known["models"])
    left = [m for m in todo if m.key in keys]
    for group in entries(meta, left) if left else []:
        # names the sweep it proves (``list`` reads it)
        words = proof.description(meta.sweep_id, purpose, setting)
        sweep_id = sweeps.create(f"{meta.name}{SUFFIX}", group, _probe(meta, setting), words)
        named = [m.key for m in left if m.model_id in {e.model_id for e in group}]
        proof.add_run(record, sweep_id, setting, named, purpose)
        proof.write(data_dir, meta.sweep_id, record)
        sweeps.run(sweep_id)
        ran.append(sweep_id)
    return ran


def _models(data_dir: Path, sweep_id: str) -> list[ModelOps]:
    return predict(sweep_models(data_dir, sweep_id))


def complete(
    data_dir: Path, sweep_id: str, sweeps: Sweeps, say: Callable[[str], None]
) -> list[str]:
    """``--complete``: the models stopped by an operator the stack lacks, whose census is not a
    run of their own to the end, run once with every operator the stack lacks on the host. The
    what-if sweeps' ids ([] for none)."""
    meta = store.read_sweep(data_dir, sweep_id)
    check(meta)
    record = proof.read(data_dir, sweep_id)
    todo = [
        m
        for m in _models(data_dir, sweep_id)
        if m.stopped is not None
        and not m.died
        and m.source != census.RUN
        and m.completed_by is None
    ]
    if not todo:
        say(
            "Complete census: no model of this sweep stopped at an operator the stack lacks "
            "without a complete census."
        )
        return []
    names = ", ".join(display_name(m.key) for m in todo)
    say(
        f"Complete census: {len(todo)} model(s) with every operator the stack lacks on the "
        f"host: {names}."
    )
    ran = _run(data_dir, meta, sweeps, record, todo, proof.MISSING_SETTING, proof.COMPLETE)
    for m in _models(data_dir, sweep_id):
        if m.key in {t.key for t in todo}:
            listed = ", ".join(m.ops_missing) or "none"
            how = (
                f"its census completed by {m.completed_by}"
                if m.completed_by
                else "no complete census came back"
            )
            say(f"  {display_name(m.key)}: {how}; the stack lacks {listed}.")
    return ran


def prove(data_dir: Path, sweep_id: str, sweeps: Sweeps, say: Callable[[str], None]) -> dict:
    """``--prove``: each step run (see the module docstring); returns the proof as ``proof.json``
    keeps it."""
    from ..probe import devices, what_if

    meta = store.read_sweep(data_dir, sweep_id)
    check(meta)
    adapter = devices.resolve(meta.probe.get("device", "auto"))
    record = proof.read(data_dir, sweep_id)
    record["steps"], record["unhostable"] = [], {}
    fixed: frozenset = frozenset()
    unhostable: dict[str, str] = {}
    for k in range(1, MAX_STEPS + 1):
        models = _models(data_dir, sweep_id)
        steps = plan_mod.porting_plan(models, fixed)
        if not steps:
            if k == 1:
                say(
                    "Nothing to prove: the plan has no step (no operator is missing, crashing "
                    "or localised wrong)."
                )
            break
        step = steps[0]
        done = list(record["steps"])
        cumulative = set(fixed | set(step.ops))
        for op in step.ops:
            why = _unhostable(op, adapter, what_if)
            if why:
                unhostable[op] = why
        by_key = {m.key: m for m in models}
        not_run = {
            key: f"needs {', '.join(sorted(set(by_key[key].blockers) & set(unhostable)))}, which "
            "cannot run on the host"
            for key in step.unlocks
            if set(by_key[key].blockers) & set(unhostable)
        }
        hosted = sorted(cumulative - set(unhostable))
        todo = [by_key[key] for key in step.unlocks if key not in not_run]
        setting = proof.setting(hosted)
        earlier = _earlier(models, step, k, done)
        ran = (
            _run(data_dir, meta, sweeps, record, todo, setting, f"step {k}")
            if todo and hosted
            else []
        )
        models = _models(data_dir, sweep_id)
        judged = (
            proof.judge(hosted, [m.key for m in todo], {m.key: m.runs for m in models}, ran)
            if todo
            else None
        )
        refused = {op: unhostable[op] for op in step.ops if op in unhostable}
        said = _said(judged, not_run, refused, earlier)
        record["steps"].append(
            {
                "step": k,
                "ops": list(step.ops),
                "host_ops": setting,
                "unlocks": step.unlocks,
                "ran": [m.key for m in todo],
                "not_run": not_run,
                "sweep_ids": ran,
                "outcome": judged.outcome
                if judged and not not_run and not refused
                else proof.NOT_CONFIRMED,
                "said": said,
                "earlier": earlier,
            }
        )
        record["unhostable"] = unhostable
        proof.write(data_dir, sweep_id, record)
        say(step_line(record["steps"][-1], record["steps"][:-1]))
        fixed = frozenset(cumulative)
    else:
        say(f"Stopped after {MAX_STEPS} steps.")
    return record


def _unhostable(op: str, adapter, what_if) -> str | None:
    """Why ``op`` cannot run on the host of ``adapter``'s device (None: it can)."""
    if op.startswith(census.DTYPE_NAMESPACE):
        return f"{op} is a dtype the stack refuses: no operator on the host gives it"
    return what_if.refusal(op, adapter)


def _earlier(models: list[ModelOps], step: plan_mod.PlanStep, k: int, done: list[dict]) -> str:
    """The models ``step`` (the ``k``th) unlocks that need an earlier step's operator too, in
    words."""
    earlier = [plan_mod.PlanStep(tuple(s["ops"]), list(s["unlocks"]), [], 0, {}) for s in done]
    return plan_mod.earlier_words(models, [*earlier, step], k)


def _said(judged: proof.StepProof | None, not_run: dict, refused: dict, earlier: str) -> str:
    """The step's sentence: confirmed or not (``judged``), what was not run and why, the models
    that needed an earlier step too."""
    parts = []
    if refused:
        parts.append("not proven: " + " ".join(refused.values()))
    if judged is not None:
        parts.append(judged.said)
    parts += [f"{display_name(key)} not run: it {why}" for key, why in not_run.items()]
    if earlier:
        parts.append(earlier)
    return "; ".join(parts) or "nothing to run"


def step_line(step: dict, before: list[dict]) -> str:
    """``step 2: aten::gelu on the host, with step 1's aten::rsqrt (what-if sweep ID; tiny-gemma,
    tiny-gpt-neox): confirmed: ...``."""
    earlier = sorted({op for s in before for op in s["ops"]})
    whose = "the earlier steps'" if len(before) > 1 else "step 1's"
    also = f", with {whose} {', '.join(earlier)}" if earlier else ""
    where = "; ".join(
        part
        for part in (
            f"what-if sweep {', '.join(step['sweep_ids'])}" if step["sweep_ids"] else "",
            ", ".join(display_name(k) for k in step["ran"]),
        )
        if part
    )
    return (
        f"step {step['step']}: {' + '.join(step['ops'])} on the host{also} "
        f"({where or 'nothing run'}): {step['said']}"
    )


def last_proof(
    data_dir, sweep_id: str, models: list[ModelOps], plan: list | None = None
) -> list[dict]:
    """The last ``--prove``'s steps as they ran, each judged again from its what-if records now
    (the records are the truth; ``proof.json`` names them): [{"step", "ops", "host_ops",
    "unlocks", "ran", "sweep_ids", "outcome", "said", "line", "stale"}]. ``plan``: the porting
    plan now (``plan.PlanStep``s); a step it no longer has as it ran (other operators, other
    models unlocked: the census or the judged verdicts changed since) is said to be stale
    (``stale``: how the plan's step reads now), so an old proof is not read as the plan's."""
    record = proof.read(data_dir, sweep_id)
    runs = {m.key: m.runs for m in models}
    steps: list[dict] = []
    for step in record.get("steps") or []:
        named = set(step.get("sweep_ids") or [])
        # the models its what-if sweeps hold rows of, with those proof.json lists: an edited list
        # hides none of them
        held = [key for key, found in runs.items() if any(r.sweep_id in named for r in found)]
        ran = list(dict.fromkeys([*(step.get("ran") or []), *held]))
        hosted = [op for op in (step.get("host_ops") or "").split(",") if op]
        judged = proof.judge(hosted, ran, runs, step.get("sweep_ids") or []) if ran else None
        refused = {
            op: why for op, why in (record.get("unhostable") or {}).items() if op in step["ops"]
        }
        said = _said(judged, step.get("not_run") or {}, refused, step.get("earlier") or "")
        outcome = (
            judged.outcome
            if judged and not step.get("not_run") and not refused
            else proof.NOT_CONFIRMED
        )
        stale = _stale(step, plan) if plan is not None else None
        if stale:
            said = f"{said}; stale: {stale}"
        entry = {**step, "outcome": outcome, "said": said, "stale": stale}
        steps.append({**entry, "line": step_line(entry, steps)})
    return steps


def _stale(step: dict, plan: list) -> str | None:
    """How the plan's step of the same number reads now, where it is not the step that ran; None
    where it is."""
    index = int(step.get("step") or 0)
    if not 1 <= index <= len(plan):
        return f"the plan has {len(plan)} step{'s' if len(plan) != 1 else ''} now, no step {index}"
    now = plan[index - 1]
    if tuple(now.ops) == tuple(step.get("ops") or ()) and sorted(now.unlocks) == sorted(
        step.get("unlocks") or []
    ):
        return None
    unlocks = ", ".join(display_name(k) for k in now.unlocks) or "nothing"
    return (
        f"the plan's step {index} is now {' + '.join(now.ops)}, unlocking {unlocks} (run --prove "
        "again)"
    )
