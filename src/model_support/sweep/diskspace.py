"""How much room the data folder has, and how a failed write is told: the sweep's room check
before it starts, and the words of the one sentence a full disk ends it with
(``errors.StorageFull``)."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from ..display import size_text
from ..errors import StorageFull

#: What one model's notebook, log and record take at least (a tiny model's; large ones write no
#: more): measured on the fixtures, a PASS's notebook 15 kB, record 4 kB, log under 1 kB; a FAIL's
#: record 8 kB with its traceback. The repro script's body (~80 kB) is kept once per sweep, not per
#: model (``store.split_repro``).
BYTES_PER_MODEL = 24_000
#: What a sweep's report and the explorer take.
REPORT_BYTES = 2_000_000


def check_room(data_dir: Path, probes: int, report: bool) -> None:
    """Refuse to start when the data folder's free space is clearly too small (under half of what
    the sweep will write: ``BYTES_PER_MODEL`` per probe, a model in each variant of the matrix,
    plus ``REPORT_BYTES`` with the report)."""
    need = probes * BYTES_PER_MODEL + (REPORT_BYTES if report else 0)
    existing = next(p for p in (data_dir, *data_dir.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if free < need / 2:
        raise StorageFull(
            f"The data folder {data_dir} has {size_text(free)} free, clearly too little for "
            f"this sweep (about {size_text(need)}: {probes} probes' notebooks, logs and "
            f"records{' and the report' if report else ''}); make room or pass --data-dir on a "
            "larger disk."
        )


#: Free bytes under which a failed write is put down to a full disk whatever its error says.
NEARLY_FULL_BYTES = 1_000_000
#: errno values that mean the disk (or a file-size or quota limit) refused a write.
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _free(data_dir: Path) -> int:
    existing = next(p for p in (data_dir, *data_dir.parents) if p.exists())
    return shutil.disk_usage(existing).free


def disk_full(exc: OSError, data_dir: Path) -> bool:
    """Whether a failed write to the data folder was for lack of space: its errno says so, or the
    disk itself is nearly full (checked now). Too many open files, ENOMEM, a permission are not."""
    return exc.errno in DISK_ERRNOS or _free(data_dir) < NEARLY_FULL_BYTES


def disk_words(exc: OSError, data_dir: Path) -> str:
    """``no space left on its disk, 12 KB free`` when the disk is full (``disk_full``), else the
    OSError's own words with the free space (``Too many open files, 80 GB free``)."""
    free = size_text(_free(data_dir))
    if disk_full(exc, data_dir):
        return f"no space left on its disk, {free} free"
    return f"{exc.strerror or type(exc).__name__}, {free} free"


def relative_to_data(exc: OSError, data_dir: Path) -> str:
    """What could not be written, as a path inside the data folder when it is one."""
    name = exc.filename or ""
    try:
        return str(Path(name).resolve().relative_to(data_dir)) if name else "to the data folder"
    except ValueError:
        return name
