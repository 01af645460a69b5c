"""The TPU contract's distributed clauses (``DISTRIBUTED_CONTRACT_KEYS`` in
``MODEL_SUPPORT_PRETEND``): what torch_tpu 0.2.0's runtime does with a process of a distributed
launch (read from its binary: docs/torch_tpu.md), played on request so that the harness's side of it
(the launch environment set in the ranks' parent, each rank's one device) runs and is tested with no
TPU.

- ``launch_env``: a process with ``WORLD_SIZE`` set (a rank) refuses to start unless the launch
  environment its parent set for every rank is there, as torch_tpu's runtime refuses one without
  ``TORCH_TPU_SLICEBUILDER_ADDRESSES`` and ``TORCH_TPU_TOPOLOGY``: ``ADDRESSES_VAR`` (one
  ``host:port`` per rank) and ``TOPOLOGY_VAR`` (the slice's shape for that many ranks, ``SHAPES``).
  ``set_launch_env`` is what sets them (torch_tpu's ``set_tpu_launch_env``): it never overwrites a
  variable already set.
- ``one_device``: such a process opens one device: the one its visibility variable names when that
  is a single id, else device ``LOCAL_RANK``, whatever else it was granted (torch_tpu:
  ``TPU_VISIBLE_DEVICES``, else ``LOCAL_RANK``).

``opened_log`` (a path): every process that registers the device appends one JSON line saying what
it opened (its rank, its devices, the launch environment it saw), so a test can see which device
each rank took.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from dataclasses import replace

from .config import CONFIG_VAR, NAME, VISIBLE_VAR, Config

#: One ``host:port`` per rank, the same list in every rank (torch_tpu:
#: TORCH_TPU_SLICEBUILDER_ADDRESSES).
ADDRESSES_VAR = "PRETEND_LAUNCH_ADDRESSES"
#: The slice's shape for the ranks (torch_tpu: TORCH_TPU_TOPOLOGY).
TOPOLOGY_VAR = "PRETEND_TOPOLOGY"
LAUNCH_VARS = (ADDRESSES_VAR, TOPOLOGY_VAR)
#: The slice shape of N ranks on one host.
SHAPES = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,4,1"}
#: The refusal, worded as torch_tpu's runtime words it.
MISSING = "missing required environment variables for distributed training"


class LaunchRefused(RuntimeError):
    """A rank of a distributed launch without the launch environment the contract requires (or
    with one that does not describe its launch): the runtime does not start."""


def shape(ranks: int) -> str:
    if ranks not in SHAPES:
        raise ValueError(
            f"{NAME} has no slice of {ranks} devices (it has {', '.join(map(str, SHAPES))})."
        )
    return SHAPES[ranks]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return int(sock.getsockname()[1])


def launch_env(nproc_per_node: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The launch environment for ``nproc_per_node`` ranks on this host: a variable ``environ``
    already holds is kept, the others made (free local ports, the slice's shape). Nothing is
    written."""
    environ = os.environ if environ is None else environ
    made = {
        ADDRESSES_VAR: lambda: ",".join(f"localhost:{_free_port()}" for _ in range(nproc_per_node)),
        TOPOLOGY_VAR: lambda: shape(nproc_per_node),
    }
    return {name: environ[name] if name in environ else make() for name, make in made.items()}


def set_launch_env(nproc_per_node: int) -> dict[str, str]:
    """``launch_env`` written into this process's environment, for the ranks it spawns next
    (torch_tpu's ``set_tpu_launch_env``)."""
    found = launch_env(nproc_per_node)
    os.environ.update(found)
    return found


def rank_view(config: Config, environ: Mapping[str, str]) -> Config:
    """``config`` as this process sees it under the contract's distributed clauses: unchanged
    outside a distributed launch (``WORLD_SIZE`` unset) or without them; in a rank,
    ``LaunchRefused`` without its launch environment (``launch_env``), and its one device
    (``one_device``). What it opened goes to ``opened_log``."""
    world = environ.get("WORLD_SIZE")
    if world is not None and (config.launch_env or config.one_device):
        if config.launch_env:
            _check_launch(environ, world)
        if config.one_device:
            config = replace(config, visible=(_one_device(config, environ),))
    if config.opened_log:
        _log(config, environ)
    return config


def _check_launch(environ: Mapping[str, str], world: str) -> None:
    missing = [name for name in LAUNCH_VARS if not environ.get(name)]
    if missing:
        raise LaunchRefused(f"{NAME} runtime: {MISSING}: {', '.join(missing)}")
    addresses = environ[ADDRESSES_VAR].split(",")
    if str(len(addresses)) != world.strip():
        raise LaunchRefused(
            f"{NAME} runtime: {ADDRESSES_VAR} lists {len(addresses)} addresses for "
            f"WORLD_SIZE={world} ranks"
        )
    if environ[TOPOLOGY_VAR] != SHAPES.get(len(addresses)):
        raise LaunchRefused(
            f"{NAME} runtime: {TOPOLOGY_VAR}={environ[TOPOLOGY_VAR]!r} is no slice of "
            f"{len(addresses)} devices"
        )


def _one_device(config: Config, environ: Mapping[str, str]) -> int:
    """The single device id the visibility variable names, else ``LOCAL_RANK``: what a rank
    opens."""
    named = environ.get(VISIBLE_VAR, "").strip()
    device = int(named) if named.isdigit() else int(environ.get("LOCAL_RANK", "0"))
    if not 0 <= device < config.devices:
        raise LaunchRefused(
            f"{NAME} runtime: device {device} does not exist ({CONFIG_VAR} has {config.devices})"
        )
    return device


def _log(config: Config, environ: Mapping[str, str]) -> None:
    line = {
        "pid": os.getpid(),
        "rank": environ.get("RANK"),
        "local_rank": environ.get("LOCAL_RANK"),
        "world_size": environ.get("WORLD_SIZE"),
        "opened": list(config.visible),
        "launch": {name: environ.get(name) for name in LAUNCH_VARS},
    }
    assert config.opened_log is not None
    with open(config.opened_log, "a") as handle:  # one short line, appended at once
        handle.write(json.dumps(line) + "\n")
