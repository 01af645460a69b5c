"""A run killed in the middle of ``fileio.atomic_write_bytes`` leaves its temporary file; the next
run of the sweep (``--resume``, holding the sweep's lock) removes those of its own files, and
nothing another command may be writing beside them without that lock (``bisect.json``,
``localised/``), nor a user's file.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from model_support.record import store


def _torn(folder: Path, name: str) -> Path:
    """A temporary file named as ``atomic_write_bytes`` names it for ``folder/name``, left
    behind."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, path = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    with open(fd, "wb") as handle:
        handle.write(b"half")
    return Path(path)


def test_a_resume_removes_the_runs_own_torn_writes_and_nothing_else(tmp_path):
    folder = store.sweep_dir(tmp_path, "s")
    own = [
        _torn(folder, "sweep.json"),
        _torn(folder, "pending.json"),
        _torn(folder / "records", "local_tiny-llama.json"),
        _torn(folder / "notebooks", "local_tiny-llama.ipynb"),
        _torn(folder / "logs", "local_tiny-llama.log"),
    ]
    others = [
        _torn(folder, "bisect.json"),  # `model-support bisect` writes it holding only its own lock
        _torn(folder / "localised", "local_tiny-llama.json"),  # `model-support localise`
    ]
    users = [folder / ".notes.tmp", folder / "records" / ".draft.tmp"]
    for path in users:
        path.write_text("mine")
    assert store.remove_torn_runner_writes(tmp_path, "s") == len(own)
    assert not any(path.exists() for path in own)
    assert all(path.exists() for path in others + users)
