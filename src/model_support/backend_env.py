"""Which device backend a process of ours loads: decided here, before torch is imported, and told to
every child.

Why: torch's device-backend autoload (``TORCH_DEVICE_BACKEND_AUTOLOAD``, on unless set) loads every
installed backend on ``import torch``. With torch_tpu installed, a plain ``model-support`` command
that imports torch (the host-ops check, ``ops --prove``) loaded the TPU runtime; torch_tpu's loader
then wrote the variable back as "1" (with ``TPU_LIBRARY_PATH`` and ``TORCHINDUCTOR_CACHE_DIR``) into
``os.environ``, every ``setdefault(..., "0")`` kept that "1", and each probe on a backend written in
Python loaded torch_tpu, whose kernels took over ``PrivateUse1``. So the project owns the variable:
importing ``model_support`` sets it to "0" in this process (``own``), the probe's adapter loads the
one backend its device needs through that backend's entry point (``loading`` notes what the backend
writes into ``os.environ`` as it loads), and a child gets ``child_environ``: the environment as the
user and the project set it, never what a backend package wrote for itself, with the autoload "0".

Nothing here imports torch or any backend; the package's root calls ``own`` on import.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping

#: torch's switch for loading every installed out-of-tree backend on ``import torch``.
AUTOLOAD_VAR = "TORCH_DEVICE_BACKEND_AUTOLOAD"
#: What installed backend packages are known to write into ``os.environ`` for themselves as they
#: load (torch_tpu 0.2.0's loader: the autoload switch written back, libtpu's path, inductor's cache
#: folder): counted as theirs where a backend may have loaded before ``own`` could look (torch
#: imported first).
KNOWN_BACKEND_WRITES = frozenset({AUTOLOAD_VAR, "TPU_LIBRARY_PATH", "TORCHINDUCTOR_CACHE_DIR"})

#: {name: the value before a backend wrote it (None: unset)}: what backends loaded in this process
#: wrote.
_written: dict[str, str | None] = {}
_owned = False


def own() -> None:
    """Take the autoload switch: "0" in this process from now on (the adapter loads the backend
    it needs). Called by the package's root on import, so by every entry point of ours before it
    imports torch. Where torch was imported before (a notebook that imported it first), a
    variable backends are known to write that differs from what the process started with
    (``/proc/self/environ``: a value the user set is kept) is taken as theirs; where the start
    cannot be read, only while a backend package is loaded."""
    global _owned
    if not _owned:
        _owned = True
        if "torch" in sys.modules:
            start = _at_start()
            for name in KNOWN_BACKEND_WRITES & os.environ.keys():
                if start is not None and os.environ[name] != start.get(name):
                    _written.setdefault(name, start.get(name))
                elif start is None and _a_backend_loaded():
                    _written.setdefault(name, None)
    os.environ[AUTOLOAD_VAR] = "0"


def _at_start() -> dict[str, str] | None:
    """The environment this process was started with (Linux keeps it in ``/proc/self/environ``),
    or None."""
    try:
        raw = open("/proc/self/environ", "rb").read()  # noqa: SIM115 read once
    except OSError:
        return None
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def _a_backend_loaded() -> bool:
    """Whether a module of an installed ``torch.backends`` entry point is imported here (read
    from metadata)."""
    from importlib.metadata import entry_points

    return any(
        entry.module.partition(".")[0] in sys.modules
        for entry in entry_points(group="torch.backends")
    )


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """Around loading a device backend (its ``torch.backends`` entry point): every variable it
    writes into ``os.environ`` is noted as the backend's own, never the user's
    (``user_environ``)."""
    before = dict(os.environ)
    try:
        yield
    finally:
        for name in before.keys() | os.environ.keys():
            if before.get(name) != os.environ.get(name):
                _written.setdefault(name, before.get(name))
        os.environ[AUTOLOAD_VAR] = "0"  # whatever the backend's loader wrote back


def put_back(before: Mapping[str, str | None]) -> None:
    """Each variable of ``before`` ({name: its value before a change, None: unset}) as it was in
    ``os.environ``."""
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def backend_written() -> frozenset[str]:
    """The variables a backend loaded in this process wrote for itself."""
    return frozenset(_written)


def user_environ(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) as the user and the project set it: each variable a
    loaded backend wrote for itself back to what it was before (or gone). What a sweep records as
    the backend's configuration and what a child inherits are read from this, so a backend
    package's own variables decide neither."""
    env = dict(os.environ if environ is None else environ)
    for name, before in _written.items():
        if name == AUTOLOAD_VAR:
            continue
        if before is None:
            env.pop(name, None)
        else:
            env[name] = before
    return env


def child_environ(
    extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment for a child process of ours: ``base`` (default: this process's) as the
    user and the project set it (``user_environ``), plus ``extra``, with the autoload explicitly
    off: the child loads the backend its device needs itself, through the adapter, whatever a
    backend package wrote into this process's environment."""
    env = user_environ(base)
    env.update(extra or {})
    env[AUTOLOAD_VAR] = "0"
    return env
