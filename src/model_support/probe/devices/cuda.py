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

    def hardware_visible(self) -> bool:
        return self.visible_count() > 0

    def visible_count(self) -> int:
        visible = os.environ.get(self.visible_var)
        if visible is not None:
            return len([d for d in visible.split(",") if d.strip()])
        return len(glob.glob("/dev/nvidia[0-9]*"))
