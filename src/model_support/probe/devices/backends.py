"""Loading an out-of-tree device backend (torch_tpu, torch_npu, a PrivateUse1 backend written in
Python): only the one the probe uses, through torch's own device-backend entry points
(``probe_backend.load_backend``).

Why not torch's autoload: with torch_tpu installed, ``import torch`` autoloads it, which costs ~8 s
and ~300 MB per process even on a machine with no TPU (and there, a later ``torch.accelerator`` call
can stall while libtpu looks for a TPU), and every installed backend would load in every process.
The package owns that autoload (``backend_env``: off in every process of ours, whatever the shell or
a backend package set), and the adapter loads the backend its device needs by calling that backend's
entry point, as the autoload would have, noting what the backend writes into ``os.environ`` as its
own (``backend_env.loading``).
"""

from __future__ import annotations

from importlib.metadata import entry_points

from ... import backend_env
from .. import probe_backend
from .base import DeviceUnavailable

AUTOLOAD_VAR = backend_env.AUTOLOAD_VAR


def prepare_environment(device: str = "auto") -> None:
    """Call before ``import torch``: torch's autoload of every installed backend off
    (``backend_env.own``: the adapter loads the one ``device`` needs). In a gated sweep process,
    the devices granted to it are pinned here (``grant.apply``), before any backend loads."""
    backend_env.own()
    from .. import grant

    grant.apply()


def backend_devices() -> list[str]:
    """The devices that installed out-of-tree backends provide (read from package metadata;
    nothing loaded)."""
    found = entry_points(group=probe_backend.BACKENDS_GROUP)
    return list(dict.fromkeys(probe_backend.backend_device(e.name) for e in found))


def backend_distributions(device: str) -> tuple[str, ...]:
    """The distributions whose ``torch.backends`` entry point provides ``device`` (read from
    package metadata; nothing loaded): an out-of-tree backend's own packages, where its adapter
    declares none."""
    found = entry_points(group=probe_backend.BACKENDS_GROUP)
    return tuple(
        dict.fromkeys(
            e.dist.name for e in found if e.dist and probe_backend.backend_device(e.name) == device
        )
    )


def load_backend(device: str) -> None:
    """``probe_backend.load_backend``, with a backend that fails to load said in one sentence
    (``DeviceUnavailable``)."""
    try:
        # what the backend writes into os.environ is its own, never the stack's
        with backend_env.loading():
            probe_backend.load_backend(device)
    except Exception as exc:  # noqa: BLE001 whatever a backend raises while loading, it is why the device is missing
        raise DeviceUnavailable(
            f"Device {device!r} was requested but its backend failed to load: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
