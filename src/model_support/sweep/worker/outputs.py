"""What a probe process leaves behind, checked before anything is kept: a notebook that is a whole,
readable notebook, a record that is whole JSON, and whether a write failed (a full disk), in which
case the model is left pending rather than stored with a broken notebook or given a verdict."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ...display import size_text
from ...redact import redact
from ..diskspace import DISK_ERRNOS, NEARLY_FULL_BYTES

_DISK_WORDS = ("No space left on device", "Disk quota exceeded", "File too large")


def read_json(path: Path) -> dict | None:
    """The JSON object in ``path``; None when absent or not whole (a write cut by a full disk)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def whole_notebook(path: Path) -> bytes | None:
    """The executed notebook's bytes (redacted) if it is a readable notebook, else None."""
    import nbformat

    try:
        text = path.read_bytes().decode("utf-8")
        nbformat.reads(text, as_version=4)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return redact(text).encode()


def write_trouble(
    work: Path, outcome: dict, log: str, record: object, notebook: bytes | None
) -> str | None:
    """Why the probe process's own files are not whole, when a write failed (a full disk): the
    model is then left pending rather than stored with a broken notebook or given a verdict.
    Papermill's own write failing for space is the disk; the words "No space left on device" in
    the log, or no file written at all, are the disk only when the disk is nearly full now (a
    model's own error may say those words about another file system)."""
    # papermill's error carries the cell's
    said = log + (outcome.get("error") or {}).get("message", "")
    suspect = any(word in said for word in _DISK_WORDS) or (record is None and not outcome)
    disk = outcome.get("errno") in DISK_ERRNOS or (
        suspect and shutil.disk_usage(work).free < NEARLY_FULL_BYTES
    )
    if disk:
        free = shutil.disk_usage(work).free
        return (
            "the probe process could not write its notebook or record: no space left on the "
            f"data folder's disk ({size_text(free)} free)"
        )
    if record is not None and notebook is None:
        return "the probe wrote its record but not a whole notebook"
    return None
