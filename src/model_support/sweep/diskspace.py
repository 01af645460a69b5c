"""How much room the data folder has, and how a failed write is told: the sweep's room check before it
starts, and the words of the one sentence a full disk ends it with (``errors.StorageFull``)."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from ..errors import StorageFull

#: What one model's notebook, log and record take at least (a tiny model's; large ones write no more): measured
#: on the fixtures, a PASS's notebook 15 KB, record 4 KB, log under 1 KB; a FAIL's record 8 KB with its traceback.
#: The repro script's body (~80 KB) is kept once per sweep, not per model (``store.split_repro``).
BYTES_PER_MODEL = 24 * 1024
#: What a sweep's report and the explorer take.
REPORT_BYTES = 2 * 1024 * 1024


def check_room(data_dir: Path, probes: int, report: bool) -> None:
    """Refuse to start when the data folder's free space is clearly too small (under half of what the
    sweep will write: ``BYTES_PER_MODEL`` per probe, a model in each variant of the matrix, plus
    ``REPORT_BYTES`` with the report)."""
    need = probes * BYTES_PER_MODEL + (REPORT_BYTES if report else 0)
    existing = next(p for p in (data_dir, *data_dir.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if free < need / 2:
        raise StorageFull(
            f"The data folder {data_dir} has {_size(free)} free, clearly too little for this sweep (about "
            f"{_size(need)}: {probes} probes' notebooks, logs and records{' and the report' if report else ''}); "
            "make room or pass --data-dir on a larger disk."
        )


def _size(nbytes: float) -> str:
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} bytes"


def disk_words(exc: OSError, data_dir: Path) -> str:
    """``no space left on device, 12 KB free`` (or the OSError's own words for other write errors)."""
    existing = next(p for p in (data_dir, *data_dir.parents) if p.exists())
    free = _size(shutil.disk_usage(existing).free)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return f"no space left on its disk, {free} free"
    return f"{exc.strerror or type(exc).__name__}, {free} free"


def relative_to_data(exc: OSError, data_dir: Path) -> str:
    """What could not be written, as a path inside the data folder when it is one."""
    name = exc.filename or ""
    try:
        return str(Path(name).resolve().relative_to(data_dir)) if name else "to the data folder"
    except ValueError:
        return name
