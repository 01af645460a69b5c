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
from . import diff
from .frames import SUSPECT_CHECKS

#: What ``--fail-on`` takes.
GATES = ("regressions", "new-failures", "perf")
#: An expectation's verdict besides the four: a PASS whose numbers or text are suspect.
SUSPECT_PASS = "suspect PASS"


@dataclass(frozen=True)
class Expectation:
    verdict: str
    reason: str
    until: _dt.date | None = None


@dataclass
class GateResult:
    """What the gate found: ``failing`` lines (each makes it fail), ``notes`` (said, not failing)."""

    failing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.failing)


def load_expectations(path: Path | str) -> dict[str, Expectation]:
    """The expectations file, every mistake said at once (one sentence each, naming the model)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise UserError(
            f"Expectations file {str(path)!r} does not exist; give a YAML file of MODEL: {{verdict, reason}}."
        )
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not YAML ({str(exc).splitlines()[0]}).") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a mapping of model id to {{verdict, reason, until}}.")
    accepted = (*schema.VERDICTS, SUSPECT_PASS)
    found, mistakes = {}, []
    for model_id, entry in raw.items():
        where = f"{path}: {model_id}"
        if not isinstance(entry, dict):
            mistakes.append(f"{where}: expected {{verdict, reason, until}}, not {entry!r}")
            continue
        unknown = sorted(set(entry) - {"verdict", "reason", "until"})
        verdict, reason, until = entry.get("verdict"), entry.get("reason"), entry.get("until")
        if unknown:
            mistakes.append(f"{where}: unknown key(s) {', '.join(unknown)}; use verdict, reason, until")
        if verdict not in accepted:
            mistakes.append(f"{where}: verdict {verdict!r} is not one of {', '.join(accepted)}")
        if not isinstance(reason, str) or not reason.strip():
            mistakes.append(f"{where}: an expectation needs a reason (an issue link or a sentence)")
        if until is not None and not isinstance(until, _dt.date):
            mistakes.append(f"{where}: until {until!r} is not a date (YYYY-MM-DD)")
        found[str(model_id)] = Expectation(str(verdict), str(reason), until if isinstance(until, _dt.date) else None)
    if mistakes:
        raise UserError(mistakes[0] if len(mistakes) == 1 else f"{len(mistakes)} mistakes: " + "; ".join(mistakes))
    return found


def _outcomes(data_dir: Path, sweep_id: str) -> dict[tuple[str, str], tuple[str, bool, str | None]]:
    """{(model, variant): (status, suspect, signature)} of a sweep's results (excluded rows are not results), as
    the diff reads them (``diff._outcomes``: the latest run of each)."""
    rows = diff._outcomes(store.scan(data_dir, "results"), sweep_id).collect()
    return {
        (r["model_id"], r["variant"]): (r["status"], r["check"] in SUSPECT_CHECKS, r["failure_signature"])
        for r in rows.iter_rows(named=True)
    }


def gate(
    data_dir: Path | str,
    a: str,
    b: str,
    fail_on: list[str],
    expectations: dict[str, Expectation] | None = None,
    today: _dt.date | None = None,
) -> GateResult:
    """The gate of sweep ``b`` against ``a`` for each of ``fail_on`` (``GATES``)."""
    unknown = [g for g in fail_on if g not in GATES]
    if unknown:
        raise UserError(f"--fail-on {unknown[0]!r} is not one of {', '.join(GATES)}.")
    if "perf" in fail_on:
        raise UserError(
            "--fail-on perf needs the repeated performance measurements (TTFT, TPOT with their spread) that are not "
            "recorded yet; use regressions or new-failures."
        )
    data_dir = Path(data_dir)
    today = today or _dt.datetime.now(_dt.UTC).date()
    expectations = expectations or {}
    before, after = _outcomes(data_dir, a), _outcomes(data_dir, b)
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
        was = before.get((model_id, variant))
        passed_before = was is not None and was[0] == schema.PASS and not was[1]
        why = f" (expected {expected.verdict}, got {verdict})" if expected else ""
        said = f"{verdict}" + (f": {signature}" if signature else "")
        if "regressions" in fail_on and passed_before:
            result.failing.append(f"regression: {name}: PASS -> {said}{why}")
        elif "new-failures" in fail_on and (was is None or passed_before):
            result.failing.append(f"new failure: {name}: {'not in ' + a if was is None else 'PASS'} -> {said}{why}")
    return result
