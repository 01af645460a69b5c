"""What running with operators on the host says of a sweep's plan: the what-if sweeps of a stack's
sweep, read back.

``model-support ops SWEEP --prove`` (``ops.prove``) runs each plan step's operators, cumulatively,
on the host of the sweep's device (a what-if sweep: the probe setting ``host_ops``,
``probe.what_if``) over the models the step unlocks; ``--complete`` runs the blocked models once
with ``host_ops: missing`` (every operator the stack lacks on the host), so each runs to its end and
its census lists everything it needs. Those sweeps are the stack's sweep's evidence, named in its
folder in ``proof.json`` (written atomically, the stack's records never touched): ``{"version",
"sweep_id", "runs": [{"sweep_id", "host_ops", "models", "purpose", "at"}], "steps": [...]}``: every
what-if sweep run for it, and the last proof's steps as they ran (their ``said`` is what was judged
then: a reader judges again from the records, which are the truth).

What a run says of a model (``Run``, one what-if row): it PASSes and agrees with the CPU reference
(``right``: numerics ``match``, ``rerun_wrong``, the judgement ``model-support localise`` gives its
own reruns with operators on the host, so the two never contradict each other; a PASS that ties,
diverges or was not checked is not), or it stops at an operator that was not on the host
(``failed_at``: one the census did not see, a blocker of that model, ``learned``), or it fails for a
reason no operator on the host fixes (``stuck``: the operator it stops at was on the host, wrong
numbers, memory, a failure that names no operator). A run of another stack than the sweep's (its
what-if sweep's versions or device configuration differ) is no evidence and is left out.

A step is confirmed only when every model it is predicted to unlock has a run with exactly its
cumulative operator set on the host (``host_ops`` as written, each operator registered:
``host_ops_run``) that is right (``judge``).
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .. import fileio
from ..probe import agreement, census, long_text, provenance
from ..probe.model_ids import display_name
from ..record import schema, store
from ..record.ops_table import CRASHES, MISSING
from ..record.sweep_meta import SweepMeta

#: The file in a stack's sweep folder naming its what-if sweeps.
PROOF_FILE = "proof.json"
VERSION = 1
#: ``host_ops``' word for every operator the stack lacks (``probe.what_if.MISSING``, not imported:
#: it imports torch's side of the probe).
MISSING_SETTING = "missing"
#: A run's purposes: the complete census, or a plan step's proof.
COMPLETE = "complete"
#: The error type of a row whose kernel died (``coverage.DEAD_KERNEL``).
DEAD_KERNEL = "DeadKernelError"
#: A step's outcomes.
CONFIRMED, NOT_CONFIRMED, PREDICTED = "confirmed", "not confirmed", "predicted"
#: The what-if row's columns read here, beside the census.
COLUMNS = (
    "sweep_id",
    "model_id",
    "variant",
    "status",
    "numerics",
    "error_type",
    "error_message",
    "attribution",
    "failure_stage",
    "crash_operator",
    "exclusion_reason",
    "what_if",
    "host_ops",
    "host_ops_run",
    "host_ops_note",
    "host_op_names",
    "host_op_calls",
    "host_op_calls_per_token",
    "dtype",
    "device_type",
    "long_text_prefill_diverges_at",
    "long_text_decode_diverges_at",
    "long_text_rate",
    "long_text_note",
    "long_text_tokens",
    *census.FIELDS,
    "ops_missing",
    "ops_fallback",
    "ops_unknown",
)


def path(data_dir, sweep_id: str) -> Path:
    """A stack sweep's ``proof.json``."""
    return store.sweep_dir(data_dir, sweep_id) / PROOF_FILE


def read(data_dir, sweep_id: str) -> dict:
    """A stack sweep's ``proof.json`` ({"runs": [], "steps": []} where there is none, or it
    cannot be read)."""
    try:
        found = json.loads(path(data_dir, sweep_id).read_text())
    except (OSError, ValueError):
        found = None
    if not isinstance(found, dict):
        return {"version": VERSION, "sweep_id": sweep_id, "runs": [], "steps": []}
    return {"version": VERSION, "sweep_id": sweep_id, "runs": [], "steps": [], **found}


def write(data_dir, sweep_id: str, proof: dict) -> None:
    """Write ``proof`` atomically (a reader sees the old file or the new one, never half of one)."""
    fileio.atomic_write_json(
        path(data_dir, sweep_id), {**proof, "version": VERSION, "sweep_id": sweep_id}
    )


def add_run(proof: dict, sweep_id: str, setting: str, models: list[str], purpose: str) -> None:
    """Name a what-if sweep in ``proof`` (once: a resumed one keeps its entry)."""
    if any(r.get("sweep_id") == sweep_id for r in proof["runs"]):
        return
    at = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    proof["runs"].append(
        {"sweep_id": sweep_id, "host_ops": setting, "models": models, "purpose": purpose, "at": at}
    )


#: How a what-if sweep's description starts (``prove``): the stack's sweep it was run for, then what
#: for.
DESCRIBED = "what-if of "


def description(sweep_id: str, purpose: str, host_ops: str) -> str:
    """A what-if sweep's description in its sweep.json: ``what-if of SWEEP: step 2,
    host_ops=aten::gelu,...``."""
    return f"{DESCRIBED}{sweep_id}: {purpose}, host_ops={host_ops}"


def proven_sweeps(data_dir, what_if_ids: Iterable[str]) -> dict[str, str]:
    """{what-if sweep: the stack's sweep it was run for} of ``what_if_ids`` where that is known:
    the sweep whose ``proof.json`` names it, else the one its own sweep.json's description names
    (``description``). A what-if sweep run by hand (``sweep -p host_ops=...``) proves no sweep:
    not in the answer."""
    wanted = set(what_if_ids)
    found: dict[str, str] = {}
    if not wanted:
        return found
    for named in sorted((Path(data_dir) / "sweeps").glob(f"*/{PROOF_FILE}")):
        for run in read(data_dir, named.parent.name).get("runs") or []:
            if isinstance(run, dict) and run.get("sweep_id") in wanted:
                found.setdefault(run["sweep_id"], named.parent.name)
    for sweep_id in sorted(wanted - set(found)):
        try:
            said = json.loads((store.sweep_dir(data_dir, sweep_id) / "sweep.json").read_text()).get(
                "description"
            )
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(said, str) and said.startswith(DESCRIBED) and ":" in said:
            stack = said.removeprefix(DESCRIBED).split(":", 1)[0].strip()
            if stack and stack != sweep_id:
                found[sweep_id] = stack
    return found


def setting(ops: Iterable[str]) -> str:
    """The ``host_ops`` setting of a set of operators: sorted, comma-separated (one spelling per
    set)."""
    return ",".join(sorted(set(ops)))


def packet(name: str) -> str:
    """An operator's packet: ``aten::add`` of ``aten::add.Tensor``."""
    namespace, _, rest = name.partition("::")
    return f"{namespace}::{rest.split('.', 1)[0]}" if rest else name


def _stack(meta: SweepMeta) -> tuple:
    """What makes a sweep's stack, comparable: the stack's package versions and the device backends'
    configuration (JSON values compared as data)."""

    def data(value):
        try:
            return json.dumps(json.loads(value), sort_keys=True)
        except (TypeError, ValueError):
            return value

    versions = tuple(
        (name, (meta.versions or {}).get(name)) for name in ("python", *provenance.PACKAGES)
    )
    return versions, tuple(sorted((k, data(v)) for k, v in (meta.device_config or {}).items()))


def same_stack(a: SweepMeta, b: SweepMeta) -> bool:
    """Two sweeps ran on one stack (package versions and backend configuration)."""
    return _stack(a) == _stack(b)


@dataclass(frozen=True)
class Run:
    """One what-if row of a model: what ran on the host and what came of it."""

    sweep_id: str
    setting: str  # ``host_ops`` as the sweep asked it
    registered: tuple[str, ...]  # ``host_ops_run``: the operator forms registered on the host
    status: str | None
    numerics: str | None
    failed_at: str | None  # the operator it stopped at (its error's, or the one its kernel died in)
    died: bool
    error: str
    called: tuple[str, ...]  # ``host_op_names``: the host operators called
    calls_per_token: float | None
    excluded: str | None = None
    row: Mapping = field(default_factory=dict, compare=False, repr=False)

    @property
    def hosted(self) -> set[str]:
        """The operators the run asked on the host (for ``missing``: the packets it registered)."""
        if self.setting.strip() == MISSING_SETTING:
            return {packet(name) for name in self.registered}
        return {name.strip() for name in self.setting.split(",") if name.strip()}

    def on_host(self, op: str) -> bool:
        """``op`` (a census name) ran on the host in this run."""
        hosted = self.hosted
        return op in hosted or packet(op) in hosted

    @property
    def right(self) -> bool:
        """It PASSed and agrees with the CPU reference (``rerun_wrong``: numerics ``match``)."""
        return self.status == schema.PASS and rerun_wrong(True, self.numerics, self.row) is None

    @property
    def learned(self) -> str | None:
        """The operator it then stopped at, not on the host in this run: a blocker its census did
        not show."""
        if self.failed_at is None or self.on_host(self.failed_at):
            return None
        return self.failed_at

    @property
    def stuck(self) -> str | None:
        """What keeps it that no operator on the host fixes, in words; None when it is right,
        when it stopped at an operator that was not on the host, or was not run."""
        if self.right or self.learned is not None or self.excluded:
            return None
        if self.status == schema.PASS:
            return rerun_wrong(True, self.numerics, self.row)
        if self.failed_at is not None:
            return f"it still fails at {self.failed_at}, which was on the host: {self.error}"
        return f"{self.status}, naming no operator: {self.error}"

    def hosted_words(self) -> str:
        """The operators it called on the host, with their calls per token: ``aten::rsqrt,
        aten::gelu; 9.0 calls per token``."""
        names = ", ".join(self.called) or "none called"
        cpt = (
            f"; {self.calls_per_token:.1f} calls per token"
            if self.calls_per_token is not None
            else ""
        )
        return names + cpt


def rerun_wrong(ran: bool, numerics: str | None, row: Mapping | None = None) -> str | None:
    """The one judgement of a run with operators on the host, whoever ran it: ``ops --prove``'s
    what-if run (a probe's verdict and numerics, ``Run.right``) and ``model-support localise``'s
    proof (its replay of the run, ``debug.localise_proof.prove``) alike, so the two never
    contradict each other over the tokens. None when it is right: it ran to its end (``ran``) and
    its output agrees with the CPU reference over every step it generated (numerics ``match``)
    and, where its ``row`` ran the long text or could have, over the text too
    (``long_text.proven``: a wrong operator only the long text saw is proven fixed only there; a
    stray position or two is no fault, and a long text that could run and did not proves
    nothing); else why not, in words. ``localise`` passes no row: it judges its own replay, which
    follows decode to the divergence it chases; where the two disagree over the long text, ``ops
    --prove``'s reading of the whole text is the plan's. A proof takes no ``ties``: flips at
    near-ties are what flat logits make of any wrong kernel (review confirmed a step so), and a
    run whose numbers were not checked proves nothing."""
    if not ran:
        return "it did not run to its end"
    if numerics == agreement.MATCH:
        return _long_text_wrong(row or {})
    if numerics == agreement.DIVERGES:
        return "its output diverges from the CPU reference"
    if numerics == agreement.TIES:
        return "its tokens flip from the CPU reference's (at near-ties): no proof that it is right"
    if numerics is not None and numerics == getattr(agreement, "TOO_FLAT", None):
        return "its reference's logits are too flat to judge it by: no proof that it is right"
    return (
        f"its numbers were not checked against the CPU reference (numerics: {numerics or 'none'})"
    )


def _long_text_wrong(row: Mapping) -> str | None:
    """Why a run's long text proves it not right (``rerun_wrong``), None where it agrees or was
    not asked for. A long text that cannot run for this model (``not run: ...``: sharded, too few
    positions, no reference) was never part of its answer, so it asks nothing; one that could and
    did not (the device raised on it) proves nothing."""
    note = row.get("long_text_note")
    if note is None or (row.get("long_text_rate") is None and note.startswith("not run:")):
        return None
    rate = row.get("long_text_rate")
    if rate is None:
        return f"its long text did not run ({note[:160]}): no proof over the text"
    if long_text.proven(rate, row.get("long_text_tokens")):
        return None
    found = [row.get(f"long_text_{path}_diverges_at") for path in ("prefill", "decode")]
    first = min((p for p in found if p is not None), default=None)
    where = f", first at position {first}" if first is not None else ""
    return (
        f"its long text still diverges from the CPU reference (rate {rate:.3f}, at least "
        f"{1 - long_text.tolerance(row.get('long_text_tokens')):.3f}{where})"
    )


def _error(row: Mapping) -> str:
    """A failure in a line: its error type and its message's first line."""
    message = ((row.get("error_message") or "").strip().splitlines() or [""])[0]
    said = f"{row.get('error_type') or row.get('status') or ''}: {message}".strip(": ")
    return said[:200]


def run_of(row: Mapping) -> Run:
    """A what-if row's ``Run``."""
    died = row.get("error_type") == DEAD_KERNEL
    failed_at = census.stopped_by(row) or (row.get("crash_operator") if died else None)
    if (
        failed_at is None
        and row.get("status") not in (schema.PASS, None)
        and row.get("attribution") != "model"
    ):
        failed_at = census.operator_named(row.get("error_message"))
    return Run(
        sweep_id=row["sweep_id"],
        setting=row.get("host_ops") or "",
        registered=tuple(row.get("host_ops_run") or ()),
        status=row.get("status"),
        numerics=row.get("numerics"),
        failed_at=failed_at,
        died=died,
        error=_error(row),
        called=tuple(row.get("host_op_names") or ()),
        calls_per_token=row.get("host_op_calls_per_token"),
        excluded=row.get("exclusion_reason"),
        row=row,
    )


def runs(data_dir, sweep_id: str, proof: dict | None = None) -> dict[str, list[Run]]:
    """Every what-if run ``proof.json`` names for the stack sweep ``sweep_id``, by the plan's
    model key, in the order they ran: its what-if rows (and its excluded ones), from sweeps that
    ran on the sweep's own stack."""
    import polars as pl

    proof = read(data_dir, sweep_id) if proof is None else proof
    named = [r["sweep_id"] for r in proof.get("runs") or [] if r.get("sweep_id")]
    if not named:
        return {}
    own = sweep_meta(data_dir, sweep_id)
    kept = [s for s in named if own is not None and is_evidence(own, sweep_meta(data_dir, s))]
    order = {s: i for i, s in enumerate(kept)}
    frames = [
        store.scan(data_dir, config)
        .filter(pl.col("sweep_id").is_in(kept))
        .select(COLUMNS)
        .collect()
        for config in (store.WHAT_IF_CONFIG, "excluded")
    ]
    rows = [r for frame in frames for r in frame.rows(named=True)]
    found: dict[str, list[Run]] = {}
    for r in sorted(rows, key=lambda r: order[r["sweep_id"]]):
        found.setdefault(store.pending_key(r["model_id"], r["variant"]), []).append(run_of(r))
    return found


def is_evidence(own: SweepMeta, other: SweepMeta | None) -> bool:
    """A sweep ``proof.json`` names is evidence for the stack's sweep ``own``: a what-if sweep
    (its definition put operators on the host) that ran on the same stack."""
    return other is not None and bool(other.probe.get("host_ops")) and same_stack(own, other)


def sweep_meta(data_dir, sweep_id: str) -> SweepMeta | None:
    """A sweep's definition, or None where its folder is gone or unreadable (no evidence then)."""
    try:
        return store.read_sweep(Path(data_dir), sweep_id)
    except Exception:  # noqa: BLE001 a sweep folder gone or unreadable: no evidence
        return None


def completed(found: list[Run]) -> Run | None:
    """The latest ``missing`` run with a complete census (its own run to the end, or completed by
    its reference)."""
    for run in reversed(found):
        if run.setting.strip() == MISSING_SETTING and run.row.get("ops") is not None:
            if run.row.get("ops_source") in (census.RUN, census.REFERENCE):
                return run
    return None


def learned(found: list[Run]) -> dict[str, str]:
    """The operators the runs stopped at that were not on the host: op -> missing, or crashes
    where the kernel died in it."""
    ops: dict[str, str] = {}
    for run in found:
        if run.learned is not None:
            ops.setdefault(run.learned, CRASHES if run.died else MISSING)
    return ops


def on_host(found: list[Run]) -> Run | None:
    """The right run with the fewest operators called on the host (the latest of those): the
    model runs so."""
    right = [r for r in found if r.right]
    return min(reversed(right), key=lambda r: len(r.called)) if right else None


def stuck(found: list[Run]) -> str | None:
    """What no operator on the host fixes, from the latest run (None when it is right, learnable
    or none ran)."""
    return found[-1].stuck if found else None


@dataclass
class StepProof:
    """A step judged from its runs: ``outcome`` (confirmed, not confirmed, predicted: no run with
    its operators), ``said`` (the sentence), the models found right, and those that were not with
    why."""

    outcome: str
    said: str
    right: list[str]
    wrong: dict[str, str]
    sweep_ids: list[str]
    learned: dict[str, str] = field(default_factory=dict)


def model_word(key: str, run: Run | None, cumulative: set[str]) -> str | None:
    """Why ``run`` does not confirm a step for ``key`` (None: it does)."""
    name = display_name(key)
    if run is None:
        return f"{name} has no what-if record with these operators on the host"
    if run.excluded:
        return f"{name} was not run: {run.excluded}"
    missing = [op for op in sorted(cumulative) if not _registered(run, op)]
    if missing:
        return (
            f"{name}'s run did not put {', '.join(missing)} on the host "
            f"({(run.row.get('host_ops_note') or '')[:160]})"
        )
    if run.right:
        return None
    if run.learned is not None:
        return f"{name} then fails at {run.learned}, which the census did not see"
    return f"{name}: {run.stuck}"


def _registered(run: Run, op: str) -> bool:
    """``op`` (a census name, or a packet) had a kernel registered on the host in ``run``."""
    return any(
        form == op or packet(form) == op or form == f"{op}.default" for form in run.registered
    )


def judge(
    cumulative: Iterable[str],
    keys: list[str],
    found: Mapping[str, list[Run]],
    sweeps: list[str] | None = None,
) -> StepProof:
    """A step whose operators, cumulatively ``cumulative``, are predicted to unlock ``keys``:
    confirmed when each ran with exactly that set on the host (``sweeps``: only those what-if
    sweeps' runs) and every such run of it is right; predicted when none ran with it; else not
    confirmed, each model that was not right said with why."""
    wanted = setting(cumulative)
    chosen: dict[str, Run | None] = {}
    for key in keys:
        candidates = [
            r
            for r in found.get(key, [])
            if r.setting == wanted and (sweeps is None or r.sweep_id in sweeps)
        ]
        # every run with the set must be right: the first that is not (a flaky one among them) is
        # what is said
        chosen[key] = next(
            (r for r in candidates if model_word(key, r, set(cumulative))), None
        ) or (candidates[-1] if candidates else None)
    ran = sorted({r.sweep_id for r in chosen.values() if r is not None})
    if not ran:
        return StepProof(
            PREDICTED, "predicted: not run with these operators on the host yet", [], {}, []
        )
    words = {key: model_word(key, run, set(cumulative)) for key, run in chosen.items()}
    right = [key for key, said in words.items() if said is None]
    wrong = {key: said for key, said in words.items() if said is not None}
    count = (
        f"{len(right)} of 1 predicted model PASSes and agrees with the reference"
        if len(keys) == 1
        else f"{len(right)} of {len(keys)} predicted models PASS and agree with the reference"
    )
    new = {
        key: run.learned
        for key, run in chosen.items()
        if run is not None and run.learned and key in wrong
    }
    if not wrong:
        return StepProof(CONFIRMED, f"confirmed: {count}", right, {}, ran)
    return StepProof(
        NOT_CONFIRMED,
        f"not confirmed: {'; '.join(wrong.values())} ({count})",
        right,
        wrong,
        ran,
        new,
    )
