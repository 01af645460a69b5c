"""``python -m model_support.cli``: the ``model-support`` command."""

from . import main

main()
