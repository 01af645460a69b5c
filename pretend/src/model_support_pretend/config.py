"""What the pretend accelerator is told to be: ``MODEL_SUPPORT_PRETEND`` (JSON), read once per process.

Every key is optional; ``{}`` is a healthy accelerator with one device and no memory limit. A bad
value is refused with one sentence naming the key and what it accepts (``PretendConfigError``),
before anything runs on the device. Standard library only: the entry point reads this module on
every ``import torch`` that autoloads backends, so it stays cheap.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

NAME = "pretend"
#: The JSON that switches the backend on and sets its faults.
CONFIG_VAR = "MODEL_SUPPORT_PRETEND"
#: Which of the ``devices`` this process sees (``"1,3"``), as CUDA_VISIBLE_DEVICES / TPU_VISIBLE_CHIPS do.
VISIBLE_VAR = "PRETEND_VISIBLE_DEVICES"
KEYS = (
    "devices",
    "memory_gb",
    "missing_ops",
    "unsupported_dtypes",
    "wrong_ops",
    "crash_ops",
    "slow_ops",
    "fallback_ops",
    "bandwidth_gbs",
    "flaky_ops",
    "flaky_file",
)
#: Seconds a ``fallback_ops`` operator costs per call beyond its work: a real CPU fallback copies its inputs to
#: the host and its results back.
FALLBACK_S = 0.002


class PretendConfigError(ValueError):
    """``MODEL_SUPPORT_PRETEND`` or ``PRETEND_VISIBLE_DEVICES`` says something the backend cannot be."""


@dataclass(frozen=True)
class Config:
    devices: int = 1
    memory_gb: float | None = None  # per device; None: no limit
    missing_ops: frozenset = field(default_factory=frozenset)
    unsupported_dtypes: frozenset = field(default_factory=frozenset)
    wrong_ops: frozenset = field(default_factory=frozenset)
    wrong_by: dict = field(default_factory=dict)  # of wrong_ops, those given a relative error: noise, not a bug
    crash_ops: frozenset = field(default_factory=frozenset)
    slow_ops: dict = field(default_factory=dict)
    fallback_ops: frozenset = field(default_factory=frozenset)  # run on the CPU underneath, slowly: a CPU fallback
    visible: tuple = (0,)  # the physical devices this process sees, in index order
    bandwidth_gbs: float | None = None  # the peak memory bandwidth it declares (GB/s); None: it declares none
    # {operator: N}: missing in the 1st, (N+1)th, ... process that calls one of them, counted in ``flaky_file``
    flaky_ops: dict = field(default_factory=dict)
    flaky_file: str | None = None

    @property
    def memory_bytes(self) -> int | None:
        return None if self.memory_gb is None else int(self.memory_gb * 1e9)


def _names(raw: dict, key: str) -> frozenset:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise PretendConfigError(f"{CONFIG_VAR}: {key!r} must be a list of names, not {value!r}.")
    return frozenset(value)


def _wrong(raw: dict) -> tuple[frozenset, dict]:
    """``wrong_ops``: a list of names (each output reversed and negated: a kernel with a bug), or a mapping of
    names to a relative error ({"aten::mm": 0.02}: each value off by that much, with a random sign: a kernel
    that is only imprecise; 0.0039, half of bf16's epsilon, is bf16-sized noise)."""
    value = raw.get("wrong_ops", [])
    if not isinstance(value, dict):
        return _names(raw, "wrong_ops"), {}
    if not all(
        isinstance(k, str) and k and isinstance(v, int | float) and not isinstance(v, bool) and v > 0
        for k, v in value.items()
    ):
        raise PretendConfigError(
            f"{CONFIG_VAR}: 'wrong_ops' must be a list of names or map names to a relative error > 0, not {value!r}."
        )
    return frozenset(value), {k: float(v) for k, v in value.items()}


def parse(text: str, visible: str | None = None) -> Config:
    """The configuration in ``text`` (JSON), seen through ``visible`` (the visibility variable's value)."""
    try:
        raw = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        raise PretendConfigError(f"{CONFIG_VAR} is not JSON ({exc.msg} at character {exc.pos}): {text!r}.") from None
    if not isinstance(raw, dict):
        raise PretendConfigError(f'{CONFIG_VAR} must be a JSON object such as {{"devices": 2}}, not {text!r}.')
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise PretendConfigError(f"{CONFIG_VAR}: unknown key(s) {', '.join(unknown)}; accepted: {', '.join(KEYS)}.")
    devices = raw.get("devices", 1)
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        raise PretendConfigError(f"{CONFIG_VAR}: 'devices' must be a whole number >= 1, not {devices!r}.")
    memory = raw.get("memory_gb")
    if memory is not None and (not isinstance(memory, int | float) or isinstance(memory, bool) or memory <= 0):
        raise PretendConfigError(f"{CONFIG_VAR}: 'memory_gb' must be a number of GB above 0, not {memory!r}.")
    slow = raw.get("slow_ops", {})
    if not isinstance(slow, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
        for k, v in slow.items()
    ):
        raise PretendConfigError(f"{CONFIG_VAR}: 'slow_ops' must map operator names to seconds >= 0, not {slow!r}.")
    bandwidth = raw.get("bandwidth_gbs")
    if bandwidth is not None and (
        not isinstance(bandwidth, int | float) or isinstance(bandwidth, bool) or bandwidth <= 0
    ):
        raise PretendConfigError(f"{CONFIG_VAR}: 'bandwidth_gbs' must be a number of GB/s above 0, not {bandwidth!r}.")
    wrong_ops, wrong_by = _wrong(raw)
    flaky, flaky_file = raw.get("flaky_ops", {}), raw.get("flaky_file")
    if not isinstance(flaky, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 2 for k, v in flaky.items()
    ):
        raise PretendConfigError(
            f"{CONFIG_VAR}: 'flaky_ops' must map operator names to a period N >= 2, not {flaky!r}."
        )
    if flaky and (not isinstance(flaky_file, str) or not flaky_file):
        raise PretendConfigError(
            f"{CONFIG_VAR}: 'flaky_ops' needs 'flaky_file', the path of the file that counts the processes calling them."
        )
    return Config(
        devices=devices,
        memory_gb=None if memory is None else float(memory),
        missing_ops=_names(raw, "missing_ops"),
        unsupported_dtypes=_names(raw, "unsupported_dtypes"),
        wrong_ops=wrong_ops,
        wrong_by=wrong_by,
        crash_ops=_names(raw, "crash_ops"),
        slow_ops={k: float(v) for k, v in slow.items()},
        fallback_ops=_names(raw, "fallback_ops"),
        visible=_visible(visible, devices),
        bandwidth_gbs=None if bandwidth is None else float(bandwidth),
        flaky_ops=dict(flaky),
        flaky_file=flaky_file,
    )


def _visible(value: str | None, devices: int) -> tuple:
    if value is None or not value.strip():
        return tuple(range(devices))
    try:
        ids = tuple(int(part) for part in value.split(","))
    except ValueError:
        ids = ()
    if not ids or len(set(ids)) != len(ids) or not all(0 <= i < devices for i in ids):
        raise PretendConfigError(
            f"{VISIBLE_VAR}={value!r} must list distinct device ids below {devices} (the devices in {CONFIG_VAR})."
        )
    return ids


def from_environment(environ=None) -> Config | None:
    """This process's configuration, or None when ``MODEL_SUPPORT_PRETEND`` is not set (the backend is off)."""
    environ = os.environ if environ is None else environ
    text = environ.get(CONFIG_VAR)
    if text is None:
        return None
    return parse(text, environ.get(VISIBLE_VAR))
