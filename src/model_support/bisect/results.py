"""``bisect.json``, beside sweep B's ``sweep.json``: the answers of every bisect run against it.

{"version": 1, "answers": [{"baseline": A, "model_id", "variant", "status", "package", "last_same",
"first_changed", "verdicts", "steps", "skipped", "unsplit", "together", "note", "installer",
"seconds"; with ``--metric`` also "metric", "threshold", "before", "after": end A's and end B's
medians as timed here}, ...]}: a new answer for the same (baseline, model, variant, metric) replaces
the old one, except one that could not run (its steps never ran the pins: an environment not built,
an end with no verdict), which never replaces an answer. Each answer is stored as its row finishes,
under a lock file (two bisects of one sweep at once lose nothing). The report, the explorer and the
terminal diff read ``changed_by`` from it: "changed by transformers 5.25.0".
"""

from __future__ import annotations

import json
from pathlib import Path

from ..fileio import atomic_write_json
from ..record import store
from .envs import locked

VERSION = 1
FILE = "bisect.json"
#: An answer's status when its steps could not run the pins (search's other statuses say what was
#: found).
NOT_RUN = "could not run"


def bisect_file(data_dir: Path | str, sweep_id: str) -> Path:
    return store.sweep_dir(Path(data_dir), sweep_id) / FILE


def read_answers(data_dir: Path | str, sweep_id: str) -> list[dict]:
    path = bisect_file(data_dir, sweep_id)
    if not path.exists():
        return []
    return list(json.loads(path.read_text()).get("answers") or [])


def _key(answer: dict) -> tuple:
    """An answer per (baseline, model, variant) and question: the verdict, or a metric (``bisect
    --metric``)."""
    return (answer.get("baseline"), answer["model_id"], answer["variant"], answer.get("metric"))


def store_answers(
    data_dir: Path | str, sweep_id: str, baseline: str | None, answers: list[dict]
) -> Path:
    """Add ``answers`` (against ``baseline``; None for the single-record form) to sweep_id's
    bisect.json; an answer that could not run is kept only where its row has no answer yet (it
    never replaces one)."""
    path = bisect_file(data_dir, sweep_id)
    with locked(path.with_name(".bisect.lock")):
        stored = read_answers(data_dir, sweep_id)
        have = {_key(a) for a in stored}
        new = [{"baseline": baseline, **a} for a in answers]
        new = [a for a in new if a.get("status") != NOT_RUN or _key(a) not in have]
        keys = {_key(a) for a in new}
        kept = [a for a in stored if _key(a) not in keys]
        atomic_write_json(path, {"version": VERSION, "answers": kept + new})
    return path


def changed_by(
    data_dir: Path | str, sweep_id: str, baseline: str | None = None
) -> dict[tuple[str, str], str]:
    """{(model_id, variant): "transformers 5.25.0"} for each row of sweep_id a bisect named the
    release of (against ``baseline`` when given, else any; the latest answer wins)."""
    out = {}
    for answer in read_answers(data_dir, sweep_id):
        if answer.get("status") not in ("found", "a backend setting") or answer.get("metric"):
            continue  # a metric's answer says what slowed a row, not what changed its verdict
        if baseline and answer.get("baseline") not in (baseline, None):
            continue
        if answer["status"] == "found":
            said = f"{answer['package']} {answer['first_changed']}"
        else:  # a backend setting (answers.SETTING): its name
            said = "setting " + ", ".join(s["name"] for s in answer.get("setting") or [])
        out[(answer["model_id"], answer["variant"])] = said
    return out
