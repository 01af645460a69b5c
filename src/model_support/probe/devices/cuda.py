"""CUDA GPUs: the generic adapter, plus what is CUDA's own: its visibility variable and its GPUs
counted without torch, NCCL for a sharded run's process group, and the sentence when none is
there."""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import sys
from pathlib import Path

from .accelerator import AcceleratorAdapter
from .registry import register

#: Where the NVIDIA kernel driver says its version ("NVRM version: NVIDIA UNIX x86_64 Kernel Module
#: 550.54.15 ...").
NVIDIA_DRIVER_FILE = Path("/proc/driver/nvidia/version")


def torch_build(name: str) -> str | None:
    """``torch.version.<name>`` (the CUDA or HIP toolkit torch was built with; None for a CPU
    build), without importing torch where it is not imported yet: read from its ``version.py``,
    as torch writes it at build time."""
    if "torch" in sys.modules:
        return getattr(sys.modules["torch"].version, name, None)
    spec = importlib.util.find_spec("torch")
    folders = list(spec.submodule_search_locations or []) if spec else []
    try:
        text = (Path(folders[0]) / "version.py").read_text() if folders else ""
    except OSError:
        return None
    found = re.search(rf"^{name}\s*(?::[^=\n]*)?=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return found.group(1) if found else None


def nvidia_driver(path: Path = NVIDIA_DRIVER_FILE) -> str | None:
    """The NVIDIA kernel driver's version, from ``path``; None where there is none (no driver
    loaded, another OS)."""
    try:
        found = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d[\w.]*)", path.read_text())
    except OSError:
        return None
    return found.group(1) if found else None


@register("cuda")
class CudaAdapter(AcceleratorAdapter):
    visible_var = "CUDA_VISIBLE_DEVICES"
    ray_resource = "GPU"
    aliases = {"gpu": "an NVIDIA or AMD GPU is cuda"}
    # kernel errors reported at the launch that caused them
    blocking_env = {"CUDA_LAUNCH_BLOCKING": "1"}
    # torch.profiler (kineto/CUPTI) reads a compiled run's kernels and copies
    profiler_activities = ("cpu", "cuda")
    # the CUDA libraries torch's wheels install beside it (cu12 and later names); a source build has
    # none
    backend_packages = ("nvidia-cuda-runtime*", "nvidia-cublas*", "nvidia-cudnn*", "nvidia-nccl*")

    def runtime_versions(self) -> dict[str, str]:
        """The toolkit torch was built with (CUDA, or HIP on ROCm) and the NVIDIA driver, where
        there is one."""
        toolkit = {
            "cuda-toolkit": torch_build("cuda"),
            "hip": torch_build("hip"),
            "nvidia-driver": nvidia_driver(),
        }
        return {name: version for name, version in toolkit.items() if version}

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
        """From the GPU's memory clock and bus width (double data rate), as torch's device
        properties give them."""
        import torch

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        clock_khz, bus_bits = (
            getattr(props, "memory_clock_rate", None),
            getattr(props, "memory_bus_width", None),
        )
        if not clock_khz or not bus_bits:
            return (
                None,
                f"torch {torch.__version__} does not give the GPU's memory clock and bus width",
            )
        return (
            2 * clock_khz * 1e3 * bus_bits / 8 / 1e9,
            "memory clock x bus width x 2, torch.cuda device properties",
        )

    def hardware_visible(self) -> bool:
        return self.visible_count() > 0

    def visible_count(self) -> int:
        visible = os.environ.get(self.visible_var)
        if visible is not None:
            return len([d for d in visible.split(",") if d.strip()])
        return len(glob.glob("/dev/nvidia[0-9]*"))
