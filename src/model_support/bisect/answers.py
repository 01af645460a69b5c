"""A bisect's answers: what each ``status`` means, the answer a row starts from, the answers that
end it before the search (flaky, not reproduced), and the one line per row the command prints."""

from __future__ import annotations

from ..record import schema
from .results import NOT_RUN
from .stacks import Row

FOUND, FLAKY, NOT_REPRODUCED, NO_PACKAGE, SAME, SETTING = (
    "found",
    "flaky",
    "not reproduced",
    "no single package",
    "same verdict",
    "a backend setting",
)
#: The labels of a step of ``bisect --metric`` (its verdict, in the search's terms): no slower than
#: end A, or slower beyond noise.
AS_A, SLOWER = "as A", "slower"
#: What an answer's ``status`` means (docs/bisect.md says the same).
STATUS_HELP = {
    FOUND: "the package and the two releases around the change are named",
    FLAKY: "two runs of the same environment gave different verdicts: not bisected",
    NOT_REPRODUCED: "an end's verdict does not come back when rerun here (the record's environment differs in "
    "something the stack does not name: the device, the host, the model's files)",
    NO_PACKAGE: "no single package's swap restores A's verdict (they may act together)",
    NOT_RUN: "an end's environment could not be built or gave no verdict here (the note says which and "
    "why)",
    SAME: "both ends give the same verdict: nothing to bisect",
    SETTING: "the backend's configuration changed it: B's packages with A's setting give A's verdict",
}


def troubled(row, out: dict, a: tuple, b: tuple) -> dict | None:
    """The answer when an end's two runs disagree (flaky) or do not give the verdict its sweep
    recorded (not reproduced); ``a`` and ``b``: each end's (verdict, trouble). None: both ends
    reproduced."""
    (verdict_a, trouble_a), (verdict_b, trouble_b) = a, b
    if FLAKY in (trouble_a, trouble_b):
        which = "B's" if trouble_b == FLAKY else "A's"
        return {
            **out,
            "status": FLAKY,
            "note": out["note"] + f"two runs of {which} environment gave different verdicts",
        }
    if trouble_a or trouble_b:
        which = "B" if trouble_b else "A"
        recorded = row.verdict_b if trouble_b else row.verdict_a
        got = verdict_b if trouble_b else verdict_a
        return {
            **out,
            "status": NOT_REPRODUCED,
            "note": out["note"]
            + f"sweep {which} recorded {recorded}; two runs of its stack here give {got}",
        }
    return None


def blank(row: Row) -> dict:
    """An answer with nothing found yet (the verdicts the records give)."""
    out: dict = {"status": None, "package": None, "last_same": None, "first_changed": None}
    out.update(
        verdict_a=row.verdict_a, verdict_b=row.verdict_b, verdicts={}, skipped=[], unsplit=None
    )
    out.update(together=[], note="")
    return out


def answer_line(answer: dict) -> str:
    """One line per row: what changed it, or why it was not bisected."""
    name = answer["model_id"] + (
        "" if answer["variant"] == schema.DEFAULT_VARIANT else f" [{answer['variant']}]"
    )
    runs = sum(1 for s in answer["steps"] if s.get("verdict") is not None or "seconds" in s)
    took = f"{runs} runs, {answer['seconds']:.1f} s"
    # bisect --metric: which figure, and its medians at the two ends as timed here
    if answer.get("metric"):
        shown = lambda v: "-" if v is None else f"{v:.4g}"  # noqa: E731
        name += (
            f": {answer['metric']} {shown(answer.get('before'))} -> "
            f"{shown(answer.get('after'))} (medians here; slower means worse by more than "
            f"{answer['threshold']:.0%} and beyond the repeats' noise)"
        )
    if answer["status"] == SETTING:
        return (
            f"{name}: changed by a backend setting: {answer['note'].rsplit('changed by ', 1)[-1]}; "
            f"{took}"
        )
    if answer["status"] == FOUND:
        said = (
            f"{name}: changed by {answer['package']} {answer['first_changed']} (last with "
            f"{answer['verdict_a']}: {answer['last_same']}; first with {answer['verdict_b']}: "
            f"{answer['first_changed']}); {took}"
        )
        if answer["skipped"]:
            said += "; skipped " + "; ".join(
                f"{s['version']} ({s['reason']})" for s in answer["skipped"]
            )
        return said + (f"; {answer['note']}" if answer["note"] else "")
    return f"{name}: {answer['status']}: {answer['note']}; {took}"
