"""Publishing: the dataset, its card, the latest report and the raw logs, pushed to the Hugging Face
Hub.

``push`` is the one entry point (``model-support push``); ``files`` says what goes up and how a file
is known to be there already, ``card`` writes the dataset card. See docs/publishing.md.
"""

from .push import PushError, PushResult, push

__all__ = ["PushError", "PushResult", "push"]
