"""One step of the bisect: a row's repro script run in an overlay environment, in its own process
group, timed alone and ended with every process it started when it runs out of time; what it
said, as a verdict or why none."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

from .. import backend_env

# what a step tells its repro script: keep the settings
from ..probe.reproduce import KEEP_CONFIG_VAR
from ..record import schema

#: A traceback's last line: the exception that stopped a script ("ImportError: ...").
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*")


def _end_group(proc: subprocess.Popen) -> None:
    """End every process left in a step's group (it runs in a group of its own): what the script
    started dies with it, on a timeout and after a normal exit alike."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def why_no_verdict(stderr: str, returncode: int) -> str:
    """The words of a script that printed no verdict: its exception's line where it has one, else
    its last two lines."""
    lines = [line.strip() for line in (stderr or "").splitlines() if line.strip()]
    said = next((line for line in reversed(lines) if _EXCEPTION_LINE.match(line)), None)
    return f"exit status {returncode}: {(said or ' '.join(lines[-2:]))[:400]}"


def step_env(settings: dict[str, str] | None, names: set[str]) -> dict[str, str] | None:
    """The environment of a step standing for an end whose backend configuration is ``settings``
    (of the setting ``names`` either end has): those set, the others unset, the script told to
    keep them. None: this process's environment as it is (no configuration recorded)."""
    if settings is None:
        return None
    # no backend's own variables
    env = {k: v for k, v in backend_env.child_environ().items() if k not in names}
    return {**env, **settings, KEEP_CONFIG_VAR: "1"}


def run_repro(
    python: Path,
    script: Path,
    args: list[str],
    timeout_s: float,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> tuple[str | None, str | None, dict]:
    """(verdict, note, its JSON line) of one run of a repro script, in a process group of its
    own: the status of its JSON line; a timeout (the whole group ended) or a killed process is
    FAIL(other), as the sweep records them; no JSON line is no verdict (note: why). The line
    holds the script's ``perf`` timing where asked ({} where it printed none). ``env``: the
    step's environment (``step_env``), else this one's."""
    with subprocess.Popen(
        [str(python), str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=env,
        start_new_session=True,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _end_group(proc)
            try:
                # a process that left the group may still hold the pipes
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            return schema.FAIL_OTHER, f"timed out after {timeout_s:.0f} s", {}
        finally:
            _end_group(proc)
    for line in reversed(stdout.splitlines()):
        try:
            said = json.loads(line)
        except ValueError:
            continue
        if isinstance(said, dict) and said.get("status") in schema.VERDICTS:
            return said["status"], said.get("error_type"), said
    if proc.returncode < 0:
        return schema.FAIL_OTHER, f"killed by signal {-proc.returncode}", {}
    return None, why_no_verdict(stderr, proc.returncode), {}
