"""The sweep's side of the Hub: its ranked model lists (``models_from_hub``) and a disk budget for
the Hugging Face cache that a sweep fills and empties.

Why it exists: a sweep over many multi-GB models must not fill the disk (nor a chosen budget) with
several workers and prefetch threads downloading at once, and must leave the user's cache as it
found it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import threading
import time
from pathlib import Path

import huggingface_hub
from huggingface_hub import constants as hf_constants

from ..display import size_text
from ..probe import hub_fetch
from ..probe.hub import metadata

SORTS = {"downloads": "downloads", "trending": "trending_score", "likes": "likes"}


_EXPAND = [
    "pipeline_tag",
    "library_name",
    "downloads",
    "likes",
    "trendingScore",
    "gated",
    "cardData",
    "createdAt",
    "safetensors",
    "tags",
    "sha",
]


def list_models(
    task="text-generation", sort="downloads", limit=50, *, token=None, endpoint=None
) -> list[dict]:
    """The Hub's top ``limit`` models for ``task``, in the Hub's order: [{"model_id", +
    ``metadata``}]. list_models pages through huggingface_hub's http_backoff, which already
    retries network errors, 429 (Retry-After) and 5xx: no retry is added here, errors are only
    classified."""
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {', '.join(SORTS)}, not {sort!r}.")
    api = huggingface_hub.HfApi(endpoint=endpoint, token=token)
    try:
        # the names are checked against SORTS and the API's expand list
        listed = api.list_models(pipeline_tag=task, sort=SORTS[sort], limit=limit, expand=_EXPAND)  # type: ignore[arg-type]
        infos = list(listed)
    except Exception as exc:  # noqa: BLE001 - classified; unknown kinds re-raise
        problem = hub_fetch.classify(exc, "(model list)", "", bool(token))[0]
        if problem is None:
            raise
        raise problem from exc
    return [{"model_id": info.id, **metadata(info)} for info in infos]


def _tree_bytes(folder: Path) -> int:
    """Bytes of the regular files under ``folder`` (symlinks, i.e. snapshot entries, not
    followed)."""
    total = 0
    for root, _dirs, names in os.walk(folder):
        for name in names:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if not os.path.islink(os.path.join(root, name)):
                total += st.st_size
    return total


class CacheBudget:
    """What a sweep downloads into a huggingface_hub cache folder, kept within ``max_gb`` and the
    free disk.

    - The (repo, revision) pairs in the cache at construction are the user's: never deleted.
    - ``reserve(model_id, nbytes)`` before a download: in-flight reservations + what the sweep keeps
      in the cache never exceed ``max_gb`` (None: no budget), and in-flight reservations never
      exceed the disk's free space minus ``margin_gb``. It blocks until the bytes fit (another
      worker's ``release`` frees them) or ``timeout_s`` passes, and returns False at once when they
      can never fit (``too_large_reason``): several workers and prefetch threads share one budget,
      so a model that fits alone waits its turn instead of being skipped, and one that cannot fit is
      never waited for.
    - ``release(model_id, revision_sha)`` after the probe: unless ``keep``, deletes that revision
      with huggingface_hub's cache API (a revision that predates the sweep is never deleted) and
      frees the reservation; with ``keep`` the files stay and count against the budget.
    - ``used_bytes()``: bytes the sweep added to the cache folder, measured on disk.
    Thread-safe. Sizes are decimal (1 GB = 1e9 bytes).
    """

    def __init__(
        self,
        cache_dir=None,
        max_gb: float | None = None,
        keep: bool = False,
        margin_gb: float = 1.0,
    ):
        self.cache_dir = Path(cache_dir or hf_constants.HF_HUB_CACHE)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.max_gb, self.keep, self.margin_gb = max_gb, keep, margin_gb
        self.max_bytes = None if max_gb is None else int(max_gb * 1e9)
        self._cond = threading.Condition()
        self._reserved: dict[str, int] = {}
        self.preexisting = frozenset(
            (r.repo_id, rev.commit_hash) for r in self._scan().repos for rev in r.revisions
        )
        self._baseline = self._repo_bytes()
        self._kept = 0

    def _scan(self):
        return huggingface_hub.scan_cache_dir(self.cache_dir)

    def _repo_bytes(self) -> dict[str, int]:
        return {
            p.name: _tree_bytes(p)
            for p in self.cache_dir.iterdir()
            if p.is_dir() and not p.name.startswith(".")
        }

    def _added(self, exclude=()) -> int:
        skip = {"models--" + m.replace("/", "--") for m in exclude}
        now = self._repo_bytes()
        return sum(
            max(0, n - self._baseline.get(name, 0)) for name, n in now.items() if name not in skip
        )

    def used_bytes(self) -> int:
        """Bytes the sweep has added to the cache folder so far, measured on disk."""
        return self._added()

    def _disk_room(self) -> int:
        return int(shutil.disk_usage(self.cache_dir).free - self.margin_gb * 1e9)

    def too_large_reason(self, nbytes: int) -> str | None:
        """Why ``nbytes`` can never fit (the budget, less what is kept; the free disk), else
        None."""
        with self._cond:
            if self.max_bytes is not None and nbytes > self.max_bytes - self._kept:
                if self._kept:
                    return (
                        f"too large for what is left of the cache budget: {size_text(nbytes)} "
                        f"> {size_text(self.max_bytes - self._kept)} ({self.max_gb:g} GB, "
                        f"{size_text(self._kept)} kept)."
                    )
                return f"too large for the cache budget: {size_text(nbytes)} > {self.max_gb:g} GB."
            room = self._disk_room() + (0 if self.keep else self._added(exclude=()) - self._kept)
            if nbytes > room:
                return (
                    f"too large for the free disk: {size_text(nbytes)} > "
                    f"{size_text(max(room, 0))} free (after a {self.margin_gb:g} GB margin)."
                )
        return None

    def fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` can be reserved right now."""
        with self._cond:
            return self._fits_now(nbytes)

    def _fits_now(self, nbytes: int) -> bool:
        in_flight = sum(self._reserved.values())
        if self.max_bytes is not None and self._kept + in_flight + nbytes > self.max_bytes:
            return False
        return in_flight + nbytes <= self._disk_room()

    def reserve(self, model_id: str, nbytes: int, timeout_s: float | None = None) -> bool:
        """Reserve ``nbytes`` for ``model_id``'s download; see the class docstring. True once
        reserved."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self.too_large_reason(nbytes) is not None:
                    return False
                if self._fits_now(nbytes):
                    self._reserved[model_id] = self._reserved.get(model_id, 0) + int(nbytes)
                    return True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                # disk space may change too
                self._cond.wait(timeout=5.0 if left is None else min(left, 5.0))

    def release(self, model_id: str, revision_sha: str | None = None) -> int:
        """Free ``model_id``'s reservation; unless ``keep``, delete the revision it downloaded
        (all of its revisions added by the sweep when the sha is unknown). Returns the bytes
        deleted."""
        freed = 0
        with self._cond:
            self._reserved.pop(model_id, None)
            if not self.keep:
                info = self._scan()
                repos = frozenset(
                    r for r in info.repos if r.repo_id == model_id and r.repo_type == "model"
                )
                mine = [
                    rev.commit_hash
                    for r in repos
                    for rev in r.revisions
                    if (model_id, rev.commit_hash) not in self.preexisting
                    and (revision_sha is None or rev.commit_hash == revision_sha)
                ]
                if mine:  # a view holding only this repo: equal shas in other repos stay untouched
                    strategy = dataclasses.replace(info, repos=repos).delete_revisions(*mine)
                    freed = strategy.expected_freed_size
                    strategy.execute()
            # what stays on disk from settled models
            self._kept = self._added(exclude=self._reserved)
            self._cond.notify_all()
        return freed
