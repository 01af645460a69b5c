"""What the backend counts of its own work for the host: device-to-host synchronisations and CPU
fallbacks.

Why here: a sync or a fallback is known for sure only where it happens, in the backend (the copy
out, the ``_local_scalar_dense`` behind ``.item()``, the fallback's kernel on the CPU); a census
read back against the configuration would guess. The probe reads these through its adapter
(``host_counters``, the protocol of ``model_support.probe.instruments.host_cost``): ``read``
snapshots, ``harness`` and ``claim`` set the probe's own syncs apart (its timer's ``synchronize``,
the copy its streamer is handed), so they are not the model's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class Counters:
    """One process's counts: syncs the run made, syncs the probe's harness made, fallback calls
    per operator."""

    def __init__(self) -> None:
        self.syncs = 0
        self.harness_syncs = 0
        self.fallbacks: dict[str, int] = {}
        self._harness = 0  # inside ``harness()``
        # the host tensor the last counted copy out made (its id)
        self._last_copy: int | None = None

    def sync(self, made=None) -> None:
        """One device-to-host synchronisation; ``made``: the host tensor a copy out produced."""
        if self._harness:
            self.harness_syncs += 1
        else:
            self.syncs += 1
            self._last_copy = id(made) if made is not None else None

    def fallback(self, op: str) -> None:
        self.fallbacks[op] = self.fallbacks.get(op, 0) + 1

    @contextlib.contextmanager
    def harness(self) -> Iterator[None]:
        """Syncs inside are the probe's own (its timer's ``synchronize``)."""
        self._harness += 1
        try:
            yield
        finally:
            self._harness -= 1

    def claim(self, tensor) -> bool:
        """The last copy out made ``tensor`` for the probe's harness (a streamer's ``.cpu()``):
        counted as the harness's. False when it was not the last copy counted."""
        if self._last_copy is None or self._last_copy != id(tensor):
            return False
        self._last_copy = None
        self.syncs -= 1
        self.harness_syncs += 1
        return True

    def read(self) -> tuple[int, int, dict[str, int]]:
        """(the run's syncs, the harness's syncs, fallback calls per operator) so far."""
        return self.syncs, self.harness_syncs, dict(self.fallbacks)
