"""What a sweep's folder holds besides sweep.json: records (and the pending models), logs, repro
bodies and profiler traces, an exclusion and where its logs are published."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .. import fileio
from ..errors import UserError
from ..fileio import atomic_write_bytes, atomic_write_json
from . import schema
from .schema import DEFAULT_VARIANT
from .sweep_folders import data_folder_lock, holds_record, record_file, stem, sweep_dir

if TYPE_CHECKING:  # polars is imported where it is used: the probe kernel writes records without it
    pass


#: The folder of repro bodies, one file per body (``<sha256>.py``): in a sweep's folder and in the
#: data folder.
REPRO = "repro"


#: A sweep's folder of first wrong operators (``debug.localise``): ``<model>.json``, its
#: one-operator script, inputs.
LOCALISED = "localised"


#: The first line of every repro script's body (``probe.repro.body``): where a script's header ends.
REPRO_BODY_MARK = "# ---- The probe's own code"


#: A sweep's file saying where its notebooks and logs are published (``published_logs``).
PUBLISHED = "published.json"


#: A sweep's folder of profiler traces (the perf phase's, ``perf_trace``): gzipped Chrome trace
#: JSON, which Perfetto opens, named by the SHA-256 of its bytes (``<sha256>.json.gz``); a record's
#: ``perf_trace_path`` names its own.
TRACES = "traces"


#: What a sweep's run writes in its folder, holding the sweep's lock (``SweepLock``): these files in
#: it, and every file of these folders. Other commands write beside them without that lock
#: (``bisect.json``, ``localised/``).
RUNNER_FILES = ("sweep.json", "pending.json", "ray.json")
RUNNER_FOLDERS = ("records", "notebooks", "logs", "repro", TRACES)


def remove_torn_runner_writes(data_dir: Path, sweep_id: str) -> int:
    """The temporary files a killed run left half-written among its own files (``RUNNER_FILES``,
    ``RUNNER_FOLDERS``); for a run that holds the sweep's lock; how many."""
    folder = sweep_dir(data_dir, sweep_id)
    removed = fileio.remove_torn_writes(folder, lambda name: name in RUNNER_FILES)
    for sub in RUNNER_FOLDERS:
        removed += fileio.remove_torn_writes(folder / sub, lambda name: True)
    return removed


def repro_dir(data_dir: Path, sweep_id: str | None = None) -> Path:
    """Where repro bodies are kept: a sweep's ``repro/`` (as its probes wrote them), or with no
    sweep the data folder's (every sweep's bodies, beside the Parquet files and on the Hub)."""
    return (sweep_dir(data_dir, sweep_id) if sweep_id else Path(data_dir)) / REPRO


def split_repro(record: schema.Record, folder: Path) -> schema.Record:
    """The record without its whole repro script: the script's body kept once in
    ``folder/<repro_sha256>.py``, the record keeping its ``repro_settings`` and the body's hash
    (``probe.repro.script_of`` puts it together again). A script whose body is not the hash's
    stays whole, as older records have it."""
    script, sha = record.get("repro_script"), record.get("repro_sha256")
    start = script.find(REPRO_BODY_MARK) if script else -1
    if not script or not sha or start < 0 or not record.get("repro_settings"):
        return record
    body = script[start:].encode()
    if hashlib.sha256(body).hexdigest() != sha:
        return record
    path = folder / f"{sha}.py"
    if not path.exists():
        atomic_write_bytes(path, body)
    return {**record, "repro_script": None}


def copy_repro_bodies(data_dir: Path, sweep_id: str) -> int:
    """A sweep's repro bodies into the data folder's ``repro/`` (each body once for every sweep:
    content addressed), so the dataset and its push carry them; returns how many were new. Only
    bodies whose contents hash to their name are copied (``repro_body``), under the data folder's
    lock."""
    new = 0
    with data_folder_lock(data_dir):
        for path in sorted(repro_dir(data_dir, sweep_id).glob("*.py")):
            target = repro_dir(data_dir) / path.name
            if target.exists() or not REPRO_NAME.fullmatch(path.stem):
                continue
            body = path.read_bytes()
            if hashlib.sha256(body).hexdigest() == path.stem:
                atomic_write_bytes(target, body)
                new += 1
    return new


#: A repro body's name: the SHA-256 of its contents, 64 lowercase hex characters.
REPRO_NAME = re.compile(r"[0-9a-f]{64}")


def repro_body(folder: Path, sha: object, whose: str) -> str | None:
    """The repro body named ``sha`` in ``folder`` (a sweep's ``repro/`` or the data folder's),
    read only by a checked hash: ``sha`` must be 64 hex characters, the file inside ``folder``,
    and its contents must hash to ``sha``; anything else is refused in one sentence naming
    ``whose`` record. None when there is no such file."""
    if not isinstance(sha, str) or not REPRO_NAME.fullmatch(sha):
        raise UserError(
            f"The record of {whose} names its repro body {str(sha)[:80]!r}, which is not a "
            "SHA-256 (64 hex characters); refused: the record was edited or damaged, run the "
            "model again."
        )
    path = Path(folder) / f"{sha}.py"
    if not path.is_file():
        return None
    body = path.read_bytes()
    if hashlib.sha256(body).hexdigest() != sha:
        raise UserError(
            f"The repro body {path} of {whose} does not hash to its name {sha[:12]}...; "
            "refused (it was altered): restore it from the sweep's repro/ folder or run the "
            "model again."
        )
    return body.decode()


#: A kept trace's name: the SHA-256 of its gzipped bytes.
TRACE_NAME = re.compile(r"[0-9a-f]{64}\.json\.gz")


def trace_name(data: bytes) -> str:
    """The name a trace's gzipped ``data`` is kept under: content addressed, so an attempt and
    its rerun each keep theirs, and a copy made twice (a split sweep's device phase, then its
    record) is one file."""
    return f"{hashlib.sha256(data).hexdigest()}.json.gz"


def trace_relpath(sweep_id: str, name: str) -> str:
    """Where a sweep's trace ``name`` is kept, relative to the data folder (portable, as
    ``notebook_relpath``)."""
    return f"sweeps/{sweep_id}/{TRACES}/{name}"


def traces_in(folder: Path) -> dict[str, bytes]:
    """The traces a probe left in its work ``folder`` (``TRACES/<sha256>.json.gz``), name ->
    bytes, for the sweep's driver to keep (a Ray worker's folder is on another host): only those
    whose bytes hash to their name."""
    found = {}
    for path in sorted((Path(folder) / TRACES).glob("*.json.gz")):
        data = path.read_bytes()
        if TRACE_NAME.fullmatch(path.name) and trace_name(data) == path.name:
            found[path.name] = data
    return found


def keep_traces(sweep_folder: Path, traces: dict[str, bytes] | None) -> None:
    """A probe's ``traces`` (``traces_in``) into its sweep's ``TRACES/``, each once, before its
    record names them."""
    for name, data in (traces or {}).items():
        path = Path(sweep_folder) / TRACES / name
        if TRACE_NAME.fullmatch(name) and trace_name(data) == name and not path.exists():
            atomic_write_bytes(path, data)


def trace_kept(data_dir: Path, record: dict) -> dict:
    """``record``, its ``perf_trace_path`` cleared (and said so in ``perf_note``) when the trace
    it names is not in the data folder (a write that failed in a split sweep's device phase): a
    record never names a file that is not there."""
    path = record.get("perf_trace_path")
    if not path or (Path(data_dir) / path).is_file():
        return record
    note = f"{record.get('perf_note') or ''}; the profiler trace was not kept".lstrip("; ")
    return {**record, "perf_trace_path": None, "perf_note": note}


def store_result(
    data_dir: Path, sweep_id: str, record: schema.Record, notebook: bytes | None, log: str
) -> Path:
    """Keep one model's outcome: notebook and log first, the repro body (once per body), the
    record last (its presence means done)."""
    folder = sweep_dir(data_dir, sweep_id)
    model_id = record["model_id"] or ""  # check_record below refuses a record without one
    name = stem(model_id, record["variant"])
    if notebook is not None:
        atomic_write_bytes(folder / "notebooks" / f"{name}.ipynb", notebook)
    atomic_write_bytes(folder / "logs" / f"{name}.log", log.encode())
    path = record_file(data_dir, sweep_id, model_id, record["variant"])
    atomic_write_json(path, schema.check_record(split_repro(record, repro_dir(data_dir, sweep_id))))
    return path


def store_log(
    data_dir: Path, sweep_id: str, model_id: str, log: str, variant: str | None = None
) -> None:
    atomic_write_bytes(
        sweep_dir(data_dir, sweep_id) / "logs" / f"{stem(model_id, variant)}.log", log.encode()
    )


def store_exclusion(
    data_dir: Path, sweep_id: str, model_id: str, reason: str, log: str, variant: str | None = None
) -> Path:
    """Keep a model the sweep found it cannot probe (no access, gone from the Hub): its log, then
    a record with only its id and ``exclusion_reason`` (done: resume skips it; an ``excluded``
    row)."""
    store_log(data_dir, sweep_id, model_id, log, variant)
    record = schema.empty_record(
        sweep_id=sweep_id,
        model_id=model_id,
        variant=variant,
        exclusion_reason=reason,
        started_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    )
    path = record_file(data_dir, sweep_id, model_id, variant)
    atomic_write_json(path, record)
    return path


def pending_key(model_id: str, variant: str | None) -> str:
    """The key of a pending (model, variant) in ``pending.json``: the model id, plus ``
    [variant]`` for any but the default variant."""
    return model_id if variant in (None, DEFAULT_VARIANT) else f"{model_id} [{variant}]"


def pending_file(data_dir: Path, sweep_id: str) -> Path:
    return sweep_dir(data_dir, sweep_id) / "pending.json"


def write_pending(data_dir: Path, sweep_id: str, pending: dict[str, dict]) -> None:
    """The models the environment kept from being probed ({model_id: {reason, problem, at}}), for
    the report, the explorer and the user; no file when there are none. Not records: ``--resume``
    probes exactly the models without a record, these included."""
    path = pending_file(data_dir, sweep_id)
    if pending:
        atomic_write_json(path, pending)
    else:
        fileio.remove(path)


def read_pending(data_dir: Path, sweep_id: str) -> dict[str, dict]:
    path = pending_file(data_dir, sweep_id)
    return json.loads(path.read_text()) if path.exists() else {}


# records under an older name also under their own, said once (``_also_under_own_name``)
_said_twice: set[Path] = set()


def iter_records(data_dir: Path, sweep_id: str):
    """The finished records of a sweep, one at a time (sorted by file name), with every field. A
    record also kept under its own one-to-one name (``migrate_names`` stopped between writing it
    and removing the old name) is read once, from its own name, and said so on stderr: a model is
    never two rows."""
    folder = sweep_dir(data_dir, sweep_id) / "records"
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        if record.get("sweep_id") not in (None, sweep_id):
            raise UserError(
                f"{path}: field sweep_id is {record.get('sweep_id')!r}, not its sweep's "
                f"{sweep_id!r}; refused (the record was copied or edited): set sweep_id to its "
                "folder's name, or move the record to its sweep."
            )
        if _also_under_own_name(path, record, sweep_id):
            continue
        yield schema.empty_record(**{k: v for k, v in record.items() if k in schema.FIELDS})


def _also_under_own_name(path: Path, record: dict, sweep_id: str) -> bool:
    """Whether the record at ``path`` is under an older name while its model's own name holds it
    too (a name migration stopped midway); said once per file on stderr, with how to finish the
    migration."""
    model_id, variant = record.get("model_id"), record.get("variant")
    if not isinstance(model_id, str):
        return False
    own = path.with_name(f"{stem(model_id, variant)}.json")
    if own == path or not holds_record(own, model_id, variant):
        return False
    if path not in _said_twice:
        _said_twice.add(path)
        print(
            f"{path}: the record of {model_id} is also under its own name {own.name} (a name "
            f"migration stopped midway); read once, from {own.name}. `model-support sweep "
            f"--resume {sweep_id}` removes the old name.",
            file=sys.stderr,
        )
    return True


def read_records(data_dir: Path, sweep_id: str) -> list[dict]:
    return list(iter_records(data_dir, sweep_id))


def exclusion(data_dir: Path, sweep_id: str) -> str | None:
    """The reason a whole sweep was excluded after the fact, or None."""
    path = sweep_dir(data_dir, sweep_id) / "exclusion.json"
    return json.loads(path.read_text())["reason"] if path.exists() else None


def published_logs(data_dir: Path, sweep_id: str) -> dict | None:
    """Where ``model-support push --logs`` put this sweep's notebooks and logs: {"repo",
    "bucket", "url"} (``url`` + ``notebooks/<stem>.ipynb`` is a notebook's address), or None."""
    path = sweep_dir(data_dir, sweep_id) / PUBLISHED
    return json.loads(path.read_text()) if path.exists() else None
