"""The gate a CI runs on two sweeps (``model-support diff A B --fail-on ...``), with expected
verdicts.

The decision is ``analysis.decision``'s (one rule for every reader; its table is tested as data):
this module reads the two sweeps, hands each run to it, and turns its answers into lines:
``failing`` (each makes the gate fail under the words asked for), ``known`` (expected failures, with
their reason) and ``notes`` (said, not failing: flaky runs, exclusions, dropped models where
``dropped`` was not asked, unexpectedly passing ones, expired expectations, the perf comparison's
notes). A regression counts once per model, its metrics listed on its line.

A PASS whose long-text agreement (``long_text_rate``, ``probe.long_text``) dropped below what is
expected of it is a regression too (``long_text_lines``, under ``regressions``): below the
expectations file's rate less its tolerance where the file names the model, else below the
baseline's own rate over the same text and length less ``expectations.long_text_tolerance``. Its
line names the rate, the floor it missed and where the text first diverged.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from . import decision, perf
from .expectations import SUSPECT_PASS, Expectation, load_expectations, long_text_tolerance

__all__ = [
    "ACROSS",
    "GATES",
    "SUSPECT_PASS",
    "Expectation",
    "GateResult",
    "check_across",
    "gate",
    "load_expectations",
]

#: What ``--fail-on`` takes.
GATES = decision.GATES
#: What ``--across`` takes: the settings two gated sweeps may be allowed to differ in.
ACROSS = decision.ACROSS
check_across = decision.check_across


@dataclass
class GateResult:
    """What the gate found: ``failing`` lines (each makes it fail), ``notes`` (said, not
    failing), ``known``."""

    failing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)
    #: The verdict changes behind ``failing`` that a bug report can be drafted for, one dict each:
    #: kind ("regression", "new failure" or "vanished"), model_id, variant, before (the baseline's
    #: verdict; None: not in it), after, signature.
    changes: list[dict] = field(default_factory=list)
    #: How many failing lines of each kind (``decision.KINDS``, and "slower" for perf), for the
    #: summary line.
    counts: dict[str, int] = field(default_factory=dict)
    #: The runs B has still to run (model, variant), and how to finish them.
    to_run: list[tuple[str, str]] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.failing)

    def summary(self) -> str:
        """ "passed", or "FAILED: 1 regression, 2 slower" (each model counted once, under its
        kind)."""
        if not self.failed:
            return "passed"
        return "FAILED: " + ", ".join(f"{n} {kind}" for kind, n in self.counts.items() if n)


def check_gates(words: list[str]) -> None:
    """One sentence for a word ``--fail-on`` does not take."""
    unknown = [g for g in words if g not in GATES]
    if unknown:
        raise UserError(f"--fail-on {unknown[0]!r} is not one of {', '.join(GATES)}.")


def gate(
    data_dir: Path | str,
    a: str,
    b: str,
    fail_on: list[str],
    expectations: dict[str, Expectation] | None = None,
    today: _dt.date | None = None,
    perf_threshold: float = perf.DEFAULT_THRESHOLD,
    across: tuple[str, ...] | list[str] = (),
) -> GateResult:
    """The gate of sweep ``b`` against ``a`` for each of ``fail_on`` (``GATES``); ``perf``: a
    slowdown beyond ``perf_threshold`` and beyond noise (``analysis.perf``,
    ``decision.compare_repeats``).

    A gate compares like with like: two sweeps whose runs differ in device, dtype or mode are
    refused in one sentence before anything is judged (``decision.refuse_unlike``), unless
    ``across`` (``--across``) names each setting allowed to differ; a what-if sweep is refused
    first (``decision.refuse_what_if``). Without a gate word (the diff's table with a
    definition's expectations) nothing is gated, so nothing is refused."""
    check_gates(fail_on)
    across = decision.check_across(across)
    data_dir = Path(data_dir)
    if fail_on:
        decision.refuse_what_if(data_dir, a, b)
        decision.refuse_unlike(data_dir, a, b, across)
    before, after, found = decision.decide_between(data_dir, a, b, expectations, today)
    if not before.runs and not before.defined:
        raise UserError(
            f"No sweep {a!r} in {data_dir}: nothing to gate against; `model-support list` "
            "shows the sweeps."
        )
    result = GateResult(to_run=after.to_run)
    _judged(result, found, fail_on)
    if after.to_run and set(fail_on):
        result.notes.append(
            f"{b} has {len(after.to_run)} run(s) still to run: finish it with `model-support "
            f"sweep --resume {b}`, then gate again"
        )
    if "regressions" in fail_on:
        dropped, notes = long_text_lines(data_dir, a, b, expectations, across)
        result.failing += dropped
        result.notes += notes
        if dropped:
            result.counts[LONG_TEXT_DROP] = len(dropped)
    if "perf" in fail_on:
        _slower(result, perf.gate_lines(data_dir, a, b, perf_threshold))
    return result


def _judged(result: GateResult, found: list, fail_on: list[str]) -> None:
    """Each change decided (``decision.decide``) into ``result``: failing under ``fail_on``, known
    (expected), or said (a note, or a change another gate word would fail)."""
    for change in found:
        if (
            change.kind in decision.FAILS_UNDER
            and not change.fails_on(fail_on)
            and change.kind not in decision.SAID
        ):
            words = ", ".join(sorted(change.fails))
            result.notes.append(f"{change.line} (not gated: add {words} to --fail-on)")
            continue
        if change.fails_on(fail_on):
            result.failing.append(change.line)
            result.counts[change.kind] = result.counts.get(change.kind, 0) + 1
            if change.kind in (decision.REGRESSION, decision.NEW_FAILURE, decision.VANISHED):
                result.changes.append(
                    {
                        "kind": change.kind,
                        "model_id": change.model_id,
                        "variant": change.variant,
                        "before": change.before
                        if change.before in decision.VERDICT_STATES
                        else None,
                        "after": change.after if change.after in decision.VERDICT_STATES else None,
                        "signature": change.signature,
                    }
                )
        elif change.kind == decision.EXPECTED:
            result.known.append(change.line)
        elif change.kind in decision.SAID:
            result.notes.append(change.line)


def _slower(result: GateResult, gated: tuple[list[str], list[str]]) -> None:
    """The perf gate's lines (``perf.gate_lines``) into ``result``, each failing line counted by
    kind."""
    slower, notes = gated
    result.failing += slower
    result.notes += notes
    for line in slower:
        kind = (
            "slower"
            if line.startswith("slower:")
            else "not timed"
            if line.startswith("perf: not timed")
            else ("perf not compared")
        )
        result.counts[kind] = result.counts.get(kind, 0) + 1


#: How the gate's summary counts a PASS whose long-text rate dropped below what is expected of it.
LONG_TEXT_DROP = "long-text regression"
#: What two runs' long-text rates must share to be compared against each other (no expectations
#: entry): the same text and length, the same model revision (its reference changes with it),
#: device, dtype, mode and stack. The gate's ``--across`` lets the device or the dtype differ
#: (``LONG_TEXT_ACROSS``).
LONG_TEXT_ALIKE = {
    "long_text_text": "text",
    "long_text_tokens": "length",
    "revision_sha": "model revision",
    "device_type": "device",
    "device_name": "device name",
    "dtype": "dtype",
    "mode": "mode",
    "stack_name": "stack",
}
#: The columns of ``LONG_TEXT_ALIKE`` each ``--across`` word lets differ.
LONG_TEXT_ACROSS = {"device": ("device_type", "device_name"), "dtype": ("dtype",)}
#: The columns the long-text comparison reads.
_LONG_TEXT_COLUMNS = (
    "model_id",
    "variant",
    "status",
    "started_at",
    "long_text_rate",
    "long_text_decode_diverges_at",
    "long_text_prefill_diverges_at",
    *LONG_TEXT_ALIKE,
)


def _long_text_rows(data_dir: Path, sweep_id: str) -> dict[tuple[str, str], dict]:
    """Each (model, variant)'s latest PASS in a sweep that measured a long-text rate."""
    import polars as pl

    from ..record import schema, store
    from .frames import sweep_rows, variant_col

    rows = (
        sweep_rows(store.scan(data_dir, "results"), sweep_id, _LONG_TEXT_COLUMNS)
        .with_columns(variant_col())
        .sort("started_at", nulls_last=False)
        .unique(["model_id", "variant"], keep="last", maintain_order=False)
        .filter((pl.col("status") == schema.PASS) & pl.col("long_text_rate").is_not_null())
        .collect()
    )
    return {(r["model_id"], r["variant"]): r for r in rows.iter_rows(named=True)}


def long_text_lines(
    data_dir: Path | str,
    a: str,
    b: str,
    expectations: dict[str, Expectation] | None = None,
    across: tuple[str, ...] | list[str] = (),
) -> tuple[list[str], list[str]]:
    """The long-text gate (under ``regressions``): (failing lines, notes). A PASS of ``b`` whose
    ``long_text_rate`` is below its floor fails: the expectations file's rate less its tolerance
    where the file names the model (its ``long_text``), else ``a``'s rate for the same run less
    ``long_text_tolerance`` where the two runs are alike (``LONG_TEXT_ALIKE``, but for what
    ``across`` lets differ). Said, not failing: a run of ``a`` that differs (not comparable,
    naming what differs), and an expected rate the sweep did not measure (``long_text`` off, or
    the check could not run: its row says why)."""
    data_dir = Path(data_dir)
    free = {column for word in across for column in LONG_TEXT_ACROSS.get(word, ())}
    alike = {column: said for column, said in LONG_TEXT_ALIKE.items() if column not in free}
    expected = getattr(expectations, "long_text", None) or {}
    before, after = _long_text_rows(data_dir, a), _long_text_rows(data_dir, b)
    failing, notes = [], []
    for key, now in sorted(after.items()):
        model_id, variant = key
        name = f"{model_id} [{variant}]"
        then, wanted = before.get(key), expected.get(model_id)
        if wanted is not None:
            floor, against = wanted.floor, f"expected {wanted.rate:.3f} less {wanted.tolerance:.3f}"
        elif then is None:
            continue
        elif differ := [column for column in alike if then.get(column) != now.get(column)]:
            notes.append(
                f"long text: not comparable: {name}: "
                + "; ".join(f"{alike[c]} {then.get(c)} in {a}, {now.get(c)} in {b}" for c in differ)
            )
            continue
        else:
            tolerance = long_text_tolerance(then["long_text_tokens"])
            floor = then["long_text_rate"] - tolerance
            against = f"{then['long_text_rate']:.3f} in {a} less {tolerance:.3f}"
        if now["long_text_rate"] >= floor - 1e-9:  # by positions, not by a float's last bit
            continue
        where = [
            f"{path} diverges at position {now[f'long_text_{path}_diverges_at']}"
            for path in ("decode", "prefill")
            if now[f"long_text_{path}_diverges_at"] is not None
        ]
        failing.append(
            f"regression: {name}: long-text agreement {now['long_text_rate']:.3f} (lowest "
            "agreement within the margin over 128-position windows of "
            f"{now['long_text_tokens']} tokens), below {floor:.3f} ({against})"
            + (f": {', '.join(where)}" if where else "")
        )
    for model_id in sorted(set(expected) - {m for m, _ in after}):
        notes.append(
            f"long text: {model_id}: a rate of {expected[model_id].rate:.3f} is expected, and "
            f"{b} measured none (long_text off, or the check could not run: its long_text_note "
            "says why)"
        )
    return failing, notes
