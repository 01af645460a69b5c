"""One folder per sweep (``<data>/sweeps/<id>/``): its lock, its records' file names, its
sweep.json, the sweeps of a data folder and the ids users give for them (``latest``,
``latest:NAME``, a unique prefix)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from .. import fileio
from ..errors import UserError
from ..fileio import atomic_write_bytes
from .dataset_files import CONFIGS, DATASET_CONFIGS, WHAT_IF_CONFIG, polars_schema, scan
from .names import check_name, legacy_name, model_file_name
from .schema import DEFAULT_VARIANT
from .sweep_meta import SweepMeta, safe_name

if TYPE_CHECKING:  # polars is imported where it is used: the probe kernel writes records without it
    pass


def sweep_dir(data_dir: Path, sweep_id: str) -> Path:
    """A sweep's folder; the id is checked to be a plain name first (never a path out of the data
    folder)."""
    return (
        Path(data_dir) / "sweeps" / check_name(sweep_id, "sweep id", f"{Path(data_dir) / 'sweeps'}")
    )


class SweepLock:
    """One writer per sweep at a time: the runner for the whole run (a second ``--resume`` of a
    running sweep is refused), and each command that rewrites a sweep's files (``compact``:
    ``aggregate``, ``exclude``, ``include``, ``push --logs``) for its rewrite, refused while a
    sweep runs. An flock on ``<sweep>/.lock``: the kernel drops it when the holder dies, so a
    killed sweep leaves no stale lock.

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
                f"Sweep folder {self.path.parent} is being written by another running sweep; "
                "wait for it to finish."
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
    """Hold ``sweep_id``'s lock while rewriting its files (already held by this process: nothing
    to take)."""
    folder = sweep_dir(data_dir, sweep_id)
    if SweepLock.held(folder):
        yield
    else:
        with SweepLock(folder):
            yield


def stem(model_id: str, variant: str | None = None) -> str:
    """The file name of a (model, variant)'s record, notebook and log: the model's safe name,
    plus ``@<variant>`` for any variant but the default one (so sweeps without a matrix keep
    their names)."""
    if variant in (None, DEFAULT_VARIANT):
        return model_file_name(model_id)
    return f"{model_file_name(model_id)}@{safe_name(variant)}"


def legacy_stem(model_id: str, variant: str | None = None) -> str:
    """The name ``stem`` gave before names were one to one (``names.legacy_name``): what older
    sweeps hold."""
    if variant in (None, DEFAULT_VARIANT):
        return legacy_name(model_id)
    return f"{legacy_name(model_id)}@{safe_name(variant)}"


def migrate_names(data_dir: Path, sweep_id: str) -> int:
    """Move records stored under a name that is not their model's one-to-one name (a sweep stored
    before names were one to one: ``tiny+opt`` as ``tiny_opt``) to it, so that resume finds each
    and a new record never overwrites another model's. A move writes the new name, then removes
    the old one; a migration stopped between the two left the record under both, so an old name
    whose record is already under its own name is removed too (else compaction would read the
    model twice). Returns how many moved (the caller says so in one line)."""
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
        elif not holds_record(target, model_id, variant):
            continue  # another model's record under that name: never overwritten, never dropped
        fileio.remove(path)
        moved += 1
    return moved


def holds_record(path: Path, model_id: str, variant: str | None) -> bool:
    """Whether the record file ``path`` is there and is (model, variant)'s: a file name alone
    does not say (an older sweep's name may be another model's one-to-one name)."""
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    same_variant = (stored.get("variant") or DEFAULT_VARIANT) == (variant or DEFAULT_VARIANT)
    return stored.get("model_id") == model_id and same_variant


def record_file(data_dir: Path, sweep_id: str, model_id: str, variant: str | None = None) -> Path:
    return sweep_dir(data_dir, sweep_id) / "records" / f"{stem(model_id, variant)}.json"


def find_record(
    data_dir: Path, sweep_id: str, model_id: str, variant: str | None = None
) -> Path | None:
    """The record file of (model, variant) in a sweep, or None: under its one-to-one name, or
    under the name an older sweep gave it (``legacy_stem``), either only when the record inside
    is that model's."""
    folder = sweep_dir(data_dir, sweep_id) / "records"
    for name in dict.fromkeys((stem(model_id, variant), legacy_stem(model_id, variant))):
        path = folder / f"{name}.json"
        if holds_record(path, model_id, variant):
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
        raise UserError(
            f"Sweep {sweep_id!r} does not exist under {data_dir}/sweeps; known sweeps: {known}."
        )
    meta = SweepMeta.from_dict(json.loads(path.read_text()))
    if meta.sweep_id != sweep_id:
        raise UserError(
            f"{path}: field sweep_id is {meta.sweep_id!r}, not its folder's name {sweep_id!r}; "
            "refused (the file was moved or edited): set sweep_id to the folder's name."
        )
    return meta


def list_sweeps(data_dir: Path) -> list[str]:
    """Sweep ids with a sweep.json, oldest first (by created_at)."""
    return _oldest_first(_created_at(data_dir))


def _oldest_first(created_at: dict[str, str]) -> list[str]:
    """Sweep ids by their ``created_at`` (``_created_at``), oldest first."""
    return [
        sweep_id
        for _, sweep_id in sorted((created, sweep_id) for sweep_id, created in created_at.items())
    ]


def _created_at(data_dir: Path) -> dict[str, str]:
    """Each sweep with a sweep.json: its ``created_at`` as written (the raw field: a moved folder is
    ``read_sweep``'s to refuse, not a listing's)."""
    return {
        path.parent.name: json.loads(path.read_text()).get("created_at", "")
        for path in (Path(data_dir) / "sweeps").glob("*/sweep.json")
    }


def is_what_if(record: dict) -> bool:
    """A run of a what-if sweep (operators on the host, ``probe.what_if``): no verdict of the
    stack. Its probe marks it (``what_if``) once its device phase ran; a stand-in the runner
    wrote (a timeout, a dead kernel, a failed download) or an early failure carries only the
    setting (``host_ops``), and is one too: review found such a crash stored in ``results`` as
    the stack's verdict, and made a later stack sweep's baseline."""
    return bool(record.get("what_if") or record.get("host_ops"))


def model_ids_of_rows(data_dir: Path, sweep_id: str) -> list[str]:
    """The models a sweep has rows of in the dataset (``results`` and ``excluded``), sorted: a
    pulled sweep's models."""
    import polars as pl

    found: set[str] = set()
    for config in CONFIGS:
        frame = (
            scan(Path(data_dir), config)
            .filter(pl.col("sweep_id") == sweep_id)
            .select("model_id")
            .unique()
        )
        found.update(m for m in frame.collect()["model_id"].to_list() if m)
    return sorted(found)


def of_the_stack():
    """``is_what_if``'s negation as a Polars filter: the rows that are the stack's verdicts (an
    older what-if stand-in left in ``results`` until recompaction is not one: the support card
    and the flips had read it as the stack's)."""
    import polars as pl

    # as is_what_if reads
    return ~(pl.col("what_if").fill_null(False) | (pl.col("host_ops").fill_null("") != ""))


def what_if_setting(data_dir: Path, sweep_id: str) -> str | None:
    """The ``host_ops`` of a what-if sweep (its definition puts operators on the host,
    ``probe.what_if``: its runs are no verdict of the stack), else None. A dataset pulled without
    ``sweeps/`` has no definition to ask: there any row of the sweep, in any config (an excluded
    one too), that carries ``host_ops`` says it."""
    path = Path(data_dir) / "sweeps" / sweep_id / "sweep.json"
    if path.exists():
        raw = json.loads(path.read_text())
        return (raw.get("probe") or raw.get("settings") or {}).get("host_ops") or None
    return host_ops_by_rows(data_dir, [sweep_id]).get(sweep_id)


def host_ops_by_rows(data_dir: Path, sweep_ids: list[str]) -> dict[str, str]:
    """Of ``sweep_ids``, each whose rows say it is a what-if sweep, as ``what_if_setting`` asks a
    sweep pulled without its definition (any row of it, in any config, that carries
    ``host_ops``): its ``host_ops``. Asked of all at once (a pulled history holds thousands),
    reading only those sweeps' own files. A sweep with its definition here is asked by it
    (``what_if_setting``; ``analysis.history.what_if_sweeps``, from the facts ``sweep_index``
    caches)."""
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
            files,
            hive_partitioning=False,
            schema=polars_schema(),
            missing_columns="insert",
            extra_columns="ignore",
        )
        .filter(pl.col("host_ops").fill_null("") != "")
        .group_by("sweep_id", maintain_order=True)
        .agg(pl.col("host_ops").first())
        .collect()
    )
    return dict(zip(said["sweep_id"].to_list(), said["host_ops"].to_list()))


def _newest_of_stack(data_dir: Path, known: list[str]) -> str | None:
    """The newest of ``known`` (oldest first) that is a sweep of the stack itself, not a what-if
    sweep (``what_if_setting``): asked newest first, so a pulled dataset's many sweeps are not
    each read."""
    return next((s for s in reversed(known) if not what_if_setting(data_dir, s)), None)


def _created(sweep_id: str, created_at: dict[str, str], local: dict[str, int]) -> tuple:
    """A sweep's place in time: its sweep.json's ``created_at`` where it has one
    (``_created_at``; ``local``: the local sweeps' order), else the UTC time in its id (a pulled
    sweep; an id in no known shape first, by name)."""
    from .sweep_meta import parse_sweep_id

    if sweep_id in local:
        try:
            created = _dt.datetime.fromisoformat(created_at[sweep_id])
            # naive: UTC, as history reads
            created = created if created.tzinfo else created.replace(tzinfo=_dt.UTC)
            return (1, created.timestamp(), local[sweep_id], sweep_id)
        except (TypeError, ValueError):
            pass
    parsed = parse_sweep_id(sweep_id)
    return (
        int(parsed.time is not None),
        parsed.time.timestamp() if parsed.time else 0.0,
        -1,
        sweep_id,
    )


#: The word that names the newest sweep (``latest``, or ``latest:NAME`` for the newest of a name).
LATEST = "latest"


def resolve_sweep_id(data_dir: Path, given: str) -> str:
    """The sweep id a user means: the id itself, ``latest`` (the newest sweep of the stack),
    ``latest:NAME`` (the newest of the stack's of a name), or a unique prefix of one; else one
    sentence with the closest ids (``model-support list`` shows them). ``latest`` never names a
    what-if sweep (``what_if_setting``: its runs are no verdict of the stack), whatever its name:
    its id or a unique prefix of it does."""
    import difflib

    from .sweep_meta import parse_sweep_id

    if (
        Path(data_dir) / "sweeps" / check_name(given, "sweep id", "the command line") / "sweep.json"
    ).exists():
        return given
    # a dataset pulled without its sweeps/ folder knows its sweeps by their Parquet files
    # (compaction leaves empty folders behind in every config)
    pulled = {
        p.parent.name.removeprefix("sweep=")
        for c in DATASET_CONFIGS
        for p in (Path(data_dir) / c).glob("sweep=*/*.parquet")
    }
    if given in pulled:
        return given
    created_at = _created_at(data_dir)
    local = _oldest_first(created_at)
    # one order for all, by time: the local ones by their created_at, the pulled ones by the time in
    # their ids (pulled ones listed after the local ones made an older pulled sweep `latest`; by
    # name, the last name)
    order = {sweep_id: i for i, sweep_id in enumerate(local)}
    known = sorted(set(local) | pulled, key=lambda s: _created(s, created_at, order))
    if given == LATEST or given.startswith(f"{LATEST}:"):
        name = given.partition(":")[2]
        # ``latest`` and ``latest:NAME`` are the newest sweep of the stack (of that name): never a
        # what-if sweep (``ops --prove``'s, or ``sweep -p host_ops=...`` under the stack's own
        # name), which only its id names
        named = [s for s in known if parse_sweep_id(s).name == name] if name else known
        newest = _newest_of_stack(data_dir, named)
        if newest:
            return newest
        if named:  # every one of them is a what-if sweep
            raise UserError(
                f"Every sweep {'named ' + repr(name) + ' ' if name else ''}under "
                f"{data_dir}/sweeps is a what-if sweep (operators on the host: no verdict of "
                f"the stack), which `{LATEST}` never names; give its id: the newest is "
                f"{named[-1]}."
            )
        names = sorted({parse_sweep_id(s).name for s in known})
        raise UserError(
            f"No sweep {'named ' + repr(name) + ' ' if name else ''}under {data_dir}/sweeps"
            + (
                f"; the names are {', '.join(names)}."
                if names
                else "; run a sweep first (make sweep)."
            )
        )
    matches = [s for s in known if s.startswith(given)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        of_names = {parse_sweep_id(s).name for s in matches}
        # the hint names only what ``latest:NAME`` resolves to: a sweep of the stack, not a what-if
        # one
        one_name = len(of_names) == 1 and _newest_of_stack(data_dir, matches) is not None
        hint = f"; `{LATEST}:{of_names.pop()}` names the newest" if one_name else ""
        raise UserError(
            f"Sweep {given!r} is the start of {len(matches)} sweeps ({', '.join(matches[-3:])}"
            f"{', ...' if len(matches) > 3 else ''}); give more of the id{hint}."
        )
    close = difflib.get_close_matches(given, known, n=3, cutoff=0.5)
    listing = (
        f"did you mean {' or '.join(close)}?"
        if close
        else f"known sweeps: {', '.join(known[-5:]) or 'none yet'}."
    )
    raise UserError(
        f"Sweep {given!r} does not exist under {data_dir}/sweeps; {listing} (`model-support "
        "list` shows them all)"
    )


@contextlib.contextmanager
def data_folder_lock(data_dir: Path):
    """The data folder's own lock (``<data>/.lock``, an flock): its shared files (the dataset
    card, the shared ``repro/``) are written by one process at a time. Blocking: each holder
    holds it for a moment."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / ".lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
