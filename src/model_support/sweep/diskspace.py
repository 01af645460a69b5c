"""How much room the data folder has, and how a failed write is told: the sweep's room check before it
starts, and the words of the one sentence a full disk ends it with (``errors.StorageFull``)."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from ..display import size_text
from ..errors import StorageFull

#: What one model's notebook, log and record take at least (a tiny model's; large ones write no more).
BYTES_PER_MODEL = 40_000
#: What a sweep's report and the explorer take.
REPORT_BYTES = 2_000_000


def check_room(data_dir: Path, probes: int, report: bool) -> None:
    """Refuse to start when the data folder's free space is clearly too small (under half of what the
    sweep will write: ``BYTES_PER_MODEL`` per probe, a model in each variant of the matrix, plus
    ``REPORT_BYTES`` with the report)."""
    need = probes * BYTES_PER_MODEL + (REPORT_BYTES if report else 0)
    existing = next(p for p in (data_dir, *data_dir.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if free < need / 2:
        raise StorageFull(
            f"The data folder {data_dir} has {size_text(free)} free, clearly too little for this sweep (about "
            f"{size_text(need)}: {probes} probes' notebooks, logs and records{' and the report' if report else ''}); "
            "make room or pass --data-dir on a larger disk."
        )


def disk_words(exc: OSError, data_dir: Path) -> str:
    """``no space left on device, 12 KB free`` (or the OSError's own words for other write errors)."""
    existing = next(p for p in (data_dir, *data_dir.parents) if p.exists())
    free = size_text(shutil.disk_usage(existing).free)
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
