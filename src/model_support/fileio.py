"""Every write to the data folder: a reader (or a SIGKILL) sees either nothing or the whole file,
never a part.

Every file the project keeps (records, notebooks, logs, Parquet, the dataset card, reports, the
JSON-lines logs) is written, replaced, appended to or removed through the few helpers here, and
nowhere else (``tests/test_store_faults.py`` checks the source for writes that bypass them). That
makes each of these calls a *write point*: the fault-injection test stops a process at every one of
them in turn (``MODEL_SUPPORT_STOP_AT_WRITE=N``: the process kills itself with SIGKILL just before
its N-th write point, as a power cut or ``kill -9`` would, nothing cleaned up), then checks that the
next command finds every record in the dataset exactly once. SQLite and LevelDB are tested the same
way.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

#: Environment variable of the fault-injection test: stop this process just before its N-th write
#: point.
STOP_AT_WRITE = "MODEL_SUPPORT_STOP_AT_WRITE"
_points = 0


def write_point(path: Path) -> None:
    """Count one write point (about to change ``path``); the N-th of ``STOP_AT_WRITE`` kills this
    process."""
    global _points
    _points += 1
    stop = os.environ.get(STOP_AT_WRITE)
    if stop and _points == int(stop):
        os.kill(os.getpid(), signal.SIGKILL)


def _fsync_dir(folder: Path) -> None:
    """Make a change of ``folder``'s entries durable (a file renamed in, created or removed): a
    rename is atomic but lives in the folder's own blocks, so a crash before they reach the disk
    brings the old entry back."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse to sync a folder: the rename is still atomic
    finally:
        os.close(fd)


def make_folders(folder: Path) -> None:
    """Create ``folder`` and its missing parents, each new one synced into its parent: a file
    synced into a folder whose own entry was never synced is lost with the folder after a crash."""
    missing = []
    folder = Path(folder)
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for new in reversed(missing):
        new.mkdir(exist_ok=True)
        _fsync_dir(new.parent)


def replace_file(tmp: Path, path: Path) -> None:
    """Move a fully written temporary file ``tmp`` (same folder) onto ``path``: synced first,
    then renamed."""
    with open(tmp, "rb+") as handle:
        os.fsync(handle.fileno())
    write_point(path)
    os.replace(tmp, path)
    _fsync_dir(Path(path).parent)


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same folder, fsync, rename)."""
    path = Path(path)
    make_folders(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)  # mkstemp's 0600 would hide shared sweep data
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        write_point(path)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


#: The temporary file ``atomic_write_bytes`` writes first: ``.NAME.XXXXXXXX.tmp`` (mkstemp's name).
TORN_WRITE = re.compile(r"^\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp$")


def remove_torn_writes(folder: Path, mine: Callable[[str], bool]) -> int:
    """Remove, in ``folder`` (not below it), the temporary files of ``atomic_write_bytes`` that a
    killed writer left for the files ``mine`` accepts (by name); how many. Only for the files a
    caller alone writes, holding their lock: another command's write under way is never touched."""
    removed = 0
    for tmp in Path(folder).glob(".*.tmp"):
        torn = TORN_WRITE.match(tmp.name)
        if torn and mine(torn.group("name")) and tmp.is_file():
            tmp.unlink(missing_ok=True)
            removed += 1
    return removed


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=1, default=str) + "\n").encode())


def create_new(path: Path) -> bool:
    """Create ``path`` empty unless it exists (a name reserved by two processes at once goes to
    one): True when this call created it."""
    path = Path(path)
    make_folders(path.parent)
    write_point(path)
    try:
        with open(path, "x"):
            pass
    except FileExistsError:
        return False
    _fsync_dir(path.parent)
    return True


def remove(path: Path) -> None:
    """Remove ``path`` if it is there (a write point like any other)."""
    path = Path(path)
    if path.exists():
        write_point(path)
        path.unlink(missing_ok=True)
        _fsync_dir(path.parent)


def append_line(path: Path, obj) -> None:
    """Append ``obj`` as one JSON line to ``path``, starting on a fresh line: a line torn by a
    crash or a full disk mid-append stays one bad line (readers skip it), never glued to the next
    good one."""
    path = Path(path)
    make_folders(path.parent)
    line = (json.dumps(obj, default=str) + "\n").encode()
    write_point(path)
    new = not path.exists()
    with open(path, "ab+") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell():
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                line = b"\n" + line
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())
    if new:
        _fsync_dir(path.parent)


def read_lines(path: Path) -> Iterator[dict]:
    """The JSON objects of a JSON-lines file, skipping (and saying once on stderr) lines that do
    not parse: the torn tail a crash mid-append leaves. A missing file has none."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return
    bad = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(row, dict):
            yield row
        else:
            bad += 1
    if bad:
        print(
            f"{path}: skipped {bad} unreadable line(s) (a write cut short); the others are read.",
            file=sys.stderr,
        )
