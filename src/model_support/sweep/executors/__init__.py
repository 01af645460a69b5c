"""Where a sweep's probes run: an ``Executor`` (``submit``, ``results``, ``stop``;
``executors.contract``), on this host (``local``: pinned processes) or on a Ray cluster (``ray``:
one task per probe), with the same promises: downloads ahead within the cache budget, devices
handed out by the scheduler, ``schedule.jsonl``, a stop that starts nothing more, a kernel that
never started left pending."""

from __future__ import annotations

from pathlib import Path

from ..budget import CacheBudget
from .contract import Executor, Stopped, default_workers, device_kind, devices_needed

__all__ = ["Executor", "Stopped", "default_workers", "device_kind", "devices_needed", "make"]


def make(
    name: str,
    device: str,
    workers: int | None,
    work_root: Path,
    budget: CacheBudget | None = None,
    prefetch: int = 1,
) -> Executor:
    """The executor ``name`` ("local" or "ray") for a sweep on ``device``; ``workers`` None: one
    per device (this host's, or the Ray cluster's)."""
    if name == "ray":
        from .ray import RayExecutor

        return RayExecutor(device, workers, budget, prefetch, work_root)
    from .local import LocalExecutor

    return LocalExecutor(device, workers or default_workers(device), work_root, budget, prefetch)
