"""``model-support``: each command is a few lines over a library call (as sqlite-utils does).

One module per group of commands, imported only when one of its commands runs or shows its help
(``LazyGroup``, click's documented pattern): ``model-support list`` never imports the sweep's code.
Inside a command module, each command imports the library it calls in its own body: one module
serves several commands whose libraries cost from 0.2 s (the store) to 1.6 s (the workflows) to
import (measured with ``python -c "import ..."``, 2026-12-08), and a command pays only for its own
(``bench/bench_cold_command.py``).
"""

from __future__ import annotations

import importlib
from collections.abc import MutableMapping

import click

#: Each command and the module under ``model_support.cli`` that defines it (a function of that name,
#: or ``list_`` for ``list``).
COMMANDS = {
    "sweep": "sweep_commands",
    "nightly": "sweep_commands",
    "report": "dataset_commands",
    "aggregate": "dataset_commands",
    "exclude": "dataset_commands",
    "include": "dataset_commands",
    "export": "dataset_commands",
    "list": "dataset_commands",
    "support": "dataset_commands",
    "push": "dataset_commands",
    "diff": "compare_commands",
    "bisect": "compare_commands",
    "debug": "model_commands",
    "repro": "model_commands",
    "localise": "model_commands",
    "judge": "model_commands",
    "ops": "ops_commands",
}


class LazyCommands(MutableMapping):
    """``COMMANDS`` as click's mapping of name -> command: every name is known without an import
    (the listing, the "Did you mean" of a typo), a command is imported from its module when it is
    looked up."""

    def __init__(self) -> None:
        self._loaded: dict[str, click.Command] = {}
        self._removed: set[str] = set()

    def __getitem__(self, name: str) -> click.Command:
        if name in self._removed or (name not in self._loaded and name not in COMMANDS):
            raise KeyError(name)
        if name not in self._loaded:
            module = importlib.import_module(f"{__name__}.{COMMANDS[name]}")
            self._loaded[name] = getattr(module, "list_" if name == "list" else name)
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._removed.discard(name)
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self._loaded.pop(name, None)
        self._removed.add(name)

    def __iter__(self):
        names = dict.fromkeys([*COMMANDS, *self._loaded])
        return iter([name for name in names if name not in self._removed])

    def __len__(self) -> int:
        return len(list(iter(self)))


class LazyGroup(click.Group):
    """A group whose commands are imported from their modules (``COMMANDS``) when first asked
    for."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.commands = LazyCommands()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--debug", is_flag=True, help="Show the traceback behind an error, not only its sentence."
)
def main(debug):
    """Sweep Hugging Face models over an accelerator stack (TPU, CUDA, CPU) and report what runs."""
