"""``torch.pretend``: the backend's device module (what ``torch.cuda`` is to CUDA), registered with
``torch._register_device_module``: device count and selection, synchronize, memory counters and the
device's properties. torch's generic ``torch.accelerator`` memory calls do not reach a backend
written in Python (its allocator is no ``DeviceAllocator``, as torch_tpu's is not), so these are
where the adapter's fallback finds them."""

from __future__ import annotations

from dataclasses import dataclass

from . import tensor as _tensor
from .config import NAME


def _state():
    return _tensor.STATE


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return len(_state().ledgers)


def current_device() -> int:
    return _state().current


def _index(device=None) -> int:
    if device is None:
        return _state().current
    if isinstance(device, int):
        return device
    index = device.index if hasattr(device, "index") else int(str(device).rpartition(":")[2] or 0)
    return _state().current if index is None else index


def set_device(device) -> None:
    index = _index(device)
    if not 0 <= index < device_count():
        raise RuntimeError(
            f"{NAME} device {index} is not visible here: this process sees {device_count()} "
            "device(s)."
        )
    _state().current = index


def synchronize(device=None) -> None:
    """Every operator has finished when it returns: nothing is queued. Still a wait of the host
    on the device wherever a real one queues: counted (``counters``)."""
    _state().sync()


#: The TPU contract's CPU fallback switch (``no_fallback``, ``tensor._cpu_fallback_on``): with the
#: clause on, a ``fallback_ops`` operator raises while this is False, as TorchTPU's
#: ``enable_cpu_fallback`` (False by default); ``torch.pretend.enable_cpu_fallback = True`` runs it
#: on the CPU. Without the clause it is not read.
enable_cpu_fallback = False

#: Its clock moves with the operators its dispatch runs; a compiled graph runs the CPU operators
#: underneath, past it, so compiled runs are timed on the host's clock
#: (``probe_core.device_clock``).
perf_clock_sees_compiled = False


def _perf_clock() -> float:
    """Seconds on the device's own timeline (``clock.DeviceClock``), read as
    ``time.perf_counter`` is: what its event timer would say. Read after ``synchronize`` (nothing
    is queued here anyway). A device module that offers ``perf_clock`` is timed on it by the
    probe's perf phase and the repro script (``probe_core.device_clock``)."""
    return _state().clock.now()


def __getattr__(name: str):
    """``perf_clock``, offered only where the configuration keeps the device's own timeline
    (``clock``: "device", the default); with "host" the module has none, as ``torch.cuda`` has
    none: the device is timed on the host."""
    if name == "perf_clock" and _state().config.clock == "device":
        return _perf_clock
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def manual_seed_all(seed: int) -> None:
    """Random numbers are drawn by the CPU underneath: torch.manual_seed already seeds them."""


manual_seed = manual_seed_all


def memory_allocated(device=None) -> int:
    return _state().ledgers[_index(device)].allocated


def max_memory_allocated(device=None) -> int:
    return _state().ledgers[_index(device)].peak


def reset_peak_memory_stats(device=None) -> None:
    ledger = _state().ledgers[_index(device)]
    ledger.peak = ledger.allocated


def mem_get_info(device=None) -> tuple[int, int]:
    ledger = _state().ledgers[_index(device)]
    total = ledger.limit if ledger.limit is not None else _host_memory()
    return max(0, total - ledger.allocated), total


def _host_memory() -> int:
    import psutil

    return psutil.virtual_memory().total


@dataclass(frozen=True)
class DeviceProperties:
    name: str
    total_memory: int
    physical_id: int


def get_device_name(device=None) -> str:
    return "Pretend accelerator (CPU underneath)"


def get_device_properties(device=None) -> DeviceProperties:
    ledger = _state().ledgers[_index(device)]
    total = ledger.limit if ledger.limit is not None else _host_memory()
    return DeviceProperties(get_device_name(device), total, ledger.physical)
