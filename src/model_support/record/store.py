"""Where records live on disk, and how they become the Parquet dataset.

Layout (docs/design.md): ``<data>/sweeps/<sweep_id>/`` holds ``sweep.json``, one JSON record per model
under ``records/`` and the executed notebooks; compaction writes
``<data>/results/sweep=<id>/part-0.parquet`` and ``<data>/excluded/sweep=<id>/part-0.parquet``.
Hive-style folders mean adding a sweep never rewrites another, and ``scan`` reads them all lazily.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import hashlib
import itertools
import json
import os
import re
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from .. import fileio
from ..errors import UserError
from ..fileio import atomic_write_bytes, atomic_write_json
from . import ops_table, schema
from .names import check_name, legacy_name, model_file_name
from .schema import DEFAULT_VARIANT
from .sweep_meta import SweepMeta, safe_name

if TYPE_CHECKING:  # polars is imported where it is used: the probe kernel writes records without it
    import polars as pl

CONFIGS = ("results", "excluded")
#: The third config: one row per operator per sweep, from the census (``ops_table``); every config of the dataset.
OPS_CONFIG = "ops"
#: What-if runs (``what_if``: operators on the host, ``probe.host_ops``), the stack's records' shape, apart: nothing
#: that reads ``results`` (the gate, the exports, the support card, the published default config) sees them.
WHAT_IF_CONFIG = "what_if"
DATASET_CONFIGS = (*CONFIGS, OPS_CONFIG, WHAT_IF_CONFIG)
#: The folder of repro bodies, one file per body (``<sha256>.py``): in a sweep's folder and in the data folder.
REPRO = "repro"
#: A sweep's folder of first wrong operators (``debug.localise``): ``<model>.json``, its one-operator script, inputs.
LOCALISED = "localised"
#: The first line of every repro script's body (``probe.repro.body``): where a script's header ends.
REPRO_BODY_MARK = "# ---- The probe's own code"
#: A sweep's file saying where its notebooks and logs are published (``published_logs``).
PUBLISHED = "published.json"
#: A sweep's folder of profiler traces (the perf phase's, ``perf_trace``): gzipped Chrome trace JSON, which Perfetto
#: opens, named by the SHA-256 of its bytes (``<sha256>.json.gz``); a record's ``perf_trace_path`` names its own.
TRACES = "traces"


def polars_schema() -> pl.Schema:
    """The record schema as Polars sees it (built from ``schema.SCHEMA``, never written twice)."""
    import polars as pl

    frame = pl.from_arrow(schema.SCHEMA.empty_table())
    assert isinstance(frame, pl.DataFrame)  # a table, not one column
    return frame.schema


def scan(data_dir: Path, config: str = "results") -> pl.LazyFrame:
    """All sweeps of one config, lazily. Files written before a column existed read it as null."""
    import polars as pl

    if config not in (*CONFIGS, WHAT_IF_CONFIG):
        raise UserError(f"config {config!r} is not one of {', '.join((*CONFIGS, WHAT_IF_CONFIG))}")
    root = Path(data_dir) / config
    files = sorted(root.glob("sweep=*/*.parquet"))
    if not files:
        return pl.LazyFrame(schema=polars_schema())
    return pl.scan_parquet(
        files, hive_partitioning=False, schema=polars_schema(), missing_columns="insert", extra_columns="ignore"
    )


def scan_ops(data_dir: Path) -> pl.LazyFrame:
    """The ``ops`` config of every sweep, lazily (``ops_table``)."""
    import polars as pl

    files = sorted((Path(data_dir) / OPS_CONFIG).glob("sweep=*/*.parquet"))
    frame = pl.from_arrow(ops_table.SCHEMA.empty_table())
    assert isinstance(frame, pl.DataFrame)
    if not files:
        return frame.lazy()
    return pl.scan_parquet(files, hive_partitioning=False, schema=frame.schema, missing_columns="insert")


#: The text columns a reader filters or groups rows by: they keep Parquet statistics (min and max per row
#: group, for pruning), as every column of another type does. The other texts (tracebacks, messages, notes,
#: settings) do not: a statistic holds the longest texts whole, twice, and cost more than the rows themselves.
KEY_TEXTS = (
    "sweep_id",
    "model_id",
    "variant",
    "status",
    "failure_stage",
    "task",
    "model_type",
    "error_type",
    "failure_signature",
    "mode",
    "cache",
    "dtype",
    "device_type",
    "parallelism",
    "numerics",
    "attribution",
    "pipeline_tag",
    "repro_sha256",
)


def statistics_columns() -> list[str]:
    """The columns written with statistics: ``KEY_TEXTS`` and every column that is not a text."""
    import pyarrow as pa

    return [
        f.name
        for f in schema.SCHEMA
        if f.name in KEY_TEXTS or not (pa.types.is_string(f.type) or pa.types.is_large_string(f.type))
    ]


#: How every Parquet file of the dataset is written (docs/dataset.md; bench/bench_row_bytes.py measured each choice
#: on the smoke sweep): zstd (level 12: nearly all of level 19's gain in a twentieth of its time) over plain encoding,
#: since a dictionary page per column costs more than it saves once zstd shares the repeats (the per-repeat and
#: per-signature lists, the notes, the settings); no copy of the Arrow schema in the footer (~14 kB a file: every
#: column's type is a plain Parquet type that pyarrow, Polars and ``datasets`` read back as declared).
PARQUET_OPTIONS = {"compression": "zstd", "compression_level": 12, "use_dictionary": False, "store_schema": False}


def write_parquet(records, path: Path, batch_rows: int = 512, arrow_schema=None) -> int:
    """Records (any iterable) -> one Parquet file with exactly the declared schema (or ``arrow_schema``), atomically,
    written in row groups of ``batch_rows`` so memory does not grow with the sweep, with ``PARQUET_OPTIONS``.
    Writes no file (and removes an old one) when there are no rows: ``datasets`` refuses a file with no row group.
    Returns the number of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    fileio.make_folders(path.parent)
    # a name of its own (two compactions of one sweep at once must not write into one temporary file)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    rows, writer = 0, None
    iterator = iter(records)
    try:
        try:
            while batch := list(itertools.islice(iterator, batch_rows)):
                if writer is None:
                    if arrow_schema is None:
                        writer = pq.ParquetWriter(
                            tmp, schema.SCHEMA, write_statistics=statistics_columns(), **PARQUET_OPTIONS
                        )
                    else:
                        writer = pq.ParquetWriter(tmp, arrow_schema, **PARQUET_OPTIONS)
                table = pa.Table.from_pylist(batch, schema=arrow_schema) if arrow_schema else schema.to_table(batch)
                writer.write_table(table)
                rows += len(batch)
        finally:
            if writer is not None:
                writer.close()
        if rows:
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide shared sweep data
            fileio.replace_file(tmp, path)  # synced, then renamed: a crash never leaves a torn file
        else:
            tmp.unlink()
            fileio.remove(path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a failed write (a full disk) leaves no temp file behind
        raise
    return rows


# --- one folder per sweep ----------------------------------------------------------------------


def sweep_dir(data_dir: Path, sweep_id: str) -> Path:
    """A sweep's folder; the id is checked to be a plain name first (never a path out of the data folder)."""
    return Path(data_dir) / "sweeps" / check_name(sweep_id, "sweep id", f"{Path(data_dir) / 'sweeps'}")


class SweepLock:
    """One writer per sweep at a time: the runner for the whole run (a second ``--resume`` of a running
    sweep is refused), and each command that rewrites a sweep's files (``compact``: ``aggregate``,
    ``exclude``, ``include``, ``push --logs``) for its rewrite, refused while a sweep runs. An flock on
    ``<sweep>/.lock``: the kernel drops it when the holder dies, so a killed sweep leaves no stale lock.

    A process that holds a sweep's lock may rewrite that sweep's files without taking it again
    (``held``): the runner compacts at the end of its run."""

    _held: set[Path] = set()
    _guard = threading.Lock()

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.path = Path(folder).resolve() / ".lock"

    def __enter__(self):
        self.handle = open(self.path, "a+")  # noqa: SIM115 closed in __exit__
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.handle.close()
            raise UserError(
                f"Sweep folder {self.path.parent} is being written by another running sweep; wait for it to finish."
            ) from None
        with self._guard:
            self._held.add(self.path)
        return self

    def __exit__(self, *exc):
        with self._guard:
            self._held.discard(self.path)
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()

    @classmethod
    def held(cls, folder: Path) -> bool:
        """Whether this process holds ``folder``'s lock."""
        with cls._guard:
            return Path(folder).resolve() / ".lock" in cls._held


@contextlib.contextmanager
def writing_all(data_dir: Path):
    """Hold every sweep's lock of the data folder (``push``: none may change while it is sent)."""
    with contextlib.ExitStack() as locks:
        for sweep_id in list_sweeps(data_dir):
            locks.enter_context(writing(data_dir, sweep_id))
        yield


@contextlib.contextmanager
def writing(data_dir: Path, sweep_id: str):
    """Hold ``sweep_id``'s lock while rewriting its files (already held by this process: nothing to take)."""
    folder = sweep_dir(data_dir, sweep_id)
    if SweepLock.held(folder):
        yield
    else:
        with SweepLock(folder):
            yield


def stem(model_id: str, variant: str | None = None) -> str:
    """The file name of a (model, variant)'s record, notebook and log: the model's safe name, plus
    ``@<variant>`` for any variant but the default one (so sweeps without a matrix keep their names)."""
    if variant in (None, DEFAULT_VARIANT):
        return model_file_name(model_id)
    return f"{model_file_name(model_id)}@{safe_name(variant)}"


def legacy_stem(model_id: str, variant: str | None = None) -> str:
    """The name ``stem`` gave before names were one to one (``names.legacy_name``): what older sweeps hold."""
    if variant in (None, DEFAULT_VARIANT):
        return legacy_name(model_id)
    return f"{legacy_name(model_id)}@{safe_name(variant)}"


def migrate_names(data_dir: Path, sweep_id: str) -> int:
    """Move records stored under a name that is not their model's one-to-one name (a sweep stored before
    names were one to one: ``tiny+opt`` as ``tiny_opt``) to it, so that resume finds each and a new record
    never overwrites another model's. A move writes the new name, then removes the old one; a migration
    stopped between the two left the record under both, so an old name whose record is already under its own
    name is removed too (else compaction would read the model twice). Returns how many moved (the caller says
    so in one line)."""
    moved = 0
    folder = sweep_dir(data_dir, sweep_id) / "records"
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        model_id, variant = record.get("model_id"), record.get("variant")
        if not isinstance(model_id, str):
            continue
        target = folder / f"{stem(model_id, variant)}.json"
        if target == path:
            continue
        if not target.exists():
            atomic_write_bytes(target, path.read_bytes())
        elif not _holds(target, model_id, variant):
            continue  # another model's record under that name: never overwritten, never dropped
        fileio.remove(path)
        moved += 1
    return moved


def _holds(path: Path, model_id: str, variant: str | None) -> bool:
    """Whether the record file ``path`` is there and is (model, variant)'s: a file name alone does not say (an
    older sweep's name may be another model's one-to-one name)."""
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    same_variant = (stored.get("variant") or DEFAULT_VARIANT) == (variant or DEFAULT_VARIANT)
    return stored.get("model_id") == model_id and same_variant


def record_file(data_dir: Path, sweep_id: str, model_id: str, variant: str | None = None) -> Path:
    return sweep_dir(data_dir, sweep_id) / "records" / f"{stem(model_id, variant)}.json"


def find_record(data_dir: Path, sweep_id: str, model_id: str, variant: str | None = None) -> Path | None:
    """The record file of (model, variant) in a sweep, or None: under its one-to-one name, or under the name an
    older sweep gave it (``legacy_stem``), either only when the record inside is that model's."""
    folder = sweep_dir(data_dir, sweep_id) / "records"
    for name in dict.fromkeys((stem(model_id, variant), legacy_stem(model_id, variant))):
        path = folder / f"{name}.json"
        if _holds(path, model_id, variant):
            return path
    return None


def notebook_relpath(sweep_id: str, model_id: str, variant: str | None = None) -> str:
    """Where a model's executed notebook is kept, relative to the data folder (portable)."""
    return f"sweeps/{sweep_id}/notebooks/{stem(model_id, variant)}.ipynb"


def read_sweep(data_dir: Path, sweep_id: str) -> SweepMeta:
    """The sweep's ``sweep.json`` (any version, see ``sweep_meta``); one sentence when unknown."""
    path = sweep_dir(data_dir, sweep_id) / "sweep.json"
    if not path.exists():
        known = ", ".join(list_sweeps(data_dir)) or "none yet"
        raise UserError(f"Sweep {sweep_id!r} does not exist under {data_dir}/sweeps; known sweeps: {known}.")
    meta = SweepMeta.from_dict(json.loads(path.read_text()))
    if meta.sweep_id != sweep_id:
        raise UserError(
            f"{path}: field sweep_id is {meta.sweep_id!r}, not its folder's name {sweep_id!r}; refused (the file "
            "was moved or edited): set sweep_id to the folder's name."
        )
    return meta


def list_sweeps(data_dir: Path) -> list[str]:
    """Sweep ids with a sweep.json, oldest first (by created_at)."""
    return _oldest_first(_created_at(data_dir))


def _oldest_first(created_at: dict[str, str]) -> list[str]:
    """Sweep ids by their ``created_at`` (``_created_at``), oldest first."""
    return [sweep_id for _, sweep_id in sorted((created, sweep_id) for sweep_id, created in created_at.items())]


def _created_at(data_dir: Path) -> dict[str, str]:
    """Each sweep with a sweep.json: its ``created_at`` as written (the raw field: a moved folder is
    ``read_sweep``'s to refuse, not a listing's)."""
    return {
        path.parent.name: json.loads(path.read_text()).get("created_at", "")
        for path in (Path(data_dir) / "sweeps").glob("*/sweep.json")
    }


def is_what_if(record: dict) -> bool:
    """A run of a what-if sweep (operators on the host, ``probe.what_if``): no verdict of the stack. Its probe marks
    it (``what_if``) once its device phase ran; a stand-in the runner wrote (a timeout, a dead kernel, a failed
    download) or an early failure carries only the setting (``host_ops``), and is one too: review found such a crash
    stored in ``results`` as the stack's verdict, and made a later stack sweep's baseline."""
    return bool(record.get("what_if") or record.get("host_ops"))


def model_ids_of_rows(data_dir: Path, sweep_id: str) -> list[str]:
    """The models a sweep has rows of in the dataset (``results`` and ``excluded``), sorted: a pulled sweep's models."""
    import polars as pl

    found: set[str] = set()
    for config in CONFIGS:
        frame = scan(Path(data_dir), config).filter(pl.col("sweep_id") == sweep_id).select("model_id").unique()
        found.update(m for m in frame.collect()["model_id"].to_list() if m)
    return sorted(found)


def of_the_stack():
    """``is_what_if``'s negation as a Polars filter: the rows that are the stack's verdicts (an older what-if stand-in
    left in ``results`` until recompaction is not one: the support card and the flips had read it as the stack's)."""
    import polars as pl

    return ~(pl.col("what_if").fill_null(False) | (pl.col("host_ops").fill_null("") != ""))  # as is_what_if reads


def what_if_setting(data_dir: Path, sweep_id: str) -> str | None:
    """The ``host_ops`` of a what-if sweep (its definition puts operators on the host, ``probe.what_if``: its runs
    are no verdict of the stack), else None. A dataset pulled without ``sweeps/`` has no definition to ask: there any
    row of the sweep, in any config (an excluded one too), that carries ``host_ops`` says it."""
    path = Path(data_dir) / "sweeps" / sweep_id / "sweep.json"
    if path.exists():
        raw = json.loads(path.read_text())
        return (raw.get("probe") or raw.get("settings") or {}).get("host_ops") or None
    return host_ops_by_rows(data_dir, [sweep_id]).get(sweep_id)


def host_ops_by_rows(data_dir: Path, sweep_ids: list[str]) -> dict[str, str]:
    """Of ``sweep_ids``, each whose rows say it is a what-if sweep, as ``what_if_setting`` asks a sweep pulled without
    its definition (any row of it, in any config, that carries ``host_ops``): its ``host_ops``. Asked of all at once
    (a pulled history holds thousands), reading only those sweeps' own files. A sweep with its definition here is
    asked by it (``what_if_setting``; ``analysis.history.what_if_sweeps``, from the facts ``sweep_index`` caches)."""
    import polars as pl

    files = [
        path
        for config in (WHAT_IF_CONFIG, *CONFIGS)  # a what-if run's own config first
        for sweep_id in sweep_ids
        for path in sorted((Path(data_dir) / config / f"sweep={sweep_id}").glob("*.parquet"))
    ]
    if not files:
        return {}
    said = (
        pl.scan_parquet(
            files, hive_partitioning=False, schema=polars_schema(), missing_columns="insert", extra_columns="ignore"
        )
        .filter(pl.col("host_ops").fill_null("") != "")
        .group_by("sweep_id", maintain_order=True)
        .agg(pl.col("host_ops").first())
        .collect()
    )
    return dict(zip(said["sweep_id"].to_list(), said["host_ops"].to_list()))


def _newest_of_stack(data_dir: Path, known: list[str]) -> str | None:
    """The newest of ``known`` (oldest first) that is a sweep of the stack itself, not a what-if sweep
    (``what_if_setting``): asked newest first, so a pulled dataset's many sweeps are not each read."""
    return next((s for s in reversed(known) if not what_if_setting(data_dir, s)), None)


def _created(sweep_id: str, created_at: dict[str, str], local: dict[str, int]) -> tuple:
    """A sweep's place in time: its sweep.json's ``created_at`` where it has one (``_created_at``; ``local``: the
    local sweeps' order), else the UTC time in its id (a pulled sweep; an id in no known shape first, by name)."""
    from .sweep_meta import parse_sweep_id

    if sweep_id in local:
        try:
            created = _dt.datetime.fromisoformat(created_at[sweep_id])
            created = created if created.tzinfo else created.replace(tzinfo=_dt.UTC)  # naive: UTC, as history reads
            return (1, created.timestamp(), local[sweep_id], sweep_id)
        except (TypeError, ValueError):
            pass
    parsed = parse_sweep_id(sweep_id)
    return (int(parsed.time is not None), parsed.time.timestamp() if parsed.time else 0.0, -1, sweep_id)


#: The word that names the newest sweep (``latest``, or ``latest:NAME`` for the newest of a name).
LATEST = "latest"


def resolve_sweep_id(data_dir: Path, given: str) -> str:
    """The sweep id a user means: the id itself, ``latest`` (the newest sweep of the stack), ``latest:NAME`` (the
    newest of the stack's of a name), or a unique prefix of one; else one sentence with the closest ids
    (``model-support list`` shows them). ``latest`` never names a what-if sweep (``what_if_setting``: its runs are no
    verdict of the stack), whatever its name: its id or a unique prefix of it does."""
    import difflib

    from .sweep_meta import parse_sweep_id

    if (Path(data_dir) / "sweeps" / check_name(given, "sweep id", "the command line") / "sweep.json").exists():
        return given
    # a dataset pulled without its sweeps/ folder knows its sweeps by their Parquet files (compaction leaves empty
    # folders behind in every config)
    pulled = {
        p.parent.name.removeprefix("sweep=")
        for c in DATASET_CONFIGS
        for p in (Path(data_dir) / c).glob("sweep=*/*.parquet")
    }
    if given in pulled:
        return given
    created_at = _created_at(data_dir)
    local = _oldest_first(created_at)
    # one order for all, by time: the local ones by their created_at, the pulled ones by the time in their ids
    # (pulled ones listed after the local ones made an older pulled sweep `latest`; by name, the last name)
    order = {sweep_id: i for i, sweep_id in enumerate(local)}
    known = sorted(set(local) | pulled, key=lambda s: _created(s, created_at, order))
    if given == LATEST or given.startswith(f"{LATEST}:"):
        name = given.partition(":")[2]
        # ``latest`` and ``latest:NAME`` are the newest sweep of the stack (of that name): never a what-if sweep
        # (``ops --prove``'s, or ``sweep -p host_ops=...`` under the stack's own name), which only its id names
        named = [s for s in known if parse_sweep_id(s).name == name] if name else known
        newest = _newest_of_stack(data_dir, named)
        if newest:
            return newest
        if named:  # every one of them is a what-if sweep
            raise UserError(
                f"Every sweep {'named ' + repr(name) + ' ' if name else ''}under {data_dir}/sweeps is a what-if sweep "
                f"(operators on the host: no verdict of the stack), which `{LATEST}` never names; give its id: the "
                f"newest is {named[-1]}."
            )
        names = sorted({parse_sweep_id(s).name for s in known})
        raise UserError(
            f"No sweep {'named ' + repr(name) + ' ' if name else ''}under {data_dir}/sweeps"
            + (f"; the names are {', '.join(names)}." if names else "; run a sweep first (make sweep).")
        )
    matches = [s for s in known if s.startswith(given)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        of_names = {parse_sweep_id(s).name for s in matches}
        # the hint names only what ``latest:NAME`` resolves to: a sweep of the stack, not a what-if one
        one_name = len(of_names) == 1 and _newest_of_stack(data_dir, matches) is not None
        hint = f"; `{LATEST}:{of_names.pop()}` names the newest" if one_name else ""
        raise UserError(
            f"Sweep {given!r} is the start of {len(matches)} sweeps ({', '.join(matches[-3:])}"
            f"{', ...' if len(matches) > 3 else ''}); give more of the id{hint}."
        )
    close = difflib.get_close_matches(given, known, n=3, cutoff=0.5)
    listing = (
        f"did you mean {' or '.join(close)}?" if close else f"known sweeps: {', '.join(known[-5:]) or 'none yet'}."
    )
    raise UserError(
        f"Sweep {given!r} does not exist under {data_dir}/sweeps; {listing} (`model-support list` shows them all)"
    )


def repro_dir(data_dir: Path, sweep_id: str | None = None) -> Path:
    """Where repro bodies are kept: a sweep's ``repro/`` (as its probes wrote them), or with no sweep the data
    folder's (every sweep's bodies, beside the Parquet files and on the Hub)."""
    return (sweep_dir(data_dir, sweep_id) if sweep_id else Path(data_dir)) / REPRO


def split_repro(record: schema.Record, folder: Path) -> schema.Record:
    """The record without its whole repro script: the script's body kept once in ``folder/<repro_sha256>.py``,
    the record keeping its ``repro_settings`` and the body's hash (``probe.repro.script_of`` puts it together
    again). A script whose body is not the hash's stays whole, as older records have it."""
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
    """A sweep's repro bodies into the data folder's ``repro/`` (each body once for every sweep: content
    addressed), so the dataset and its push carry them; returns how many were new. Only bodies whose contents
    hash to their name are copied (``repro_body``), under the data folder's lock."""
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
    """The repro body named ``sha`` in ``folder`` (a sweep's ``repro/`` or the data folder's), read only by a
    checked hash: ``sha`` must be 64 hex characters, the file inside ``folder``, and its contents must hash to
    ``sha``; anything else is refused in one sentence naming ``whose`` record. None when there is no such file."""
    if not isinstance(sha, str) or not REPRO_NAME.fullmatch(sha):
        raise UserError(
            f"The record of {whose} names its repro body {str(sha)[:80]!r}, which is not a SHA-256 (64 hex "
            "characters); refused: the record was edited or damaged, run the model again."
        )
    path = Path(folder) / f"{sha}.py"
    if not path.is_file():
        return None
    body = path.read_bytes()
    if hashlib.sha256(body).hexdigest() != sha:
        raise UserError(
            f"The repro body {path} of {whose} does not hash to its name {sha[:12]}...; refused (it was altered): "
            "restore it from the sweep's repro/ folder or run the model again."
        )
    return body.decode()


#: A kept trace's name: the SHA-256 of its gzipped bytes.
TRACE_NAME = re.compile(r"[0-9a-f]{64}\.json\.gz")


def trace_name(data: bytes) -> str:
    """The name a trace's gzipped ``data`` is kept under: content addressed, so an attempt and its rerun each keep
    theirs, and a copy made twice (a split sweep's device phase, then its record) is one file."""
    return f"{hashlib.sha256(data).hexdigest()}.json.gz"


def trace_relpath(sweep_id: str, name: str) -> str:
    """Where a sweep's trace ``name`` is kept, relative to the data folder (portable, as ``notebook_relpath``)."""
    return f"sweeps/{sweep_id}/{TRACES}/{name}"


def traces_in(folder: Path) -> dict[str, bytes]:
    """The traces a probe left in its work ``folder`` (``TRACES/<sha256>.json.gz``), name -> bytes, for the sweep's
    driver to keep (a Ray worker's folder is on another host): only those whose bytes hash to their name."""
    found = {}
    for path in sorted((Path(folder) / TRACES).glob("*.json.gz")):
        data = path.read_bytes()
        if TRACE_NAME.fullmatch(path.name) and trace_name(data) == path.name:
            found[path.name] = data
    return found


def keep_traces(sweep_folder: Path, traces: dict[str, bytes] | None) -> None:
    """A probe's ``traces`` (``traces_in``) into its sweep's ``TRACES/``, each once, before its record names them."""
    for name, data in (traces or {}).items():
        path = Path(sweep_folder) / TRACES / name
        if TRACE_NAME.fullmatch(name) and trace_name(data) == name and not path.exists():
            atomic_write_bytes(path, data)


def trace_kept(data_dir: Path, record: dict) -> dict:
    """``record``, its ``perf_trace_path`` cleared (and said so in ``perf_note``) when the trace it names is not in the
    data folder (a write that failed in a split sweep's device phase): a record never names a file that is not there."""
    path = record.get("perf_trace_path")
    if not path or (Path(data_dir) / path).is_file():
        return record
    note = f"{record.get('perf_note') or ''}; the profiler trace was not kept".lstrip("; ")
    return {**record, "perf_trace_path": None, "perf_note": note}


def store_result(data_dir: Path, sweep_id: str, record: schema.Record, notebook: bytes | None, log: str) -> Path:
    """Keep one model's outcome: notebook and log first, the repro body (once per body), the record last
    (its presence means done)."""
    folder = sweep_dir(data_dir, sweep_id)
    model_id = record["model_id"] or ""  # check_record below refuses a record without one
    name = stem(model_id, record["variant"])
    if notebook is not None:
        atomic_write_bytes(folder / "notebooks" / f"{name}.ipynb", notebook)
    atomic_write_bytes(folder / "logs" / f"{name}.log", log.encode())
    path = record_file(data_dir, sweep_id, model_id, record["variant"])
    atomic_write_json(path, schema.check_record(split_repro(record, repro_dir(data_dir, sweep_id))))
    return path


def store_log(data_dir: Path, sweep_id: str, model_id: str, log: str, variant: str | None = None) -> None:
    atomic_write_bytes(sweep_dir(data_dir, sweep_id) / "logs" / f"{stem(model_id, variant)}.log", log.encode())


def store_exclusion(
    data_dir: Path, sweep_id: str, model_id: str, reason: str, log: str, variant: str | None = None
) -> Path:
    """Keep a model the sweep found it cannot probe (no access, gone from the Hub): its log, then a
    record with only its id and ``exclusion_reason`` (done: resume skips it; an ``excluded`` row)."""
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
    """The key of a pending (model, variant) in ``pending.json``: the model id, plus `` [variant]`` for
    any but the default variant."""
    return model_id if variant in (None, DEFAULT_VARIANT) else f"{model_id} [{variant}]"


def pending_file(data_dir: Path, sweep_id: str) -> Path:
    return sweep_dir(data_dir, sweep_id) / "pending.json"


def write_pending(data_dir: Path, sweep_id: str, pending: dict[str, dict]) -> None:
    """The models the environment kept from being probed ({model_id: {reason, problem, at}}), for the
    report, the explorer and the user; no file when there are none. Not records: ``--resume`` probes
    exactly the models without a record, these included."""
    path = pending_file(data_dir, sweep_id)
    if pending:
        atomic_write_json(path, pending)
    else:
        fileio.remove(path)


def read_pending(data_dir: Path, sweep_id: str) -> dict[str, dict]:
    path = pending_file(data_dir, sweep_id)
    return json.loads(path.read_text()) if path.exists() else {}


def iter_records(data_dir: Path, sweep_id: str):
    """The finished records of a sweep, one at a time (sorted by file name), with every field. A record also kept
    under its own one-to-one name (``migrate_names`` stopped between writing it and removing the old name) is read
    once, from its own name, and said so on stderr: a model is never two rows."""
    folder = sweep_dir(data_dir, sweep_id) / "records"
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        if record.get("sweep_id") not in (None, sweep_id):
            raise UserError(
                f"{path}: field sweep_id is {record.get('sweep_id')!r}, not its sweep's {sweep_id!r}; refused (the "
                "record was copied or edited): set sweep_id to its folder's name, or move the record to its sweep."
            )
        if _also_under_own_name(path, record, sweep_id):
            continue
        yield schema.empty_record(**{k: v for k, v in record.items() if k in schema.FIELDS})


_said_twice: set[Path] = set()


def _also_under_own_name(path: Path, record: dict, sweep_id: str) -> bool:
    """Whether the record at ``path`` is under an older name while its model's own name holds it too (a name
    migration stopped midway); said once per file on stderr, with how to finish the migration."""
    model_id, variant = record.get("model_id"), record.get("variant")
    if not isinstance(model_id, str):
        return False
    own = path.with_name(f"{stem(model_id, variant)}.json")
    if own == path or not _holds(own, model_id, variant):
        return False
    if path not in _said_twice:
        _said_twice.add(path)
        print(
            f"{path}: the record of {model_id} is also under its own name {own.name} (a name migration stopped "
            f"midway); read once, from {own.name}. `model-support sweep --resume {sweep_id}` removes the old name.",
            file=sys.stderr,
        )
    return True


def read_records(data_dir: Path, sweep_id: str) -> list[dict]:
    return list(iter_records(data_dir, sweep_id))


# --- the Parquet dataset -----------------------------------------------------------------------


def parquet_file(data_dir: Path, config: str, sweep_id: str) -> Path:
    check_name(sweep_id, "sweep id", f"{Path(data_dir) / config}")
    return Path(data_dir) / config / f"sweep={sweep_id}" / "part-0.parquet"


def exclusion(data_dir: Path, sweep_id: str) -> str | None:
    """The reason a whole sweep was excluded after the fact, or None."""
    path = sweep_dir(data_dir, sweep_id) / "exclusion.json"
    return json.loads(path.read_text())["reason"] if path.exists() else None


def published_logs(data_dir: Path, sweep_id: str) -> dict | None:
    """Where ``model-support push --logs`` put this sweep's notebooks and logs: {"repo", "bucket", "url"}
    (``url`` + ``notebooks/<stem>.ipynb`` is a notebook's address), or None."""
    path = sweep_dir(data_dir, sweep_id) / PUBLISHED
    return json.loads(path.read_text()) if path.exists() else None


# --- changes of the dataset, committed as a whole ----------------------------------------------
#
# A change that rewrites a sweep's Parquet files (compaction, ``exclude``, ``include``, a push recording where
# the logs go) is a journaled redo: first ``change.json`` in the sweep's folder (what the change is, and the
# sidecar files it ends with: ``exclusion.json``, ``published.json``), then the sidecars, then the Parquet
# files in an order that can only duplicate a row, never lose one (the config a row moves *to* is written
# before the one it leaves), and ``change.json`` removed last. The JSON records are the source of truth and
# compaction rebuilds the files from them, so finishing an interrupted change is doing it again: the next
# command that reads or writes the data folder (``finish_interrupted``) does, and says so in one line. A
# plain reader (``datasets``) may see a moving row in both configs for an instant, never in neither.

#: The journal of a change in progress, in the sweep's folder.
CHANGE = "change.json"
#: The sidecar files a change may set (the journal says their final contents, or None for no file).
SIDECARS = ("exclusion.json", PUBLISHED)
_open_changes: set[Path] = set()


@contextlib.contextmanager
def change(data_dir: Path, sweep_id: str, what: str, sidecars: dict[str, dict | None] | None = None):
    """Journal a change of ``sweep_id``'s dataset files (``what``: compact, exclude, include, push) that ends
    with ``sidecars`` ({file name: contents or None}); the caller holds the sweep's lock. Nested in an open
    change of the same sweep (``set_exclusion`` compacting), the outer journal covers it. The journal stays
    when the body raises: the change is half-done, the next command finishes it."""
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
    """The change a stopped process left half-done in ``sweep_id`` (its journal), with its sidecars set as the
    journal says: what remains is to rebuild the files from the records. None when there is none (or it is this
    process's own, open). The caller holds the sweep's lock."""
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
    """Finish every change a stopped process left half-done (of ``sweep_ids``, default all): its sidecars set
    as the journal says, its Parquet files rebuilt from the records, the journal removed. A sweep another
    process is writing is left to it. Returns one sentence per change finished."""
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
            f"Sweep {sweep_id}: an interrupted {what} (begun {entry.get('at', 'earlier')}) was {done}: its "
            "dataset files were rebuilt from its records."
        )
    return said


def require_whole(data_dir: Path) -> None:
    """Refuse (one sentence) while any sweep of the data folder has a change half-done (``push``)."""
    if half := interrupted(data_dir):
        raise UserError(
            f"{data_dir} has a change half-done in sweep(s) {', '.join(half)}; refused to publish it: run "
            f"`model-support aggregate {half[0]}` (any command finishes it) and push again."
        )


def set_published_logs(data_dir: Path, sweep_id: str, where: dict | None) -> tuple[int, int]:
    """Record where this sweep's notebooks and logs are published (None: nowhere) and compact again, so
    that each row's ``notebook_url`` and ``log_url`` point there; returns (results, excluded)."""
    with writing(data_dir, sweep_id), change(data_dir, sweep_id, "publish", {PUBLISHED: where}):
        _apply_sidecars(data_dir, sweep_id, {PUBLISHED: where})
        return compact(data_dir, sweep_id)


def _with_urls(record: dict, folder: Path, base: str) -> dict:
    """The record with the published addresses of its notebook and log (each only when the file exists)."""
    name = stem(record["model_id"], record["variant"])
    return {
        **record,
        "notebook_url": f"{base}notebooks/{name}.ipynb" if (folder / "notebooks" / f"{name}.ipynb").exists() else None,
        "log_url": f"{base}logs/{name}.log" if (folder / "logs" / f"{name}.log").exists() else None,
    }


def compact(data_dir: Path, sweep_id: str) -> tuple[int, int]:
    """Records (plus the models excluded before running) -> this sweep's two Parquet files.

    A record with an ``exclusion_reason`` (a model found gated or gone while the sweep ran) goes to
    ``excluded``, a what-if run's (``is_what_if``: marked, or carrying ``host_ops``) to its own config, every other to ``results`` (``config_of``). Rewrites only this sweep's files, as one journaled change
    (``change``); the JSON records stay the source of truth, so compaction can be redone at any time and
    gives the same rows (a whole-sweep exclusion and the published logs' addresses are applied here). A
    change of this sweep left half-done by a stopped process is finished first. Records are streamed (two
    passes), so memory stays flat however long the sweep. Returns (results, excluded). Refused (one
    sentence) while another process writes the sweep (``SweepLock``)."""
    meta = read_sweep(data_dir, sweep_id)
    with writing(data_dir, sweep_id):
        _take_over(data_dir, sweep_id)  # a change left half-done: its sidecars now, its files by this compaction
        with change(data_dir, sweep_id, "compact"):
            return _compact(data_dir, sweep_id, meta)


def config_of(record: dict) -> str:
    """The config a record's row belongs to: ``excluded`` (no verdict), ``what_if`` (operators ran on the host: never
    the stack's verdict), else ``results``."""
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
            host_ops=meta.probe.get("host_ops") or None,  # a pulled what-if sweep's rows say what it was
        )
        for model_id, reason in meta.excluded.items()
    ]

    def records(config: str):
        for record in iter_records(data_dir, sweep_id):
            if published:
                record = _with_urls(record, sweep_dir(data_dir, sweep_id), published["url"])
            if whole_sweep_reason:
                if config == "excluded":
                    yield {**record, "exclusion_reason": record["exclusion_reason"] or whole_sweep_reason}
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

    # the config the rows move to first: a stop between the two files leaves a row in both, never in neither
    if whole_sweep_reason:
        excluded = write_excluded()
        results = write_results()
    else:
        results = write_results()
        excluded = write_excluded()
    write_parquet(records(WHAT_IF_CONFIG), parquet_file(data_dir, WHAT_IF_CONFIG, sweep_id))  # none: no file
    ops = (
        []
        if whole_sweep_reason
        else ops_table.op_rows(r for r in iter_records(data_dir, sweep_id) if not is_what_if(r))
    )
    write_parquet(ops, parquet_file(data_dir, OPS_CONFIG, sweep_id), arrow_schema=ops_table.SCHEMA)
    write_dataset_card(data_dir)
    return results, excluded


def set_exclusion(data_dir: Path, sweep_id: str, reason: str | None) -> tuple[int, int]:
    """Exclude a whole sweep (a broken stack) with ``reason``, or include it again with None: one journaled
    change (``change``), finished by the next command if this one is stopped midway."""
    read_sweep(data_dir, sweep_id)  # refuses an unknown sweep with the list of known ones
    if reason is not None and not reason.strip():
        raise UserError("An exclusion needs a reason; pass --reason with a short explanation.")
    sidecar = {"exclusion.json": None if reason is None else {"reason": reason}}
    with writing(data_dir, sweep_id), change(data_dir, sweep_id, "include" if reason is None else "exclude", sidecar):
        _apply_sidecars(data_dir, sweep_id, sidecar)
        return compact(data_dir, sweep_id)


@contextlib.contextmanager
def data_folder_lock(data_dir: Path):
    """The data folder's own lock (``<data>/.lock``, an flock): its shared files (the dataset card, the
    shared ``repro/``) are written by one process at a time. Blocking: each holder holds it for a moment."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / ".lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


DATASET_CARD = """---
{configs}license: other
tags:
- model-support
---
# Model-support sweeps

Which Hugging Face models load and generate on which accelerator stack, which fail, where and why.
One row per model per sweep; the columns are the probe's record fields (`model_support.record.schema`).

- `results`: every probed model: `status` is PASS, FAIL(load), FAIL(gen) or FAIL(other), with
  `failure_stage`, `failure_signature`, the error and traceback, tokens, timings, memory, the CPU
  reference check, the full version stack, and the standalone script that reproduces the probe: its
  `repro_settings` and `repro_sha256`, the name of its body in `repro/<sha256>.py` beside the Parquet
  files (`model-support repro SWEEP_ID MODEL`; older rows carry the whole script in `repro_script`).
- `excluded`: models excluded before running (with `exclusion_reason`) and whole sweeps excluded
  after the fact (a broken stack). Excluded rows are never counted as failures.
- `ops`: one row per operator per sweep, from the probes' operator census: `op`, `status` on the sweep's
  stack (implemented, CPU fallback, missing, unknown), `device_type`, `versions`, the `models` that call it,
  `probes`, `calls` and `calls_per_probe`: a stack's coverage over time is a query.
- `what_if`: what-if runs (`what_if` true), the `results` columns: the same models with the operators their
  device lacks or gets wrong run on the host's CPU kernels (`host_ops`, `host_ops_run`, `host_op_calls`), which
  prove a porting plan's step or a blamed operator by running. Never a verdict of the stack: no PASS here counts
  in `results`, the gate, the exports or the support card.

```python
from datasets import load_dataset
results = load_dataset("<this folder or repo>", "results", split="train")
ops = load_dataset("<this folder or repo>", "ops", split="train")
```

Sweeps in this folder: {sweeps}.

## Fields

Every column is nullable; files written before a field existed (its `since`, the record version)
read it as null, or as the value noted.

| field | type | group | since | what |
|---|---|---|---|---|
{fields}
"""


def field_table() -> str:
    """The dataset card's rows of fields, from the record's declaration (``schema.DECLARATION``)."""
    return "\n".join(
        f"| `{f.name}` | `{f.type}` | {f.group} | {f.since} | "
        + f.doc.replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
        + (f" (older files: `{f.older}`)" if f.older is not None else "")
        + " |"
        for f in schema.DECLARATION
    )


def card_configs(data_dir: Path) -> str:
    """The card's YAML ``configs:`` block, each config only once it has a file (a config whose glob matches
    nothing would make ``load_dataset`` fail for every config); written by huggingface_hub's card data, as the
    Hub reads it."""
    from huggingface_hub import DatasetCardData

    data_dir = Path(data_dir)
    present = [c for c in DATASET_CONFIGS if any((data_dir / c).glob("sweep=*/*.parquet"))]
    configs = [
        {
            "config_name": c,
            "data_files": [{"split": "train", "path": f"{c}/sweep=*/*.parquet"}],
            **({"default": True} if c == "results" else {}),
        }
        for c in present
    ]
    return DatasetCardData(configs=configs).to_yaml() + "\n"


def write_dataset_card(data_dir: Path) -> Path:
    """The local card: the configs (``card_configs``) and the sweeps in this folder. ``model-support push``
    publishes a fuller one (``publish.card``)."""
    data_dir = Path(data_dir)
    sweeps = sorted(
        {
            p.parent.name.removeprefix("sweep=")
            for c in DATASET_CONFIGS
            for p in (data_dir / c).glob("sweep=*/*.parquet")
        }
    )
    card = (
        DATASET_CARD.replace("{configs}", card_configs(data_dir))
        .replace("{sweeps}", ", ".join(sweeps) or "none")
        .replace("{fields}", field_table())
    )
    path = data_dir / "README.md"
    with data_folder_lock(data_dir):
        atomic_write_bytes(path, card.encode())
    return path
