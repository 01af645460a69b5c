"""The one decision: how each (model, variant) stands between a baseline sweep A and a later sweep
B.

Why one module: the gate a CI runs (``diff --fail-on``), the nightly, the report's standing and the
perf comparison each used to decide for themselves, and their copies disagreed (an expectation
``verdict: PASS`` was "unexpectedly passing" in one and nothing in another; a model excluded in A
and failing in B was "new" in one and "neither" in another). Here the decision is a pure function of
two ``Run`` states, an expectation and a date (``decide``), its table tested as data
(tests/test_decision.py), and everything else reads it.

A run's state in one sweep (``STATES``): its verdict (``PASS``, ``suspect PASS``: its logits diverge
from the reference or its text is not fluent, or one of the three failures), or why it has none:
``excluded`` (a row of the ``excluded`` config: the environment, a budget, a mode the stack lacks),
``not run`` (in the sweep's definition, no row yet: pending or never reached; ``--resume`` finishes
it), ``absent`` (not in the sweep's definition) or ``no row`` (no row, and the sweep's definition is
not here to say why: a dataset pulled from the Hub).

The rules, in order (the first that applies):

1. **B not finished is no passing gate**: a run still to run in B is ``not run`` and fails under
   every gate word, with how to finish it.
2. **Excluded in either sweep counts in neither direction** (the environment is never a verdict):
   ``excluded``, named, failing no gate.
3. **Nothing vanishes silently**: a run with a verdict in A and none in B is ``dropped`` when B's
   definition left it out (failing only ``--fail-on dropped``) and ``vanished`` when nothing says
   why (failing ``regressions`` and ``new-failures``).
4. A live expectation (not past its ``until``) whose verdict is B's makes it ``expected`` (a PASS
   expected as a PASS too); one whose verdict B's clean PASS is not makes it ``unexpectedly
   passing`` (said, never failing). An expectation with another verdict counts as none, and the line
   says what was expected.
5. **Flaky means it passed once**: B's attempts (``sweep.reruns``) include a clean PASS and a run
   that was not: ``flaky``, said, failing nothing. Attempts that fail differently are the worse
   failure, and count. A run flaky in A passed there once: B failing it outright is a
   ``regression``.
6. Otherwise by verdicts: A clean PASS, B not (a failure or a suspect PASS): ``regression`` (fails
   ``regressions`` and ``new-failures``); no verdict in A, B not passing: ``new failure`` (fails
   ``new-failures``); A not passing, B a clean PASS: ``fixed``; both not passing: ``still failing``;
   both passing: ``passing``.

Two sweeps are gated only when alike (``refuse_unlike``): runs of another device, dtype or mode are
refused in one sentence before anything is judged, unless ``--across`` names the setting (the
variant names neither the device nor the dtype, so a FAIL on one device read as a regression of a
PASS on another).

Performance (``perf_change``): two PASS runs' repeats are compared only when they are like (the same
``perf_tokens``, device, mode, dtype, stack of a several-stack sweep, clock and input: prompt, chat
template used, ``tokens_in``); otherwise ``not comparable`` with what differs. A tokens/s derived
from TTFT and TPOT (one-token repeats) is not judged: they are (``analysis.perf.judged``). Like runs
are decided from their medians against the threshold *and* a noise estimate taken from both sweeps'
repeats: ``slower`` / ``faster`` when the medians moved by more than both, ``within noise``
otherwise (the line says when the noise, not the threshold, decided: more repeats would tell). The
noise is each median's standard error (1.2533 x sigma / sqrt(n), sigma the standard deviation of the
repeats less the one farthest from their median, corrected for what that leaves out:
``_TRIMMED_SIGMA``), the two combined as independent errors, times ``NOISE_SIGMAS`` (4). Medians,
not the ranges the gate once compared: one disturbed repeat of three moves a range without bound,
and a median not at all; a standard error, not one repeat's spread: more repeats narrow it, so a
small slowdown is caught by asking for more (``perf_repeats``). Left as it is: between two sweeps a
host's load can move every repeat of one sweep at once, which no repeat shows; the threshold covers
that, and on a busy host a larger one is needed (tests/test_perf_host_clock.py). Within one phase a
level shift moves several repeats together, and the noise estimate assumes independent repeats:
simulated (review, 2026-12-07), 1% noise with a 10% shift in half the phases reads as slower 3.5% of
the time at the 5% threshold with the budget stopping at three repeats, 9-11% with no budget; a
phase that ends unsettled could widen the bound by its spread (not done yet).
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ..probe.performance import spread  # noqa: F401 (the record's *_spread, read by the perf comparison)
from ..record import schema

#: A PASS whose logits diverge from the reference or whose text is not fluent: a state, and an
#: expectation's verdict.
SUSPECT_PASS = "suspect PASS"


class Expectation(Protocol):
    """An expected verdict (``analysis.expectations.Expectation``, which reads the YAML): what
    the decision needs."""

    @property
    def verdict(self) -> str: ...

    @property
    def reason(self) -> str: ...

    @property
    def until(self) -> _dt.date | None: ...


# --------------------------------------------------------------------------------------------
# the states of a run in one sweep

EXCLUDED = "excluded"
NOT_RUN = "not run"
ABSENT = "absent"
NO_ROW = "no row"
#: Every state a run can be in, in one sweep: a verdict, or why there is none.
STATES = (schema.PASS, SUSPECT_PASS, *schema.VERDICTS[1:], EXCLUDED, NOT_RUN, ABSENT, NO_ROW)
#: The states that carry a verdict.
VERDICT_STATES = (schema.PASS, SUSPECT_PASS, *schema.VERDICTS[1:])

# --------------------------------------------------------------------------------------------
# the vocabulary of a change

REGRESSION = "regression"
NEW_FAILURE = "new failure"
VANISHED = "vanished"
DROPPED = "dropped"
NOT_RUN_IN_B = "not run"
EXCLUDED_CHANGE = "excluded"
FLAKY = "flaky"
EXPECTED = "expected"
EXPIRED = "expired"
UNEXPECTEDLY_PASSING = "unexpectedly passing"
FIXED = "fixed"
STILL_FAILING = "still failing"
PASSING = "passing"
#: Every kind of change, in the order the gate says them (what fails first).
KINDS = (
    NOT_RUN_IN_B,
    REGRESSION,
    NEW_FAILURE,
    VANISHED,
    DROPPED,
    FLAKY,
    EXCLUDED_CHANGE,
    EXPECTED,
    EXPIRED,
    UNEXPECTEDLY_PASSING,
    FIXED,
    STILL_FAILING,
    PASSING,
)
#: What ``--fail-on`` takes: the words a gate can fail under.
GATES = ("regressions", "new-failures", "dropped", "perf")
#: Which gate words each kind fails under (the rest fail none).
FAILS_UNDER = {
    NOT_RUN_IN_B: frozenset(GATES),
    REGRESSION: frozenset({"regressions", "new-failures"}),
    NEW_FAILURE: frozenset({"new-failures"}),
    VANISHED: frozenset({"regressions", "new-failures"}),
    DROPPED: frozenset({"dropped"}),
}
#: The kinds a gate mentions without failing (the rest, ``fixed``, ``still failing``, ``passing``,
#: are the diff's).
SAID = (FLAKY, EXCLUDED_CHANGE, DROPPED, UNEXPECTEDLY_PASSING, EXPIRED)


@dataclass(frozen=True)
class Run:
    """One (model, variant) in one sweep: its ``state`` (``STATES``), its failure signature, why
    it was excluded, and, for a run rerun before it counted, its attempts in words when at least
    one passed cleanly and one did not (``flaky``; None otherwise)."""

    state: str
    signature: str | None = None
    reason: str | None = None
    flaky: str | None = None

    def __post_init__(self):
        if self.state not in STATES:
            raise ValueError(f"{self.state!r} is not one of {STATES}")

    @property
    def has_verdict(self) -> bool:
        return self.state in VERDICT_STATES

    @property
    def passes(self) -> bool:
        """A clean PASS: PASS and not suspect."""
        return self.state == schema.PASS


@dataclass(frozen=True)
class Change:
    """How one run stands: ``kind`` (``KINDS``), the line the gate says, and the gate words it
    fails under."""

    model_id: str
    variant: str | None
    kind: str
    line: str
    before: str
    after: str
    signature: str | None = None
    fails: frozenset[str] = field(default_factory=frozenset)

    def fails_on(self, words: Iterable[str]) -> bool:
        return bool(self.fails & set(words))


def verdict_state(status: str | None, suspect: bool) -> str:
    """A record's verdict as a state: a suspect PASS apart from a clean one."""
    if status == schema.PASS and suspect:
        return SUSPECT_PASS
    if status not in schema.VERDICTS:
        raise ValueError(f"{status!r} is no verdict")
    return status


def flaky_attempts(attempts: list[dict] | None) -> str | None:
    """A rerun's attempts in words when they make it flaky (at least one clean PASS and at least
    one attempt that was not one), else None: attempts that fail differently are no flake."""
    outcomes = [(a.get("status"), bool(a.get("suspect"))) for a in attempts or []]
    if not schema.flaky(outcomes):
        return None
    return " then ".join(
        str(verdict_state(s, suspect) if s in schema.VERDICTS else s) for s, suspect in outcomes
    )


def live(
    expectations: Mapping[str, Expectation], today: _dt.date
) -> tuple[dict[str, Expectation], set[str]]:
    """(the expectations still in force, the models whose expectation's ``until`` is past)."""
    gone = {m for m, e in expectations.items() if e.until is not None and e.until < today}
    return {m: e for m, e in expectations.items() if m not in gone}, gone


def _name(model_id: str, variant: str | None) -> str:
    return f"{model_id} [{variant}]" if variant else model_id


def decide(
    model_id: str,
    variant: str | None,
    a: Run,
    b: Run,
    expected: Expectation | None = None,
    a_name: str = "A",
    b_name: str = "B",
) -> Change:
    """The change of one run from A to B (the module's rules); ``expected``: its live
    expectation, if any."""
    name = _name(model_id, variant)

    def change(kind: str, line: str) -> Change:
        return Change(
            model_id,
            variant,
            kind,
            line,
            a.state,
            b.state,
            b.signature,
            FAILS_UNDER.get(kind, frozenset()),
        )

    if b.state == NOT_RUN:
        return change(NOT_RUN_IN_B, f"not run: {name}: {b_name} has not run it yet")
    if EXCLUDED in (a.state, b.state):
        where = b_name if b.state == EXCLUDED else a_name
        why = (b if b.state == EXCLUDED else a).reason
        return change(
            EXCLUDED_CHANGE, f"excluded: {name}: excluded in {where}" + (f" ({why})" if why else "")
        )
    if not b.has_verdict:
        if not a.has_verdict:
            return change(PASSING, f"{name}: in neither sweep")
        if b.state == ABSENT:
            return change(
                DROPPED,
                f"dropped: {name}: {a.state} in {a_name}, left out of {b_name}'s definition",
            )
        why_not = b.reason or "nothing says why"
        return change(
            VANISHED, f"vanished: {name}: {a.state} in {a_name}, no row in {b_name} ({why_not})"
        )
    verdict = b.state
    said = verdict + (f": {b.signature}" if b.signature and not b.passes else "")
    if expected is not None and expected.verdict == verdict:
        return change(EXPECTED, f"{name}: {verdict}, expected ({expected.reason})")
    if b.passes:
        if expected is not None:
            return change(
                UNEXPECTEDLY_PASSING,
                f"unexpectedly passing: {name} (expected {expected.verdict}): remove the "
                "expectation",
            )
        if a.has_verdict and not a.passes:
            return change(FIXED, f"fixed: {name}: {a.state} -> PASS")
        return change(PASSING, f"{name}: PASS")
    if b.flaky:
        return change(FLAKY, f"flaky: {name}: {b.flaky}: not counted as a change")
    why = f" (expected {expected.verdict}, got {verdict})" if expected else ""
    where = f" ({a.reason})" if a.reason and a.has_verdict else ""
    if a.passes:
        return change(REGRESSION, f"regression: {name}: PASS{where} -> {said}{why}")
    if a.flaky:  # it passed once in A: a run that now fails every attempt has regressed from that
        return change(
            REGRESSION,
            f"regression: {name}: {a.state}, flaky in {a_name} ({a.flaky}){where} -> {said}{why}",
        )
    if not a.has_verdict:
        was = {
            NOT_RUN: f"not run in {a_name}",
            NO_ROW: f"not in {a_name}",
            ABSENT: f"not in {a_name}",
        }[a.state]
        return change(NEW_FAILURE, f"new failure: {name}: {was} -> {said}{why}")
    return change(STILL_FAILING, f"{name}: {a.state} -> {said}{why}")


def decide_sweeps(
    before: SweepRuns,
    after: SweepRuns,
    expectations: Mapping[str, Expectation] | None = None,
    today: _dt.date | None = None,
    earlier: Callable[[tuple[str, str]], Run | None] | None = None,
) -> list[Change]:
    """Every run of either sweep decided, plus one ``expired`` entry per expectation past its
    date, in ``KINDS`` order. A run A excluded or had not run is read from ``earlier`` (the last
    verdict of the sweeps before A, of its name and device) where it has one: a night that said
    nothing hides no regression that follows it."""
    today = today or _dt.datetime.now(_dt.UTC).date()
    in_force, gone = live(expectations or {}, today)
    found = []
    for key in sorted(set(before.runs) | set(after.runs)):
        model_id, variant = key
        a, b = before.state(key, "A"), after.state(key, "B")
        if a.state in (EXCLUDED, NOT_RUN) and earlier is not None:
            a = earlier(key) or a
        found.append(
            decide(model_id, variant, a, b, in_force.get(model_id), before.sweep_id, after.sweep_id)
        )
    for model_id in sorted(gone):
        e = (expectations or {})[model_id]
        line = f"expired expectation: {model_id} (until {e.until}): renew or remove it"
        found.append(Change(model_id, None, EXPIRED, line, "", ""))
    order = {k: i for i, k in enumerate(KINDS)}
    return sorted(found, key=lambda c: order[c.kind])


def earlier_verdicts(data_dir, a: str, depth: int = 10) -> Callable[[tuple[str, str]], Run | None]:
    """For a run sweep ``a`` excluded or had not run: its last verdict in the sweeps before ``a``
    of the same name and device (up to ``depth`` of them, read once, when first asked), naming
    the sweep; None where none had one."""
    from pathlib import Path

    chain: list[SweepRuns] | None = None

    def read_chain() -> list[SweepRuns]:
        from .history import SWEEP_CACHE, previous_sweep_id, sweep_index

        folder = Path(data_dir)
        sweeps = sweep_index(folder, cache_dir=folder / SWEEP_CACHE)
        known, found = set(sweeps["sweep_id"].to_list()), []
        current: str | None = a
        for _ in range(depth):
            if current is None or current not in known:
                break
            current = previous_sweep_id(sweeps, current)
            if current is not None:
                found.append(read_runs(folder, current))
        return found

    def earlier(key: tuple[str, str]) -> Run | None:
        nonlocal chain
        if chain is None:
            chain = read_chain()
        for runs in chain:
            run = runs.runs.get(key)
            if run is not None and run.has_verdict:
                return Run(
                    run.state,
                    run.signature,
                    f"the last verdict before {a}, in {runs.sweep_id}",
                    run.flaky,
                )
        return None

    return earlier


def refuse_what_if(data_dir, *sweep_ids: str) -> None:
    """One sentence for a what-if sweep (its definition put operators on the host, ``host_ops``):
    its runs are not the stack's verdicts, so the gate and the diff compare none of them."""
    from pathlib import Path

    from ..errors import UserError
    from ..record import store

    for sweep_id in sweep_ids:
        # its definition, or a pulled sweep's rows, say so
        if store.what_if_setting(Path(data_dir), sweep_id):
            raise UserError(
                f"Sweep {sweep_id} is a what-if sweep (host_ops puts operators on the host): "
                "its runs are not the stack's verdicts, so the gate compares none of them; "
                "compare two sweeps of the stack itself."
            )


#: What the gate holds alike between two whole sweeps (``refuse_unlike``): ``--across``'s word -> (the record's
#: field, how it reads in the sentence). The variant names the mode, not the device nor the dtype: a CPU sweep's
#: ``tiny-llama [eager+dynamic]`` and an accelerator's are one run to the decision, and the gate had failed on
#: "regression: tiny-llama PASS -> FAIL(gen)" with the devices named only in the diff's header.
ALIKE = {"device": ("device_type", "device"), "dtype": ("dtype", "dtype"), "mode": ("mode", "mode")}
#: What ``--across`` takes: not the mode, which the variant names, so that runs of another mode are
#: other runs (every run of A would read as vanished from B: review found ``--across mode`` red with
#: every model passing in both).
ACROSS = ("device", "dtype")


def check_across(words) -> tuple[str, ...]:
    """``--across`` as a tuple of ``ACROSS`` words (a comma-separated text or a list); one
    sentence for another."""
    from ..errors import UserError

    if isinstance(words, str):
        words = words.split(",")
    found = tuple(w.strip() for w in words or () if w.strip())
    unknown = [w for w in found if w not in ACROSS]
    if unknown:
        raise UserError(
            f"--across {unknown[0]!r} is not one of {', '.join(ACROSS)} (comma-separated)."
        )
    return found


def sweep_settings(data_dir, sweep_id: str) -> dict[tuple[str, str], dict[str, str | None]]:
    """{(model, variant): {device_type, dtype, mode}} of a sweep's verdicts (the latest row of
    each, as the decision reads them); a null mode (an older file) read from the variant, which
    always names it."""
    from pathlib import Path

    import polars as pl

    from ..record import store
    from .frames import sweep_rows, variant_col

    fields = [column for column, _ in ALIKE.values()]
    rows = (
        sweep_rows(
            store.scan(Path(data_dir), "results"),
            sweep_id,
            ["model_id", "variant", "started_at", *fields],
        )
        .with_columns(variant_col())
        .with_columns(
            pl.coalesce(pl.col("mode"), pl.col("variant").str.split("+").list.first()).alias("mode")
        )
        .sort("started_at", nulls_last=False)
        .unique(["model_id", "variant"], keep="last", maintain_order=False)
        .collect()
    )
    return {
        (r["model_id"], r["variant"]): {f: r[f] for f in fields} for r in rows.iter_rows(named=True)
    }


def unlike_sweeps(before: dict, after: dict, across=()) -> dict[str, tuple[list[str], list[str]]]:
    """What sets two sweeps' runs apart (``sweep_settings`` of each): {``--across`` word: (A's
    values, B's)} for each ``ALIKE`` setting not in ``across`` that differs: a run both sweeps
    have ran with another value of it, or the two share no value of it (the variant names the
    mode, so sweeps of disjoint modes share no run: each would read as vanished and new). A null
    (a row that does not say: an older file, a hand-made record) says nothing; a sweep with no
    rows has nothing to set apart. A definition that adds or drops a mode still compares what it
    shares."""
    found = {}
    for word, (column, _) in ALIKE.items():
        if word in across:
            continue
        was = {run.get(column) for run in before.values()} - {None}
        now = {run.get(column) for run in after.values()} - {None}
        if not was or not now:
            continue
        shared = [
            key
            for key in before.keys() & after.keys()
            if None not in (before[key].get(column), after[key].get(column))
            and before[key][column] != after[key][column]
        ]
        if shared or not was & now:
            found[word] = (sorted(was), sorted(now))
    return found


def refuse_unlike(data_dir, a: str, b: str, across=()) -> None:
    """One sentence, before anything is judged, for two sweeps whose runs ran on another device
    (``device_type``), dtype or mode (``unlike_sweeps``) unless ``across`` names each setting
    that may differ: a verdict on one device is no regression of another, and a FAIL(gen) on an
    accelerator against a PASS on the CPU had failed the gate as a regression. The perf gate
    keeps its own rule per run (``unlike``: such runs are not comparable)."""
    from ..errors import UserError

    differs = unlike_sweeps(
        sweep_settings(data_dir, a), sweep_settings(data_dir, b), check_across(across)
    )
    if not differs:
        return
    parts = [
        f"{ALIKE[word][1]} ({', '.join(was)} in {a}; {', '.join(now)} in {b})"
        for word, (was, now) in differs.items()
    ]
    allowed = [word for word in differs if word in ACROSS]
    how = (
        f"give --across {','.join(allowed)} to compare them anyway"
        if len(allowed) == len(differs)
        else "runs of another mode are other runs (the variant names the mode): gate sweeps of the "
        "same mode"
    )
    raise UserError(
        f"Sweeps {a} and {b} differ in {' and '.join(parts)}: the gate compares a run only "
        f"with itself on the same device, dtype and mode; {how}."
    )


def decide_between(
    data_dir,
    a: str,
    b: str,
    expectations: Mapping[str, Expectation] | None = None,
    today: _dt.date | None = None,
) -> tuple[SweepRuns, SweepRuns, list[Change]]:
    """Sweeps ``a`` and ``b`` read (``read_runs``) and decided (``decide_sweeps``, a silent night
    in A read from the sweeps before it): what the gate and the diff's table both say."""
    refuse_what_if(data_dir, a, b)
    before, after = read_runs(data_dir, a), read_runs(data_dir, b)
    return (
        before,
        after,
        decide_sweeps(before, after, expectations, today, earlier_verdicts(data_dir, a)),
    )


# --------------------------------------------------------------------------------------------
# performance: like with like, medians against the noise

SLOWER, FASTER, WITHIN_NOISE, NOT_COMPARABLE = "slower", "faster", "within noise", "not comparable"
PERF_KINDS = (SLOWER, FASTER, WITHIN_NOISE, NOT_COMPARABLE)
#: How many combined standard errors a median must move to be beyond noise (4, with the sigma less
#: the farthest repeat corrected for its bias, ``_TRIMMED_SIGMA``: noise alone reads as slower 0.8%
#: of the time at three repeats with 3% noise each and a 5% threshold, 1.9% at 5% noise, 0.1-0.2% at
#: five repeats; simulated in tests/test_decision.py; it was 3.4-8.4% at three uncorrected, review
#: found).
NOISE_SIGMAS = 4.0
#: The standard error of a median is about this times the standard deviation over the square root of
#: the repeats.
MEDIAN_SE = 1.2533
#: What must be equal for two runs' timings to compare: field -> how a difference reads. The input
#: is part of the work timed: TTFT is the prompt's prefill and each decode step reads a KV cache as
#: long as it, so a 52-token prompt against a 5-token one (another ``prompt``, a chat template used
#: on one side only, another tokenizer's count) is not comparable; it had read as "timed alike ...
#: passed".
LIKE = {
    "perf_tokens_out": "tokens per timed repeat (perf_tokens, or the phase's own floor: 4, 16 on the CPU)",
    "device_type": "device",
    "device_name": "device name",
    "mode": "mode",
    "dtype": "dtype",
    "stack_name": "stack",
    "perf_clock": "clock",
    "prompt": "prompt",
    "chat_template_used": "chat template used",
    "tokens_in": "prompt tokens (tokens_in, after the chat template)",
}
#: LIKE's fields said quoted and cut (a prompt can be long).
_QUOTED = ("prompt",)
#: How much of a quoted value a line says.
_QUOTED_CHARS = 40


def finite(values) -> list[float]:
    """The repeats that are numbers (a null or a NaN is no timing)."""
    return [float(v) for v in values or [] if v is not None and math.isfinite(v)]


def median_noise(values: list[float]) -> float | None:
    """One side's noise on its median, relative to it: the standard error of a median (1.2533 x
    sigma / sqrt(n)), sigma estimated as the standard deviation of the repeats less the one
    farthest from their median (so one wild repeat does not inflate it, as a median is not moved
    by it), divided by what that estimate averages for normal repeats (``_TRIMMED_SIGMA``: a
    third of sigma at three; two repeats, nothing left out, are taken as they are). It shrinks
    with more repeats: more repeats tell. None with fewer than two repeats (no noise can be
    measured)."""
    values = finite(values)
    if len(values) < 2:
        return None
    middle = statistics.median(values)
    if middle <= 0:
        return None
    kept = sorted(values, key=lambda v: abs(v - middle))[:-1] if len(values) >= 3 else values
    sigma = statistics.stdev(kept) / _trimmed_bias(len(values)) if len(kept) >= 2 else 0.0
    return MEDIAN_SE * sigma / math.sqrt(len(values)) / middle


#: What the standard deviation of n normal repeats less the one farthest from their median averages,
#: as a share of the true one (simulated, 10^5 draws each): three repeats keep the two closest, 0.32
#: of sigma. Uncorrected, the gate's noise was 3 times too small at n = 3 and read noise as a
#: regression 3.4% of the time, not 0.3% (review).
_TRIMMED_SIGMA = {
    2: 1.0,
    3: 0.32,
    4: 0.523,
    5: 0.625,
    6: 0.676,
    7: 0.721,
    8: 0.746,
    9: 0.77,
    10: 0.787,
    12: 0.816,
    15: 0.845,
    20: 0.872,
    30: 0.906,
    60: 0.945,
}


def _trimmed_bias(n: int) -> float:
    """``_TRIMMED_SIGMA`` at ``n`` repeats, interpolated between its rows (past 60: 1 - 3.3 / n)."""
    if n in _TRIMMED_SIGMA:
        return _TRIMMED_SIGMA[n]
    if n > 60:
        return 1.0 - 3.3 / n
    low = max(k for k in _TRIMMED_SIGMA if k < n)
    high = min(k for k in _TRIMMED_SIGMA if k > n)
    share = (n - low) / (high - low)
    return _TRIMMED_SIGMA[low] + share * (_TRIMMED_SIGMA[high] - _TRIMMED_SIGMA[low])


@dataclass(frozen=True)
class MetricChange:
    """One metric of one run between two sweeps: ``kind`` (``PERF_KINDS``), before and after
    medians, the change (relative, signed as the metric moved), the bound it had to pass (max of
    threshold and noise) and why."""

    metric: str
    kind: str
    before: float | None = None
    after: float | None = None
    change: float | None = None
    bound: float | None = None
    why: str = ""


def compare_repeats(
    ra: list[float], rb: list[float], more_is_better: bool, threshold: float, metric: str = ""
) -> MetricChange:
    """Two sweeps' repeats of one metric: slower / faster when the median moved by more than the
    threshold and by more than ``NOISE_SIGMAS`` of the medians' combined standard errors
    (``median_noise``), within noise otherwise; not comparable with fewer than two repeats on a
    side (no noise to measure)."""
    ra, rb = finite(ra), finite(rb)
    if len(ra) < 2 or len(rb) < 2:
        side = "A" if len(ra) < 2 else "B"
        return MetricChange(
            metric,
            NOT_COMPARABLE,
            why=f"fewer than 2 repeats in {side} (its perf phase stopped there: perf_stop): its "
            "noise cannot be measured",
        )
    a, b = statistics.median(ra), statistics.median(rb)
    if a <= 0 or b <= 0:
        return MetricChange(metric, NOT_COMPARABLE, a, b, why="a median of zero")
    change = (b - a) / a
    noise = NOISE_SIGMAS * math.hypot(median_noise(ra) or 0.0, median_noise(rb) or 0.0)
    bound = max(threshold, noise)
    worse = -change if more_is_better else change
    if abs(change) <= bound:
        why = ""
        if abs(change) > threshold:
            why = (
                f"beyond the threshold but within the repeats' noise ({noise:.1%}): more repeats "
                "would tell"
            )
        return MetricChange(metric, WITHIN_NOISE, a, b, change, bound, why)
    return MetricChange(metric, SLOWER if worse > 0 else FASTER, a, b, change, bound)


def unlike(then: dict, now: dict, ignore: tuple[str, ...] = ()) -> list[str]:
    """What makes two runs' timings not comparable (``LIKE``, less the fields in ``ignore``), as
    "mode eager -> compile"; [] when they are like. A field neither row has (an older file) is
    not held against them; one only one of them has is said as unknown on the other side, and the
    runs are not comparable: nothing vouches that they are alike there. For the input's fields
    that is never an older file's gap (``prompt`` and ``chat_template_used`` are in every record,
    ``tokens_in`` since version 2, the timings since 16), so a null on one side is a row that
    cannot say what it timed."""

    def said_as(name: str, value, side: str) -> str:
        if value is None:
            return f"unknown in {side} (its row does not say)"
        if name in _QUOTED:
            text = str(value)
            return repr(text if len(text) <= _QUOTED_CHARS else text[: _QUOTED_CHARS - 1] + "…")
        return str(value)

    return [
        f"{said} {said_as(f, then.get(f), 'A')} -> {said_as(f, now.get(f), 'B')}"
        for f, said in LIKE.items()
        if f not in ignore
        and (then.get(f) is not None or now.get(f) is not None)
        and then.get(f) != now.get(f)
    ]


# --------------------------------------------------------------------------------------------
# a sweep's runs, read once for every reader


@dataclass
class SweepRuns:
    """A sweep's runs as the decision reads them: ``runs`` {(model, variant): Run}; ``complete``:
    whether its definition is here (then a run of another sweep missing from it is ``absent``,
    not ``no row``), and the (model, variant)s still to run, in order."""

    sweep_id: str
    runs: dict[tuple[str, str], Run]
    defined: bool
    to_run: list[tuple[str, str]]
    #: The definition's models and the variants it runs each as ({} without a definition).
    models: dict[str, set[str]] = field(default_factory=dict)
    #: Models excluded as a whole (an excluded row with no variant: the definition's ``exclude:``, a
    #: budget), and why.
    excluded_models: dict[str, str | None] = field(default_factory=dict)

    def state(self, key: tuple[str, str], side: str) -> Run:
        """The run of ``key`` here, or why there is none: excluded with its model, in the
        definition as other variants (no row, saying so), left out of the definition (absent), or
        no definition to say (no row)."""
        if key in self.runs:
            return self.runs[key]
        model_id = key[0]
        if model_id in self.excluded_models:
            return Run(EXCLUDED, reason=self.excluded_models[model_id])
        if not self.defined:
            return Run(NO_ROW)
        if model_id in self.models:
            others = ", ".join(sorted(self.models[model_id]))
            return Run(
                NO_ROW, reason=f"{side}'s definition runs it as {others}: the variant changed"
            )
        return Run(ABSENT)


def read_runs(data_dir, sweep_id: str) -> SweepRuns:
    """A sweep's runs: each (model, variant)'s latest result (``diff.latest_outcomes``: suspect
    by the report's rule, its attempts read for a flake), its excluded rows, and, where its
    sweep.json is here, the runs of its definition with neither (``not run``). The one query the
    gate, the report's standing and the flake screen share."""
    import json
    from pathlib import Path

    import polars as pl

    from ..record import store
    from . import diff
    from .frames import SUSPECT_CHECKS, variant_col

    data_dir = Path(data_dir)
    results = store.scan(data_dir, "results")
    latest = diff.latest_outcomes(results, sweep_id)
    excluded = (
        store.scan(data_dir, "excluded")
        .filter(pl.col("sweep_id") == sweep_id)
        .with_columns(pl.col("variant").is_null().alias("whole_model"), variant_col())
        .select("model_id", "variant", "exclusion_reason", "whole_model")
    )
    rows, out = pl.collect_all([latest, excluded])
    runs: dict[tuple[str, str], Run] = {}
    whole: dict[str, str | None] = {}
    for r in out.iter_rows(named=True):
        runs[r["model_id"], r["variant"]] = Run(EXCLUDED, reason=r["exclusion_reason"])
        # no variant: the model as a whole (the definition's exclude:, a budget)
        if r["whole_model"]:
            whole[r["model_id"]] = r["exclusion_reason"]
    for r in rows.iter_rows(named=True):
        key = (r["model_id"], r["variant"])
        if r["status"] not in schema.VERDICTS:
            continue
        raw = r["attempts"]
        runs[key] = Run(
            verdict_state(r["status"], r["check"] in SUSPECT_CHECKS),
            r["failure_signature"],
            flaky=flaky_attempts(json.loads(raw) if raw else None),
        )
    defined, to_run = False, []
    models: dict[str, set[str]] = {}
    if (store.sweep_dir(data_dir, sweep_id) / "sweep.json").is_file():
        from ..probe import probe_params

        meta = store.read_sweep(data_dir, sweep_id)
        defined = True
        # excluded by the definition, before running
        for model_id, reason in (meta.excluded or {}).items():
            whole.setdefault(model_id, reason)
        for entry in meta.models:
            for combo in probe_params.combinations(meta.matrix, meta.stacks):
                key = (
                    entry.model_id,
                    probe_params.variant({**meta.probe, **entry.overrides, **combo}),
                )
                models.setdefault(entry.model_id, set()).add(key[1])
                if key not in runs and entry.model_id not in whole:
                    runs[key] = Run(NOT_RUN)
                    to_run.append(key)
    return SweepRuns(sweep_id, runs, defined, to_run, models, whole)


#: The decision's kinds the diff's table says in its place (``relabel``), each one of
#: ``frames.CHANGES``.
RELABELLED = (VANISHED, NOT_RUN_IN_B, FLAKY, EXCLUDED_CHANGE, DROPPED)


def relabel(changes, data_dir, a: str, b: str):
    """The diff's changes (``diff.model_changes``: from the results alone) in the decision's
    words where the decision says more: a run flaky, excluded, dropped, vanished or not run is
    said so, never "newly failing" or "removed", so the table and the gate under it speak one
    vocabulary."""
    import polars as pl

    found = {(c.model_id, c.variant): c.kind for c in decide_between(data_dir, a, b)[2]}
    said = {key: kind for key, kind in found.items() if kind in RELABELLED}
    if not said or not changes.height:
        return changes
    dtype = changes.schema["change"]
    words = pl.DataFrame(
        [(m, v, k) for (m, v), k in said.items()],
        schema={"model_id": pl.String, "variant": pl.String, "_kind": pl.String},
        orient="row",
    )
    return (
        changes.join(words, on=["model_id", "variant"], how="left", maintain_order="left")
        .with_columns(pl.coalesce(pl.col("_kind").cast(dtype), pl.col("change")).alias("change"))
        .drop("_kind")
    )
