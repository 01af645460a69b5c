"""The one base class for mistakes a user can fix: each message is one sentence naming what is
wrong and how to fix it. The CLI prints it (exit status 2) instead of a traceback."""


class UserError(ValueError):
    """Bad input (a params file, a flag, a parameter, an unknown sweep): one sentence, no
    traceback."""

    def _render_traceback_(self) -> list[str]:
        """What IPython shows for it in a notebook cell (papermill's error then carries it too): the
        sentence, not the frames that raised it."""
        return [f"{type(self).__name__}: {self}"]


class StorageFull(Exception):
    """The data folder could not be written (a full disk, or the write's own error): one sentence
    saying what could not be written, why, what is already safe and the command that finishes the
    job. Not a user's mistake in the command, so the CLI prints it without a usage banner (exit
    status 1)."""


class Interrupted(Exception):
    """A sweep stopped before its end (Ctrl-C, SIGTERM, its executor failing): one sentence
    saying how many models are stored and the command that finishes it (exit status 1, no usage
    banner)."""
