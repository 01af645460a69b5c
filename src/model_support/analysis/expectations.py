"""Expected verdicts: a YAML file ``{MODEL_ID: {verdict: "FAIL(gen)", reason: "...", until:
2027-01-31}}``.

Why a file of its own: the gate (``gate``), the sweep's report and ``diff`` read the same
expectations, given with ``--expect FILE`` or in the sweep definition (``expect: FILE``, recorded in
sweep.json's ``expect`` as the entries the file held when the sweep was created, so the report and
``diff`` need no file later). A known failure is one whose verdict is the expected one and whose
expectation has not expired (``until`` is past); an expectation with another verdict counts as none;
an expected failure that now passes is said ("unexpectedly passing: remove the expectation"), and so
is an expired expectation. ``verdict`` is one of the four, or ``suspect PASS`` (a PASS whose logits
or text are suspect).

An entry may also hold the model's long-text agreement (``long_text: {rate: 0.969, tolerance:
0.01}``, or ``long_text: 0.969`` with the default tolerance; ``verdict`` and ``reason`` are then
optional): the rate a PASS's ``long_text_rate`` is expected to reach (``probe.long_text``: the
lowest agreement within the margin with the CPU reference over 128-position windows of the long
text; near-tie flips agree). Why here: the rate depends on the model (a model whose logits are flat
at many positions flips further under bf16), so one threshold for all models would either miss a
broken kernel on a decisive model or fail a healthy flat one; the rate applies to every variant of
the model a sweep runs (dtype, mode); the value a team recorded on a stack it trusts, less a
tolerance, is what a later sweep must reach (tt-metal gates its accuracy the same way, at the
recorded value less half a point). The gate (``gate.long_text_lines``) names a drop below it as a
regression; without an entry it compares with the baseline's own rate, less ``LONG_TEXT_TOLERANCE``.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..probe import long_text as long_text_mod
from ..record import schema
from . import decision

# an expectation's verdict besides the four: a PASS whose numbers are suspect
from .decision import SUSPECT_PASS

#: What an expectation's verdict may be.
ACCEPTED = (*schema.VERDICTS, SUSPECT_PASS)
#: The tolerance of a long-text expectation that names none, and of the comparison with the baseline
#: where no entry names the model (``probe.long_text.TOLERANCE``, measured there: 0.025, three
#: positions of a 128-position window; the rate that counted near-ties read 0.977 healthy and moved
#: by 0.0625 with bf16-sized noise, so it was 0.08 then, which let a 2.5% wrong layer through). A
#: baseline's comparison gets at least two positions of its shortest window
#: (``long_text_tolerance``): one stray flip is no regression.
LONG_TEXT_TOLERANCE = long_text_mod.TOLERANCE
long_text_tolerance = long_text_mod.tolerance


#: How a run stands against the expectations (``judge``).
KNOWN, UNEXPECTED, UNEXPECTEDLY_PASSING = "known failure", "new failure", "unexpectedly passing"


@dataclass(frozen=True)
class Expectation:
    verdict: str
    reason: str
    until: _dt.date | None = None


@dataclass(frozen=True)
class LongTextExpectation:
    """A model's expected long-text rate: a PASS's ``long_text_rate`` below ``rate - tolerance``
    is a regression."""

    rate: float
    tolerance: float = LONG_TEXT_TOLERANCE
    reason: str = ""

    @property
    def floor(self) -> float:
        return self.rate - self.tolerance


class Expectations(dict):
    """The expected verdicts by model (a ``dict`` of ``Expectation``, what the decision reads)
    and, apart, ``long_text``: the expected long-text rates by model (``LongTextExpectation``).
    An entry with a rate and no verdict expects no verdict: it is in ``long_text`` only, never a
    known failure. True when either holds one."""

    def __init__(self, verdicts=(), long_text: dict[str, LongTextExpectation] | None = None):
        super().__init__(verdicts)
        self.long_text: dict[str, LongTextExpectation] = dict(long_text or {})

    def __bool__(self) -> bool:
        return bool(len(self) or self.long_text)


def load_expectations(path: Path | str) -> Expectations:
    """The expectations file, every mistake said at once (one sentence each, naming the model)."""
    return parse(read(path), str(path))


def read(path: Path | str) -> dict:
    """The file's mapping as YAML gives it (not checked: ``parse`` does); a missing or non-YAML
    file is one sentence."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise UserError(
            f"Expectations file {str(path)!r} does not exist; give a YAML file of MODEL: "
            "{verdict, reason}."
        )
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not YAML ({str(exc).splitlines()[0]}).") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a mapping of model id to {{verdict, reason, until}}.")
    return raw


def _date(value: Any) -> _dt.date | None:
    """``until`` as YAML gives it (a date) or as sweep.json keeps it (ISO text); None when it is
    neither."""
    if isinstance(value, _dt.date):
        return value
    if isinstance(value, str):
        try:
            return _dt.date.fromisoformat(value)
        except ValueError:
            return None
    return None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1


def _long_text(
    value: Any, reason: Any, where: str, mistakes: list[str]
) -> LongTextExpectation | None:
    """An entry's ``long_text`` (a rate, or {rate, tolerance}), checked; None (its mistake said)
    when it is wrong."""
    if _number(value):
        return LongTextExpectation(float(value), reason=str(reason or ""))
    if (
        isinstance(value, dict)
        and not set(value) - {"rate", "tolerance"}
        and _number(value.get("rate"))
    ):
        tolerance = value.get("tolerance", LONG_TEXT_TOLERANCE)
        if _number(tolerance):
            return LongTextExpectation(float(value["rate"]), float(tolerance), str(reason or ""))
        mistakes.append(f"{where}: long_text tolerance {tolerance!r} is not a number from 0 to 1")
        return None
    mistakes.append(
        f"{where}: long_text {value!r} is not a rate from 0 to 1 nor {{rate, tolerance}} "
        "(long_text: {rate: 0.97})"
    )
    return None


def parse(raw: Any, source: str) -> Expectations:
    """A mapping of expectations (a file's, or sweep.json's ``expect.entries``) checked: every
    mistake at once. An entry with ``long_text`` may leave out ``verdict`` (and then ``reason``):
    it expects a rate, not a verdict."""
    if not isinstance(raw, dict):
        raise UserError(f"{source}: expected a mapping of model id to {{verdict, reason, until}}.")
    found, rates, mistakes = {}, {}, []
    for model_id, entry in raw.items():
        where = f"{source}: {model_id}"
        if not isinstance(entry, dict):
            mistakes.append(f"{where}: expected {{verdict, reason, until}}, not {entry!r}")
            continue
        unknown = sorted(set(entry) - {"verdict", "reason", "until", "long_text"})
        verdict, reason, until = entry.get("verdict"), entry.get("reason"), entry.get("until")
        if unknown:
            mistakes.append(
                f"{where}: unknown key(s) {', '.join(unknown)}; use verdict, reason, until, "
                "long_text"
            )
        if "long_text" in entry:
            rate = _long_text(entry["long_text"], reason, where, mistakes)
            if rate is not None:
                rates[str(model_id)] = rate
            if verdict is None:  # a rate alone: no verdict expected
                if until is not None:
                    mistakes.append(
                        f"{where}: until applies to an expected verdict; this entry expects none"
                    )
                continue
        if verdict not in ACCEPTED:
            mistakes.append(f"{where}: verdict {verdict!r} is not one of {', '.join(ACCEPTED)}")
        if not isinstance(reason, str) or not reason.strip():
            mistakes.append(f"{where}: an expectation needs a reason (an issue link or a sentence)")
        if until is not None and _date(until) is None:
            mistakes.append(f"{where}: until {until!r} is not a date (YYYY-MM-DD)")
        found[str(model_id)] = Expectation(str(verdict), str(reason), _date(until))
    if mistakes:
        raise UserError(
            mistakes[0]
            if len(mistakes) == 1
            else f"{len(mistakes)} mistakes: " + "; ".join(mistakes)
        )
    return Expectations(found, rates)


def to_meta(path: Path | str) -> dict:
    """What sweep.json keeps of an expectations file: its path and its entries (checked; dates as
    ISO text)."""
    found = load_expectations(path)
    entries: dict[str, dict] = {
        m: {
            "verdict": e.verdict,
            "reason": e.reason,
            "until": e.until.isoformat() if e.until else None,
        }
        for m, e in found.items()
    }
    for m, rate in found.long_text.items():
        entries.setdefault(m, {"reason": rate.reason} if rate.reason else {})
        entries[m]["long_text"] = {"rate": rate.rate, "tolerance": rate.tolerance}
    return {"file": str(path), "entries": entries}


def from_meta(expect: dict | None) -> Expectations:
    """The expectations a sweep recorded (sweep.json's ``expect``); none when it recorded none."""
    if not expect or not expect.get("entries"):
        return Expectations()
    return parse(expect["entries"], str(expect.get("file") or "sweep.json expect"))


#: The kinds ``standing`` sorts a sweep's runs into, in the order the report lists them.
STANDINGS = (UNEXPECTED, KNOWN, "flaky", UNEXPECTEDLY_PASSING, "expired expectation")


def standing(runs: dict, expectations: dict[str, Expectation], today: _dt.date | None = None):
    """A sweep's runs against its expectations, for the report, by the gate's own decision
    (``analysis.decision``, each run against no baseline): kind (``STANDINGS``: new failures,
    known failures with their reason, flaky runs (a clean PASS among the attempts: neither),
    unexpectedly passing ("remove the expectation"), expired expectations), model_id, variant,
    verdict, expected, reason. A clean PASS nobody expected to fail, or expected to pass, is not
    listed. ``runs``: ``decision.read_runs(...).runs``."""
    import polars as pl

    today = today or _dt.datetime.now(_dt.UTC).date()
    in_force, gone = decision.live(expectations, today)
    words = {
        decision.NEW_FAILURE: UNEXPECTED,
        decision.EXPECTED: KNOWN,
        decision.FLAKY: "flaky",
        decision.UNEXPECTEDLY_PASSING: UNEXPECTEDLY_PASSING,
    }
    rows: list[tuple[str, str | None, str | None, str | None, str | None, str | None]] = []
    for (model_id, variant), run in sorted(runs.items()):
        if not run.has_verdict:
            continue
        expected = in_force.get(model_id)
        change = decision.decide(model_id, variant, decision.Run(decision.NO_ROW), run, expected)
        kind = words.get(change.kind)
        if kind is None or (kind == KNOWN and run.passes):
            continue
        reason = (
            expected.reason if expected else (f"attempts: {run.flaky}" if kind == "flaky" else None)
        )
        rows.append(
            (kind, model_id, variant, run.state, expected.verdict if expected else None, reason)
        )
    for model_id in sorted(gone):
        e = expectations[model_id]
        rows.append(
            (
                "expired expectation",
                model_id,
                None,
                None,
                e.verdict,
                f"{e.reason} (until {e.until})",
            )
        )
    # typed columns: an empty frame (nothing to list) sorts and renders like a full one
    frame = pl.DataFrame(
        rows,
        schema={
            name: pl.String
            for name in ("kind", "model_id", "variant", "verdict", "expected", "reason")
        },
        orient="row",
    )
    order = pl.col("kind").replace_strict(
        list(STANDINGS), list(range(len(STANDINGS))), return_dtype=pl.Int64
    )
    return frame.sort(order, maintain_order=True)
