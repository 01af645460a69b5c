"""Publishing: pushing the dataset to the Hugging Face Hub (``push``)."""

from .push import PushError, push

__all__ = ["PushError", "push"]
