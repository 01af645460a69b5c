"""The one-operator repro: the first wrong operator as a tiny standalone script and its inputs, what
a porting engineer attaches to a bug report against the stack.

The script is a header, the source of ``op_check`` (its program and its tolerances: the same
judgement the localiser made), the repro scripts' own ``set_up_backend`` and what it calls
(``apply_device_config``, ``load_backend``: it sets the stack's backend configuration as it ran,
e.g. ``LIBTPU_INIT_ARGS`` or a test backend's faults, each said on stdout, or leaves this
environment's with ``--stack-as-found``; loads only that backend; and says in one sentence, exit
status 2, where the device is not here), then its ``SETTINGS``. It needs torch and the device's
backend package, nothing of this project.

The inputs (the device's own inputs of that call, copied to the CPU) are one ``torch.save`` file
stored by its content: ``inputs/<sha256>.pt`` beside the script; the script reads it only when its
bytes hash to the sha256 it names, with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import pprint
import re
from pathlib import Path

from .. import fileio
from ..probe import probe_backend, reproduce
from . import op_check

#: Where a localised model's inputs files are kept, beside its script.
INPUTS = "inputs"

HEADER = """#!/usr/bin/env python
# The first wrong operator of {model_id!r} on {device!r}{sweep}: {operator}.{overload} in {module}
# (input shapes {shapes}, dtypes {dtypes}).
# Run with plain python beside its inputs file ({inputs_file}, or inputs/{inputs_file}; else pass its path):
# it runs the operator on the device and on the CPU from the device's own inputs, prints both outputs, and exits
# 1 while they differ beyond the tolerance, 0 when they agree, 2 with one sentence where this stack cannot run it
# (the device or its backend not here). Needs torch, and the package that provides the device's backend.
# It sets the stack's backend configuration as the localiser ran it (SETTINGS' device_config), each setting said;
# to run on this environment's stack as found instead (e.g. to check a fix): add {flag} to its command line
# ({keep}=1 does the same).
"""

TAIL = """

# ---- the repro scripts' own: the stack's configuration and its backend, as the probe's script sets them ----
import sys  # noqa: E402

BACKENDS_GROUP = {backends_group!r}
BACKEND_ENTRY_POINTS_VAR = {entry_points_var!r}
KEEP_CONFIG_VAR = {keep_var!r}
AS_FOUND_FLAG = {flag!r}

{functions}

SETTINGS = {settings}

if __name__ == "__main__":
    sys.exit(run_script(SETTINGS, sys.argv, set_up_backend))
"""

#: An import of this package in a body that must run without it.
_PACKAGE_IMPORT = re.compile(
    r"^\s*(?:from\s+\.|from\s+model_support\b|import\s+model_support\b)", re.MULTILINE
)


def _body() -> str:
    source = inspect.getsource(op_check)
    if _PACKAGE_IMPORT.search(source):
        raise ValueError(
            "op_check imports this package: its source cannot be a standalone script's body"
        )
    return source


def script(settings: dict, sweep_id: str | None = None) -> str:
    """The whole script for one localised operator; ``settings``: operator, overload, module,
    shapes, dtypes, device (its type), device_config, inputs_sha256, model_id."""
    functions = "\n\n".join(
        inspect.getsource(f)
        for f in (
            probe_backend.backend_device,
            probe_backend.load_backend,
            reproduce.stack_as_found,
            reproduce.apply_device_config,
            reproduce.set_up_backend,
        )
    )
    head = HEADER.format(
        sweep=f" (sweep {sweep_id})" if sweep_id else "",
        inputs_file=f"{settings['inputs_sha256']}.pt",
        keep=reproduce.KEEP_CONFIG_VAR,
        flag=reproduce.AS_FOUND_FLAG,
        **{
            k: settings.get(k)
            for k in ("model_id", "device", "operator", "overload", "module", "shapes", "dtypes")
        },
    )
    tail = TAIL.format(
        backends_group=probe_backend.BACKENDS_GROUP,
        entry_points_var=probe_backend.BACKEND_ENTRY_POINTS_VAR,
        keep_var=reproduce.KEEP_CONFIG_VAR,
        flag=reproduce.AS_FOUND_FLAG,
        functions=functions,
        settings=pprint.pformat(settings, sort_dicts=False),
    )
    return head + _body() + tail


def inputs_bytes(encoded_args, encoded_kwargs) -> bytes:
    """The operator's ``op_check.encode``d arguments as one ``torch.save`` file's bytes."""
    import torch

    buffer = io.BytesIO()
    torch.save({"args": encoded_args, "kwargs": encoded_kwargs}, buffer)
    return buffer.getvalue()


def write(
    folder: Path,
    name: str,
    settings: dict,
    encoded_args,
    encoded_kwargs,
    sweep_id: str | None = None,
) -> Path:
    """Store the script as ``<folder>/<name>.py`` and its inputs as
    ``<folder>/inputs/<sha256>.pt`` (once: the same inputs are the same file); ``settings`` gets
    ``inputs_sha256``. Returns the script's path."""
    data = inputs_bytes(encoded_args, encoded_kwargs)
    sha = hashlib.sha256(data).hexdigest()
    inputs = Path(folder) / INPUTS / f"{sha}.pt"
    if not inputs.exists():
        fileio.atomic_write_bytes(inputs, data)
    settings["inputs_sha256"] = sha
    path = Path(folder) / f"{name}.py"
    fileio.atomic_write_bytes(path, script(settings, sweep_id).encode(), mode=0o755)
    return path
