"""Downloads ahead of the probes: each worker's next model is fetched while the current one runs.

A sweep of Hub models on one host spends two kinds of time per model: downloading it (network) and
probing it (device). ``Prefetcher`` fetches the sweep's models in order on background threads, at
most ``window`` models that are downloaded or downloading but not yet probed (the workers' current
models plus ``prefetch`` ahead for each), and only as far as the cache budget allows
(``budget.CacheBudget``: what is downloaded and not yet probed never exceeds ``max_gb`` nor the free
disk). So a sweep's wall time approaches max(download, probe) rather than their sum, and the disk
never fills. ``done`` frees a model's place: its files are deleted (unless the sweep keeps its
cache) and the next download may start. A model too large for the budget is excluded with the
reason, before anything is downloaded.

Downloads run on daemon threads: ``close`` (the sweep stopped) waits for none of them. A download
cut short leaves huggingface_hub's own ``.incomplete`` file, which the next fetch resumes. A feeder
that raises (a thread that cannot be started, a bug) hands no model on: whoever waits for one gets
``PrefetchFailed`` with its error, so the sweep ends in one sentence instead of waiting forever.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import Future

from ...probe import hub, hub_fetch
from ..budget import CacheBudget
from .download import Download, download
from .task import ProbeTask


class PrefetchFailed(RuntimeError):
    """The prefetcher's feeder raised: no model after the one it was handing on can be
    downloaded."""


class Prefetcher:
    def __init__(
        self, tasks: list[ProbeTask], window: int, budget: CacheBudget | None, threads: int
    ):
        self._tasks = tasks
        self._window = threading.Semaphore(max(1, window))
        self._budget = budget
        self._slots = threading.Semaphore(max(1, threads))  # downloads at once
        self._futures: dict[int, Future] = {}
        self._ready = [threading.Event() for _ in tasks]
        self._stop = threading.Event()
        # A model's variants share its download: reserved once, deleted after its last variant.
        self._left = Counter(task["source"] for task in tasks)
        self._reserved: set[str] = set()
        self._lock = threading.Lock()
        self._failed: BaseException | None = None
        self._feeder = threading.Thread(
            target=self._feed_or_fail, name="prefetch-feeder", daemon=True
        )
        self._feeder.start()

    def _feed_or_fail(self) -> None:
        """``_feed``; when it raises, every model not handed on yet gets its error (``wait``),
        not a wait forever."""
        try:
            self._feed()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for a model it did not hand on
            self._failed = exc
            for ready in self._ready:
                ready.set()

    def _feed(self) -> None:
        for index, task in enumerate(self._tasks):
            self._window.acquire()
            if self._stop.is_set():
                return
            future: Future = Future()
            if hub_fetch.is_local(task["source"]):
                future.set_result(Download("ready", path=task["source"]))
            else:
                early = self._reserve(task)
                if early is not None:
                    future.set_result(early)
                else:
                    self._slots.acquire()
                    if self._stop.is_set():
                        return
                    threading.Thread(
                        target=self._download,
                        args=(task, future),
                        name=f"prefetch-{index}",
                        daemon=True,
                    ).start()
            self._futures[index] = future
            self._ready[index].set()

    def _download(self, task: ProbeTask, future: Future) -> None:
        try:
            future.set_result(download(task))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for this model
            future.set_exception(exc)
        finally:
            self._slots.release()

    def _reserve(self, task: ProbeTask) -> Download | None:
        """Room in the budget for ``task``'s download (waiting for it), or why it cannot be
        fetched."""
        if self._budget is None or task["source"] in self._reserved:
            return None
        size = task.get("planned_bytes")
        if size is None:  # the Hub was not asked when the sweep was created: ask now
            try:
                facts = hub.model_facts(
                    task["source"],
                    task.get("revision_sha") or task["params"].get("revision") or "",
                    log=lambda _: None,
                    **hub_fetch.retry_policy(),
                )
            except hub_fetch.EnvironmentProblem as exc:
                return Download("pending", reason=str(exc), problem=exc.kind)
            except (hub_fetch.NoAccess, hub_fetch.NotOnHub) as exc:
                return Download("excluded", reason=str(exc))
            size = facts["planned_bytes"] or 0
        reason = self._budget.too_large_reason(size)
        if reason:
            return Download("excluded", reason=reason)
        self._budget.reserve(task["source"], size)
        self._reserved.add(task["source"])
        return None

    def wait(self, index: int) -> Download:
        """``tasks[index]``'s download, once finished (it never raises for the Hub's answer);
        ``pending`` at once when the sweep stops first; ``PrefetchFailed`` when the feeder raised
        before handing it on."""
        self._ready[index].wait()
        future = self._futures.get(index)
        if future is None and self._failed is not None:
            failed = self._failed
            text = str(failed).strip().splitlines()
            raise PrefetchFailed(
                f"the downloads ahead of the probes stopped: {type(failed).__name__}"
                + (f": {text[0]}" if text else "")
            ) from failed
        while future is not None and not self._stop.is_set():
            try:
                return future.result(timeout=0.5)
            except TimeoutError:
                continue
        return Download("pending", reason="the sweep stopped before this model was downloaded")

    def done(self, index: int, got: Download) -> None:
        """The model's probe is over: delete its files (unless kept), free its place in the
        window."""
        task = self._tasks[index]
        with self._lock:
            self._left[task["source"]] -= 1
            last = self._left[task["source"]] == 0
        if last and self._budget is not None and not hub_fetch.is_local(task["source"]):
            self._budget.release(task["source"], got.fields.get("revision_sha"))
        self._window.release()

    def close(self) -> None:
        """Stop downloading now, waiting for no download in flight; whoever still waits for a
        model gets ``pending``."""
        self._stop.set()
        self._window.release()
        self._slots.release()
        for ready in self._ready:
            ready.set()
