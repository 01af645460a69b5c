"""A sweep's census against a stack: each model's missing, crashing, wrong and fallback operators,
its predicted verdict, and what keeps it from a predicted PASS.

The census of a row (``ops`` in the order of first call, ``ops_stages``) says what the model needs;
a stack's coverage (operator -> ``record.ops_table.OP_STATUSES``) what it has. A model's first
missing or crashing operator is where a run on that stack stops: a missing one's stage gives the
verdict (``probe_core.STAGE_VERDICT``: the generation's is ``FAIL(gen)``, the weights' copy's
``FAIL(load)``), a crashing one (the runtime aborts) is ``FAIL(other)``, as a dead kernel is; a
stack that refuses the run's dtype (``dtype::bfloat16`` missing) fails it at load, and one that
refuses a dtype only some calls use (a bfloat16 model's RMSNorm upcast to float32: the census' dtype
signatures, ``bf16->f32``) fails it at the first operator whose signature names it, by that
operator's stage (the dtype is the blocker). Coverage is judged per operator, and per dtype through
``dtype::`` alone: no adapter here can say that an operator it has lacks one dtype (a registration
covers every dtype). A model with none passes, fallbacks included (a wrong operator passes too, with
wrong output). A row with no complete census (the model failed on its own before it ran, everywhere:
the reference failed too) keeps its recorded verdict; a row with no census at all (compile mode, a
sharded run, an older sweep) is ``unknown``.

On the sweep's own stack (no coverage given) the rows are the coverage: their ``ops_missing``,
``ops_fallback``, ``ops_unknown``, and the operator each failure of the stack's names
(``census.stopped_by``: missing where the run raised, crashing where its kernel died); a row's
recorded verdict stands where its census explains nothing (a failure that names no operator). The
operators ``model-support localise`` found wrong in a model (its answer in the sweep's folder,
``ops.localised``) are wrong for that model: blockers whatever its row's verdict, a PASS whose
output agrees with the CPU reference too (issue 56: with every ``aten::mul`` wrong, the tiny
fixtures' flat logits still ``tie`` or ``match``; a wrong operator the reference check did not see
is no less wrong, and the next prompt may show it). Wrong is per model, as localised: an operator
localised wrong in one model is not assumed wrong in another that calls it (that one's diverging
PASS is said to be not localised).

The coverage of *this machine's* stack comes from its device adapter in a child process (``python -m
model_support.ops DEVICE``, the operators on stdin), as the sweep's runner asks for a device's
facts: the backend is loaded there, never in the command's own process. Its answer keeps the
adapter's notes (``StackCoverage``): an operator only the stack's boxed fallback catches is
``missing`` where that fallback raises (TorchTPU's, off by default), and its note names the switch
that would make it a CPU fallback; each model and the plan's step that fixes it say it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .. import backend_env
from ..engine import children
from ..errors import UserError
from ..probe import agreement, census
from ..probe.probe_core import STAGE_VERDICT
from ..record import schema, store
from ..record.ops_table import CRASHES, FALLBACK, IMPLEMENTED, MISSING, UNKNOWN, WRONG
from . import localised as localised_mod
from . import proof as proof_mod

#: The prediction where the census cannot tell.
UNKNOWN_VERDICT = "unknown"
#: The error type of a row whose kernel died (the worker's stand-in record): its operator crashed,
#: it raised nothing.
DEAD_KERNEL = "DeadKernelError"
#: The statuses where a run stops.
STOPS = (MISSING, CRASHES)
#: The row columns the prediction reads.
COLUMNS = (
    "model_id",
    "variant",
    "status",
    "failure_stage",
    "error_type",
    "error_message",
    "attribution",
    "numerics",
    "dtype",
    "device_type",
    *census.FIELDS,
    "ops_missing",
    "ops_fallback",
    "ops_unknown",
)


@dataclass
class ModelOps:
    """One (model, variant) of a sweep: its recorded verdict, its census, and what a stack lacks
    of it."""

    key: str  # the model id, plus `` [variant]`` for any variant but the default
    status: str | None
    device_type: str | None
    ops: list[str] | None
    stages: list[str] | None
    calls: list[int] | None
    source: str | None
    ops_missing: list[str] = field(default_factory=list)
    ops_fallback: list[str] = field(default_factory=list)
    ops_unknown: list[str] = field(default_factory=list)
    predicted: str = UNKNOWN_VERDICT
    # where a run on the stack stops (an operator, or ``dtype::...``)
    first_missing: str | None = None
    dtype: str | None = None
    attribution: str | None = None
    failure_stage: str | None = None
    error_type: str | None = None
    numerics: str | None = None
    # the operator a failure of the stack's names (``census.stopped_by``)
    stopped: str | None = None
    ops_crashing: list[str] = field(default_factory=list)
    ops_wrong: list[str] = field(default_factory=list)
    # what must be fixed for a predicted PASS, first needed first
    blockers: list[str] = field(default_factory=list)
    faults: dict[str, str] = field(default_factory=dict)  # blocker -> missing / crashes / wrong
    # a PASS on its own stack whose output diverges, and no wrong operator named
    diverges: bool = False
    # (op, dtype signature, calls, min rank, max rank) of each census entry (``census.SIG_FIELDS``);
    # none before them
    signatures: list[tuple] = field(default_factory=list)
    # the operators ``model-support localise`` found wrong in it on the sweep's stack, the first
    # first (``ops.localised``); None: never localised, []: localised, and no operator is wrong
    localised: list[str] | None = None
    sweep_id: str | None = None
    model_id: str | None = None
    variant: str | None = None
    # what running it with operators on the host said (``ops.proof``: the what-if sweeps of the
    # sweep, in order)
    runs: list[proof_mod.Run] = field(default_factory=list)
    # operators a what-if run stopped at that were not on the host, which its census did not show:
    # op -> fault
    learned: dict[str, str] = field(default_factory=dict)
    # the what-if sweep whose ``host_ops: missing`` run gave its census (it ran to its end), or None
    completed_by: str | None = None
    # per operator of its census whose status a switch of the stack decides, what the coverage said
    # of it (an operator only the stack's boxed fallback catches: missing while its CPU fallback is
    # off, naming the switch)
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def right(self) -> bool:
        """A PASS whose output agrees with the CPU reference (``numerics`` match or ties): right
        as recorded."""
        return self.status == schema.PASS and self.numerics in (agreement.MATCH, agreement.TIES)

    @property
    def diverging(self) -> bool:
        """A PASS whose output diverges from the CPU reference, as recorded (a wrong operator
        named or not)."""
        return self.status == schema.PASS and self.numerics == agreement.DIVERGES

    def localise_command(self) -> str:
        """The command that localises it (``model-support localise SWEEP MODEL [--variant V]``)."""
        return localised_mod.command(self.sweep_id, self.model_id or self.key, self.variant)

    def needed_dtypes(self) -> dict[str, str]:
        """``dtype::<dtype>`` of each dtype the census' signatures name -> the first operator
        whose signature names it (what a stack must hold for that call to run)."""
        needs: dict[str, str] = {}
        for op, dtypes, *_ in self.signatures:
            for name in census.signature_dtypes(dtypes or ""):
                needs.setdefault(f"{census.DTYPE_NAMESPACE}{name}", op)
        return needs

    @property
    def complete(self) -> bool:
        """A census of a run that completed (the row's own, or completed by its CPU reference's)."""
        return self.ops is not None and self.source in (census.RUN, census.REFERENCE)

    @property
    def died(self) -> bool:
        """Its kernel died (a runtime abort): it raised nothing, its census died with it."""
        return self.error_type == DEAD_KERNEL

    @property
    def passes(self) -> bool:
        """Predicted PASS with nothing wrong: no wrong operator, no diverging output."""
        return self.predicted == schema.PASS and not self.blockers and not self.diverges

    @property
    def unlockable(self) -> bool:
        """Fixing its blockers makes it a predicted PASS, as far as the census can tell: its
        census is complete, or it has none because its kernel died at the operator its failure
        names (the CPU reference passed)."""
        if not self.blockers:
            return False
        return self.complete or (self.ops is None and self.died and self.stopped is not None)

    def requirements(self) -> tuple[list[str], list[str]]:
        """(operators, stages) the model needs of a stack, in the order a run needs them: its
        census, then the operator that stopped it when the census lacks it (a sweep from before
        census.completed)."""
        ops, stages = list(self.ops or []), list(self.stages or ["generate"] * len(self.ops or []))
        if self.stopped and self.stopped not in ops:
            ops.append(self.stopped)
            stages.append(self.failure_stage or "generate")
        for op in self.learned:  # found by running it with operators on the host
            if op not in ops:
                ops.append(op)
                stages.append("generate")
        return ops, stages

    def as_json(self) -> dict:
        return {
            "ops_missing": self.ops_missing,
            "ops_crashing": self.ops_crashing,
            "ops_wrong": self.ops_wrong,
            "ops_fallback": self.ops_fallback,
            "predicted": self.predicted,
            # what its what-if runs found, where they ran (``ops.proof``): the operators a run then
            # stopped at, the sweep whose complete census it uses
            **({"learned": self.learned} if self.learned else {}),
            **({"completed_by": self.completed_by} if self.completed_by else {}),
            # where a switch of the stack decides an operator's status: which, and the switch
            # (``StackCoverage``)
            **({"notes": self.notes} if self.notes else {}),
        }


def sweep_models(data_dir: Path, sweep_id: str) -> list[ModelOps]:
    """The sweep's result rows (the Parquet dataset: compacted at the end of every sweep), one
    per (model, variant), with their census, the coverage their own stack recorded, what
    ``model-support localise`` found in them (``localised``, from the sweep's folder) and what
    its what-if sweeps found (``ops.proof``: a complete census from a ``host_ops: missing`` run
    replaces a stopped one; operators a run then stopped at are ``learned``); none for a sweep
    with no result rows (a caller refuses an unknown id: a pulled dataset has rows and no
    sweep.json)."""
    import polars as pl

    frame = (
        store.scan(data_dir, "results")
        .filter(pl.col("sweep_id") == sweep_id)
        .select(COLUMNS)
        .sort("model_id")
    )
    models = [_model(r) for r in frame.collect().rows(named=True)]
    found = localised_mod.answers(data_dir, sweep_id)
    ran = proof_mod.runs(data_dir, sweep_id)
    for m in models:
        m.sweep_id = sweep_id
        if m.key in found:
            m.localised = localised_mod.wrong_ops(found[m.key])
        with_runs(m, ran.get(m.key, []))
    # an operator one run stopped at that another run of this stack ran on its device is no missing
    # operator (a flaky failure, a model's own error): review found one flake learned as 'missing'
    # and its step 'confirmed'
    fine = {
        proof_mod.packet(op)
        for r in (*models, *(_model(dict(run.row)) for rs in ran.values() for run in rs))
        for op in r.ops or ()
        if op not in (r.ops_missing or ())
    }
    for m in models:
        m.learned = {op: kind for op, kind in m.learned.items() if proof_mod.packet(op) not in fine}
    return models


def with_runs(m: ModelOps, runs: list[proof_mod.Run]) -> None:
    """What its what-if runs say of ``m``: the census of its latest complete ``host_ops:
    missing`` run instead of a stopped one (the run went on to its end, so its census lists every
    operator the stack lacks), and the operators a run stopped at that were not on the host
    (``learned``)."""
    m.runs = runs
    done = proof_mod.completed(runs)
    if done is not None and m.source != census.RUN:
        r = _model(dict(done.row))
        m.ops, m.stages, m.calls, m.source, m.signatures = (
            r.ops,
            r.stages,
            r.calls,
            r.source,
            r.signatures,
        )
        m.ops_missing = list(dict.fromkeys([*r.ops_missing, *m.ops_missing]))
        m.ops_fallback, m.ops_unknown = r.ops_fallback, r.ops_unknown
        m.completed_by = done.sweep_id
    m.learned = proof_mod.learned(runs)
    known = {entry[0] for entry in m.signatures}
    for run in runs:  # the signatures it stopped at, from that run's census
        stopped = (
            _model(dict(run.row)).signatures
            if run.learned in m.learned and run.learned not in known
            else []
        )
        m.signatures += [entry for entry in stopped if entry[0] == run.learned]
        known |= {entry[0] for entry in stopped}


def _model(r: dict) -> ModelOps:
    """A row's ``ModelOps``."""
    return ModelOps(
        key=store.pending_key(r["model_id"], r["variant"]),
        model_id=r["model_id"],
        variant=r["variant"],
        status=r["status"],
        device_type=r["device_type"],
        ops=r["ops"],
        stages=r["ops_stages"],
        calls=r["ops_calls"],
        source=r["ops_source"],
        ops_missing=list(r["ops_missing"] or []),
        ops_fallback=list(r["ops_fallback"] or []),
        ops_unknown=list(r["ops_unknown"] or []),
        dtype=r["dtype"],
        attribution=r["attribution"],
        failure_stage=r["failure_stage"],
        error_type=r["error_type"],
        numerics=r["numerics"],
        stopped=census.stopped_by(r),
        signatures=list(zip(*(r[f] or [None] * len(r["ops_sig_ops"]) for f in census.SIG_FIELDS)))
        if r.get("ops_sig_ops") is not None
        else [],
    )


def census_ops(models: list[ModelOps]) -> list[str]:
    """What to ask a stack about, once each: every operator the models' censuses name, the
    operators their failures name, and their dtypes (``dtype::bfloat16``)."""
    names = [op for m in models for op in m.requirements()[0]]
    dtypes = [f"{census.DTYPE_NAMESPACE}{m.dtype}" for m in models if m.dtype]
    named = [name for m in models for name in m.needed_dtypes()]  # the dtypes the signatures name
    return list(dict.fromkeys([*names, *dtypes, *named]))


def recorded_coverage(models: list[ModelOps]) -> dict[str, str]:
    """The coverage the sweep's own stack recorded on its rows (``ops_missing``,
    ``ops_fallback``, ``ops_unknown``; the operator a failure of the stack's names: crashing
    where its kernel died, else missing; every other operator implemented)."""
    coverage = dict.fromkeys(census_ops(models), IMPLEMENTED)
    for m in models:
        coverage.update(dict.fromkeys(m.ops_unknown, UNKNOWN))
    for m in models:
        coverage.update(dict.fromkeys(m.ops_fallback, FALLBACK))
    for m in models:
        coverage.update(dict.fromkeys(m.ops_missing, MISSING))
    for m in models:
        if m.stopped is not None:
            coverage[m.stopped] = CRASHES if m.died else MISSING
    return coverage


def predict(models: list[ModelOps], coverage: dict[str, str] | None = None) -> list[ModelOps]:
    """Each model's missing, crashing, wrong and fallback operators on the stack ``coverage``
    describes (None: the sweep's own, as its rows recorded it), its predicted verdict and its
    blockers (see the module docstring). Changes ``models`` in place."""
    own = coverage is None
    coverage = recorded_coverage(models) if coverage is None else coverage
    for m in models:
        _predict(m, coverage, own)
    return models


def _predict(m: ModelOps, coverage: dict[str, str], own: bool) -> None:
    """One model's prediction (``predict``)."""
    ops, stages = m.requirements()
    status_of = {op: coverage.get(op, UNKNOWN) for op in ops}
    said = getattr(coverage, "notes", {})  # a StackCoverage's: what a switch of the stack decides
    m.notes = {op: said[op] for op in ops if op in said}
    # a what-if run of this model stopped there, with it not on the host: a stop for this model
    if own:
        status_of |= {
            op: fault for op, fault in m.learned.items() if status_of.get(op) not in STOPS
        }
    # wrong for this model, as localise found it, whatever its verdict (a stop stays a stop)
    if own and m.localised:
        ops += [op for op in m.localised if op not in status_of]
        stages += ["generate"] * (len(ops) - len(stages))
        status_of |= {op: WRONG for op in m.localised if status_of.get(op) not in STOPS}
    m.ops_missing = [op for op in ops if status_of[op] == MISSING]
    m.ops_crashing = [op for op in ops if status_of[op] == CRASHES]
    m.ops_wrong = [op for op in ops if status_of[op] == WRONG]
    m.ops_fallback = [op for op in ops if status_of[op] == FALLBACK]
    m.ops_unknown = [op for op in ops if status_of[op] == UNKNOWN]
    dtype = census.dtype_name(m.dtype)
    refused = [dtype] if dtype is not None and coverage.get(dtype) == MISSING else []
    # a dtype some calls use (the signatures) that the stack refuses stops the run at the first of
    # those calls
    late = {
        n: op
        for n, op in m.needed_dtypes().items()
        if coverage.get(n) == MISSING and n not in refused
    }
    stop_at = {op: op for op in ops if status_of[op] in STOPS}
    for name, op in late.items():
        stop_at.setdefault(op, name)
    stops = [op for op in ops if op in stop_at]
    m.faults = {
        **dict.fromkeys(refused, MISSING),
        **{op: status_of[op] for op in ops if status_of[op] in (MISSING, CRASHES, WRONG)},
        **dict.fromkeys(late, MISSING),
    }
    m.blockers = list(m.faults)
    m.first_missing = next(iter([*refused, *(stop_at[op] for op in stops)]), None)
    m.diverges = own and m.diverging and not m.ops_wrong
    if refused:  # the weights' copy is the first thing a run puts on the device
        m.predicted = schema.FAIL_LOAD
    elif stops:
        first = stops[0]
        stage = (
            stages[ops.index(first)]
            if status_of[first] != CRASHES or stop_at[first] != first
            else "runner"
        )
        m.predicted = STAGE_VERDICT.get(stage, schema.FAIL_OTHER)
    # no census: the recorded failure, or nothing to say of a PASS
    elif m.ops is None and m.stopped is None:
        m.predicted = UNKNOWN_VERDICT if m.status == schema.PASS or m.status is None else m.status
    # its kernel died at an operator that runs here: nothing says what follows it
    elif m.ops is None:
        m.predicted = UNKNOWN_VERDICT
    # the stack's verdict stands (a failure naming no operator); or its own failure
    elif own or not m.complete:
        m.predicted = m.status or UNKNOWN_VERDICT
    else:
        m.predicted = schema.PASS


#: How long the child that reads a stack's coverage may take (it imports torch and loads one
#: backend).
COVERAGE_TIMEOUT_S = 300.0


class StackCoverage(dict):
    """A stack's coverage (operator -> status), with ``notes``: per operator whose status a
    switch of the stack decides, the sentence its adapter says (``Adapter.coverage_with_notes``:
    an operator only the stack's boxed fallback catches is missing while that fallback is off,
    "... makes it a CPU fallback"). ``predict`` gives each model the notes on its operators
    (``ModelOps.notes``), and the plan's steps say them."""

    def __init__(self, coverage: dict[str, str], notes: dict[str, str] | None = None):
        super().__init__(coverage)
        self.notes = dict(notes or {})


def stack_coverage(device: str, ops: list[str]) -> StackCoverage:
    """What this machine's ``device`` stack does with each of ``ops``, asked of a child process
    that loads its backend (the device itself need not be present: the registrations are the
    backend's, a TPU's are read without a TPU), with the adapter's notes (``StackCoverage``). One
    sentence (``UserError``) when the backend cannot be loaded or does not answer in time."""
    env = backend_env.child_environ()  # the child loads only this device's backend
    argv = [sys.executable, "-m", "model_support.ops", device]
    try:
        answer = children.last_json(
            argv, "its backend", COVERAGE_TIMEOUT_S, input=json.dumps(ops), env=env
        )
    except children.ChildFailed as exc:
        raise UserError(
            f"The {device} stack's coverage could not be read here: {str(exc).rstrip('.')}."
        ) from None
    if "problem" in answer:
        raise UserError(answer["problem"])
    return StackCoverage(answer["coverage"], answer.get("notes"))


def child(device: str, ops: list[str]) -> dict:
    """In the child: load ``device``'s backend and ask its adapter (``coverage_with_notes``: its
    ``op_coverage`` and what a switch of the stack decides)."""
    from ..probe import devices

    if device == "auto":
        return {
            "problem": "--on needs a device's name (cpu, cuda, tpu, or a backend's own), not auto."
        }
    if device != "cpu" and not devices.known_device(device):
        return {"problem": devices.unknown_device(device)}
    adapter = devices.adapter_for(device)
    if device != "cpu":
        try:
            devices.load_backend(device)
        except devices.DeviceUnavailable as exc:
            return {"problem": str(exc)}
    try:
        coverage, notes = adapter.coverage_with_notes(ops)
        return {"coverage": coverage, "notes": notes}
    except devices.DeviceUnavailable as exc:
        return {"problem": str(exc)}
