"""The probe kernel's side of the device gate (``sweep.worker.device_gate``): its devices' pinning,
set at the grant.

A sweep hands a gated probe process its model before its devices are granted; the process's kernel
was started, warm, before anyone knew which devices it would get. ``apply`` (called by
``devices.prepare_environment``, the notebook's first call, after the grant and before any backend
is loaded) sets the granted devices' pinning variables in the kernel from the grant file the runner
wrote. Outside a gated sweep (a single papermill run, a notebook rerun in JupyterLab) it does
nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

#: The gated probe process's work folder, where the runner writes ``grant.json`` at the grant.
GATE_VAR = "MODEL_SUPPORT_DEVICE_GATE"
GRANT_FILE = "grant.json"


def apply() -> dict:
    """The granted devices' pinning variables, set in this process (and returned); {} when not
    gated."""
    folder = os.environ.pop(GATE_VAR, None)
    grant = Path(folder) / GRANT_FILE if folder else None
    if grant is None or not grant.exists():
        return {}
    env = json.loads(grant.read_text())["env"]
    os.environ.update(env)
    return env
