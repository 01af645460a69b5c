"""The flight recorder: the last operators dispatched to the device, in a file that outlives the
process.

Why: a device runtime that aborts (SIGABRT, SIGSEGV) often says nothing, or says it late: an
asynchronous runtime reports a kernel's fault at a later call. The probe's record dies with the
process; the runner's stand-in record then knows only "the kernel died". The recorder keeps the last
``SLOTS`` operators the probe dispatched to its device (name, the dtype and shape of each tensor
argument, the stage) in a small file in the probe's work folder, so that the runner's record names
the operator the kernel died in (``crash_fields``).

Cheap by construction: the file has a fixed size and is mapped into memory (``mmap``, shared): an
operator is one ``struct.pack_into`` into a ring slot and one into the header's counter, no system
call, no JSON; the kernel's page cache keeps what was written when the process dies. It is a
``TorchDispatchMode`` of the census' kind, held under the census (so it sees the operators as the
census counts them, composites decomposed); like every dispatch mode it sees eager runs only: in
compile mode it reads "not measured".

An asynchronous runtime's late abort makes the last operator recorded a later one than the culprit.
So a silent abort of a stack whose adapter declares a ``blocking_env`` (``CUDA_LAUNCH_BLOCKING=1``;
TorchTPU's ``TORCH_TPU_LAUNCH_BLOCKING=1``, the name its binary reads; a test backend's own switch)
is rerun once, synchronously, in the probe's process (``rerun_silent_crash``, the model's stages
only, under the recorder: ``instruments.rerun``), and that rerun's last operator is the one named.

**Off in a probe's own run by default** (the probe's ``flight_recorder`` setting, ``auto``): a
dispatch mode costs every operator a Python call (about 20 us with its line; up to a sixth of a
small model's probe on a Python device, ``bench/bench_instruments.py``), and its answer is only
needed when a kernel dies. So the probe only arms the file (its meta: ``recording`` auto, no mode on
the stack), and a probe whose kernel died silently (last words naming no operator) is rerun once
under the recorder, synchronously where the stack has a switch, which is what names the operator:
the rerun above, for every silent abort. ``on`` records the probe's own run as well (a crash that
may not come back in a rerun: a nightly chasing a flaky abort); ``off``: neither, the row says so.

Standard library only at import: the sweep's runner reads the file (``read``, ``crash_fields``).
"""

from __future__ import annotations

import functools
import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ... import backend_env
from ...fileio import atomic_write_json

#: Where the probe writes its recorder's file: set by the sweep's runner per probe
#: (``sweep.worker.process``).
FLIGHT_VAR = "MODEL_SUPPORT_FLIGHT_FILE"
#: The file's name in the probe's work folder; the synchronous rerun's beside it.
FLIGHT_FILE, RERUN_FILE = "flight.bin", "flight-blocking.bin"
#: Operators kept, and the bytes of each slot (an operator's line is cut to fit).
SLOTS, SLOT_BYTES = 16, 512
_MAGIC = b"MSFLIGHT"
_HEADER = struct.Struct("<8sIIQ")  # magic, slots, slot bytes, operators recorded so far
_META_BYTES = 1024  # JSON: the device, its adapter's blocking_env, the mode
_SLOT = struct.Struct("<QH")  # the operator's number, its line's length; then the line (utf-8)
_SLOTS_AT = _HEADER.size + _META_BYTES
SIZE = _SLOTS_AT + SLOTS * SLOT_BYTES
#: The signals of a runtime's abort or fault: a silent one of these is rerun synchronously (a
#: SIGKILL is not).
ABORTS = (signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE)
#: The probe's ``flight_recorder`` setting: auto (armed: the file, no recording; a silent abort
#: rerun under it), on (the probe's own run recorded too), off.
AUTO, ON, OFF = "auto", "on", "off"


def FlightRecorder(
    path: str | Path, device_type: str, meta: dict | None = None, recording: bool = True
) -> Any:
    """The recorder over ``path`` for operators reaching ``device_type`` (a
    ``TorchDispatchMode``: hold it with ``with`` over the stages; ``enter(stage)`` names the
    stage). ``meta``: what the runner needs to know of the run (its adapter's ``blocking_env``,
    the ``recording`` setting). ``recording`` False: the file with its meta only (armed), no mode
    on torch's stack, nothing recorded."""
    return _recorder_class()(Path(path), device_type, meta or {}, recording)


def _line(name: str, stage: str | None, args, kwargs) -> bytes:
    """``aten::mm|bfloat16[5, 64], bfloat16[64, 64]|generate``: what one slot holds."""
    import torch

    tensors = []

    def walk(tree) -> None:
        if isinstance(tree, torch.Tensor):
            tensors.append(f"{str(tree.dtype).removeprefix('torch.')}{list(tree.shape)}")
        elif isinstance(tree, tuple | list):
            for item in tree:
                walk(item)
        elif isinstance(tree, dict):
            for item in tree.values():
                walk(item)

    walk(args)
    walk(kwargs)
    return f"{name}|{', '.join(tensors)}|{stage or ''}".encode()[: SLOT_BYTES - _SLOT.size]


@functools.cache
def _recorder_class():
    """The mode's class, made on first use: importing this module imports no torch (the runner
    reads files)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from .. import census
    from ..census import dispatch_key

    class _FlightRecorder(TorchDispatchMode):
        def __init__(self, path: Path, device_type: str, meta: dict, recording: bool = True):
            super().__init__()
            self.path, self.device_type, self.meta, self.recording = (
                path,
                device_type,
                meta,
                recording,
            )
            self.key = dispatch_key(device_type)
            self.stage: str | None = None
            self.count = 0
            self.map: mmap.mmap | None = None

        def __enter__(self):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.ftruncate(fd, SIZE)
                self.map = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fd)
            meta = json.dumps({**self.meta, "device": self.device_type}).encode()[:_META_BYTES]
            self.map[_HEADER.size : _HEADER.size + len(meta)] = meta
            _HEADER.pack_into(self.map, 0, _MAGIC, SLOTS, SLOT_BYTES, 0)
            return super().__enter__() if self.recording else self

        def __exit__(self, *exc):
            if self.recording:
                super().__exit__(*exc)
            if self.map is not None:
                self.map.close()
                self.map = None

        def enter(self, stage: str) -> None:
            self.stage = stage

        def _reaches_device(self, tree) -> bool:
            return census.names_device(tree, self.device_type)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if self.map is None or not (self._reaches_device(args) or self._reaches_device(kwargs)):
                return func(*args, **kwargs)
            # as the census: a composite reaches the device as its parts
            if census.composite_on(func, self.key):
                # its parts come back through the recorder
                out = census.decompose_through(self, func, args, kwargs)
                if out is not NotImplemented:
                    return out
            line = _line(func.name(), self.stage, args, kwargs)
            self.count += 1
            at = _SLOTS_AT + (self.count % SLOTS) * SLOT_BYTES
            _SLOT.pack_into(self.map, at, self.count, len(line))
            self.map[at + _SLOT.size : at + _SLOT.size + len(line)] = line
            # the header's counter, last: the slot is whole
            struct.pack_into("<Q", self.map, 16, self.count)
            return func(*args, **kwargs)

    return _FlightRecorder


def read(path: str | Path) -> dict | None:
    """What a recorder's file holds: {"meta": {...}, "recorded": N, "ops": [{"op", "args",
    "stage"}, ...]} with the last operator last; None when there is no such file (no recorder
    ran) or it is not one."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    if len(data) < SIZE or data[:8] != _MAGIC:
        return None
    _, slots, slot_bytes, recorded = _HEADER.unpack_from(data, 0)
    meta = json.loads(data[_HEADER.size : _SLOTS_AT].rstrip(b"\0") or b"{}")
    ops = []
    for number in range(max(1, recorded - slots + 1), recorded + 1):
        at = _SLOTS_AT + (number % slots) * slot_bytes
        stored, length = _SLOT.unpack_from(data, at)
        if stored != number:  # overwritten while the process died mid-slot: skipped
            continue
        name, args, stage = (
            data[at + _SLOT.size : at + _SLOT.size + length].decode(errors="replace").split("|", 2)
        )
        ops.append({"op": name, "args": args, "stage": stage})
    return {"meta": meta, "recorded": recorded, "ops": ops}


def recorder_for(settings: dict, adapter, mode_sees: bool, rerun: bool = False) -> Any:
    """The probe's recorder, when its runner asked for one (``FLIGHT_VAR``), the device is not
    the host and a dispatch mode sees the run (``mode_sees``: eager and fused); else None. It
    records with ``flight_recorder`` on and in a crash's ``rerun``; else it is armed only
    (``AUTO``: the runner reruns a silent abort; ``OFF``: not)."""
    path = os.environ.get(FLIGHT_VAR)
    if not path or adapter.type == "cpu" or not mode_sees:
        return None
    switch = ON if rerun else settings.get("flight_recorder", AUTO)
    meta = {"blocking_env": adapter.blocking_env, "mode": settings["mode"], "recording": switch}
    return FlightRecorder(path, adapter.type, meta, recording=switch == ON)


def silent(said: str | None) -> bool:
    """Whether a dead kernel's last words (``said``) name no operator: the runtime did not say
    where it died."""
    from ..census import operator_named

    return operator_named(said) is None


def rerun_silent_crash(
    work: Path, started: Path, kernel_exit: int | None, said: str | None, left_s: float
) -> None:
    """In the probe's process, once its kernel died: a silent abort (``ABORTS``, last words
    naming no operator) is rerun once (``instruments.rerun``: the model's stages only, under a
    recorder writing ``RERUN_FILE``) with the stack's ``blocking_env`` where it has one and the
    run was not synchronous already; with the recorder armed only (``AUTO``: nothing recorded of
    the probe's own run) also without one, since only the rerun can name the operator. Within
    ``left_s`` seconds (what is left of the model's timeout). Its outcome is in that file, and in
    ``RERUN_FILE.json`` (exit status, or the timeout, and the switch it ran with)."""
    recorded = read(work / FLIGHT_FILE)
    if recorded is None or not kernel_exit or -kernel_exit not in ABORTS or not silent(said):
        return
    switch = recorded["meta"].get("recording", ON)  # a file from before the setting was recorded
    blocking = recorded["meta"].get("blocking_env") or {}
    if all(os.environ.get(k) == v for k, v in blocking.items()):
        blocking = {}  # the run already was synchronous (or the stack has no switch)
    if switch == OFF or not started.exists() or (switch == ON and not blocking):
        # not asked, nothing to rerun from, or the recorder's own last operator is as good as a
        # rerun's
        return
    env = backend_env.child_environ({**blocking, FLIGHT_VAR: str(work / RERUN_FILE)})
    argv = [sys.executable, "-m", "model_support.probe.instruments.rerun", str(started)]
    began = time.perf_counter()
    outcome: dict[str, Any]
    try:
        done = subprocess.run(
            argv, env=env, capture_output=True, timeout=max(left_s, 10.0), check=False
        )
        outcome = {"exit": done.returncode, "seconds": time.perf_counter() - began}
    except subprocess.TimeoutExpired:
        outcome = {"exit": None, "seconds": time.perf_counter() - began, "timed_out": True}
    outcome["blocking_env"] = blocking
    atomic_write_json(work / f"{RERUN_FILE}.json", outcome)


def _args(op: dict) -> str:
    return op["args"] or "no tensor arguments"


#: Why a compiled run that died names no operator: never a guess.
NOT_IN_COMPILE = (
    "not measured: compile mode (no dispatch mode sees a compiled run's operators, and a "
    "profiler's data dies with the crashed process)"
)


def crash_fields(
    work: Path, died: bool, mode: str | None = None, kernel_exit: int | None = None
) -> dict:
    """The record's ``crash_operator`` fields for a probe in ``work`` whose kernel died
    (``died``; ``kernel_exit``: its exit status, minus the signal that ended it), from the
    recorder's file and its synchronous rerun's; {} when no recorder ran (a compiled run: why
    not, ``mode``)."""
    recorded = read(work / FLIGHT_FILE)
    if died and recorded is None and mode == "compile":
        return {"crash_operator_note": NOT_IN_COMPILE}
    if not died or recorded is None:
        return {}
    switch = recorded["meta"].get("recording", ON)
    if switch == OFF:
        return {"crash_operator_note": "not measured: flight_recorder=off"}
    if switch == AUTO:
        return _rerun_only(work, kernel_exit)
    if not recorded["ops"]:
        return {
            "crash_operator_note": "the flight recorder saw no operator on the device before the kernel died"
        }
    last = recorded["ops"][-1]
    rerun = read(work / RERUN_FILE)
    outcome = _read_json(work / f"{RERUN_FILE}.json")
    first = (
        f"the last operator dispatched to the device (flight recorder, {recorded['recorded']} "
        "recorded)"
    )
    if outcome is None:
        return {
            "crash_operator": last["op"],
            "crash_operator_args": _args(last),
            "crash_operator_note": first,
        }
    switch = " ".join(f"{k}={v}" for k, v in outcome["blocking_env"].items())
    if rerun and rerun["ops"] and outcome["exit"] is not None and outcome["exit"] < 0:
        culprit = rerun["ops"][-1]
        note = (
            f"the operator a synchronous rerun ({switch}) died in; the first run's last operator "
            f"was {last['op']}"
        )
        return {
            "crash_operator": culprit["op"],
            "crash_operator_args": _args(culprit),
            "crash_operator_note": note,
        }
    why = "timed out" if outcome.get("timed_out") else f"ended with exit status {outcome['exit']}"
    note = (
        f"{first}; a synchronous rerun ({switch}) {why} without dying, so an asynchronous report "
        "may name a later one"
    )
    return {
        "crash_operator": last["op"],
        "crash_operator_args": _args(last),
        "crash_operator_note": note,
    }


#: Why a dead kernel's row names no operator with the recorder armed only (``AUTO``), and no rerun
#: ran.
NOT_RERUN = (
    "not measured: the flight recorder is off in a probe's own run (flight_recorder auto: "
    "only a silent abort is rerun under it, and this one was not rerun: its runtime's last "
    "words, in the error, name its operator, or the probe left nothing to rerun from); "
    "flight_recorder on records the probe's own run"
)


def killed(kernel_exit: int | None) -> str | None:
    """The signal that ended a kernel, by name, where it is not a runtime's abort (``ABORTS``):
    SIGKILL (what the kernel's OOM killer sends), SIGTERM; None otherwise."""
    if kernel_exit is None or kernel_exit >= 0 or -kernel_exit in ABORTS:
        return None
    try:
        return signal.Signals(-kernel_exit).name
    except ValueError:
        return f"signal {-kernel_exit}"


def _rerun_only(work: Path, kernel_exit: int | None = None) -> dict:
    """``crash_fields`` with the probe's own run not recorded (``AUTO``): its rerun's last
    operator, or why none."""
    outcome = _read_json(work / f"{RERUN_FILE}.json")
    # a kill, not an abort: nothing a rerun would name
    if outcome is None and (name := killed(kernel_exit)):
        oom = (
            " (what the kernel's OOM killer sends when memory runs out)"
            if name == "SIGKILL"
            else ""
        )
        return {
            "crash_operator_note": (
                f"not measured: the kernel was killed by {name}{oom}, not aborted by its "
                "runtime, so it was not rerun under the flight recorder (flight_recorder auto "
                "reruns a silent abort only); flight_recorder on records the probe's own run"
            )
        }
    if outcome is None:
        return {"crash_operator_note": NOT_RERUN}
    blocking = outcome.get("blocking_env") or {}
    how = (
        f"a synchronous rerun ({' '.join(f'{k}={v}' for k, v in blocking.items())})"
        if blocking
        else "a rerun"
    )
    rerun = read(work / RERUN_FILE)
    if rerun and rerun["ops"] and outcome["exit"] is not None and outcome["exit"] < 0:
        culprit = rerun["ops"][-1]
        note = (
            f"the operator {how} died in, under the flight recorder (off in the probe's own run: "
            "flight_recorder auto)"
        )
        if not blocking:
            note += (
                "; the stack has no synchronous switch, so an asynchronous report may name a "
                "later one"
            )
        return {
            "crash_operator": culprit["op"],
            "crash_operator_args": _args(culprit),
            "crash_operator_note": note,
        }
    why = "timed out" if outcome.get("timed_out") else f"ended with exit status {outcome['exit']}"
    note = (
        "not measured: the flight recorder is off in a probe's own run (flight_recorder "
        f"auto), and {how} under it {why} without dying (a crash that did not come back; "
        "flight_recorder on records the probe's own run)"
    )
    return {"crash_operator_note": note}


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
