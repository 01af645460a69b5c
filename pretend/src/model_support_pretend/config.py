"""What the pretend accelerator is told to be: ``MODEL_SUPPORT_PRETEND`` (JSON), read once per
process.

Every key is optional; ``{}`` is a healthy accelerator with one device and no memory limit. A bad
value is refused with one sentence naming the key and what it accepts (``PretendConfigError``),
before anything runs on the device. Standard library only: the entry point reads this module on
every ``import torch`` that autoloads backends, so it stays cheap.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace

NAME = "pretend"
#: The JSON that switches the backend on and sets its faults.
CONFIG_VAR = "MODEL_SUPPORT_PRETEND"
#: Which of the ``devices`` this process sees (``"1,3"``), as CUDA_VISIBLE_DEVICES /
#: TPU_VISIBLE_CHIPS do.
VISIBLE_VAR = "PRETEND_VISIBLE_DEVICES"
KEYS: tuple[str, ...] = (
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
    "crash_message",
    "crash_after",
    "wrong_past_length",
    "launch_us",
    "clock_jitter",
    "clock",
    "sdpa_kernel",
    "matmul_noise",
)
#: The TPU contract, clause by clause (``tpu_contract``): what TorchTPU 0.2.0 does that a stack may
#: do, played on request so the TPU's paths run without a chip. ``no_fallback``: no CPU fallback
#: unless switched on (``fallback_ops`` raise "'<op>' is not implemented for pretend" while
#: ``torch.pretend.enable_cpu_fallback`` is False, as TorchTPU's ``enable_cpu_fallback`` is by
#: default); ``compile_static``: the device compiles with its own torch.compile backend
#: (``pretend``: aot_eager underneath), which torch.compile gives ``dynamic=False`` unless told
#: otherwise and which refuses dynamic=True, as TorchTPU patches torch.compile for ``tpu``.
TPU_CONTRACT_KEYS = ("no_fallback", "compile_static")
KEYS = (*KEYS, *TPU_CONTRACT_KEYS)
#: The TPU contract's distributed clauses (``launch``): ``launch_env``: a rank of a distributed
#: launch (``WORLD_SIZE`` set) refuses to start without the launch environment its parent sets
#: (``launch.LAUNCH_VARS``), as TorchTPU's runtime refuses one without
#: TORCH_TPU_SLICEBUILDER_ADDRESSES and TORCH_TPU_TOPOLOGY; ``one_device``: such a rank opens one
#: device, the single id ``PRETEND_VISIBLE_DEVICES`` names, else device LOCAL_RANK (TorchTPU:
#: TPU_VISIBLE_DEVICES, else LOCAL_RANK); ``opened_log``: a file where each process that registers
#: the device says what it opened (JSON lines).
DISTRIBUTED_CONTRACT_KEYS = ("launch_env", "one_device", "opened_log")
KEYS = (*KEYS, *DISTRIBUTED_CONTRACT_KEYS)
#: Set to 1, the runtime reports a crash at the operator that caused it (``crash_after`` ignored),
#: as ``CUDA_LAUNCH_BLOCKING=1`` makes CUDA's: the synchronous rerun's switch (the adapter's
#: ``blocking_env``). Not part of the stack's configuration: the same faults, reported sooner.
BLOCKING_VAR = "PRETEND_LAUNCH_BLOCKING"
#: Seconds a ``fallback_ops`` operator costs per call beyond its work: a real CPU fallback copies
#: its inputs to the host and its results back.
FALLBACK_S = 0.002
#: The operators ``wrong_past_length`` can break, each past a length along the sequence axis it
#: works over (a KV-cache or long-context bug), by what that axis is (``tensor.sequence_length``
#: reads it): the softmaxes over their ``dim`` (in attention, the key positions: the cache's
#: length), ``aten::bmm`` over its contraction (mat1's last dimension: the key positions of
#: attention's probabilities times values; in queries times keys it is the head size, so N must
#: exceed that). The attention of transformers' sdpa reaches a backend as these.
PAST_LENGTH_AXES = {
    "aten::_safe_softmax": "the dimension it normalises (dim): in attention, the key positions",
    "aten::_softmax": "the dimension it normalises (dim): in attention, the key positions",
    "aten::bmm": "the contraction (mat1's last dimension): in attention's probabilities x values, the key "
    "positions",
}

#: The matrix products ``matmul_noise`` makes noisy: what a linear layer (aten::linear: aten::mm,
#: aten::addmm) and attention's products (aten::bmm, aten::baddbmm) reach a backend as.
MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})
#: bf16's unit roundoff (2^-8): the largest relative error of rounding to bfloat16, half its
#: epsilon.
BF16_ROUNDOFF = 2.0**-8

#: What the device runs scaled_dot_product_attention as (``sdpa_kernel``, see ``attention``): the
#: math attention (the default), CUDA's flash attention kernel, or a kernel of this device's own;
#: neither of the last two has a CPU kernel.
SDPA_KERNELS = ("math", "flash", "own")


class PretendConfigError(ValueError):
    """``MODEL_SUPPORT_PRETEND`` or ``PRETEND_VISIBLE_DEVICES`` says something the backend cannot
    be."""


@dataclass(frozen=True)
class Config:
    devices: int = 1
    memory_gb: float | None = None  # per device; None: no limit
    missing_ops: frozenset = field(default_factory=frozenset)
    unsupported_dtypes: frozenset = field(default_factory=frozenset)
    wrong_ops: frozenset = field(default_factory=frozenset)
    # of wrong_ops, those given a relative error: noise, not a bug
    wrong_by: dict = field(default_factory=dict)
    crash_ops: frozenset = field(default_factory=frozenset)
    slow_ops: dict = field(default_factory=dict)
    # run on the CPU underneath, slowly: a CPU fallback
    fallback_ops: frozenset = field(default_factory=frozenset)
    visible: tuple = (0,)  # the physical devices this process sees, in index order
    # the peak memory bandwidth it declares (GB/s); None: it declares none
    bandwidth_gbs: float | None = None
    # {operator: N}: missing in the 1st, (N+1)th, ... process that calls one of them, counted in
    # ``flaky_file``
    flaky_ops: dict = field(default_factory=dict)
    flaky_file: str | None = None
    # False: a crash aborts with no word on stderr, as many runtimes' aborts do
    crash_message: bool = True
    # a crash reported this many operators later, as an asynchronous runtime reports it
    crash_after: int = 0
    blocking: bool = False  # BLOCKING_VAR set: every crash reported at its own operator
    # {operator: N}: its results wrong once its sequence axis (``PAST_LENGTH_AXES``) reaches N
    # positions
    wrong_past_length: dict = field(default_factory=dict)
    # its clock (``clock.DeviceClock``): each kernel's launch latency, and the relative spread of
    # its timings
    launch_us: float = 5.0
    clock_jitter: float = 0.01
    # "device": ``torch.pretend.perf_clock`` offers the timeline above; "host": it offers none, so
    # the device is timed on the host's wall clock after a sync, as CUDA's and the TPU's are (and
    # its stalls, slept, are what it reads)
    clock: str = "device"
    sdpa_kernel: str = SDPA_KERNELS[0]  # what attention runs as on the device (``attention``)
    # every matrix product's values off by a relative error drawn uniformly from +-matmul_noise
    # (``MATMUL_OPS``): a healthy stack that rounds its products differently, BF16_ROUNDOFF the size
    # of bf16's own rounding; no fault
    matmul_noise: float | None = None
    # the TPU contract's clauses (``TPU_CONTRACT_KEYS``, ``tpu_contract``)
    no_fallback: bool = False  # fallback_ops raise unless torch.pretend.enable_cpu_fallback is True
    # its own compile backend, dynamic=False by default, as torch_tpu's
    compile_static: bool = False
    # the TPU contract's distributed clauses (``DISTRIBUTED_CONTRACT_KEYS``, ``launch``)
    launch_env: bool = False  # a rank refuses to start without its launch environment
    one_device: bool = False  # a rank opens one device: its single visible id, else LOCAL_RANK
    opened_log: str | None = None  # where each process says what it opened

    @property
    def memory_bytes(self) -> int | None:
        return None if self.memory_gb is None else int(self.memory_gb * 1e9)


def _names(raw: dict, key: str) -> frozenset:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise PretendConfigError(f"{CONFIG_VAR}: {key!r} must be a list of names, not {value!r}.")
    return frozenset(value)


def _wrong(raw: dict) -> tuple[frozenset, dict]:
    """``wrong_ops``: a list of names (each output reversed and negated: a kernel with a bug), or
    a mapping of names to a relative error ({"aten::mm": 0.02}: each value off by that much, with
    a random sign: a kernel that is only imprecise; 0.0039, half of bf16's epsilon, is bf16-sized
    noise)."""
    value = raw.get("wrong_ops", [])
    if not isinstance(value, dict):
        return _names(raw, "wrong_ops"), {}
    if not all(
        isinstance(k, str)
        and k
        and isinstance(v, int | float)
        and not isinstance(v, bool)
        and v > 0
        for k, v in value.items()
    ):
        raise PretendConfigError(
            f"{CONFIG_VAR}: 'wrong_ops' must be a list of names or map names to a relative "
            f"error > 0, not {value!r}."
        )
    return frozenset(value), {k: float(v) for k, v in value.items()}


def parse(text: str, visible: str | None = None) -> Config:
    """The configuration in ``text`` (JSON), seen through ``visible`` (the visibility variable's
    value)."""
    try:
        raw = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        raise PretendConfigError(
            f"{CONFIG_VAR} is not JSON ({exc.msg} at character {exc.pos}): {text!r}."
        ) from None
    if not isinstance(raw, dict):
        raise PretendConfigError(
            f'{CONFIG_VAR} must be a JSON object such as {{"devices": 2}}, not {text!r}.'
        )
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise PretendConfigError(
            f"{CONFIG_VAR}: unknown key(s) {', '.join(unknown)}; accepted: {', '.join(KEYS)}."
        )
    devices = raw.get("devices", 1)
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        raise PretendConfigError(
            f"{CONFIG_VAR}: 'devices' must be a whole number >= 1, not {devices!r}."
        )
    memory = raw.get("memory_gb")
    if memory is not None and (
        not isinstance(memory, int | float) or isinstance(memory, bool) or memory <= 0
    ):
        raise PretendConfigError(
            f"{CONFIG_VAR}: 'memory_gb' must be a number of GB above 0, not {memory!r}."
        )
    slow = raw.get("slow_ops", {})
    if not isinstance(slow, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
        for k, v in slow.items()
    ):
        raise PretendConfigError(
            f"{CONFIG_VAR}: 'slow_ops' must map operator names to seconds >= 0, not {slow!r}."
        )
    bandwidth = raw.get("bandwidth_gbs")
    if bandwidth is not None and (
        not isinstance(bandwidth, int | float) or isinstance(bandwidth, bool) or bandwidth <= 0
    ):
        raise PretendConfigError(
            f"{CONFIG_VAR}: 'bandwidth_gbs' must be a number of GB/s above 0, not {bandwidth!r}."
        )
    wrong_ops, wrong_by = _wrong(raw)
    flaky, flaky_file = raw.get("flaky_ops", {}), raw.get("flaky_file")
    if not isinstance(flaky, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 2
        for k, v in flaky.items()
    ):
        raise PretendConfigError(
            f"{CONFIG_VAR}: 'flaky_ops' must map operator names to a period N >= 2, not {flaky!r}."
        )
    if flaky and (not isinstance(flaky_file, str) or not flaky_file):
        raise PretendConfigError(
            f"{CONFIG_VAR}: 'flaky_ops' needs 'flaky_file', the path of the file that counts "
            "the processes calling them."
        )
    past = _past_length(raw)
    message, after = raw.get("crash_message", True), raw.get("crash_after", 0)
    if not isinstance(message, bool):
        raise PretendConfigError(
            f"{CONFIG_VAR}: 'crash_message' must be true or false, not {message!r}."
        )
    if not isinstance(after, int) or isinstance(after, bool) or after < 0:
        raise PretendConfigError(
            f"{CONFIG_VAR}: 'crash_after' must be a whole number of operators >= 0, not {after!r}."
        )
    launch, jitter = raw.get("launch_us", 5.0), raw.get("clock_jitter", 0.01)
    if not isinstance(launch, int | float) or isinstance(launch, bool) or launch < 0:
        raise PretendConfigError(
            f"{CONFIG_VAR}: 'launch_us' must be microseconds >= 0 per kernel, not {launch!r}."
        )
    if not isinstance(jitter, int | float) or isinstance(jitter, bool) or not 0 <= jitter < 0.3:
        raise PretendConfigError(
            f"{CONFIG_VAR}: 'clock_jitter' must be a relative spread from 0 to below 0.3 "
            f"(0.01: 1%), not {jitter!r}."
        )
    clock = raw.get("clock", "device")
    if clock not in ("device", "host"):
        raise PretendConfigError(
            f"{CONFIG_VAR}: 'clock' must be 'device' or 'host', not {clock!r}."
        )
    sdpa_kernel = raw.get("sdpa_kernel", SDPA_KERNELS[0])
    if sdpa_kernel not in SDPA_KERNELS:
        raise PretendConfigError(
            f"{CONFIG_VAR}: 'sdpa_kernel' must be one of {', '.join(map(repr, SDPA_KERNELS))}, "
            f"not {sdpa_kernel!r}."
        )
    noise = raw.get("matmul_noise")
    if noise is not None and (
        not isinstance(noise, int | float) or isinstance(noise, bool) or not 0 < noise < 0.5
    ):
        raise PretendConfigError(
            f"{CONFIG_VAR}: 'matmul_noise' must be a relative error above 0 and below 0.5 "
            f"({BF16_ROUNDOFF:.4g}: bf16's rounding), not {noise!r}."
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
        crash_message=message,
        crash_after=after,
        wrong_past_length=past,
        launch_us=float(launch),
        clock_jitter=float(jitter),
        clock=clock,
        sdpa_kernel=sdpa_kernel,
        matmul_noise=None if noise is None else float(noise),
        **tpu_contract(raw),
        **distributed_contract(raw),
    )


def distributed_contract(raw: dict) -> dict:
    """The TPU contract's distributed clauses asked for (``DISTRIBUTED_CONTRACT_KEYS``)."""
    found = {}
    for key in ("launch_env", "one_device"):
        value = raw.get(key, False)
        if not isinstance(value, bool):
            raise PretendConfigError(f"{CONFIG_VAR}: {key!r} must be true or false, not {value!r}.")
        found[key] = value
    log = raw.get("opened_log")
    if log is not None and (not isinstance(log, str) or not log):
        raise PretendConfigError(
            f"{CONFIG_VAR}: 'opened_log' must be the path of a file, not {log!r}."
        )
    return {**found, "opened_log": log}


def tpu_contract(raw: dict) -> dict:
    """The TPU contract's clauses asked for (``TPU_CONTRACT_KEYS``): each true or false."""
    found = {}
    for key in TPU_CONTRACT_KEYS:
        value = raw.get(key, False)
        if not isinstance(value, bool):
            raise PretendConfigError(f"{CONFIG_VAR}: {key!r} must be true or false, not {value!r}.")
        found[key] = value
    return found


def _past_length(raw: dict) -> dict:
    """``wrong_past_length``: {operator: N}, an operator of ``PAST_LENGTH_AXES`` wrong from N
    positions on."""
    value = raw.get("wrong_past_length", {})
    if not isinstance(value, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value.values()
    ):
        raise PretendConfigError(
            f"{CONFIG_VAR}: 'wrong_past_length' must map operator names to a length N >= 1 "
            f"(positions), not {value!r}."
        )
    unknown = sorted(set(value) - set(PAST_LENGTH_AXES))
    if unknown:
        raise PretendConfigError(
            f"{CONFIG_VAR}: 'wrong_past_length' names {', '.join(unknown)}, whose sequence "
            f"axis it does not know; it breaks {', '.join(PAST_LENGTH_AXES)} (the operators "
            "attention reaches a backend as)."
        )
    return dict(value)


def _visible(value: str | None, devices: int) -> tuple:
    if value is None or not value.strip():
        return tuple(range(devices))
    try:
        ids = tuple(int(part) for part in value.split(","))
    except ValueError:
        ids = ()
    if not ids or len(set(ids)) != len(ids) or not all(0 <= i < devices for i in ids):
        raise PretendConfigError(
            f"{VISIBLE_VAR}={value!r} must list distinct device ids below {devices} (the "
            f"devices in {CONFIG_VAR})."
        )
    return ids


def from_environment(environ=None) -> Config | None:
    """This process's configuration, or None when ``MODEL_SUPPORT_PRETEND`` is not set (the
    backend is off)."""
    environ = os.environ if environ is None else environ
    text = environ.get(CONFIG_VAR)
    if text is None:
        return None
    config = parse(text, environ.get(VISIBLE_VAR))
    if environ.get(BLOCKING_VAR, "") not in ("", "0"):
        config = replace(config, blocking=True)
    return config
