"""The porting plan: what to fix next, greedily, by how many models each step makes a predicted
PASS.

A model is unlocked by the step that fixes its *last* blocker (an operator the stack lacks, one its
runtime aborts in, one that gives wrong results, or a dtype it refuses): counting first errors
(failure signatures) gives the wrong answer, since the first error hides the next one. Each step
fixes the set of operators that unlocks the most models per operator fixed: one operator where one
unlocks models by itself, or a group of operators that only unlock together (a model lacking both
``aten::rsqrt`` and ``aten::silu`` passes when both are done, neither alone unlocks it). The
candidates are the models' remaining blocker sets, and a step is never a set a smaller one lies
inside (that one goes first); ties go to fewer operators, then to the operators the most
still-blocked models need, then by name. Each step says how many models are predicted PASS once it
is done (cumulative). Models that fail for other reasons (their own, a failure that names no
operator, a census that cannot tell) are in no step: ``still_blocked`` says what keeps them.

A wrong operator is a blocker like a missing one: on another stack where its adapter says so
(``wrong``), on the sweep's own stack where ``model-support localise`` found it wrong in a model
(``ModelOps.localised``), whatever that model's verdict: a PASS whose output agrees with the CPU
reference all the same "computes wrong numbers" and is a step like the others (the reference check
compares a few tokens of one prompt; the operator is wrong for every prompt). A step fixing one says
in how many of the models it blocks it was localised (``PlanStep.localised``). A diverging PASS that
was never localised is in no step, and said so with the command that would localise it
(``not_localised``).

Each step also says precisely what to implement (``PlanStep.precise``): per operator, the dtype
signatures and ranks the models it blocks called it with, from their census (``aten::rsqrt for f32,
3 dims``); per refused dtype, the calls that need it (``dtype::float32 (aten::_to_copy bf16->f32,
2-3 dims)``). A census from before signatures says the operator alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..probe import census
from ..probe.model_ids import display_name
from ..record.ops_table import MISSING, WRONG
from . import proof as proof_mod
from .coverage import UNKNOWN_VERDICT, ModelOps

#: Signatures a step's line names per operator (the most-called first); the rest are counted.
SHOWN_SIGNATURES = 3


@dataclass(frozen=True)
class PlanStep:
    """One step: the operators to fix (one, or a group that only unlocks together) and what each
    lacks, the models it unlocks, those it blocks (they need one of its operators) until then,
    and how many models are predicted PASS once it is done."""

    ops: tuple[str, ...]
    unlocks: list[str]
    blocks: list[str]
    passing: int
    faults: dict[str, str]
    # per operator (or dtype::), the signatures the models it blocks need: [{"dtypes", "min_rank", "max_rank",
    # "calls", and "op" for a dtype's}], the most-called first (``signatures_needed``)
    signatures: dict[str, list[dict]] = field(default_factory=dict)
    # per wrong operator: the models it blocks in which ``model-support localise`` found it wrong
    localised: dict[str, list[str]] = field(default_factory=dict)
    # per operator whose status a switch of the stack decides, the coverage's note
    # (``coverage.StackCoverage``): an operator only its boxed fallback catches, missing while that
    # fallback is off, and the switch that turns it on
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def op(self) -> str:
        """The step's operators as one name: ``aten::rsqrt + aten::silu`` for a group."""
        return " + ".join(self.ops)

    def precise_op(self, op: str) -> str:
        """One operator of the step with what the models need of it: ``aten::rsqrt for f32, 3
        dims``."""
        return precise(op, self.signatures.get(op, []))

    def fault(self, op: str, by: str = "") -> str:
        """What is wrong with one operator of the step, in words ("" for a missing one: the
        plan's default): ``crashes``, ``wrong numbers in 2 models, localised`` (``by`` follows:
        `` by model-support localise``), ``wrong numbers`` (a stack's coverage says so); a
        missing one a switch of the stack decides, the coverage's note (``missing while the tpu
        stack's CPU fallback is off: torch_tpu...enable_cpu_fallback = True makes it a CPU
        fallback``)."""
        fault = self.faults.get(op)
        if fault == MISSING and op in self.notes:
            return self.notes[op]
        if fault == MISSING or fault is None:
            return ""
        if fault == WRONG and self.localised.get(op):
            count = len(self.localised[op])
            return f"wrong numbers in {count} model{'' if count == 1 else 's'}, localised{by}"
        return "wrong numbers" if fault == WRONG else fault

    @property
    def precise(self) -> str:
        """The step as one line naming dtypes and ranks: ``aten::rsqrt for f32, 3 dims +
        aten::silu for bf16, 3 dims``."""
        return " + ".join(self.precise_op(op) for op in self.ops)

    def as_json(self) -> dict:
        return {
            "op": self.op,
            "ops": list(self.ops),
            "precise": self.precise,
            "signatures": {op: self.signatures.get(op, []) for op in self.ops},
            "faults": self.faults,
            "unlocks": self.unlocks,
            "passing": self.passing,
            "blocks": self.blocks,
            "localised": {op: keys for op, keys in self.localised.items() if keys},
            "notes": {op: note for op, note in self.notes.items() if op in self.ops},
        }


def passing_now(models: Iterable[ModelOps]) -> int:
    """How many models are predicted PASS on the stack before any step (nothing wrong with them
    either)."""
    return sum(1 for m in models if m.passes)


def _best_group(sets: Counter) -> frozenset:
    """The operators to fix next, from the remaining blocker sets (``sets``: each distinct one,
    with how many models have exactly it): the set with the most models per operator (then fewer
    operators, then the operators the most models still need, then the names); then, while a
    smaller remaining set lies inside it, that one, so a step is always a set none of whose parts
    unlocks a model by itself. Linear in the distinct sets per step (models of one architecture
    share their census: a sweep of thousands has tens or hundreds of them)."""
    need: Counter = Counter()
    for needs, models in sets.items():
        for op in needs:
            need[op] += models

    def key(g: frozenset) -> tuple:
        return (-sets[g] / len(g), len(g), -sum(need[op] for op in g), sorted(g))

    group = min(sets, key=key)
    while True:
        inside = [s for s in sets if s < group]
        if not inside:
            return group
        group = min(inside, key=key)


def dims(low: int | None, high: int | None) -> str:
    """``3 dims``, ``1-3 dims``; ``dims unknown`` where the census could not tell."""
    if low is None or high is None:
        return "dims unknown"
    return f"{low} dims" if low == high else f"{low}-{high} dims"


def precise(op: str, signatures: list[dict]) -> str:
    """``op`` with the signatures needed of it: ``aten::rsqrt for f32, 3 dims``; several joined
    by ``;``; a dtype's with the calls that need it: ``dtype::float32 (aten::_to_copy bf16->f32,
    3 dims)``."""
    if not signatures:
        return op
    shown = signatures[:SHOWN_SIGNATURES]
    more = f"; +{len(signatures) - len(shown)} more" if len(signatures) > len(shown) else ""
    if op.startswith(census.DTYPE_NAMESPACE):
        said = "; ".join(
            f"{s['op']} {s['dtypes']}, {dims(s['min_rank'], s['max_rank'])}" for s in shown
        )
        return f"{op} ({said}{more})"
    said = "; ".join(
        f"{s['dtypes'] or 'no tensors'}, {dims(s['min_rank'], s['max_rank'])}" for s in shown
    )
    return f"{op} for {said}{more}"


def signatures_needed(models: Iterable[ModelOps], op: str) -> list[dict]:
    """The signatures ``models`` called ``op`` with (for ``dtype::X``: their calls whose
    signature names X), merged over the models: calls summed, ranks widened; the most-called
    first. Empty without signatures."""
    dtype = (
        op.removeprefix(census.DTYPE_NAMESPACE) if op.startswith(census.DTYPE_NAMESPACE) else None
    )
    merged: dict[tuple, dict] = {}
    for m in models:
        for name, dtypes, calls, low, high in m.signatures:
            if (
                (name != op)
                if dtype is None
                else (dtype not in census.signature_dtypes(dtypes or ""))
            ):
                continue
            row = merged.setdefault(
                (name, dtypes), {"dtypes": dtypes, "min_rank": low, "max_rank": high, "calls": 0}
            )
            if dtype is not None:
                row["op"] = name
            row["calls"] += calls or 0
            if low is not None:
                row["min_rank"] = low if row["min_rank"] is None else min(row["min_rank"], low)
            if high is not None:
                row["max_rank"] = high if row["max_rank"] is None else max(row["max_rank"], high)
    return sorted(merged.values(), key=lambda r: -r["calls"])


def porting_plan(models: list[ModelOps], fixed: frozenset = frozenset()) -> list[PlanStep]:
    """The greedy plan over ``models`` (predicted by ``coverage.predict``, so each has its
    ``blockers``); ``fixed``: operators taken as done already (the steps a proof ran:
    ``ops.prove``), the plan of what remains after them."""
    by_key = {m.key: m for m in models}
    remaining = {m.key: frozenset(m.blockers) - fixed for m in models if m.unlockable}
    passing = passing_now(models) + sum(1 for needs in remaining.values() if not needs)
    remaining = {key: needs for key, needs in remaining.items() if needs}
    faults = {op: fault for m in models for op, fault in m.faults.items()}
    notes = {op: note for m in models for op, note in m.notes.items()}
    steps = []
    while remaining:
        group = _best_group(Counter(remaining.values()))
        blocks = sorted(key for key, needs in remaining.items() if needs & group)
        unlocks = [key for key in blocks if remaining[key] <= group]
        passing += len(unlocks)
        need = Counter(op for key in blocks for op in remaining[key] & group)
        ops = tuple(sorted(group, key=lambda op: (-need[op], op)))
        needed = {op: signatures_needed([by_key[key] for key in blocks], op) for op in ops}
        localised = {
            op: [key for key in blocks if op in (by_key[key].localised or ())] for op in ops
        }
        step_faults = {op: faults[op] for op in ops}
        step_notes = {op: notes[op] for op in ops if op in notes}
        steps.append(
            PlanStep(ops, unlocks, blocks, passing, step_faults, needed, localised, step_notes)
        )
        for key in blocks:
            remaining[key] -= group
            if not remaining[key]:
                del remaining[key]
    return steps


def cumulative(steps: list[PlanStep], upto: int) -> set[str]:
    """The operators of steps 1..``upto`` (1-based): what is on the host when step ``upto`` is
    run."""
    return {op for s in steps[:upto] for op in s.ops}


def with_earlier(
    models: list[ModelOps], steps: list[PlanStep], index: int
) -> dict[str, list[tuple[str, int]]]:
    """The models step ``index`` (1-based) unlocks that need an operator of an earlier step too:
    key -> [(operator, its step)], its own step's last (a model needing two operators is unlocked
    at the step that gives both)."""
    by_key = {m.key: m for m in models}
    step_of = {op: i for i, s in enumerate(steps[:index], 1) for op in s.ops}
    found = {}
    for key in steps[index - 1].unlocks:
        needs = sorted(
            ((op, step_of[op]) for op in by_key[key].blockers if op in step_of),
            key=lambda pair: (pair[1], pair[0]),
        )
        if any(i < index for _, i in needs):
            found[key] = needs
    return found


def earlier_words(models: list[ModelOps], steps: list[PlanStep], index: int) -> str:
    """``tiny-gemma needs aten::rsqrt (step 1) and aten::gelu (step 2): unlocked at step 2, with
    both`` for each model step ``index`` unlocks that needs an earlier step's operator too; ""
    for none."""
    said = []
    for key, needs in with_earlier(models, steps, index).items():
        ops = [f"{op} (step {i})" for op, i in needs]
        joined = ", ".join(ops[:-1]) + f" and {ops[-1]}" if len(ops) > 1 else ops[0]
        both = "both" if len(ops) == 2 else f"all {len(ops)}"
        said.append(f"{display_name(key)} needs {joined}: unlocked at step {index}, with {both}")
    return "; ".join(said)


def step_proofs(
    models: list[ModelOps], steps: list[PlanStep], unhostable: Iterable[str] = ()
) -> list[proof_mod.StepProof]:
    """Each step as running says it (``proof.judge``): its cumulative operators (less those that
    cannot go to the host, ``unhostable``, and refused dtypes) on the host over the models it
    unlocks."""
    runs = {m.key: m.runs for m in models}
    skip = {op for m in models for op in m.blockers if op.startswith(census.DTYPE_NAMESPACE)} | set(
        unhostable
    )
    found = []
    for i, step in enumerate(steps, 1):
        refused = [op for op in step.ops if op in skip]
        if refused:  # its models are not run: nothing can confirm it
            said = f"not proven: {', '.join(refused)} cannot run on the host"
            found.append(proof_mod.StepProof(proof_mod.NOT_CONFIRMED, said, [], {}, []))
            continue
        hosted = {op for op in cumulative(steps, i) if op not in skip}
        found.append(proof_mod.judge(hosted, step.unlocks, runs))
    return found


#: Why a model that no step unlocks stays blocked, in the order they are shown.
NO_CENSUS = (
    "no census to predict from (compile mode, a sharded run, an older sweep, or a kernel that died)"
)
OWN_FAILURE = "its own failure: the CPU reference fails too"
DIVERGES = (
    "its output diverges from the CPU reference and it is not localised: no operator is named"
)
NONE_FOUND = (
    "its output diverges from the CPU reference and model-support localise found no operator wrong"
)
PARTIAL = "a partial census: what it needs after the operator that stopped it is unknown"
UNNAMED = "a failure that names no operator"


def blocked_reason(m: ModelOps) -> str | None:
    """Why no step of the plan unlocks ``m`` (one of the reasons above); None for a model that
    passes or that a step unlocks."""
    if m.passes or m.unlockable:
        return None
    if m.predicted == UNKNOWN_VERDICT:
        return NO_CENSUS
    if m.attribution in ("model", "both"):
        return OWN_FAILURE
    if m.diverges:
        return DIVERGES if m.localised is None else NONE_FOUND
    if m.blockers:
        return PARTIAL
    return UNNAMED


def still_blocked(models: list[ModelOps]) -> list[tuple[str, list[str]]]:
    """The models no step unlocks, by what keeps them: [(reason, model keys)], in the reasons'
    order."""
    found: dict[str, list[str]] = {}
    for m in models:
        reason = blocked_reason(m)
        if reason is not None:
            found.setdefault(reason, []).append(m.key)
    order = (NO_CENSUS, OWN_FAILURE, DIVERGES, NONE_FOUND, PARTIAL, UNNAMED)
    return [(reason, found[reason]) for reason in order if reason in found]


def not_localised(models: list[ModelOps]) -> list[ModelOps]:
    """The diverging PASSes ``model-support localise`` has not been run on (in no step, never
    silently dropped)."""
    return [m for m in models if m.diverges and m.localised is None]


def not_localised_line(models: list[ModelOps]) -> str | None:
    """``2 diverging PASSes not localised: run model-support localise SWEEP MODEL`` (one command
    per model); None when every diverging PASS is localised."""
    found = not_localised(models)
    if not found:
        return None
    count = len(found)
    commands = "; ".join(m.localise_command() for m in found)
    return f"{count} diverging PASS{'' if count == 1 else 'es'} not localised: run {commands}"


#: Each model's one standing in the plan (``standing``).
RUNS = "runs on the device"
BLOCKED_MISSING = "blocked by missing ops"
BLOCKED_WRONG = "blocked by wrong numbers"
BLOCKED_OTHER = "blocked"
#: A model a what-if run found right with operators on the host (``runs with 2 operators on the host
#: (...)``).
RUNS_ON_HOST = "runs with"
#: A model a what-if run found failing for a reason no operator on the host fixes.
NO_HOST_FIX = "blocked by something no host operator fixes"
#: A PASS whose output agrees with the CPU reference, with an operator ``model-support localise``
#: found wrong in it.
COMPUTES_WRONG = "computes wrong numbers"


def standing(m: ModelOps) -> str:
    """Where a model stands, in one phrase: it runs on the device (predicted PASS, nothing
    wrong); it runs with N operators on the host (a what-if run with them there PASSed and agrees
    with the reference: ``ops.proof``); blocked by something no host operator fixes (its latest
    what-if run stopped at an operator that was on the host, diverged, or failed naming none);
    blocked by missing ops (missing or crashing operators, a refused dtype, operators a what-if
    run then stopped at), blocked by wrong numbers (localised: the operators localise named; not
    localised: a diverging PASS no one localised yet; or the stack's coverage says so), both; it
    computes wrong numbers (a PASS agreeing with the CPU reference in which localise named wrong
    operators: no verdict says it, the plan does); or blocked for a reason no step fixes
    (``blocked_reason``)."""
    if m.passes:
        return RUNS
    hosted = proof_mod.on_host(m.runs)
    if hosted is not None:
        count = len(hosted.called)
        return (
            f"{RUNS_ON_HOST} {count} operator{'' if count == 1 else 's'} on the host "
            f"({hosted.hosted_words()})"
        )
    stuck = proof_mod.stuck(m.runs)
    if stuck is not None:
        return f"{NO_HOST_FIX}: {stuck}"
    stops = [op for op in m.blockers if m.faults.get(op) != WRONG]
    wrong = [op for op in m.blockers if m.faults.get(op) == WRONG]
    if wrong:
        localised = [op for op in wrong if op in (m.localised or ())]
        how = (
            f"localised: {', '.join(localised)}"
            if localised
            else f"the stack's coverage: {', '.join(wrong)}"
        )
        if localised and not stops and m.right:
            return (
                f"{COMPUTES_WRONG} ({how}), though its output agrees with the CPU reference "
                f"({m.numerics})"
            )
        said = f"{BLOCKED_WRONG} ({how})"
        return (
            f"{BLOCKED_MISSING} ({', '.join(stops)}) and {said.removeprefix('blocked by ')}"
            if stops
            else said
        )
    if stops:
        return f"{BLOCKED_MISSING} ({', '.join(stops)})"
    if m.diverges:
        return (
            f"{BLOCKED_WRONG} "
            f"({'not localised' if m.localised is None else 'localise named no operator'})"
        )
    return f"{BLOCKED_OTHER}: {blocked_reason(m) or m.predicted}"


def fallback_work(models: list[ModelOps]) -> list[dict]:
    """The work the steps leave: operators the stack runs but on the CPU (``ops_fallback``). A
    fallback blocks no verdict, so no step fixes it; it is work still, since every model that
    calls it pays a copy to the host and back on every call (a row's ``fallback_calls_per_token``
    measures it): [{"op", "models", "calls"}], weighed by how many models call it, then by their
    calls (the census'), then by name."""
    found: dict[str, dict] = {}
    for m in models:
        calls = dict(zip(m.ops or [], m.calls or []))
        for op in m.ops_fallback:
            entry = found.setdefault(op, {"op": op, "models": [], "calls": 0})
            entry["models"].append(m.key)
            entry["calls"] += calls.get(op) or 0
    return sorted(found.values(), key=lambda e: (-len(e["models"]), -e["calls"], e["op"]))


def plan_json(models: list[ModelOps], steps: list[PlanStep], proofs: list | None = None) -> dict:
    """``model-support ops --json``: {"passing": before any step, "plan": [{"op", "ops",
    "precise", "signatures", "faults", "unlocks", "passing", "blocks", "localised", "proof":
    {"outcome", "said", "sweep_ids"} (``proofs``: ``step_proofs``; null without), "with_earlier":
    {key: [[op, step]...]}}...], "blocked": [{"by", "models"}...], "not_localised": [{"model",
    "command"}...] (the diverging PASSes no one localised), "fallbacks": [{"op", "models",
    "calls"}...] (``fallback_work``), "models": {key: {"ops_missing", "ops_crashing",
    "ops_wrong", "ops_fallback", "predicted", and where what-if runs found them "learned",
    "completed_by"}}, "standing": {key: ``standing``}}."""
    proven = (
        [{"outcome": p.outcome, "said": p.said, "sweep_ids": p.sweep_ids} for p in proofs]
        if proofs
        else None
    )
    return {
        "passing": passing_now(models),
        "plan": [
            {
                **s.as_json(),
                "proof": proven[i - 1] if proven else None,
                "with_earlier": with_earlier(models, steps, i),
            }
            for i, s in enumerate(steps, 1)
        ],
        "blocked": [{"by": reason, "models": keys} for reason, keys in still_blocked(models)],
        "not_localised": [
            {"model": m.key, "command": m.localise_command()} for m in not_localised(models)
        ],
        "fallbacks": fallback_work(models),
        "models": {m.key: m.as_json() for m in models},
        "standing": {m.key: standing(m) for m in models},
    }
