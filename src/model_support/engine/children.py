"""Child processes, done one way everywhere: a child that dies with its parent, a process tree ended
whole, and a short-lived child whose answer is the JSON on its last line of output.

Why one module: every process the package starts (probe processes, kernels forked by the zygote, the
zygote, a sharded run's launcher and ranks, the short-lived children that ask a device for its
facts, a stack for its coverage or the CPU reference for a dead probe's attribution) must leave
nothing behind and, when it does not answer, say so in one sentence. Written three times, the copies
drifted: one killed only the direct child on a timeout (a grandchild kept the pipes open and the
caller waiting), one listed the tree after killing its root (the orphans were already re-parented
and missed), and each child worded its timeout its own way.

Stdlib only at import (psutil when a tree is killed): the zygote imports this before it forks its
kernels.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from typing import Any

#: ``prctl`` option: the signal this process gets when its parent ends (Linux).
_PR_SET_PDEATHSIG = 1
#: The Python a sweep's probe processes (and their zygote) run: set while a stack of other package
#: versions runs (a sweep's ``stacks:`` entry with ``packages``: its overlay environment's
#: interpreter, built by ``bisect.envs``).
PYTHON_VAR = "MODEL_SUPPORT_PROBE_PYTHON"


def interpreter(environ: Mapping[str, str] | None = None) -> str:
    """The interpreter a probe's processes run: ``PYTHON_VAR`` in ``environ`` (default: this
    process's), else this process's own."""
    import sys

    return (os.environ if environ is None else environ).get(PYTHON_VAR) or sys.executable


def die_with_parent() -> None:
    """Linux: SIGKILL this process when the process that started it ends, so that a killed runner
    (SIGKILL, an out-of-memory kill) leaves no probe, kernel or rank running on its own. Call it
    first thing in the child, not as a ``preexec_fn`` (between fork and exec it can deadlock when
    the parent has other threads holding locks); elsewhere (no libc, not Linux) nothing happens."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def kill_tree(
    root: subprocess.Popen | int, also: Iterable[Any] = (), reap: bool = True, wait_s: float = 30.0
) -> None:
    """SIGKILL ``root`` (a ``Popen`` or a pid), every process under it, ``also`` (more
    ``psutil.Process`` of the same job that may have left the tree: a sharded run's ranks) and
    the process group of each of them that leads one (what they started in their own group goes
    with them); then, with ``reap``, wait until they are gone.

    The tree is listed before anything is killed: a process whose parent was killed first is
    re-parented and no longer found under ``root``. ``reap`` False for a caller that reaps its
    children itself (the zygote collects each kernel's exit status with ``waitpid``): nothing is
    waited for. A ``Popen`` already reaped has no tree left to find (its pid may be another
    process's now): only ``also`` is killed."""
    import psutil

    reaped = isinstance(root, subprocess.Popen) and root.returncode is not None
    pid = root.pid if isinstance(root, subprocess.Popen) else root
    victims: dict[int, Any] = {}
    if not reaped:
        with contextlib.suppress(psutil.NoSuchProcess):
            top = psutil.Process(pid)
            victims = {p.pid: p for p in [top, *top.children(recursive=True)]}
    for proc in also:
        victims.setdefault(proc.pid, proc)
    ours = os.getpgrp()
    for victim_pid, victim in victims.items():
        with contextlib.suppress(OSError):
            # it leads a group: whatever it started there too
            if os.getpgid(victim_pid) == victim_pid != ours:
                os.killpg(victim_pid, signal.SIGKILL)
        with contextlib.suppress(psutil.NoSuchProcess):
            victim.kill()
    if not reap:
        return
    if isinstance(root, subprocess.Popen):
        root.wait()
    _wait_gone([v for p, v in victims.items() if p != pid], wait_s)


def _wait_gone(procs: list[Any], wait_s: float) -> None:
    """Until every one of ``procs`` has ended (a zombie has: its memory and devices are given
    back), at most ``wait_s`` seconds. Not ``psutil.wait_procs``: a process that is not our child
    stays a zombie until its new parent reaps it, and a container whose first process reaps
    nothing would keep every caller waiting its whole timeout."""
    import psutil

    deadline = time.monotonic() + wait_s
    while procs and time.monotonic() < deadline:
        alive = []
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                if proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
        procs = alive
        if procs:
            time.sleep(0.02)


class ChildFailed(Exception):
    """A short-lived child gave no answer: it did not answer in time (``timed_out``: its process
    group was killed), or it ended without a JSON last line. ``str()`` is one sentence naming
    what failed and why, for the caller to put in its own (a device's problem, a ``UserError``, a
    record's note)."""

    def __init__(self, sentence: str, timed_out: bool = False):
        super().__init__(sentence)
        self.timed_out = timed_out


def _exit_words(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


def last_json(
    argv: list[str],
    what: str,
    timeout_s: float,
    *,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> Any:
    """Run ``argv`` (with ``input`` on its stdin) and return its last line of stdout read as
    JSON: the protocol of every short-lived child the package asks something of (its imports and
    warnings may print before).

    The child runs in a process group of its own, ended as a whole once it answered or ran past
    ``timeout_s``: a process it started cannot outlive it nor keep its pipes (and so the caller)
    waiting. ``ChildFailed`` when it gives no answer: "``what`` did not answer within N s" on a
    timeout, else its last line of stderr (or how it exited)."""
    with subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=None if env is None else dict(env),
        cwd=cwd,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            # its pipes closed with it (or are left open)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=5)
            raise ChildFailed(
                f"{what} did not answer within {timeout_s:g} s", timed_out=True
            ) from None
        finally:
            _end_group(proc.pid)
    lines = out.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        said = (
            err.strip().splitlines() or [f"{what} wrote no answer ({_exit_words(proc.returncode)})"]
        )[-1]
        raise ChildFailed(said.strip()[:500]) from None


def _end_group(pgid: int) -> None:
    """What is left of a child's own process group once it answered (or was killed)."""
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)
