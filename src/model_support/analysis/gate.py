"""The gate a CI runs on two sweeps (``model-support diff A B --fail-on ...``), with expected verdicts.

"Passing" means PASS and not suspect (its logits agree with the reference, or with none its text is fluent). A
model excluded in either sweep counts in neither direction. An expectation (a YAML file:
``{MODEL_ID: {verdict: "FAIL(gen)", reason: "...", until: 2027-01-31}}``) makes a failure with that verdict a
known one; an expectation with another verdict, or past its ``until``, does not, and both are said, as is an
expected failure that now passes ("remove the expectation"). One line per regression, naming the model.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from ..record import schema, store
from . import diff, perf
from .expectations import SUSPECT_PASS, Expectation, load_expectations
from .frames import SUSPECT_CHECKS

__all__ = ["GATES", "SUSPECT_PASS", "Expectation", "GateResult", "gate", "load_expectations"]

#: What ``--fail-on`` takes.
GATES = ("regressions", "new-failures", "perf")


@dataclass
class GateResult:
    """What the gate found: ``failing`` lines (each makes it fail), ``notes`` (said, not failing)."""

    failing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)
    #: The verdict changes behind ``failing`` (not the slowdowns), one dict each: kind ("regression" or "new
    #: failure"), model_id, variant, before (the baseline's verdict; None: not in it), after, signature.
    changes: list[dict] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.failing)


def _outcomes(data_dir: Path, sweep_id: str) -> dict[tuple[str, str], tuple[str, bool, str | None]]:
    """{(model, variant): (status, suspect, signature)} of a sweep's results (excluded rows are not results), as
    the diff reads them (``diff._outcomes``: the latest run of each)."""
    rows = diff._outcomes(store.scan(data_dir, "results"), sweep_id).collect()
    return {
        (r["model_id"], r["variant"]): (r["status"], r["check"] in SUSPECT_CHECKS, r["failure_signature"])
        for r in rows.iter_rows(named=True)
    }


def _flaky(data_dir: Path, sweep_id: str) -> dict[tuple[str, str], str]:
    """{(model, variant): its attempts' verdicts in words} of the sweep's runs marked ``flaky`` (rerun, and the
    attempts gave two verdicts: ``sweep.reruns``)."""
    import json

    import polars as pl

    from .frames import variant_col

    rows = (
        store.scan(data_dir, "results")
        .filter((pl.col("sweep_id") == sweep_id) & pl.col("flaky").fill_null(False))
        .with_columns(variant_col())
        .select("model_id", "variant", "attempts")
        .collect()
    )
    return {
        (r["model_id"], r["variant"]): " then ".join(
            SUSPECT_PASS if a.get("suspect") else str(a.get("status")) for a in json.loads(r["attempts"] or "[]")
        )
        for r in rows.iter_rows(named=True)
    }


def gate(
    data_dir: Path | str,
    a: str,
    b: str,
    fail_on: list[str],
    expectations: dict[str, Expectation] | None = None,
    today: _dt.date | None = None,
    perf_threshold: float = perf.DEFAULT_THRESHOLD,
) -> GateResult:
    """The gate of sweep ``b`` against ``a`` for each of ``fail_on`` (``GATES``); ``perf``: a slowdown beyond
    ``perf_threshold`` and beyond noise (``analysis.perf``)."""
    unknown = [g for g in fail_on if g not in GATES]
    if unknown:
        raise UserError(f"--fail-on {unknown[0]!r} is not one of {', '.join(GATES)}.")
    data_dir = Path(data_dir)
    today = today or _dt.datetime.now(_dt.UTC).date()
    expectations = expectations or {}
    before, after = _outcomes(data_dir, a), _outcomes(data_dir, b)
    flaky = _flaky(data_dir, b)
    result = GateResult()
    expired = {m for m, e in expectations.items() if e.until is not None and e.until < today}
    for model_id in sorted(expired):
        result.notes.append(
            f"expired expectation: {model_id} (until {expectations[model_id].until}): renew or remove it"
        )
    for (model_id, variant), (status, suspect, signature) in sorted(after.items()):
        name = f"{model_id} [{variant}]"
        verdict = SUSPECT_PASS if status == schema.PASS and suspect else status
        passes = verdict == schema.PASS
        expected = expectations.get(model_id) if model_id not in expired else None
        if expected and passes:
            result.notes.append(f"unexpectedly passing: {name} (expected {expected.verdict}): remove the expectation")
            continue
        if passes:
            continue
        if expected and expected.verdict == verdict:
            result.known.append(f"{name}: {verdict}, expected ({expected.reason})")
            continue
        if (model_id, variant) in flaky:  # its attempts disagreed (``sweep.reruns``): not a change
            result.notes.append(f"flaky: {name}: {flaky[model_id, variant]}: not counted as a change")
            continue
        was = before.get((model_id, variant))
        passed_before = was is not None and was[0] == schema.PASS and not was[1]
        why = f" (expected {expected.verdict}, got {verdict})" if expected else ""
        said = f"{verdict}" + (f": {signature}" if signature else "")
        change = {"model_id": model_id, "variant": variant, "after": verdict, "signature": signature}
        if "regressions" in fail_on and passed_before:
            result.failing.append(f"regression: {name}: PASS -> {said}{why}")
            result.changes.append({"kind": "regression", "before": schema.PASS, **change})
        elif "new-failures" in fail_on and (was is None or passed_before):
            result.failing.append(f"new failure: {name}: {'not in ' + a if was is None else 'PASS'} -> {said}{why}")
            result.changes.append({"kind": "new failure", "before": was and schema.PASS, **change})
    if "perf" in fail_on:
        slower, notes = perf.gate_lines(data_dir, a, b, perf_threshold)
        result.failing += slower
        result.notes += notes
    return result
