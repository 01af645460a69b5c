"""TPUs through torch_tpu 0.2.0 (docs/torch_tpu.md): the generic adapter, plus what is TorchTPU's own:
torch.compile's ``tpu`` backend, compilation-cache statistics, the HBM size, the ``tpu_dist`` process
group, chips counted and pinned with the TPU runtime's variables, and the sentences when torch_tpu or
the TPU is missing. Its generic calls (count, synchronize, memory counters) go through
``torch.accelerator``; ``torch.tpu.is_available`` and friends are internal in 0.2.0. Every name of
torch_tpu used here is checked against the installed wheel by ``tests/test_torch_tpu_names.py``.
"""

from __future__ import annotations

import glob
import importlib.util
from collections.abc import Iterable, Mapping

from .accelerator import AcceleratorAdapter
from .registry import register

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
TPU_BASE_PORT = 8476  # pytorch/xla's local processes: 8476 + lowest chip
#: HBM of a v5e chip, the smallest in use: the device memory when torch_tpu cannot tell (the plan then
#: errs towards more chips).
SMALLEST_HBM = 16 * 2**30


def tpu_hardware_visible() -> bool:
    """TPU VMs expose /dev/accel* (v2-v5e) or /dev/vfio/<n> (v5p and later)."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def torch_tpu_installed() -> bool:
    return importlib.util.find_spec("torch_tpu") is not None


def tpu_rank_env(local_rank: int, world_size: int, chips: list[int] | None = None) -> dict:
    """The TPU runtime's variables that give rank ``local_rank`` one chip of a ``world_size``-process slice
    on this host (torch_tpu: one chip per process, seen at index 0). ``chips``: the chips of the probe
    (the scheduler's ``TPU_VISIBLE_CHIPS`` block), else 0..world_size-1. Written from libtpu's
    multi-process conventions (pytorch/xla, JAX): NOT tested on a TPU here."""
    chips = list(chips) if chips else list(range(world_size))
    if len(chips) < world_size:
        raise ValueError(f"{world_size} TPU ranks need {world_size} chips, got {chips}.")
    if world_size not in TPU_CHIP_BOUNDS:
        raise ValueError(f"A TPU slice on one host has 1, 2, 4 or 8 processes, not {world_size}.")
    ports = [TPU_BASE_PORT + chip for chip in chips[:world_size]]
    return {
        "TPU_VISIBLE_CHIPS": str(chips[local_rank]),
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": TPU_CHIP_BOUNDS[world_size],
        "TPU_PROCESS_ADDRESSES": ",".join(f"localhost:{port}" for port in ports),
        "TPU_PROCESS_PORT": str(ports[local_rank]),
        "CLOUD_TPU_TASK_ID": str(local_rank),
    }


@register("tpu")
class TpuAdapter(AcceleratorAdapter):
    visible_var = "TPU_VISIBLE_CHIPS"
    ray_resource = "TPU"
    aligned_blocks = True  # a process owns an aligned block of chips (TPU_CHIP_BOUNDS)
    shared_devices = False  # a chip is opened by one process at a time
    # the TPU runtime's flags and its PJRT/XLA settings: they change what the stack does
    config_vars = ("LIBTPU_INIT_ARGS", "XLA_FLAGS", "PJRT_*", "TPU_*")
    config_shown = config_vars  # flags and topology, no secret
    harness_vars = tuple(tpu_rank_env(0, 1))  # a sharded rank's place, set per probe by the harness
    backend_packages = ("torch_tpu", "libtpu")  # TorchTPU and the TPU runtime it drives: their builds are the stack's
    own_modes = ("fused",)  # TorchTPU's deferred-and-fused eager (``probe_core.fused_eager_missing``)

    def __init__(self, type: str = "tpu"):
        super().__init__(type)

    def unavailable(self, elsewhere=list) -> str | None:
        if not torch_tpu_installed():
            return (
                "Device 'tpu' was requested but the torch_tpu package is not installed; "
                "install it with `pip install -e '.[tpu]'` on a TPU VM, or pass device='cpu' or 'cuda'."
            )
        import torch

        from .backends import load_backend

        load_backend("tpu")  # torch_tpu's entry point: registers the 'tpu' device when chips are present
        if not torch.accelerator.is_available():
            return (
                "Device 'tpu' was requested but no TPU is present on this machine "
                "(torch_tpu is installed, but torch.accelerator.is_available() is False)."
            )
        accelerator = torch.accelerator.current_accelerator()
        if accelerator is None or accelerator.type != "tpu":
            return f"Device 'tpu' was requested but the current accelerator is {accelerator}, not a TPU."
        return None

    def compile_backend(self) -> str:
        return "tpu"  # torch.compile(model, backend="tpu") is torch_tpu's graph-mode path

    def device_memory_bytes(self) -> int:
        import torch

        try:  # experimental in torch_tpu 0.2.0: raises for a generation it does not recognise
            return int(torch.tpu.get_device_properties().total_memory)  # type: ignore[attr-defined]  # torch_tpu adds it
        except (RuntimeError, AttributeError):
            return SMALLEST_HBM

    def compile_cache_stats(self):
        import torch

        hits = getattr(torch.tpu, "_get_cache_hits", None)
        misses = getattr(torch.tpu, "_get_cache_misses", None)
        try:
            return (int(hits()) if hits else None, int(misses()) if misses else None)
        except (RuntimeError, TypeError, ValueError):
            return None, None

    def distributed_backend(self) -> str:
        return "tpu_dist"  # registered by torch_tpu's entry point

    def hardware_visible(self) -> bool:
        return torch_tpu_installed() and tpu_hardware_visible()

    def pinning_env(self, ids: Iterable[int]) -> dict:
        ids = tuple(ids)
        listed = ",".join(str(i) for i in ids)
        n = len(ids)
        if not ids:
            raise ValueError("A tpu probe must be pinned to at least one device.")
        if n not in TPU_CHIP_BOUNDS or ids != tuple(range(ids[0], ids[0] + n)) or ids[0] % n:
            raise ValueError(f"A TPU process owns an aligned block of 1, 2, 4 or 8 chips, not chips {listed}.")
        return {
            "TPU_VISIBLE_CHIPS": listed,
            "TPU_CHIPS_PER_PROCESS_BOUNDS": TPU_CHIP_BOUNDS[n],
            "TPU_PROCESS_BOUNDS": "1,1,1",  # one process in its own slice
            "TPU_PROCESS_PORT": str(TPU_BASE_PORT + ids[0]),  # unique: running probes own disjoint chips
        }

    def rank_env(self, local_rank: int, world_size: int, environ: Mapping[str, str]) -> dict:
        visible = environ.get(self.visible_var)
        return tpu_rank_env(local_rank, world_size, [int(c) for c in visible.split(",")] if visible else None)

    def rank_device(self, local_rank: int):
        """The one chip ``rank_env`` left this rank's process (torch_tpu: one chip per process, seen at its
        own index, 0), whatever the rank: device ``local_rank`` does not exist in rank 1's process."""
        current, _ = self.ask("current_device_index")
        return self.select(int(current or 0))
