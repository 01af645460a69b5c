"""One small adapter per backend (cpu, cuda, tpu) behind one interface.

Everything device-specific the probe needs goes through an adapter: the torch device to move to,
synchronize (so timings are honest), peak device memory (with the source it came from, or null when
nothing trustworthy exists), the device's name and count, and compilation-cache statistics where
the backend offers them. The tpu adapter uses torch_tpu 0.2.0 through ``torch.accelerator``
(``torch.tpu.is_available`` and friends are internal in 0.2.0; see docs/torch_tpu.md).

Why ``prepare_environment``: with torch_tpu installed, ``import torch`` autoloads it through torch's
device-backend entry point, which costs ~8 s and ~300 MB per process even on a machine with no TPU.
A probe that will not use a TPU turns that autoload off before torch is imported.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from .probe_params import DEVICES as DEVICE_CHOICES

AUTOLOAD_VAR = "TORCH_DEVICE_BACKEND_AUTOLOAD"


class DeviceUnavailable(RuntimeError):
    """The requested device cannot be used here; the message is one sentence saying why."""


def tpu_hardware_visible() -> bool:
    """TPU VMs expose /dev/accel* (v2-v5e) or /dev/vfio/<n> (v5p and later)."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def torch_tpu_installed() -> bool:
    return importlib.util.find_spec("torch_tpu") is not None


def prepare_environment(device: str) -> None:
    """Call before ``import torch``: skip torch_tpu's autoload when no TPU will be used.

    Only the current process (and the kernels it starts) is affected, and only when the user has
    not set the variable themselves.
    """
    wants_tpu = device == "tpu" or (device == "auto" and torch_tpu_installed() and tpu_hardware_visible())
    if not wants_tpu:
        os.environ.setdefault(AUTOLOAD_VAR, "0")


#: TPU_CHIPS_PER_PROCESS_BOUNDS by chip count, with TPU_PROCESS_BOUNDS "1,1,1" (one process owning its
#: chips). 1 and 2 chips: the JAX maintainers' recipe for several TPU processes on one VM
#: (gist.github.com/skye/f82ba45d2445bb19d53545538754f9a3: "1,1,1"; "1,2,1" with chips "0,1" or "2,3";
#: a unique port per process; it names the chips TPU_VISIBLE_DEVICES, pytorch/xla's tests of its TPU
#: env (github.com/pytorch/xla/pull/4724) use TPU_VISIBLE_CHIPS and TPU_PROCESS_PORT 8476 + process).
#: 4 chips: "2,2,1" with chips "0,1,2,3", as single-process 4-chip vLLM-on-TPU launchers set it (public
#: code, not Google's docs). 8 chips: "2,4,1" is NOT verified: inferred from the 2x4 topology of the
#: 8-chip single-host slices (v5e/v6e, cloud.google.com/tpu/docs). That an aligned block of chip ids
#: is a block of neighbouring chips is likewise assumed, not verified on every TPU generation.
TPU_CHIP_BOUNDS = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,4,1"}
TPU_BASE_PORT = 8476  # as sweep.pinning_env today and pytorch/xla's local processes: 8476 + lowest chip


def pinning_env(kind: str, ids: Iterable[int]) -> dict:
    """Environment variables that pin a probe process to the devices ``ids`` (kind cuda, tpu, cpu or fake)."""
    ids = tuple(ids)
    listed = ",".join(str(i) for i in ids)
    if kind == "cpu":
        return {}
    if kind not in ("cuda", "tpu", "fake"):
        raise ValueError(f"Unknown device kind {kind!r}: expected cuda, tpu, cpu or fake.")
    if not ids:
        raise ValueError(f"A {kind} probe must be pinned to at least one device.")
    if kind == "cuda":
        return {"CUDA_VISIBLE_DEVICES": listed}
    if kind == "fake":
        return {"FAKE_DEVICES": listed}
    n = len(ids)
    if n not in TPU_CHIP_BOUNDS or ids != tuple(range(ids[0], ids[0] + n)) or ids[0] % n:
        raise ValueError(f"A TPU process owns an aligned block of 1, 2, 4 or 8 chips, not chips {listed}.")
    return {
        "TPU_VISIBLE_CHIPS": listed,
        "TPU_CHIPS_PER_PROCESS_BOUNDS": TPU_CHIP_BOUNDS[n],
        "TPU_PROCESS_BOUNDS": "1,1,1",  # one process in its own slice
        "TPU_PROCESS_PORT": str(TPU_BASE_PORT + ids[0]),  # unique: running probes own disjoint chips
    }


@dataclass
class Adapter:
    """The interface every backend implements; the cpu adapter is the base."""

    type: str = "cpu"

    @property
    def torch_device(self):
        import torch

        return torch.device(self.type)

    def synchronize(self) -> None:
        pass

    def reset_peak_memory(self) -> None:
        pass

    def peak_memory_mb(self) -> tuple[float | None, str | None]:
        """(peak MB, where the number came from); (None, None) when nothing trustworthy exists."""
        return None, None

    def device_name(self) -> str:
        import platform

        return platform.processor() or platform.machine() or "cpu"

    def device_count(self) -> int:
        return 1

    def compile_cache_stats(self) -> tuple[int | None, int | None]:
        return None, None

    def compile_backend(self) -> str:
        """torch.compile's backend for this device: inductor (cpu, cuda); the tpu adapter says tpu."""
        return "inductor"

    def mode_unavailable(self, mode: str) -> str | None:
        """Why this stack cannot run the probe in ``mode``, or None. Only ``fused`` (TorchTPU's
        deferred-and-fused eager) can be missing: a TPU with a torch_tpu that exposes it runs it."""
        if mode != "fused":
            return None
        from .probe_core import fused_eager_missing

        return fused_eager_missing(self.type)

    def devices_present(self) -> int:
        """How many devices a sharded probe may use: the chips or GPUs; on the CPU one rank per core."""
        return self.device_count() if self.type != "cpu" else max(1, os.cpu_count() or 1)

    def device_memory_bytes(self) -> int:
        """Memory of one device (the host's, shared by the ranks, on the CPU)."""
        import psutil

        return psutil.virtual_memory().total // self.devices_present()


class CudaAdapter(Adapter):
    def __init__(self):
        super().__init__("cuda")

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def reset_peak_memory(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats()

    def peak_memory_mb(self):
        import torch

        return torch.cuda.max_memory_allocated() / 2**20, "torch.cuda.max_memory_allocated"

    def device_name(self) -> str:
        import torch

        return torch.cuda.get_device_name(0)

    def device_count(self) -> int:
        import torch

        return torch.cuda.device_count()

    def device_memory_bytes(self) -> int:
        import torch

        return torch.cuda.get_device_properties(0).total_memory


class TpuAdapter(Adapter):
    """torch_tpu 0.2.0: public ``torch.accelerator`` calls, experimental/private ``torch.tpu`` ones guarded."""

    def __init__(self):
        super().__init__("tpu")

    def compile_backend(self) -> str:
        return "tpu"  # torch.compile(model, backend="tpu") is torch_tpu's graph-mode path

    def device_memory_bytes(self) -> int:
        import torch

        try:  # experimental in torch_tpu 0.2.0: raises for a generation it does not recognise
            return int(torch.tpu.get_device_properties().total_memory)  # type: ignore[attr-defined]  # torch_tpu adds it
        except (RuntimeError, AttributeError):
            return 16 * 2**30  # a v5e chip, the smallest in use: the plan then errs towards more chips

    def synchronize(self) -> None:
        import torch

        torch.accelerator.synchronize()

    def reset_peak_memory(self) -> None:
        import torch

        try:
            torch.accelerator.reset_peak_memory_stats()
        except (RuntimeError, AttributeError, NotImplementedError):
            pass

    def peak_memory_mb(self):
        import torch

        try:
            peak = torch.accelerator.max_memory_allocated()
        except (RuntimeError, AttributeError, NotImplementedError):
            return None, None
        # torch_tpu 0.2.0 may not back the generic counter: a zero after running a model is not a
        # measurement, so it is recorded as unknown rather than as 0.
        if not peak:
            return None, None
        return peak / 2**20, "torch.accelerator.max_memory_allocated"

    def device_name(self) -> str:
        import torch

        try:
            return str(torch.tpu.get_device_name())  # type: ignore[attr-defined]  # torch_tpu adds it
        except (RuntimeError, AttributeError):
            return "tpu"

    def device_count(self) -> int:
        import torch

        return torch.accelerator.device_count()

    def compile_cache_stats(self):
        import torch

        hits = getattr(torch.tpu, "_get_cache_hits", None)
        misses = getattr(torch.tpu, "_get_cache_misses", None)
        try:
            return (int(hits()) if hits else None, int(misses()) if misses else None)
        except (RuntimeError, TypeError, ValueError):
            return None, None


def _tpu() -> TpuAdapter:
    if not torch_tpu_installed():
        raise DeviceUnavailable(
            "Device 'tpu' was requested but the torch_tpu package is not installed; "
            "install it with `pip install -e '.[tpu]'` on a TPU VM, or pass device='cpu' or 'cuda'."
        )
    import torch
    import torch_tpu  # noqa: F401  (registers the 'tpu' backend and torch.tpu)

    if not torch.accelerator.is_available():
        raise DeviceUnavailable(
            "Device 'tpu' was requested but no TPU is present on this machine "
            "(torch_tpu is installed, but torch.accelerator.is_available() is False)."
        )
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None or accelerator.type != "tpu":
        raise DeviceUnavailable(f"Device 'tpu' was requested but the current accelerator is {accelerator}, not a TPU.")
    return TpuAdapter()


def _cuda() -> CudaAdapter:
    import torch

    if not torch.cuda.is_available():
        raise DeviceUnavailable(
            "Device 'cuda' was requested but no CUDA GPU is visible here "
            f"(torch {torch.__version__}, torch.cuda.is_available() is False)."
        )
    return CudaAdapter()


def resolve(device: str) -> Adapter:
    """The adapter for ``device``; ``auto`` picks tpu, then cuda, then cpu."""
    if device not in DEVICE_CHOICES:
        raise DeviceUnavailable(f"Unknown device {device!r}; choose one of {', '.join(DEVICE_CHOICES)}.")
    if device == "cpu":
        return Adapter("cpu")
    if device == "cuda":
        return _cuda()
    if device == "tpu":
        return _tpu()
    if torch_tpu_installed() and tpu_hardware_visible():
        try:
            return _tpu()
        except DeviceUnavailable:
            pass
    try:
        return _cuda()
    except DeviceUnavailable:
        return Adapter("cpu")


def visible_device_count(device: str) -> int:
    """How many devices of this kind the sweep can pin workers to (without importing torch_tpu when
    there is no TPU hardware, so the parent runner stays light)."""
    if device in ("cpu",):
        return 1
    if device in ("tpu", "auto") and torch_tpu_installed() and tpu_hardware_visible():
        return max(1, len(glob.glob("/dev/accel*")) or len(glob.glob("/dev/vfio/[0-9]*")))
    if device in ("cuda", "auto"):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            return len([d for d in visible.split(",") if d.strip()])
        return len(glob.glob("/dev/nvidia[0-9]*"))
    return 1


def check_available(device: str) -> str | None:
    """None when ``device`` can be used here, else the one sentence a probe would record.

    Checked in a short-lived child process: the runner itself must not import torch_tpu (it would
    hold the TPU chip that the probes need) nor create a CUDA context. cpu and auto always work."""
    if device in ("cpu", "auto"):
        return None
    if device not in DEVICE_CHOICES:
        return f"Unknown device {device!r}; choose one of {', '.join(DEVICE_CHOICES)}."
    env = dict(os.environ)
    if device != "tpu":
        env.setdefault(AUTOLOAD_VAR, "0")
    done = subprocess.run(
        [sys.executable, "-m", "model_support.probe.devices", device],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines and lines[-1] == "ok":
        return None
    if lines:
        return lines[-1]
    return f"Device {device!r} could not be checked: {(done.stderr.strip().splitlines() or ['no output'])[-1]}"


if __name__ == "__main__":  # python -m model_support.probe.devices DEVICE: "ok", or the sentence why not
    try:
        resolve(sys.argv[1])
        print("ok")
    except DeviceUnavailable as exc:
        print(exc)
