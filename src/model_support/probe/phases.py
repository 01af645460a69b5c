"""A probe's two phases: the device's work, then the host checks, so a device is held for its work
only.

Why: the checks said of a verdict (the CPU reference, the fluency judge, attribution reruns) run on
the CPU and need only what the device phase leaves (its tokens, its step logits, the record so far).
On a TPU host a chip is released only when the process that opened it ends, so a probe whose checks
run in its own process holds its chip idle through all of them. With ``checks="after"`` (what the
sweep runner asks for on accelerators) the probe process stops after its device phase: it writes the
record so far, marked pending, and the checks' inputs (``STATE_FILE``, next to ``record_path``), and
ends, which releases the device; a host process then runs ``finish_checks`` from that state
(``sweep.worker.host_checks``) and writes the final record. With ``checks="here"`` (a single
papermill run, CPU sweeps) both phases run in one process, as one story.

A check that raises is a note on the record (``reference_note``, ``fluency_note``), never a verdict
change: the verdict is the device phase's and is final when it ends. ``device_work`` times the
device phase (``DEVICE_FILE``, in a sweep worker's folder) for the sweep's held-idle and utilisation
figures: the device's own work only. Inside it, the stages' hook (``stages``) takes out the
stretches where the host works and the device waits (the config, the tokenizer and the weights built
in host memory, the chat template): counted as the device's, they made held-idle read better than it
was.
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..fileio import atomic_write_json
from ..record.schema import Record
from . import checks as host

#: In a sweep worker's folder: the device phase's timings, and (checks "after", next to
#: ``record_path``) the host checks' inputs. The worker names the first in ``DEVICE_ENV``: a probe
#: run by hand leaves no side file.
DEVICE_FILE, STATE_FILE = "device_phase.json", "checks.json"
DEVICE_ENV = "MODEL_SUPPORT_DEVICE_PHASE_FILE"
#: What a record whose checks are still to run says in their place.
PENDING = "pending: the host checks run after the device is released"

#: The clock the device phase is timed on: wall-clock seconds (``time.time``), comparable across the
#: sweep's processes (its schedule rows). Read at each call, so a test sets a fake one
#: (``monkeypatch.setattr(phases, "now", clock)``) and asserts exact seconds, not a sleep's give or
#: take.
now: Callable[[], float] = time.time
# this process's device work, (start, end) on ``now``'s clock
_spans: list[tuple[float, float]] = []
# of it, the seconds of the named parts (``part``: the perf phase, the recompile check)
_parts: dict[str, float] = {}
_pending: dict[str, dict] = {}  # checks stashed by the device phase in this process, by record key
#: The stages of ``probe_core.run_stages`` where the host works and the device waits: "load" (the
#: config, the tokenizer, the weights built in host memory; until they start to move, ``to_device``)
#: and "template" (the chat template). The others ("generate", "compile") are the device's.
HOST_STAGES = frozenset({"load", "template"})


class _Clock:
    """The device stretch open now: inside a ``device_work`` block (``inside``), since ``since``
    (None while the host works); ``staged``: the block's stages said where the device works (the
    block as a whole is not)."""

    inside = False
    staged = False
    since: float | None = None


def key(record: Record) -> str:
    return f"{record['sweep_id']}|{record['model_id']}|{record['variant']}"


def start() -> None:
    """A probe starts in this process: its device time counts from zero (a rerun in the same
    kernel)."""
    _spans.clear()
    _parts.clear()


def _close() -> None:
    if _Clock.since is not None:
        _spans.append((_Clock.since, now()))
        _Clock.since = None


def _open() -> None:
    if _Clock.inside and _Clock.since is None:
        _Clock.since = now()


@contextmanager
def device_work() -> Iterator[None]:
    """Time a stretch of the device phase: weights to the device, compilation, generation, the
    device's own counters (a sharded run's ranks, on their devices). Counted whole unless the
    stages inside say where the host works (``stages``)."""
    _Clock.inside, _Clock.staged = True, False
    _open()
    try:
        yield
    finally:
        _close()
        _Clock.inside = False


def stages(then: Callable[[str], None] | None = None) -> Callable[[str], None]:
    """An ``on_stage`` hook for ``probe_core.run_stages`` inside ``device_work``: a host stage
    (``HOST_STAGES``) pauses the device phase's clock, a device stage restarts it;
    ``then(stage)`` is called too (the census)."""

    def on_stage(name: str) -> None:
        # from the first stage on, the stages say where the device works
        if _Clock.inside and not _Clock.staged:
            _Clock.staged, _Clock.since = True, None
        if name in HOST_STAGES:
            _close()
        else:
            _open()
        if then is not None:
            then(name)

    return on_stage


@contextmanager
def part(name: str) -> Iterator[None]:
    """A named part of a ``device_work`` block (``"perf"``, ``"recompiles"``): its seconds are
    the device's work like the rest of the block, and said apart (``device_phase``'s ``parts``),
    so the sweep's device time shows what the perf phase and the recompile check cost the device.
    Outside a block it counts nothing."""
    began = now()
    try:
        yield
    finally:
        if _Clock.inside:
            _parts[name] = _parts.get(name, 0.0) + now() - began


def to_device() -> None:
    """Inside the load stage, the weights built in host memory start to move to the device: its
    work from here (``run_stages``' ``on_device`` hook, where the stages announce it)."""
    _open()


def device_phase() -> dict:
    """The device phase so far: its seconds, when it started and ended (wall clock), and the
    seconds of its named parts (``part``)."""
    if not _spans:
        return {"device_s": 0.0, "start": None, "end": None, "parts": {}}
    return {
        "device_s": sum(end - begin for begin, end in _spans),
        "start": _spans[0][0],
        "end": _spans[-1][1],
        "parts": dict(_parts),
    }


def checks(
    record: Record,
    settings: dict,
    kind: str,
    device_steps: list | None = None,
    prompt_ids: list | None = None,
    long_text: dict | None = None,
) -> None:
    """The host checks of ``record``: ``kind`` "pass" (the reference, the long text's comparison,
    the judge of a PASS) or "attribute" (whose failure a FAIL is). Run now (``checks="here"``),
    or stashed for after the device phase. ``long_text``: what the long text's device half kept
    (``checks.long_text_on_device``), JSON like the rest."""
    state = {
        "kind": kind,
        "settings": settings,
        "device_steps": device_steps,
        "prompt_ids": prompt_ids,
        "long_text": long_text,
    }
    if settings.get("checks") != "after":
        if settings.get("reference") != "none" or settings.get("judge"):
            # the device's model (its cycles too) is freed before a check loads its own (0.38 s a
            # walk)
            gc.collect()
        run_checks(record, state)
        return
    _pending[key(record)] = state
    record["reference_note"] = record["reference_note"] or PENDING
    if kind == "pass":
        record["numerics_note"] = record["fluency_note"] = PENDING
        if long_text is not None:
            record["long_text_note"] = PENDING


def run_checks(record: Record, state: dict) -> Record:
    """Run the stashed checks on ``record``; a check that raises becomes a note, never a verdict
    change."""
    settings, verdict = state["settings"], (record["status"], record["failure_stage"])
    for note in ("reference_note", "numerics_note", "fluency_note", "long_text_note"):
        if record[note] == PENDING:
            record[note] = None
    try:
        if state["kind"] == "pass":
            host.check_pass(
                record, settings, state["device_steps"], state["prompt_ids"], state.get("long_text")
            )
        else:
            host.attribute(record, settings)
    except Exception as exc:  # noqa: BLE001 a check's failure is said on the record, never its verdict
        said = f"the host checks raised {type(exc).__name__}: {exc}"[:2000]
        record["reference_note"] = record["reference_note"] or said
        if state["kind"] == "pass":
            record["numerics_note"] = record["numerics_note"] or f"no reference: {said}"
            record["fluency_note"] = record["fluency_note"] or said
    record["status"], record["failure_stage"] = verdict
    return record


def unfinished(record: Record, why: str) -> Record:
    """The checks could not run (their host process died or timed out): said in their place; the
    verdict stays."""
    for note in ("reference_note", "numerics_note", "fluency_note", "long_text_note"):
        if record[note] == PENDING:
            record[note] = f"host checks not finished: {why}"[:2000]
    return record


def save(record: Record, record_path: str) -> bool:
    """After the device phase: write its timings, and (checks "after") the checks' inputs with
    the record so far, next to ``record_path``. True when checks wait there for a host process."""
    # plain writes, no fsync: read by the sweep's worker once this process has ended (and its
    # devices with it); a kill before then leaves the model to run again, whole
    if os.environ.get(DEVICE_ENV):
        Path(os.environ[DEVICE_ENV]).write_text(json.dumps(device_phase()))
    if not record_path:
        return False
    folder = Path(record_path).parent
    state = _pending.get(key(record))
    if state is None:
        return False
    # where the final record goes when the checks run in this process
    state["record_path"] = record_path
    (folder / STATE_FILE).write_text(
        json.dumps({**state, "record": record, "device_phase": device_phase()}, default=str)
    )
    return True


def resume(state_path: str, record_path: str = "") -> Record:
    """In a host process: the record a device phase left (``STATE_FILE``), its checks stashed
    here for ``finish_checks``; the final record goes to ``record_path``."""
    from transformers.utils import logging as hf_logging

    # as the probe does: per-shard progress bars only clutter notebooks
    hf_logging.disable_progress_bar()
    state = json.loads(Path(state_path).read_text())
    record = state.pop("record")
    _pending[key(record)] = {**state, "record_path": record_path}
    return record


def finish_checks(record: Record) -> Record:
    """The notebook's host-checks cell: run the checks the device phase left for ``record`` (in
    this process, or a host process after ``resume``), write the final record where its state
    says, return it. A record with nothing pending comes back as it is (its checks ran with its
    device phase)."""
    state = _pending.pop(key(record), None)
    if state is None:
        return record
    from ..record.schema import check_record
    from ..redact import redact_record
    from .model_ids import machine_paths

    began = time.perf_counter()
    run_checks(record, state)
    # both phases
    record["duration_s"] = (record["duration_s"] or 0.0) + time.perf_counter() - began
    check_record(redact_record(record, machine_paths(state["settings"]["model_id"])))
    target = state.get("record_path", "")
    if target:
        atomic_write_json(Path(target), record)
    return record
