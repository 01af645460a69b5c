"""CUDA GPUs: the generic adapter, plus what is CUDA's own: its visibility variable and its GPUs
counted without torch, NCCL for a sharded run's process group, and the sentence when none is there."""

from __future__ import annotations

import glob
import os

from .accelerator import AcceleratorAdapter
from .registry import register


@register("cuda")
class CudaAdapter(AcceleratorAdapter):
    visible_var = "CUDA_VISIBLE_DEVICES"
    ray_resource = "GPU"
    aliases = {"gpu": "an NVIDIA or AMD GPU is cuda"}
    blocking_env = {"CUDA_LAUNCH_BLOCKING": "1"}  # kernel errors reported at the launch that caused them
    profiler_activities = ("cpu", "cuda")  # torch.profiler (kineto/CUPTI) reads a compiled run's kernels and copies

    def __init__(self, type: str = "cuda"):
        super().__init__(type)

    def unavailable(self, elsewhere=list) -> str | None:
        import torch

        if not torch.cuda.is_available():
            return (
                "Device 'cuda' was requested but no CUDA GPU is visible here "
                f"(torch {torch.__version__}, torch.cuda.is_available() is False)."
            )
        return None

    def distributed_backend(self) -> str:
        return "nccl"

    def peak_bandwidth_gbs(self) -> tuple[float | None, str]:
        """From the GPU's memory clock and bus width (double data rate), as torch's device properties give them."""
        import torch

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        clock_khz, bus_bits = getattr(props, "memory_clock_rate", None), getattr(props, "memory_bus_width", None)
        if not clock_khz or not bus_bits:
            return None, f"torch {torch.__version__} does not give the GPU's memory clock and bus width"
        return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9, "memory clock x bus width x 2, torch.cuda device properties"

    def hardware_visible(self) -> bool:
        return self.visible_count() > 0

    def visible_count(self) -> int:
        visible = os.environ.get(self.visible_var)
        if visible is not None:
            return len([d for d in visible.split(",") if d.strip()])
        return len(glob.glob("/dev/nvidia[0-9]*"))
