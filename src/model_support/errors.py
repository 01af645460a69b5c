"""The one base class for mistakes a user can fix: each message is one sentence naming what is
wrong and how to fix it. The CLI prints it (exit status 2) instead of a traceback."""


class UserError(ValueError):
    """Bad input (a params file, a flag, a parameter, an unknown sweep): one sentence, no traceback."""
