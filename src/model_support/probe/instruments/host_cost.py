"""What a PASS costs the host: the device-to-host syncs and the CPU fallbacks of each decode token.

Why: a model that passes but copies to the host or runs an operator on the CPU at every token is
slow in production, and no verdict says so (tt-xla#2241, executorch#12495). They are counted where
they happen, by the backend itself (the adapter's ``host_counters``, the ``HostCounters`` protocol
below): never the census read back against the stack's configuration, which would guess. A stack
that keeps no such counters reads "not measured" (CUDA, TPU today), never a guess; in compile mode
an adapter's profiler counts the syncs instead where it offers one (``profiled``).

The verdict's generation is counted, token by token: the probe's step timer
(``probe_core.StepTimer``, a ``generate()`` streamer) reads the counters as each token arrives, so
the prompt's prefill (the first token) stands apart from the decode steps after it. The probe's own
syncs are set apart as the harness's: the timer's ``synchronize`` (inside ``harness()``) and the
host copy of each token that transformers makes for the streamer (``claim``). What is left is what a
production generate loop on this stack pays too (the model's own syncs and fallbacks, transformers'
end-of-sequence check).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from ...record import schema
from .. import probe_core

#: The record's host-cost fields (group ``host``), null unless measured.
FIELDS = schema.names_in("host")


class HostCounters(Protocol):
    """A backend's own counts (a test backend's own counters, say)."""

    def read(self) -> tuple[int, int, dict[str, int]]:
        """(the run's syncs, the harness's syncs, CPU fallback calls per operator) so far."""
        ...

    def harness(self) -> AbstractContextManager[None]:
        """Syncs inside are the probe's own."""
        ...

    def claim(self, tensor: Any) -> bool:
        """The last copy to the host made ``tensor`` for the probe: the harness's."""
        ...


def not_measured(why: str) -> dict:
    """The host-cost fields of a probe whose host cost was not counted, with the reason."""
    return {**dict.fromkeys(FIELDS), "host_cost_note": f"not measured: {why}"}


class Meter:
    """Counts one generation's host cost on ``counters`` through the step timer it makes
    (``timer``)."""

    def __init__(self, counters: HostCounters, who: str):
        self.counters, self.who = counters, who
        # a read as each token (the prompt first) arrived
        self.marks: list[tuple[int, int, dict[str, int]]] = []

    def timer(self, synchronize: Callable[[], None] | None) -> probe_core.StepTimer:
        """The step timer for the verdict's generation: marks each token, its device sync the
        harness's."""
        return _Timer(self, synchronize)

    def fields(self) -> dict:
        """The record's host-cost fields from the marks: per decode token (the first token's
        prefill apart)."""
        if len(self.marks) < 3:  # the prompt's, the first token's, one decode token's
            return not_measured("fewer than two new tokens: no decode step to count")
        (syncs0, _, fallbacks0), (syncs1, harness1, fallbacks1) = self.marks[0], self.marks[1]
        syncs_n, harness_n, fallbacks_n = self.marks[-1]
        steps = len(self.marks) - 2
        ops = list(fallbacks_n)  # in first-call order, the prefill's and the decode's
        decode = {op: fallbacks_n[op] - fallbacks1.get(op, 0) for op in ops}
        return {
            "host_syncs_per_token": (syncs_n - syncs1) / steps,
            "harness_syncs_per_token": (harness_n - harness1) / steps,
            "prefill_host_syncs": syncs1 - syncs0,
            "fallback_calls_per_token": sum(decode.values()) / steps,
            "fallback_ops": [op for op in ops if fallbacks_n[op] > fallbacks0.get(op, 0)],
            "fallback_op_calls": [
                fallbacks_n[op] - fallbacks0.get(op, 0)
                for op in ops
                if fallbacks_n[op] > fallbacks0.get(op, 0)
            ],
            "host_cost_note": f"counted by the {self.who} backend over {steps} decode tokens; the probe's own "
            "syncs (its step timer's device sync, the host copy of each token its streamer is "
            "handed) apart",
        }


class _Timer(probe_core.StepTimer):
    """``StepTimer`` that reads the counters as each token arrives (``Meter.marks``)."""

    def __init__(self, meter: Meter, synchronize: Callable[[], None] | None):
        counters = meter.counters

        def wait() -> None:
            with counters.harness():
                synchronize()  # type: ignore[misc]  # only made when there is one

        super().__init__(wait if synchronize else None)
        self.meter = meter

    def put(self, value):
        counters = self.meter.counters
        # transformers copied it to the host for this streamer: the harness's sync
        counters.claim(value)
        self.meter.marks.append(counters.read())
        super().put(value)


def meter_for(adapter, mode: str, switch: str = "on") -> tuple[Meter | None, str | None]:
    """(a meter on ``adapter``'s counters, None) or (None, why the host cost is not measured:
    also the probe's ``host_cost`` setting, ``switch``, off)."""
    if switch == "off":
        return None, "host_cost=off"
    if adapter.type == "cpu":
        return None, "the CPU is the host"
    counters = adapter.host_counters()
    if counters is None:
        return (
            None,
            f"the {adapter.type} adapter keeps no counts of host syncs or CPU fallbacks (no "
            "profiler read)",
        )
    return Meter(counters, adapter.type), None
