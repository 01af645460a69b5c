"""The pretend device's own timeline: what its event timer would read
(``torch.pretend.perf_clock``).

Why a modelled clock rather than a measured one: its kernels run in Python on a shared CPU, and the
CPU time they take moves by ~10% from one process to the next even on a quiet host (memory layout,
the interpreter's caches), and by several times on a loaded one, so two sweeps of one stack would
differ by more than a slowdown worth catching. A real accelerator's timeline moves by about a
percent between runs. So each kernel advances the clock by what such a device would take, a launch
latency plus the bytes it reads and writes at the device's bandwidth, times a noise drawn per kernel
and per process (``clock_jitter``: the spread of a real device between runs, so that the gate's rule
against noise is exercised, not bypassed); a view launches nothing; a stall (``slow_ops``, a
fallback's round trip) counts its configured seconds exactly. The host's own work (Python, the
generation loop) takes no time on it, as it takes none on a device's event timeline.

With ``clock: host`` the device offers no timeline (``torch.pretend`` has no ``perf_clock``, as
``torch.cuda`` has none): its kernels are queued, the host waits for them at a sync or a copy to the
host, and the perf phase reads the host's wall clock after a sync, the path of CUDA and of the TPU.
The wait makes the host's clock read the device's modelled work (with its noise) rather than the
loaded host's Python.
"""

from __future__ import annotations

import random
import time

#: Bytes per second the clock moves data at where the configuration declares no ``bandwidth_gbs``
#: (the adapter then still reports no peak bandwidth: utilisation needs a declared one).
DEFAULT_BANDWIDTH = 100e9
#: How far apart, relative to their size, two processes' timings of the same work can be, in spreads
#: (``clock_jitter``): each pace is at most 2 spreads off; the per-kernel noise averages out over a
#: step's kernels.
NOISE_BOUND = 4


class DeviceClock:
    """Seconds on the device's timeline since the backend started."""

    def __init__(
        self, launch_s: float, bandwidth_gbs: float | None, jitter: float, queued: bool = False
    ):
        self.launch_s = launch_s
        self.bandwidth = bandwidth_gbs * 1e9 if bandwidth_gbs else DEFAULT_BANDWIDTH
        self.jitter = jitter
        self._random = random.Random()  # seeded from the system: each process draws its own noise
        # the process's own pace, as two runs of one device differ (clocks, placement): at most 2
        # spreads off, so two processes' timings of the same work differ by at most ~4 spreads
        # (``NOISE_BOUND``)
        self.pace = 1.0 + self._clamped() if jitter else 1.0
        self.elapsed = 0.0
        #: ``clock: host``: the device runs its kernels in a queue the host waits on (``wait``), and
        #: offers no clock of its own; ``busy_until`` is when, on the host's wall clock, the queued
        #: work ends.
        self.queued = queued
        self.busy_until = 0.0

    def _clamped(self) -> float:
        return max(-2 * self.jitter, min(2 * self.jitter, self._random.gauss(0.0, self.jitter)))

    def kernel(self, nbytes: int) -> None:
        """One kernel that reads and writes ``nbytes``."""
        seconds = (self.launch_s + nbytes / self.bandwidth) * self.pace
        self._busy(seconds * (1.0 + self._clamped()) if self.jitter else seconds)

    def _busy(self, seconds: float) -> None:
        self.elapsed += seconds
        if self.queued:  # the kernel starts when the device is free and the host has launched it
            self.busy_until = max(self.busy_until, time.perf_counter()) + seconds

    def wait(self) -> None:
        """The host waits for the device to finish what it queued (``clock: host``: a sync, a
        copy to the host), as it waits on a real asynchronous device: the host's wall clock then
        reads the device's work, whatever the host's own load, and a stall costs what it would."""
        if self.queued:
            time.sleep(max(0.0, self.busy_until - time.perf_counter()))

    def stall(self, seconds: float) -> None:
        """The device waits ``seconds`` (counted whole: what the configuration asked)."""
        self._busy(seconds)

    def now(self) -> float:
        return self.elapsed
