"""Flakes screened before they count: a run whose verdict (or suspect-ness) differs from the
baseline's is rerun.

Why: a nightly gate that fails on a verdict that flips back the next night is ignored within a week
(Intel's XPU nightlies rerun every changed verdict before they report it). The baseline is the one
the sweep's report and ``diff`` use (the last sweep of the same name and device:
``analysis.flakes``), chosen at the sweep's first run and kept in sweep.json (``baseline``) so a
resumed sweep screens against the same one.

The rule, per (model, variant): the first attempt's outcome (status, suspect) is compared with the
baseline's (a run absent from the baseline differs when it does not pass; with no baseline nothing
is rerun). A differing run is rerun, up to ``reruns`` times, until one attempt passed and one did
not (``flaky``). Still one record per (model, variant):

- ``attempts`` (JSON text, first first: each attempt's status, suspect, failure_signature,
  started_at and duration_s) on every record that was rerun, null on one run once. JSON rather than
  a list of verdicts: an attempt is more than its verdict (a suspect PASS, the signature it failed
  with, when), and the column's type stays the same when an attempt says more later, as
  ``repro_settings`` does;
- ``flaky``: true when at least one attempt passed (a clean PASS) and at least one did not
  (``flaky``), false when none passed or all did (a real change, or the worse of two failures: it
  counts), null when run once;
- the record itself (its verdict, error, notebook) is the **first attempt that did not pass** (PASS
  and not suspect), else the first: the worse, so a flaky model is never reported as supported, and
  its failure's evidence (error, traceback, notebook) is the record's. The log holds every
  attempt's, one after another.

Between attempts the ones done are kept in ``sweeps/<id>/attempts/`` (``<stem>.json``, written last,
and each attempt's notebook): no record yet, so ``--resume`` probes the model again and that run is
the next attempt; a sweep stopped between attempts loses nothing and doubles nothing. Every write
goes through ``fileio``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from .. import fileio
from ..record import schema, store

FOLDER = "attempts"


class Screen(Protocol):
    """The baseline a sweep's verdicts are compared with (``analysis.flakes.Baseline``, given by
    the caller: the sweep room does not read the dataset's tables)."""

    sweep_id: str

    def before(self, model_id: str, variant: str) -> tuple[str | None, bool] | None:
        """The baseline's (status, suspect) of this run; None when the baseline has no such run."""
        ...

    def outcome(self, record: Any) -> tuple[str | None, bool]:
        """A record's (status, suspect), as the diff reads it."""
        ...


class Settled(NamedTuple):
    """What to store for a (model, variant): its record, notebook and log."""

    record: dict
    notebook: bytes | None
    log: str


def _paths(data_dir: Path, sweep_id: str, model_id: str, variant: str | None) -> tuple[Path, str]:
    return store.sweep_dir(data_dir, sweep_id) / FOLDER, store.stem(model_id, variant)


def kept(data_dir: Path, sweep_id: str, model_id: str, variant: str | None) -> list[dict]:
    """The attempts kept so far ({"record", "log", "notebook": file name or None}), first first."""
    folder, stem = _paths(data_dir, sweep_id, model_id, variant)
    path = folder / f"{stem}.json"
    if not path.is_file():
        return []
    return json.loads(path.read_text(encoding="utf-8"))["attempts"]


def forget(data_dir: Path, sweep_id: str, model_id: str, variant: str | None) -> None:
    """The record is stored (or the model excluded): its kept attempts go."""
    folder, stem = _paths(data_dir, sweep_id, model_id, variant)
    if not folder.is_dir():
        return
    fileio.remove(folder / f"{stem}.json")
    for notebook in folder.glob(f"{glob_escape(stem)}.*.ipynb"):
        fileio.remove(notebook)


def glob_escape(text: str) -> str:
    import glob

    return glob.escape(text)


def _passes(outcome: tuple[str | None, bool]) -> bool:
    return outcome[0] == schema.PASS and not outcome[1]


#: The flake rule (``schema.flaky``): at least one attempt a clean PASS and at least one not.
flaky = schema.flaky


def settle(
    data_dir: Path,
    sweep_id: str,
    record: dict,
    notebook: bytes | None,
    log: str,
    screen: Screen | None,
    reruns: int,
) -> Settled | None:
    """This attempt's outcome with the ones kept before: what to store now, or None when the run
    is to be rerun (this attempt kept in ``attempts/``)."""
    model_id, variant = record["model_id"], record["variant"]
    earlier = kept(data_dir, sweep_id, model_id, variant)
    if screen is None and not earlier:
        return Settled(record, notebook, log)
    folder, stem = _paths(data_dir, sweep_id, model_id, variant)
    done = [*earlier, {"record": record, "log": log, "notebook": None, "_bytes": notebook}]
    outcomes = [
        screen.outcome(a["record"]) if screen else (a["record"]["status"], False) for a in done
    ]
    before = screen.before(model_id, variant or schema.DEFAULT_VARIANT) if screen else None
    changed = (outcomes[0] != before) if before is not None else not _passes(outcomes[0])
    disagree = flaky(outcomes)
    if screen is not None and changed and not disagree and len(done) < 1 + reruns:
        name = None
        if notebook is not None:
            name = f"{stem}.{len(done)}.ipynb"
            fileio.atomic_write_bytes(folder / name, notebook)
        entry = {"record": record, "log": log, "notebook": name}
        # last: the attempt is kept
        fileio.atomic_write_json(folder / f"{stem}.json", {"attempts": [*earlier, entry]})
        return None
    if len(done) == 1:
        return Settled(record, notebook, log)
    chosen = next((k for k, o in enumerate(outcomes) if not _passes(o)), 0)
    body = dict(done[chosen]["record"])
    body["attempts"] = json.dumps(
        [
            {
                "status": a["record"].get("status"),
                "suspect": o[1],
                "failure_signature": a["record"].get("failure_signature"),
                "started_at": a["record"].get("started_at"),
                "duration_s": a["record"].get("duration_s"),
            }
            for a, o in zip(done, outcomes)
        ]
    )
    body["flaky"] = disagree
    chosen_notebook = done[chosen].get("_bytes")
    if chosen_notebook is None and done[chosen].get("notebook"):
        path = folder / done[chosen]["notebook"]
        chosen_notebook = path.read_bytes() if path.is_file() else None
    logs = "\n".join(
        f"===== attempt {k + 1} of {len(done)}: {o[0]}{' (suspect)' if o[1] else ''} "
        f"=====\n{a['log']}"
        for k, (a, o) in enumerate(zip(done, outcomes))
    )
    return Settled(body, chosen_notebook, logs)
