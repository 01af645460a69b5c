"""The device gate: a probe process handed its model before its devices are granted, pinned when
they are.

Why: a device held while its probe process starts papermill, injects the parameters and reads the
weights from disk is a device doing nothing. A gated probe process (``Standby`` with a ``gate``)
gets its task as soon as a worker takes the model: it has already started its kernel and imported
the stack (nothing device-bound: no backend is loaded), and while it waits at the gate it reads the
model's files into the page cache (``read_ahead``: the kernel's memory, given back under pressure).
The runner holds the devices (``with gate() as env``) from the grant until the process ends; at the
grant the pinning variables (``CUDA_VISIBLE_DEVICES``, the TPU runtime's chips,
``<NAME>_VISIBLE_DEVICES``) are set in the waiting kernel, before its notebook loads the device's
backend, and the notebook runs.

Pinning at the grant rather than at process start is what lets any waiting process take whichever
device frees first: the warm-up imports torch and transformers but loads no backend and asks no
device anything (a test checks), so a variable set then is read when the backend initialises, as at
start.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from ...fileio import atomic_write_json
from ...probe.grant import GATE_VAR, GRANT_FILE

#: Weight files worth reading ahead (the rest of a model folder is small).
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def held(standby) -> AbstractContextManager[None]:
    """The devices of a gated ``standby``, held for the ``with`` block (none without a gate)."""
    return _held(standby) if getattr(standby, "gate", None) is not None else nullcontext()


AT_GATE = "at_gate"


@contextmanager
def _held(standby) -> Iterator[None]:
    while not (standby.work / AT_GATE).exists() and standby.proc.poll() is None:
        # the devices are asked for once the process waits at the gate, warm, its model read ahead
        time.sleep(0.01)
    with standby.gate() as env:
        atomic_write_json(standby.work / GRANT_FILE, {"env": env})
        yield


def await_grant(work: Path, task: Mapping[str, Any]) -> None:
    """In the probe process, before its notebook starts: read the model's files ahead, say it
    waits at the gate, wait for the grant (the kernel pins its devices from the grant file:
    ``probe.grant``)."""
    read_ahead(task.get("snapshot") or task["source"])
    (work / AT_GATE).touch()
    grant = work / GRANT_FILE
    while not grant.exists():
        time.sleep(0.005)


def read_ahead(folder: str) -> int:
    """Ask the OS to read a local model folder's weight files into the page cache (asynchronous,
    no copy in this process); the bytes asked for. A Hub id or a missing folder: nothing."""
    path, asked = Path(folder), 0
    if not path.is_dir():
        return 0
    for file in sorted(path.rglob("*")):
        if file.suffix in _WEIGHTS and file.is_file():
            try:
                with open(file, "rb") as handle:
                    os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
                asked += file.stat().st_size
            except OSError:
                pass
    return asked


def gated_env(work: Path) -> dict:
    """A gated probe process's environment: where its kernel finds the grant (``probe.grant``)."""
    return {GATE_VAR: str(work)}
