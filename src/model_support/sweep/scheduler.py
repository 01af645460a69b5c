"""Hand out accelerator devices to probes that need one or several of them.

Why it exists: a model too big for one chip runs tensor or expert parallel over N chips (N a power
of two). A sweep's workers then hand out devices, not slots. The obvious generalisation of one slot
per worker (a model takes its N slots one by one) deadlocks (two 8-chip models holding 4 chips
each), and plain first-fit backfilling starves big models (a stream of 1-chip models never leaves 8
free).

Policy: FIFO with reservation ("drain") backfilling. Durations are unknown in advance, so the rule
uses no estimates.
- Requests wait in arrival order; the oldest waiting one is the head. A grant is all or nothing: a
  request holds no device until it gets every device it needs.
- On every request, release and cancel the queue is dispatched: the head starts as soon as a fitting
  set of devices is free.
- A head that does not fit reserves a target when it becomes the head: the aligned block of `need`
  devices with the fewest busy ones. Target devices that free up stay free for it. Later requests
  backfill (in arrival order) only onto free devices outside the target, so a backfilled probe never
  sits on a device the head is waiting for. After a dispatch no waiting request fits in the free
  devices outside the head's target: no device idles while a model that may use it waits.
- Placement: an aligned block, ids at positions [k*need, (k+1)*need), inside the most occupied
  region (buddy-style best fit), so large aligned blocks stay whole. With ``contiguous=True`` (TPUs:
  chips are allocated in slices and a multi-chip process needs an aligned block of neighbouring
  chips) only aligned blocks are granted; otherwise any free devices when no aligned block is free.

No deadlock: a waiting request holds nothing (no hold and wait); a request larger than the machine
is refused at once with ValueError, so every waiting request fits the empty machine; and every
release re-runs the dispatch. So while a request waits, either a probe runs (and will release) or
every device is free and the head is granted.

No starvation: let D be the longest probe time (in a sweep, at most the per-model timeout). A
request that becomes the head at t0 picks its target then; the probes on the target started before
t0 and end by t0 + D, and nothing new starts on the target, so by t0 + D the target is free and the
head starts: a head waits at most D. Backfilling starts later requests early but never moves one
ahead of an earlier one, so the p-th waiting request starts within (p + 1) * D however many small
requests keep arriving.

The price of the reservation is idle devices while a head drains its target: on the bench's mix
(1,000 models, 8 devices, 2% needing all 8) in shuffled order, about 14% of device time. For a list
known in advance, ``largest_first`` removes most drains (big models start on an empty machine, and
the 1-device models fill the end): about 3%, the figure of a sweep, whose models ``run_on_devices``
takes in ``device_order``. See bench/bench_scheduler.py, which drives ``run_on_devices`` itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

J = TypeVar("J")
R = TypeVar("R")


class SchedulerClosed(RuntimeError):
    """The scheduler was closed (the sweep stopped): a request waiting for devices, or made
    after, gets none."""


@dataclass(eq=False)
class Request:
    """One wait for devices, with its times (time.monotonic) for tests and benchmarks."""

    need: int
    key: Any = None
    queued: float = field(default_factory=time.monotonic)
    head: float | None = None  # when it became the oldest waiting request
    granted: float | None = None
    ids: tuple[int, ...] = ()  # the devices granted (none until then)
    target: frozenset | None = None  # devices reserved for it while it is the head
    event: threading.Event = field(default_factory=threading.Event)


class DeviceScheduler:
    """Thread-safe hand-out of ``devices`` (a count, or the ids) by the policy in the module
    docstring."""

    def __init__(self, devices: int | list[int], contiguous: bool = False):
        self.ids = tuple(range(devices)) if isinstance(devices, int) else tuple(devices)
        if not self.ids or len(set(self.ids)) != len(self.ids):
            raise ValueError(
                f"A scheduler needs at least one device and distinct ids, not {devices!r}."
            )
        self.size = len(self.ids)
        self.contiguous = contiguous
        self._pos = {d: i for i, d in enumerate(self.ids)}
        self._free = set(self.ids)
        self._queue: list[Request] = []
        self._lock = threading.Lock()
        self.closed = False

    @property
    def free(self) -> tuple[int, ...]:
        """The devices no request holds now (all of them after a run that gave back what it
        took)."""
        with self._lock:
            return tuple(d for d in self.ids if d in self._free)

    def acquire(self, need: int, key=None, timeout: float | None = None) -> tuple[int, ...]:
        """Block until ``need`` devices are granted; return their ids (TimeoutError after
        ``timeout`` s). ``key`` labels the request (a model id, an index): it is kept on the
        request, not used to order it."""
        request = self.submit(need, key)
        if not request.event.wait(timeout) and self.cancel(request):
            raise TimeoutError(f"{need} device(s) were not free within {timeout} s.")
        if not request.ids:
            raise SchedulerClosed("the scheduler was closed while this request waited")
        return request.ids

    @contextmanager
    def hold(self, need: int, key=None) -> Iterator[Request]:
        """Wait for ``need`` devices and hold them for the ``with`` block: the request, with its
        ids and times (queued, head, granted); they are given back however the block ends."""
        request = self.submit(need, key)
        request.event.wait()
        if not request.ids:  # closed while it waited: no devices, nothing to give back
            raise SchedulerClosed("the scheduler was closed while this request waited")
        try:
            yield request
        finally:
            self.release(request.ids)

    def submit(self, need: int, key=None) -> Request:
        """Queue a request without blocking; its ``event`` is set once its devices are granted."""
        if not isinstance(need, int) or need < 1:
            raise ValueError(f"A model needs a whole number of devices, at least 1, not {need!r}.")
        if need > self.size:
            raise ValueError(
                f"A model that needs {need} devices cannot run here: there are only {self.size}."
            )
        request = Request(need, key)
        with self._lock:
            if self.closed:
                raise SchedulerClosed("the scheduler is closed: it grants nothing more")
            self._queue.append(request)
            granted = self._dispatch()
        self._notify(granted)
        return request

    def release(self, ids: Iterable[int]) -> None:
        """Give back granted devices; waiting requests that now fit are granted at once."""
        with self._lock:
            ids = set(ids)
            if not ids <= set(self.ids) - self._free:
                raise ValueError(
                    f"Devices {sorted(ids)} are not all held: release only what was granted."
                )
            self._free |= ids
            granted = self._dispatch()
        self._notify(granted)

    def cancel(self, request: Request) -> bool:
        """Withdraw a waiting request; False when it was already granted (the caller then owns
        its ids)."""
        with self._lock:
            if request not in self._queue:
                return False
            self._queue.remove(request)
            granted = self._dispatch()
        self._notify(granted)
        return True

    def close(self) -> None:
        """Grant nothing more (the sweep stopped): every waiting request wakes with no devices
        (``hold`` and ``acquire`` raise ``SchedulerClosed``), new ones are refused; devices held
        are still given back. So a probe killed by the stop frees its devices to no one, and no
        fresh probe starts on them."""
        with self._lock:
            self.closed = True
            waiting, self._queue = self._queue, []
        self._notify(waiting)

    # -- policy (called with the lock held) --
    def _dispatch(self) -> list[Request]:
        now, granted = time.monotonic(), list[Request]()
        if self.closed:
            return granted
        while self._queue:  # the head, as long as it fits
            head = self._queue[0]
            head.head = head.head or now
            ids = self._place(head.need, self._free)
            if ids is None:
                break
            granted.append(self._grant(self._queue.pop(0), ids, now))
        if self._queue:  # backfill around the head's reserved target
            head = self._queue[0]
            if head.target is None:
                head.target = self._target(head.need)
            spare = self._free - head.target
            for request in list(self._queue[1:]):
                ids = self._place(request.need, spare) if spare else None
                if ids is not None:
                    spare -= set(ids)
                    self._queue.remove(request)
                    granted.append(self._grant(request, ids, now))
        return granted

    def _target(self, need: int) -> frozenset:
        """The aligned block with the fewest busy devices (the lowest on a tie)."""
        return frozenset(
            min(self._blocks(need), key=lambda b: (sum(d not in self._free for d in b), b))
        )

    def _place(self, need: int, available: set) -> tuple[int, ...] | None:
        blocks = [b for b in self._blocks(need) if available.issuperset(b)]
        if blocks:
            return min(blocks, key=self._crowding)
        if self.contiguous or len(available) < need:
            return None
        return tuple(
            sorted(
                sorted(available, key=lambda d: self._crowding((d,)))[:need],
                key=self._pos.__getitem__,
            )
        )

    def _blocks(self, need: int) -> list[tuple[int, ...]]:
        return [self.ids[k * need : (k + 1) * need] for k in range(self.size // need)]

    def _crowding(self, block: tuple[int, ...]) -> tuple:
        """Sort key: busy devices in the enclosing aligned blocks (2x, 4x, ... the size), most
        first."""
        position, size, key = self._pos[block[0]], 2 * len(block), []
        while size < 2 * self.size:
            start = position // size * size
            key.append(-sum(d not in self._free for d in self.ids[start : start + size]))
            size *= 2
        return (*key, position)

    def _grant(self, request: Request, ids: tuple[int, ...], now: float) -> Request:
        self._free -= set(ids)
        # backfilled: never head
        request.ids, request.granted, request.head = ids, now, request.head or now
        return request

    @staticmethod
    def _notify(granted: list[Request]) -> None:
        for request in granted:
            request.event.set()


def largest_first(tasks: Iterable, need_of: Callable[[Any], int]) -> list:
    """The tasks, those needing most devices first (given order kept within a size): a known list in
    this order rarely drains devices for a big model, since big models start on an empty machine."""
    return sorted(tasks, key=need_of, reverse=True)


def device_order(jobs: Iterable[J], need_of: Callable[[J], int]) -> list[J]:
    """The order a local sweep hands its models out in: biggest first (``largest_first``) when any
    needs more than one device, else as given."""
    jobs = list(jobs)
    return largest_first(jobs, need_of) if any(need_of(job) > 1 for job in jobs) else jobs


#: What a probe gets to hold its devices: ``with devices() as request:`` waits for them
#: (``request.ids``).
Devices = Callable[[], AbstractContextManager[Request]]


def run_on_devices(
    jobs: Iterable[J],
    need_of: Callable[[J], int],
    scheduler: DeviceScheduler,
    probe: Callable[[J, Devices], R],
    on_stop: Callable[[], None] | None = None,
    threads: int | None = None,
) -> Iterator[R]:
    """The local executor's scheduling (``executors.contract.Executor.results``, on jobs in
    ``device_order``; bench/bench_scheduler.py drives it with simulated probes): one thread per
    device, each taking the next job in order and calling ``probe(job, devices)``, which holds
    its devices for as long as it needs them (``with devices() as request``: the scheduler's
    policy decides when) or none (a job with nothing to run). Results are yielded as the probes
    finish, and a finished one is not kept: memory stays flat. An exception from ``probe`` is
    raised here, after its devices were given back. Closing early cancels the jobs not started,
    closes the scheduler (a job waiting for devices gets none: ``SchedulerClosed`` in its thread,
    not here), calls ``on_stop`` (to stop the running probes) and waits, so no probe starts after
    a stop. ``threads`` (default one per device): more lets a job do host work after giving its
    devices back (its host checks) while another job holds them."""
    pool = ThreadPoolExecutor(max_workers=threads or scheduler.size, thread_name_prefix="probe")

    def one(index: int, job: J) -> R:
        return probe(job, lambda: scheduler.hold(need_of(job), key=index))

    try:
        unfinished = {pool.submit(one, index, job) for index, job in enumerate(jobs)}
        # woken twice a second: a signal (Ctrl-C) another thread received is acted on
        while unfinished:
            done, unfinished = wait(unfinished, timeout=0.5, return_when=FIRST_COMPLETED)
            for future in done:
                yield future.result()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        scheduler.close()
        if on_stop is not None:
            on_stop()
        pool.shutdown(wait=True)
