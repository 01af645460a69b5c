"""Changes of the dataset, committed as a whole: compaction, exclude and include, where a sweep's
logs are published; a change a stopped process left half-done is finished by the next command
(``finish_interrupted``).

A change that rewrites a sweep's Parquet files (compaction, ``exclude``, ``include``, a push
recording where the logs go) is a journaled redo: first ``change.json`` in the sweep's folder (what
the change is, and the sidecar files it ends with: ``exclusion.json``, ``published.json``), then the
sidecars, then the Parquet files in an order that can only duplicate a row, never lose one (the
config a row moves *to* is written before the one it leaves), and ``change.json`` removed last. The
JSON records are the source of truth and compaction rebuilds the files from them, so finishing an
interrupted change is doing it again: the next command that reads or writes the data folder
(``finish_interrupted``) does, and says so in one line. A plain reader (``datasets``) may see a
moving row in both configs for an instant, never in neither.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING

from .. import fileio
from ..errors import UserError
from ..fileio import atomic_write_json
from . import ops_table, schema
from .dataset_card import write_dataset_card
from .dataset_files import OPS_CONFIG, WHAT_IF_CONFIG, parquet_file, write_parquet
from .sweep_files import PUBLISHED, copy_repro_bodies, exclusion, iter_records, published_logs
from .sweep_folders import is_what_if, read_sweep, stem, sweep_dir, writing
from .sweep_meta import SweepMeta

if TYPE_CHECKING:  # polars is imported where it is used: the probe kernel writes records without it
    pass


#: The journal of a change in progress, in the sweep's folder.
CHANGE = "change.json"


#: The sidecar files a change may set (the journal says their final contents, or None for no file).
SIDECARS = ("exclusion.json", PUBLISHED)
_open_changes: set[Path] = set()


@contextlib.contextmanager
def change(
    data_dir: Path, sweep_id: str, what: str, sidecars: dict[str, dict | None] | None = None
):
    """Journal a change of ``sweep_id``'s dataset files (``what``: compact, exclude, include,
    push) that ends with ``sidecars`` ({file name: contents or None}); the caller holds the
    sweep's lock. Nested in an open change of the same sweep (``set_exclusion`` compacting), the
    outer journal covers it. The journal stays when the body raises: the change is half-done, the
    next command finishes it."""
    journal = sweep_dir(data_dir, sweep_id) / CHANGE
    key = journal.resolve()
    if key in _open_changes:
        yield
        return
    atomic_write_json(
        journal,
        {
            "change": what,
            "sidecars": sidecars or {},
            "at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        },
    )
    _open_changes.add(key)
    try:
        yield
    finally:
        _open_changes.discard(key)
    fileio.remove(journal)


def _apply_sidecars(data_dir: Path, sweep_id: str, sidecars: dict[str, dict | None]) -> None:
    for name, contents in sidecars.items():
        if name not in SIDECARS:
            continue
        path = sweep_dir(data_dir, sweep_id) / name
        if contents is None:
            fileio.remove(path)
        else:
            atomic_write_json(path, contents)


def _take_over(data_dir: Path, sweep_id: str) -> dict | None:
    """The change a stopped process left half-done in ``sweep_id`` (its journal), with its
    sidecars set as the journal says: what remains is to rebuild the files from the records. None
    when there is none (or it is this process's own, open). The caller holds the sweep's lock."""
    journal = sweep_dir(data_dir, sweep_id) / CHANGE
    if not journal.exists() or journal.resolve() in _open_changes:
        return None
    try:
        entry = json.loads(journal.read_text())
    except ValueError:  # a journal torn as it was written: the change had not begun
        entry = {"change": "unknown", "sidecars": {}}
    _apply_sidecars(data_dir, sweep_id, entry.get("sidecars") or {})
    return entry


def interrupted(data_dir: Path) -> list[str]:
    """The sweeps with a change half-done (a journal left by a process that stopped mid-change)."""
    return sorted(p.parent.name for p in (Path(data_dir) / "sweeps").glob(f"*/{CHANGE}"))


def finish_interrupted(data_dir: Path, sweep_ids: list[str] | None = None) -> list[str]:
    """Finish every change a stopped process left half-done (of ``sweep_ids``, default all): its
    sidecars set as the journal says, its Parquet files rebuilt from the records, the journal
    removed. A sweep another process is writing is left to it. Returns one sentence per change
    finished."""
    said = []
    for sweep_id in sweep_ids if sweep_ids is not None else interrupted(data_dir):
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(writing(data_dir, sweep_id))
            except UserError:
                continue  # its writer is alive and finishes it
            entry = _take_over(data_dir, sweep_id)
            if entry is None:
                continue
            if (sweep_dir(data_dir, sweep_id) / "sweep.json").exists():
                _compact(data_dir, sweep_id, read_sweep(data_dir, sweep_id))
            fileio.remove(sweep_dir(data_dir, sweep_id) / CHANGE)
        what = entry.get("change", "change")
        done = "undone" if what == "push" else "finished"
        said.append(
            f"Sweep {sweep_id}: an interrupted {what} (begun {entry.get('at', 'earlier')}) was "
            f"{done}: its dataset files were rebuilt from its records."
        )
    return said


def require_whole(data_dir: Path) -> None:
    """Refuse (one sentence) while any sweep of the data folder has a change half-done
    (``push``)."""
    if half := interrupted(data_dir):
        raise UserError(
            f"{data_dir} has a change half-done in sweep(s) {', '.join(half)}; refused to "
            f"publish it: run `model-support aggregate {half[0]}` (any command finishes it) "
            "and push again."
        )


def set_published_logs(data_dir: Path, sweep_id: str, where: dict | None) -> tuple[int, int]:
    """Record where this sweep's notebooks and logs are published (None: nowhere) and compact
    again, so that each row's ``notebook_url`` and ``log_url`` point there; returns (results,
    excluded)."""
    with writing(data_dir, sweep_id), change(data_dir, sweep_id, "publish", {PUBLISHED: where}):
        _apply_sidecars(data_dir, sweep_id, {PUBLISHED: where})
        return compact(data_dir, sweep_id)


def _with_urls(record: dict, folder: Path, base: str) -> dict:
    """The record with the published addresses of its notebook and log (each only when the file
    exists)."""
    name = stem(record["model_id"], record["variant"])
    return {
        **record,
        "notebook_url": f"{base}notebooks/{name}.ipynb"
        if (folder / "notebooks" / f"{name}.ipynb").exists()
        else None,
        "log_url": f"{base}logs/{name}.log" if (folder / "logs" / f"{name}.log").exists() else None,
    }


def compact(data_dir: Path, sweep_id: str) -> tuple[int, int]:
    """Records (plus the models excluded before running) -> this sweep's two Parquet files.

    A record with an ``exclusion_reason`` (a model found gated or gone while the sweep ran) goes
    to ``excluded``, a what-if run's (``is_what_if``: marked, or carrying ``host_ops``) to its
    own config, every other to ``results`` (``config_of``). Rewrites only this sweep's files, as
    one journaled change (``change``); the JSON records stay the source of truth, so compaction
    can be redone at any time and gives the same rows (a whole-sweep exclusion and the published
    logs' addresses are applied here). A change of this sweep left half-done by a stopped process
    is finished first. Records are streamed (two passes), so memory stays flat however long the
    sweep. Returns (results, excluded). Refused (one sentence) while another process writes the
    sweep (``SweepLock``)."""
    meta = read_sweep(data_dir, sweep_id)
    with writing(data_dir, sweep_id):
        # a change left half-done: its sidecars now, its files by this compaction
        _take_over(data_dir, sweep_id)
        with change(data_dir, sweep_id, "compact"):
            return _compact(data_dir, sweep_id, meta)


def config_of(record: dict) -> str:
    """The config a record's row belongs to: ``excluded`` (no verdict), ``what_if`` (operators
    ran on the host: never the stack's verdict), else ``results``."""
    if record.get("exclusion_reason"):
        return "excluded"
    return WHAT_IF_CONFIG if is_what_if(record) else "results"


def _compact(data_dir: Path, sweep_id: str, meta: SweepMeta) -> tuple[int, int]:
    whole_sweep_reason = exclusion(data_dir, sweep_id)
    published = published_logs(data_dir, sweep_id)
    before_running = [
        schema.empty_record(
            sweep_id=sweep_id,
            model_id=model_id,
            exclusion_reason=reason,
            started_at=meta.created_at,
            # a pulled what-if sweep's rows say what it was
            host_ops=meta.probe.get("host_ops") or None,
        )
        for model_id, reason in meta.excluded.items()
    ]

    def records(config: str):
        for record in iter_records(data_dir, sweep_id):
            if published:
                record = _with_urls(record, sweep_dir(data_dir, sweep_id), published["url"])
            if whole_sweep_reason:
                if config == "excluded":
                    yield {
                        **record,
                        "exclusion_reason": record["exclusion_reason"] or whole_sweep_reason,
                    }
            elif config_of(record) == config:
                yield record

    copy_repro_bodies(data_dir, sweep_id)  # before any row that names a body
    results_file, excluded_file = (
        parquet_file(data_dir, "results", sweep_id),
        parquet_file(data_dir, "excluded", sweep_id),
    )

    def write_results() -> int:
        return write_parquet(records("results"), results_file)

    def write_excluded() -> int:
        return write_parquet(itertools.chain(records("excluded"), before_running), excluded_file)

    # the config the rows move to first: a stop between the two files leaves a row in both, never in
    # neither
    if whole_sweep_reason:
        excluded = write_excluded()
        results = write_results()
    else:
        results = write_results()
        excluded = write_excluded()
    # none: no file
    write_parquet(records(WHAT_IF_CONFIG), parquet_file(data_dir, WHAT_IF_CONFIG, sweep_id))
    ops = (
        []
        if whole_sweep_reason
        else ops_table.op_rows(r for r in iter_records(data_dir, sweep_id) if not is_what_if(r))
    )
    write_parquet(ops, parquet_file(data_dir, OPS_CONFIG, sweep_id), arrow_schema=ops_table.SCHEMA)
    write_dataset_card(data_dir)
    return results, excluded


def set_exclusion(data_dir: Path, sweep_id: str, reason: str | None) -> tuple[int, int]:
    """Exclude a whole sweep (a broken stack) with ``reason``, or include it again with None: one
    journaled change (``change``), finished by the next command if this one is stopped midway."""
    read_sweep(data_dir, sweep_id)  # refuses an unknown sweep with the list of known ones
    if reason is not None and not reason.strip():
        raise UserError("An exclusion needs a reason; pass --reason with a short explanation.")
    sidecar = {"exclusion.json": None if reason is None else {"reason": reason}}
    with (
        writing(data_dir, sweep_id),
        change(data_dir, sweep_id, "include" if reason is None else "exclude", sidecar),
    ):
        _apply_sidecars(data_dir, sweep_id, sidecar)
        return compact(data_dir, sweep_id)
