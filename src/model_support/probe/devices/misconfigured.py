"""A device backend that cannot start with the configuration it was given is bad input, not a
verdict.

A backend's own configuration (the variables its adapter declares in ``config_vars``:
``LIBTPU_INIT_ARGS`` for the TPU runtime, a JSON configuration for a backend written in Python) is
the user's to write. When the backend raises while it loads or starts with it set (a typo in the
JSON, a flag libtpu does not know), the probe would record that as a FAIL(other) at stage runner and
exit 0: the typo as a verdict. ``refuse``, called by the probe notebook before anything runs, says
it in one sentence instead, and no record is written.

A device that is really not here (no such accelerator, its backend switched off or not installed, no
chip) is the adapter's own answer, not an exception of the backend: it stays what the design says (a
FAIL(other) record by a single probe, refused before anything runs by a sweep).
"""

from __future__ import annotations

from ...errors import UserError
from .base import DeviceUnavailable
from .registry import adapter_class
from .resolve import auto_candidates, resolve


class BackendConfigError(UserError):
    """A device backend does not load or start with the configuration its variables set."""


def configured(name: str) -> list[str]:
    """The configuration variables of device ``name``'s adapter that are set here."""
    return adapter_class(name).config_names()  # as the user set them (backend_env.user_environ)


def _backends(device: str) -> list[str]:
    """The backends the probe may start for ``device``: the one it names; for ``auto``, as
    ``resolve`` looks (the accelerator torch reports, else every candidate: ``resolve`` skips one
    that fails, so a typo in its configuration would make auto the CPU, silently)."""
    if device == "cpu":
        return []
    if device != "auto":
        return [device]
    import torch

    current = torch.accelerator.current_accelerator()
    if current is not None and torch.accelerator.is_available():
        return [current.type]
    return auto_candidates()


def _failure(name: str) -> BaseException | None:
    """What the backend of ``name`` raised while it loaded or started (``resolve``), or None: it
    started, or its adapter answered that the device is not here (a sentence of its own, no
    exception of the backend)."""
    try:
        resolve(name)
    except DeviceUnavailable as exc:
        # set when the backend's own loading raised (``backends.load_backend``)
        return exc.__cause__
    except UserError:
        # the adapter itself does not import: its own sentence, when the probe resolves it
        return None
    except Exception as exc:  # noqa: BLE001 whatever the backend raised while starting is what its configuration did
        return exc
    return None


def refuse(device: str) -> None:
    """Raise ``BackendConfigError`` (one sentence naming the variables) when a backend the probe
    would start for ``device`` fails with its configuration set. Call after
    ``prepare_environment`` and before the probe."""
    for name in _backends(device):
        variables = configured(name)
        if not variables:
            continue
        cause = _failure(name)
        if cause is not None:
            said = f"{type(cause).__name__}: {cause}".rstrip(".")
            raise BackendConfigError(
                f"The {name} backend does not start with the configuration "
                f"{' and '.join(variables)} sets here ({said}); fix {' or '.join(variables)}, "
                "or unset it, and run again."
            )
