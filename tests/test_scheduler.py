"""The multi-device scheduler and the local sweep's scheduling over it (``run_on_devices``): real
threads; the policy checked by the order of grants and events, never by how long something took."""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

from model_support.probe.devices import pinning_env
from model_support.sweep.scheduler import (
    DeviceScheduler,
    device_order,
    largest_first,
    run_on_devices,
)


def consume(results, timeout: float = 60.0) -> list:
    """Drain a run_on_devices generator on a thread; fail (instead of hanging) if it deadlocks."""
    out, errors = [], []

    def drain():
        try:
            out.extend(results)
        except BaseException as error:  # noqa: BLE001 - re-raised in the test thread
            errors.append(error)

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"run_on_devices did not finish within {timeout} s (deadlock?)"
    if errors:
        raise errors[0]
    return out


class Owners:
    """Who holds each device right now: a device taken while another job holds it is recorded."""

    def __init__(self, size: int):
        self.owner: list = [None] * size
        self.clashes: list = []
        self.peak = self.busy = 0
        self.lock = threading.Lock()

    def take(self, job, ids) -> None:
        with self.lock:
            if any(self.owner[d] is not None for d in ids):
                self.clashes.append((job, ids))
            for d in ids:
                self.owner[d] = job
            self.busy += len(ids)
            self.peak = max(self.peak, self.busy)

    def give(self, ids) -> None:
        with self.lock:
            for d in ids:
                self.owner[d] = None
            self.busy -= len(ids)


@pytest.mark.parametrize("contiguous", [False, True], ids=["any-devices", "aligned-blocks"])
def test_mixed_sizes_finish_without_deadlock_and_never_share_a_device(contiguous):
    rng = random.Random(7)
    jobs = [
        (i, rng.choice([1, 1, 1, 1, 2, 2, 4, 8]), rng.uniform(0.001, 0.006)) for i in range(150)
    ]
    owners, grants = Owners(8), {}

    def probe(job, devices):
        with devices() as grant:
            assert len(grant.ids) == job[1] and len(set(grant.ids)) == job[1]
            owners.take(job, grant.ids)
            time.sleep(job[2])
            owners.give(grant.ids)
        grants[job] = grant.ids
        return job

    finished = consume(
        run_on_devices(
            device_order(jobs, lambda j: j[1]),
            lambda j: j[1],
            DeviceScheduler(8, contiguous),
            probe,
        )
    )
    assert sorted(finished) == sorted(jobs)
    assert owners.clashes == [] and owners.peak <= 8
    assert all(0 <= d < 8 for ids in grants.values() for d in ids)
    if contiguous:  # TPU mode: every grant is an aligned block [k*n, (k+1)*n)
        assert all(
            ids == tuple(range(ids[0], ids[0] + len(ids))) and ids[0] % len(ids) == 0
            for ids in grants.values()
        )


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
    # Six 1-device probes hold devices 0-5, then a 4-device model asks: it reserves block 4-7 (the
    # least busy one). 1-device models asking after it never get 6 or 7 (its target) but do get 0-3
    # as they free up; it starts the moment 4 and 5 are free, before any 1-device model that asked
    # after it.
    scheduler = DeviceScheduler(8, contiguous=contiguous)
    small = [scheduler.submit(1, key=f"s{i}") for i in range(6)]
    assert [r.ids for r in small] == [(i,) for i in range(6)]
    big = scheduler.submit(4, key="big")
    assert not big.event.is_set() and big.target == frozenset({4, 5, 6, 7})
    later = [scheduler.submit(1, key=f"l{i}") for i in range(3)]
    # 6 and 7 are free, but reserved for the big model
    assert not any(r.event.is_set() for r in later)
    scheduler.release(small[0].ids)
    scheduler.release(small[1].ids)
    # backfilled outside 4-7
    assert [r.ids for r in later[:2]] == [(0,), (1,)] and not later[2].event.is_set()
    scheduler.release(small[4].ids)
    # 4 waits for 5: nobody else takes it
    assert not big.event.is_set() and not later[2].event.is_set()
    scheduler.release(small[5].ids)
    assert big.ids == (4, 5, 6, 7) and not later[2].event.is_set()
    scheduler.release(small[2].ids)
    assert later[2].ids == (2,)


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


def test_an_8_device_model_is_not_starved_by_an_endless_stream_of_1_device_models():
    # Eight 1-device models hold every device; an 8-device model asks, and every time a device frees
    # up another 1-device model asks too (an endless stream). With the reservation the big model
    # gets all eight once the eight that ran before it are done, ahead of the whole stream; without
    # it (the control) every freed device goes to the stream and the big model never starts.
    for policy, should_start in ((DeviceScheduler, True), (FirstFit, False)):
        scheduler = policy(8)
        running = [scheduler.submit(1) for _ in range(8)]
        big = scheduler.submit(8)
        stream = []
        for _ in range(40):
            scheduler.release(running.pop(0).ids)
            stream.append(scheduler.submit(1))
            running += [r for r in stream if r.event.is_set() and r not in running and r.ids]
            if big.event.is_set():
                break
        if should_start:
            assert big.ids == tuple(range(8)) and not any(r.event.is_set() for r in stream)
        else:
            assert not big.event.is_set() and all(r.event.is_set() for r in stream)


def test_a_request_larger_than_the_machine_is_refused_with_one_sentence():
    scheduler = DeviceScheduler(8)
    with pytest.raises(ValueError) as refused:
        scheduler.acquire(16)
    message = str(refused.value)
    assert message == "A model that needs 16 devices cannot run here: there are only 8."
    assert message.count(". ") == 0
    with pytest.raises(ValueError, match="at least 1"):
        scheduler.acquire(0)

    def probe(need, devices):
        with devices():
            return need

    with pytest.raises(ValueError, match="needs 16 devices"):
        consume(run_on_devices([1, 16], lambda need: need, scheduler, probe))
    # nothing leaked; the run closed it
    assert scheduler.free == tuple(range(8)) and scheduler.closed


def test_results_are_yielded_as_they_finish():
    """The slow probe goes on only once the quick one's result has come back: yielded as they
    finish."""
    quick_back = threading.Event()

    def probe(job, devices):
        with devices():
            if job == "slow":
                assert quick_back.wait(30), (
                    "the quick result was not yielded while the slow probe ran"
                )
        return job

    arrivals = []
    for value in run_on_devices(["slow", "quick"], lambda j: 1, DeviceScheduler(2), probe):
        arrivals.append(value)
        quick_back.set()
    assert arrivals == ["quick", "slow"]


def test_closing_early_stops_the_rest_and_calls_on_stop():
    """Job 0 comes back at once; every other job that starts waits until on_stop lets it go (the
    running probes being stopped): closing after the first result starts no further job, and when
    close returns no probe thread is left that could start one."""
    ran, gate, stopping = [], threading.Event(), threading.Event()

    def probe(job, devices):
        ran.append((job, stopping.is_set()))
        with devices():
            if job != 0:
                assert gate.wait(30), "on_stop was not called"
        return job

    def on_stop():
        stopping.set()  # from here on, a probe that starts started after the close
        gate.set()

    results = run_on_devices(range(10_000), lambda j: 1, DeviceScheduler(4), probe, on_stop=on_stop)
    assert next(results) == 0
    results.close()  # returns once every started probe is over
    assert gate.is_set()
    started = [job for job, _ in ran]
    # job 0, one more per thread
    assert sorted(started) == list(range(len(started))) and len(started) <= 1 + 4
    assert [job for job, after_close in ran if after_close] == []  # none after close
    # none left to start one
    assert not [t.name for t in threading.enumerate() if t.name.startswith("probe_")]


def test_an_error_in_a_probe_is_raised_after_its_devices_are_released():
    scheduler = DeviceScheduler(4)

    def probe(job, devices):
        with devices():
            if job == "bad":
                raise RuntimeError("probe exploded")
        return job

    with pytest.raises(RuntimeError, match="probe exploded"):
        consume(run_on_devices(["ok", "bad", "ok"], lambda j: 2, scheduler, probe))
    # released, though the run ended on the error (and closed it)
    assert scheduler.free == (0, 1, 2, 3)


def test_a_job_that_needs_no_device_holds_none():
    scheduler = DeviceScheduler(1)
    with scheduler.hold(1):  # the only device is taken: a job that asks for none still runs
        assert consume(
            run_on_devices(["no devices"], lambda j: 1, scheduler, lambda job, devices: job)
        ) == ["no devices"]


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
    assert [t[0] for t in device_order(tasks, lambda t: t[1])] == ["b", "d", "c", "a", "e"]
    ones = [("a", 1), ("b", 1)]
    assert device_order(ones, lambda t: t[1]) == ones  # one device each: as given


def test_pinning_env():
    assert pinning_env("cuda", (0, 1)) == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert pinning_env("cuda", (3,)) == {"CUDA_VISIBLE_DEVICES": "3"}
    # one chip: torch_tpu's one-chip-per-process variable, and libtpu's own one-chip settings (issue
    # 58: the adapter asks torch_tpu; tests/test_torch_tpu_conformance.py checks each name against
    # the installed package)
    assert pinning_env("tpu", (3,)) == {
        "TPU_VISIBLE_DEVICES": "3",
        "TPU_VISIBLE_CHIPS": "3",
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_PORT": "8479",
    }
    # several chips: the grant only; the probe process never opens them, its ranks each open one
    assert pinning_env("tpu", (4, 5)) == {"TPU_VISIBLE_DEVICES": "4,5"}
    assert pinning_env("tpu", tuple(range(8))) == {"TPU_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    for bad in ((1, 2), (0, 2)):  # not an aligned block of 1, 2, 4 or 8 chips
        with pytest.raises(ValueError, match="aligned block"):
            pinning_env("tpu", bad)
    # torch_tpu's own table says which sizes exist
    with pytest.raises(ValueError, match="no slice of 3 chips"):
        pinning_env("tpu", (0, 1, 2))
    assert pinning_env("cpu", (0,)) == {}
    # any other accelerator: the generic adapter's <NAME>_VISIBLE_DEVICES
    assert pinning_env("fake", (0, 1)) == {"FAKE_VISIBLE_DEVICES": "0,1"}
    with pytest.raises(ValueError, match="must be pinned to at least one device"):
        pinning_env("fake", ())


def test_more_workers_than_devices_share_them_and_a_model_needing_more_is_refused(
    tmp_path, monkeypatch
):
    """4 workers on one GPU all see GPU 0 (they pinned CUDA_VISIBLE_DEVICES=1..3, no GPU at all,
    before); a model that needs more devices than the machine has is one sentence before any
    probe."""
    from model_support.errors import UserError
    from model_support.sweep.executors.local import LocalExecutor, _Processes

    # the device facts come from a child process
    monkeypatch.setenv("MODEL_SUPPORT_PRETEND", '{"devices": 1}')
    processes = _Processes("pretend", tmp_path, prewarm=False, models=0)
    assert processes.count == 1
    assert processes.pin((0,)) == processes.pin((3,)) == {"PRETEND_VISIBLE_DEVICES": "0"}
    executor = LocalExecutor("pretend", 4, tmp_path)
    executor.submit([{"model_id": "org/wide"}])  # type: ignore[list-item]  # start reads only its id
    with pytest.raises(
        UserError, match="^org/wide needs 2 pretend devices and this machine has 1.$"
    ):
        executor.start([2])
    # a CPU sweep's slots pin nothing
    assert _Processes("cpu", tmp_path, prewarm=False, models=0).pin((3,)) == {}


def _environ(process, wait_s: float = 10.0) -> dict:
    """A process's environment as the kernel shows it: empty for a moment after its exec (Popen
    returns when the exec closed its close-on-exec pipe, before the new stack, the environment on
    it, is laid out)."""
    deadline = time.monotonic() + wait_s
    while not (environ := process.environ()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return environ


def test_the_processes_a_sweep_runs_at_once_share_the_cores_for_torchs_threads(
    tmp_path, monkeypatch
):
    """Two CPU workers: the sweep's zygote and its probe processes get OMP_NUM_THREADS = cores /
    2 (left alone, each process's torch starts a thread per core and they spin waiting for each
    other), and the probe's kernel is still forked from the zygote (the same environment); a
    value the user set is theirs."""
    import psutil

    from model_support.sweep.executors.local import THREADS_VAR, LocalExecutor, thread_share

    # the suite sets its own (conftest): a user who did not
    monkeypatch.delenv(THREADS_VAR, raising=False)
    # the session's zygote (conftest) serves the same environment under xdist (each worker's thread
    # share is the one checked here), and a sweep then forks from it: this test is about the sweep's
    # own zygote
    monkeypatch.delenv("MODEL_SUPPORT_KERNEL_ZYGOTE", raising=False)
    share = str(max(1, len(os.sched_getaffinity(0)) // 2))
    assert thread_share(1, {}) == {} and thread_share(2, {THREADS_VAR: "3"}) == {}
    executor = LocalExecutor("cpu", 2, tmp_path)
    executor.submit([{"model_id": "org/a"}, {"model_id": "org/b"}])  # type: ignore[list-item]  # start reads ids
    executor.start([1, 1])
    try:
        assert executor._zygote is not None and executor._processes is not None
        zygote = psutil.Process(executor._zygote.pid)
        assert _environ(zygote).get(THREADS_VAR) == share
        standby = executor._processes.take((0,))
        assert _environ(psutil.Process(standby.proc.pid)).get(THREADS_VAR) == share
        assert standby.wait_warm(120), "the probe process never warmed up"
        kernels = [k for k in zygote.children() if k.cwd() == str(standby.work)]
        # forked, not started fresh
        assert kernels and _environ(kernels[0]).get(THREADS_VAR) == share
    finally:
        executor.kill_running()
        executor.finish()


def test_a_probe_waiting_for_devices_starts_nothing_after_a_stop():
    """The stop kills the running probe, which gives its device back: the probe waiting for that
    device must not be granted it and start (it would run a fresh model to its timeout in a
    stopped sweep)."""
    scheduler, started, stopping = DeviceScheduler(2), [], threading.Event()

    def probe(job, devices):
        name, _need = job
        with devices():
            started.append(name)
            if name == "running":
                assert stopping.wait(30), "on_stop was not called"
        return name

    jobs = [("running", 1), ("quick", 1), ("waiting", 2)]
    results = run_on_devices(jobs, lambda j: j[1], scheduler, probe, on_stop=stopping.set)
    assert next(results) == "quick"
    deadline = time.monotonic() + 30
    while not scheduler._queue and time.monotonic() < deadline:  # "waiting" asks for both devices
        time.sleep(0.01)
    assert scheduler._queue, "the two-device job never asked for its devices"
    # the stop: "running" is let go (as a killed probe ends) and gives its device back
    results.close()
    assert started == ["running", "quick"]
    assert scheduler.free == (0, 1)  # every device back, none granted after the stop


def test_a_closed_scheduler_grants_nothing_and_still_takes_devices_back():
    from model_support.sweep.scheduler import SchedulerClosed

    scheduler = DeviceScheduler(2)
    held = scheduler.acquire(2)
    waiter_error = []

    def wait_for_one():
        try:
            scheduler.acquire(1)
        except SchedulerClosed as error:
            waiter_error.append(error)

    thread = threading.Thread(target=wait_for_one)
    thread.start()
    while not scheduler._queue:
        time.sleep(0.01)
    scheduler.close()
    thread.join(10)
    assert waiter_error and not thread.is_alive()
    scheduler.release(held)
    with pytest.raises(SchedulerClosed):
        scheduler.submit(1)


def test_a_retry_runs_on_a_fresh_process_and_leaves_the_slots_warm_one_to_the_next_model(tmp_path):
    """A probe whose kernel never started runs again on a fresh process (``take(retry=True)``);
    the process warming up for the slot's next model stays the slot's. It was replaced by
    another, and went on running, owned by no one (no stop or discard reached it), until the
    sweep ended."""
    import psutil

    from model_support.sweep.executors.local import _Processes

    def ours() -> list:
        found = []
        for child in psutil.Process().children():
            try:
                if (
                    str(tmp_path) in " ".join(child.cmdline())
                    and child.status() != psutil.STATUS_ZOMBIE
                ):
                    found.append(child)
            except psutil.NoSuchProcess:
                pass
        return found

    processes = _Processes("cpu", tmp_path, prewarm=True, models=3)
    try:
        first = processes.take((0,))
        warm = processes.warm[0]
        again = processes.take((0,), retry=True)
        assert again not in (first, warm) and processes.warm == {0: warm}
        processes.stop()
        processes.discard()
        assert not ours()
    finally:
        for stray in ours():
            stray.kill()
