"""The two forms of ``model-support bisect``: sweep A against sweep B (every row whose verdict
differs, or the models named), and one record over a range you suspect. Answers are stored in B's
``bisect.json``."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from packaging.utils import canonicalize_name

from ..analysis import perf
from ..errors import UserError
from ..record import store
from . import results, stacks
from .envs import Overlays
from .releases import Source
from .search import AS_A, SLOWER, Bisector, Job
from .stacks import NOT_SWAPPED, Change

#: Where overlay environments are cached unless ``--cache-dir`` says otherwise.
CACHE_VAR = "MODEL_SUPPORT_BISECT_CACHE"


def cache_dir(data_dir: Path | str, given: Path | str | None = None) -> Path:
    """``given``, else $MODEL_SUPPORT_BISECT_CACHE, else ``<data dir>/bisect-envs``; absolute
    (resolved from the folder the command was typed in), as every path the environments hold must
    be."""
    return Path(given or os.environ.get(CACHE_VAR) or Path(data_dir) / "bisect-envs").resolve()


def _workers(jobs: int | None, n: int) -> int:
    return max(1, min(n, jobs or min(4, os.cpu_count() or 1)))


def _bisector(data_dir, cache, find_links, pre, yanked, log=None) -> Bisector:
    """The bisector over this source (the wheelhouse, else pip's configured index); says on
    ``log`` what builds the environments and where the releases come from."""
    if find_links is not None and not Path(find_links).is_dir():
        raise UserError(f"--find-links {find_links} is not a folder of wheels.")
    overlays = Overlays(
        cache_dir(data_dir, cache), Source.wheelhouse(find_links) if find_links else None
    )
    if log:
        log(
            f"overlay environments in {overlays.cache}, built with {overlays.tool}; releases "
            f"from {overlays.source}"
        )
    return Bisector(overlays, pre=pre, yanked=yanked)


def _store_each(
    data_dir: Path | str, sweep_id: str, baseline: str | None
) -> Callable[[dict], None]:
    """Stores an answer in the sweep's bisect.json as its row finishes (not all at the end: a
    later row's trouble loses nothing answered)."""

    def store(answer: dict) -> None:
        results.store_answers(data_dir, sweep_id, baseline, [answer])

    return store


def bisect_sweeps(
    data_dir: Path | str,
    a: str,
    b: str,
    *,
    models: tuple | list = (),
    find_links: Path | None = None,
    cache: Path | None = None,
    pre: bool = False,
    yanked: bool = False,
    jobs: int | None = None,
    log: Callable[[str], None] | None = None,
    metric: str | None = None,
    threshold: float = perf.DEFAULT_THRESHOLD,
) -> list[dict]:
    """One answer per row of sweep ``b`` whose verdict differs from sweep ``a``'s (or per row of
    the ``models`` named), stored in b's bisect.json. With ``metric`` (``perf.METRICS``' tpot_s,
    ttft_s, perf_tokens_per_s): per row whose metric got slower beyond ``threshold`` and noise
    (the perf gate's rule), each step timed by the repro script, ``metric_repeats`` times."""
    stacks.require_sweeps(data_dir, a, b)
    meta_b = store.read_sweep(Path(data_dir), b)
    stack_a = stacks.sweep_stack(store.read_sweep(Path(data_dir), a))
    stack_b = stacks.sweep_stack(meta_b)
    candidates = [c for c in stacks.stack_changes(stack_a, stack_b) if c.name not in NOT_SWAPPED]
    keys = None
    if metric and not models:
        keys = [
            (r["model_id"], r["variant"]) for r in perf.slower(data_dir, a, b, metric, threshold)
        ]
    rows = stacks.rows_to_bisect(data_dir, a, b, models, keys)
    for row in rows if metric else ():
        row.verdict_a, row.verdict_b = AS_A, SLOWER  # the labels each step gets against end A
    repeats = metric_repeats(meta_b.probe)
    bisector = _bisector(data_dir, cache, find_links, pre, yanked, log if rows else None)
    settings_a = stacks.sweep_settings(store.read_sweep(Path(data_dir), a))
    settings_b = stacks.sweep_settings(store.read_sweep(Path(data_dir), b))
    jobs_ = [
        Job(row, stack_a, stack_b, candidates, settings_a=settings_a, settings_b=settings_b)
        for row in rows
    ]
    for job in jobs_ if metric else ():
        job.metric, job.threshold, job.repeats = metric, threshold, repeats
    return bisector.bisect_all(jobs_, _workers(jobs, len(jobs_)), log, _store_each(data_dir, b, a))


def metric_repeats(probe: dict) -> int:
    """The repeats each step of ``--metric`` times: the sweep's ``perf_repeats`` (the perf
    phase's cap), at least 3 (two repeats' ranges are apart too easily for "apart" to mean beyond
    noise) and at most 5 (each step is a whole install and probe; the perf phase stops at 3 once
    its spread is in reach, ``probe.performance.Plan``)."""
    return min(max(3, int(probe.get("perf_repeats") or 3)), 5)


def bisect_record(
    data_dir: Path | str,
    sweep_id: str,
    model: str,
    *,
    package: str,
    from_version: str,
    to_version: str | None = None,
    find_links: Path | None = None,
    cache: Path | None = None,
    pre: bool = False,
    yanked: bool = False,
    log: Callable[[str], None] | None = None,
) -> list[dict]:
    """The single-record form: ``model``'s rows of ``sweep_id`` over ``package``'s releases from
    ``from_version`` to ``to_version`` (default: the sweep's version of it), stored in its
    bisect.json."""
    stacks.require_sweeps(data_dir, sweep_id)
    name = canonicalize_name(package)
    stack = stacks.sweep_stack(store.read_sweep(Path(data_dir), sweep_id))
    to_version = to_version or stack.get(name)
    if to_version is None:
        raise UserError(f"Sweep {sweep_id}'s stack has no {package}: give --to VERSION.")
    rows = stacks.rows_to_bisect(data_dir, None, sweep_id, [model])
    stack_b = {**stack, name: to_version}
    stack_a = {**stack, name: from_version}
    jobs = []
    for row in rows:
        row.verdict_a = None  # what --from gives, found by its run
        if to_version != stack.get(name):
            row.verdict_b = None  # the record ran on another version: no record to compare with
        jobs.append(Job(row, stack_a, stack_b, [Change(name, from_version, to_version)]))
    bisector = _bisector(data_dir, cache, find_links, pre, yanked, log)
    return bisector.bisect_all(jobs, 1, log, _store_each(data_dir, sweep_id, None))


def clean(data_dir: Path | str, cache: Path | None = None) -> Path:
    """Remove the cached overlay environments; the folder removed."""
    folder = cache_dir(data_dir, cache)
    Overlays(folder).clean()
    return folder
