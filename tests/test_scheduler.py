"""The multi-device scheduler: real threads, short sleeps (the whole file runs in a few seconds)."""

from __future__ import annotations

import random
import threading
import time

import pytest

from model_support.probe.devices import pinning_env
from model_support.sweep.scheduler import DeviceScheduler, largest_first, schedule


def consume(results, timeout: float = 15.0) -> list:
    """Drain a schedule() generator on a thread; fail (instead of hanging) if it deadlocks."""
    out, errors = [], []

    def drain():
        try:
            out.extend(results)
        except BaseException as error:  # noqa: BLE001 - re-raised in the test thread
            errors.append(error)

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"schedule() did not finish within {timeout} s (deadlock?)"
    if errors:
        raise errors[0]
    return out


def sleeper(task, ids):
    time.sleep(task[1])
    return task


def assert_no_device_shared(finished) -> None:
    """From the recorded times and ids: no device id is used by two tasks that overlap in time."""
    by_device: dict[int, list] = {}
    for f in finished:
        for device in f.ids:
            by_device.setdefault(device, []).append((f.started, f.ended))
    for device, spans in by_device.items():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end, f"device {device} ran two tasks at once"


@pytest.mark.parametrize("contiguous", [False, True], ids=["any-devices", "aligned-blocks"])
def test_mixed_sizes_finish_without_deadlock_and_never_share_a_device(contiguous):
    rng = random.Random(7)
    tasks = [(rng.choice([1, 1, 1, 1, 2, 2, 4, 8]), rng.uniform(0.001, 0.006)) for _ in range(150)]
    busy, peak, lock = [0], [0], threading.Lock()

    def run(task, ids):
        assert len(ids) == task[0] and len(set(ids)) == task[0]
        with lock:
            busy[0] += len(ids)
            peak[0] = max(peak[0], busy[0])
        time.sleep(task[1])
        with lock:
            busy[0] -= len(ids)

    finished = consume(schedule(tasks, lambda t: t[0], run, 8, contiguous=contiguous))
    assert sorted(f.task for f in finished) == sorted(tasks)
    assert peak[0] <= 8
    assert all(0 <= d < 8 for f in finished for d in f.ids)
    assert_no_device_shared(finished)
    if contiguous:  # TPU mode: every grant is an aligned block [k*n, (k+1)*n)
        assert all(f.ids == tuple(range(f.ids[0], f.ids[0] + len(f.ids))) for f in finished)
        assert all(f.ids[0] % len(f.ids) == 0 for f in finished)


def test_threads_calling_acquire_directly_never_share_a_device():
    scheduler = DeviceScheduler(8, contiguous=True)
    owner = [None] * 8
    lock, problems = threading.Lock(), []

    def worker(seed):
        rng = random.Random(seed)
        for _ in range(15):
            ids = scheduler.acquire(rng.choice([1, 1, 2, 4, 8]), timeout=10)
            with lock:
                if any(owner[d] is not None for d in ids):
                    problems.append(ids)
                for d in ids:
                    owner[d] = seed
            time.sleep(rng.uniform(0.0005, 0.002))
            with lock:
                for d in ids:
                    owner[d] = None
            scheduler.release(ids)

    threads = [threading.Thread(target=worker, args=(seed,), daemon=True) for seed in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    assert not any(thread.is_alive() for thread in threads), "deadlock"
    assert problems == []
    assert scheduler.acquire(8, timeout=1) == tuple(range(8))  # everything was released


@pytest.mark.parametrize("contiguous", [True, False], ids=["aligned-blocks", "any-devices"])
def test_a_4_device_model_waits_for_4_free_while_1_device_models_keep_the_others_busy(contiguous):
    # Six 1-device probes fill devices 0-5 (0-3 short, 4-5 long), then a 4-device model, then a stream
    # of short 1-device probes that outlasts the long ones. The big model reserves block 4-7 (the least
    # busy one): nothing new starts on 6-7, the small models keep 0-3 busy, and it starts as soon as
    # 4-5 free up (with any devices allowed too: 0-3 never become free together meanwhile).
    short, long = 0.04, 0.25
    tasks = [(1, short)] * 4 + [(1, long)] * 2 + [(4, 0.02)] + [(1, short)] * 36
    finished = consume(
        schedule(enumerate(tasks), lambda t: t[1][0], lambda t, ids: time.sleep(t[1][1]), 8, contiguous=contiguous)
    )
    assert_no_device_shared(finished)
    big = next(f for f in finished if len(f.ids) == 4)
    assert big.ids == (4, 5, 6, 7)
    long_end = max(f.ended for f in finished if f.task[1][1] == long)
    assert big.granted >= long_end - 0.001  # it waited for 4 free devices
    assert big.granted - long_end < 0.05  # and started as soon as they were free
    meanwhile = [f for f in finished if len(f.ids) == 1 and big.queued < f.started < big.granted]
    assert len(meanwhile) >= 12 and all(f.ids[0] in (0, 1, 2, 3) for f in meanwhile)
    assert not [f for f in finished if f is not big and set(f.ids) & {6, 7} and f.started < big.granted]


def test_any_free_devices_do_for_cuda_but_only_aligned_blocks_for_tpu():
    for contiguous, expected in ((False, (1, 3)), (True, None)):
        scheduler = DeviceScheduler(4, contiguous=contiguous)
        assert [scheduler.acquire(1) for _ in range(3)] == [(0,), (1,), (2,)]
        scheduler.release((1,))  # free: 1 and 3, no aligned pair
        try:
            got = scheduler.acquire(2, timeout=0.05)
        except TimeoutError:
            got = None
        assert got == expected


class FirstFit(DeviceScheduler):
    """Control: backfilling without the head's reservation (what the policy guards against)."""

    def _target(self, need):
        return frozenset()


def small_stream(scheduler, stop, longest):
    """Eight feeders, each asking for 1 device again as soon as it released one: an endless stream."""

    def feed(seed):
        rng = random.Random(seed)
        while not stop.is_set():
            ids = scheduler.acquire(1, timeout=5)
            time.sleep(rng.uniform(longest / 4, longest))
            scheduler.release(ids)

    threads = [threading.Thread(target=feed, args=(seed,), daemon=True) for seed in range(8)]
    for thread in threads:
        thread.start()
    return threads


def test_an_8_device_model_is_not_starved_by_an_endless_stream_of_1_device_models():
    # Bound (module docstring): with at most p requests ahead of it, a request starts within
    # (p + 1) x the longest probe. Here at most 8 feeders are ahead: (8 + 1) x 40 ms = 0.36 s.
    longest = 0.04
    for policy, should_start in ((DeviceScheduler, True), (FirstFit, False)):
        scheduler, stop = policy(8), threading.Event()
        threads = small_stream(scheduler, stop, longest)
        time.sleep(0.15)  # the stream is running, every device busy
        asked = time.monotonic()
        try:
            ids = scheduler.acquire(8, timeout=1.0)
            waited = time.monotonic() - asked
            scheduler.release(ids)
        except TimeoutError:
            ids = None
        stop.set()
        for thread in threads:
            thread.join(5)
        if should_start:
            assert ids == tuple(range(8))
            assert waited <= 9 * longest + 0.15, waited
        else:  # the control starves it: 8 devices are never free at once while the stream goes on
            assert ids is None


def test_a_request_larger_than_the_machine_is_refused_with_one_sentence():
    scheduler = DeviceScheduler(8)
    with pytest.raises(ValueError) as refused:
        scheduler.acquire(16)
    message = str(refused.value)
    assert message == "A model that needs 16 devices cannot run here: there are only 8."
    assert message.count(". ") == 0
    with pytest.raises(ValueError, match="at least 1"):
        scheduler.acquire(0)
    with pytest.raises(ValueError, match="needs 16 devices"):
        consume(schedule([(1, 0.0), (16, 0.0)], lambda t: t[0], sleeper, scheduler))
    assert scheduler.acquire(8, timeout=1) == tuple(range(8))  # nothing leaked


def test_results_are_yielded_as_they_finish():
    tasks = [(1, 0.4), (1, 0.02), (1, 0.2)]
    start, arrivals = time.monotonic(), []
    for finished in schedule(tasks, lambda t: t[0], sleeper, 3):
        arrivals.append((finished.value, time.monotonic() - start))
    assert [value for value, _ in arrivals] == [(1, 0.02), (1, 0.2), (1, 0.4)]
    assert arrivals[0][1] < 0.2  # the quick one came back while the slow one still ran
    for f in schedule(tasks, lambda t: t[0], sleeper, 3):  # recorded times are ordered
        assert f.queued <= f.head <= f.granted <= f.started <= f.ended


def test_tasks_are_read_lazily_and_closing_stops_the_rest():
    pulled, ran = [0], []

    def tasks():
        for i in range(10_000):
            pulled[0] += 1
            yield (1, 0.001, i)

    results = schedule(tasks(), lambda t: t[0], lambda t, ids: ran.append(t), 4, lookahead=10)
    next(results)
    assert pulled[0] <= 11
    results.close()
    count = len(ran)
    time.sleep(0.05)
    assert len(ran) == count <= 11  # nothing started after close


def test_an_error_in_a_probe_is_raised_after_its_devices_are_released():
    scheduler = DeviceScheduler(4)

    def run(task, ids):
        if task == "bad":
            raise RuntimeError("probe exploded")
        time.sleep(0.01)

    with pytest.raises(RuntimeError, match="probe exploded"):
        consume(schedule(["ok", "bad", "ok"], lambda t: 2, run, scheduler))
    assert scheduler.acquire(4, timeout=1) == (0, 1, 2, 3)


def test_acquire_timeout_release_checks_and_best_fit_placement():
    scheduler = DeviceScheduler(8)
    assert scheduler.acquire(1) == (0,)
    assert scheduler.acquire(1) == (1,)  # next to the busy one: the block 4-7 stays whole
    assert scheduler.acquire(4) == (4, 5, 6, 7)
    with pytest.raises(TimeoutError):
        scheduler.acquire(4, timeout=0.05)
    assert scheduler.acquire(2, timeout=0.05) == (2, 3)  # the timed-out request left the queue
    with pytest.raises(ValueError, match="not all held"):
        scheduler.release([0, 9])
    scheduler.release([4, 5, 6, 7])
    with pytest.raises(ValueError, match="distinct"):
        DeviceScheduler([0, 0])
    assert DeviceScheduler([2, 3, 6, 7], contiguous=True).acquire(2) == (2, 3)


def test_largest_first_keeps_the_given_order_within_a_size():
    tasks = [("a", 1), ("b", 4), ("c", 2), ("d", 4), ("e", 1)]
    assert [t[0] for t in largest_first(tasks, lambda t: t[1])] == ["b", "d", "c", "a", "e"]


def test_pinning_env():
    assert pinning_env("cuda", (0, 1)) == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert pinning_env("cuda", (3,)) == {"CUDA_VISIBLE_DEVICES": "3"}
    # one chip: exactly what sweep.pinning_env("tpu", slot) sets today
    assert pinning_env("tpu", (3,)) == {
        "TPU_VISIBLE_CHIPS": "3",
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_PORT": "8479",
    }
    assert pinning_env("tpu", (4, 5)) == {
        "TPU_VISIBLE_CHIPS": "4,5",
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,2,1",
        "TPU_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_PORT": "8480",
    }
    assert pinning_env("tpu", (0, 1, 2, 3))["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "2,2,1"
    assert pinning_env("tpu", tuple(range(8)))["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "2,4,1"
    assert pinning_env("tpu", tuple(range(8)))["TPU_VISIBLE_CHIPS"] == "0,1,2,3,4,5,6,7"
    for bad in ((1, 2), (0, 1, 2), (0, 2)):  # not an aligned block of 1, 2, 4 or 8 chips
        with pytest.raises(ValueError, match="aligned block"):
            pinning_env("tpu", bad)
    assert pinning_env("cpu", (0,)) == {}
    # any other accelerator: the generic adapter's <NAME>_VISIBLE_DEVICES
    assert pinning_env("fake", (0, 1)) == {"FAKE_VISIBLE_DEVICES": "0,1"}
    with pytest.raises(ValueError, match="must be pinned to at least one device"):
        pinning_env("fake", ())
