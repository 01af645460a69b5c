"""The pretend device's own timeline: what its event timer would read (``torch.pretend.perf_clock``).

Why a modelled clock rather than a measured one: its kernels run in Python on a shared CPU, and the CPU time they
take moves by ~10% from one process to the next even on a quiet host (memory layout, the interpreter's caches), and
by several times on a loaded one, so two sweeps of one stack would differ by more than a slowdown worth catching. A
real accelerator's timeline moves by about a percent between runs. So each kernel advances the clock by what such a
device would take, a launch latency plus the bytes it reads and writes at the device's bandwidth, times a noise drawn
per kernel and per process (``clock_jitter``: the spread of a real device between runs, so that the gate's rule
against noise is exercised, not bypassed); a view launches nothing; a stall (``slow_ops``, a fallback's round trip)
counts its configured seconds exactly. The host's own work (Python, the generation loop) takes no time on it, as it
takes none on a device's event timeline.
"""

from __future__ import annotations

import random

#: Bytes per second the clock moves data at where the configuration declares no ``bandwidth_gbs`` (the adapter then
#: still reports no peak bandwidth: utilisation needs a declared one).
DEFAULT_BANDWIDTH = 100e9
#: How far apart, relative to their size, two processes' timings of the same work can be, in spreads
#: (``clock_jitter``): each pace is at most 2 spreads off; the per-kernel noise averages out over a step's kernels.
NOISE_BOUND = 4


class DeviceClock:
    """Seconds on the device's timeline since the backend started."""

    def __init__(self, launch_s: float, bandwidth_gbs: float | None, jitter: float):
        self.launch_s = launch_s
        self.bandwidth = bandwidth_gbs * 1e9 if bandwidth_gbs else DEFAULT_BANDWIDTH
        self.jitter = jitter
        self._random = random.Random()  # seeded from the system: each process draws its own noise
        # the process's own pace, as two runs of one device differ (clocks, placement): at most 2 spreads off, so
        # two processes' timings of the same work differ by at most ~4 spreads (``NOISE_BOUND``)
        self.pace = 1.0 + self._clamped() if jitter else 1.0
        self.elapsed = 0.0

    def _clamped(self) -> float:
        return max(-2 * self.jitter, min(2 * self.jitter, self._random.gauss(0.0, self.jitter)))

    def kernel(self, nbytes: int) -> None:
        """One kernel that reads and writes ``nbytes``."""
        seconds = (self.launch_s + nbytes / self.bandwidth) * self.pace
        self.elapsed += seconds * (1.0 + self._clamped()) if self.jitter else seconds

    def stall(self, seconds: float) -> None:
        """The device waits ``seconds`` (counted whole: what the configuration asked)."""
        self.elapsed += seconds

    def now(self) -> float:
        return self.elapsed
