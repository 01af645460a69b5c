"""The kernel's side of a notebook run: the stack imported once and kept out of the collector's
sight, and a process that ends at once when its client shuts it down.

Why (``bench/results/cold_command.json``, a cold ``papermill notebooks/probe.ipynb`` on tiny-llama):
a kernel that has imported torch and transformers holds ~360,000 objects that live as long as it
does, and every full garbage collection walks them all, 0.4 s each on this machine: the probe's host
checks collect twice to free the device's model, IPython's clean-up at exit once more. And after
papermill's shutdown request such a kernel took 1.2 to 2.6 s to end, the interpreter tearing down
every module and object while papermill waits, often until jupyter_client gave up (half its 5 s
``shutdown_wait_time``) and sent SIGTERM. Neither is the probe's work.

- ``preload``: import what every probe imports (``STACK``, nothing device-bound: call it after the
  device's environment is set), then ``gc.freeze()``: what exists now is never collected (it never
  was: modules, classes, the libraries' tables), so a collection walks only what came after (a
  model, its tensors, their cycles). The zygote (``engine.zygote``) does the same before it forks,
  so a forked kernel inherits both.
- ``exit_at_shutdown``: when the kernel is shut down (a shutdown request, not a restart), the
  process ends with ``os._exit(0)``, the status of a kernel that completes its shutdown, after every
  exit handler has run as always (IPython's history, logging's flush, torch's, temporary folders)
  and its standard streams are flushed: only the interpreter's finalization is skipped, which
  nothing of a finished notebook needs (its outputs and record are written). Any other end (a crash,
  ``sys.exit`` in a cell, a restart) is left as it was. The sweep's kernels are killed at once
  (``kernels._shutdown``); this serves a notebook run by hand or by papermill's command.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys

#: What every probe imports, nothing device-bound (a device's backend is loaded by its adapter,
#: after).
STACK = (
    "import torch, torch._dynamo, torch.distributed.tensor\n"
    "import transformers\n"
    "from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer\n"
)
#: Set on the kernel once armed (arming twice wraps once).
ARMED = "_model_support_exit_at_shutdown"


def prepare(shell=None) -> None:
    """Both, in a probe's kernel: the stack imported and frozen (``preload``), the exit armed
    (``exit_at_shutdown``)."""
    preload()
    exit_at_shutdown(shell)


def preload(code: str = STACK) -> None:
    """Import ``code`` (``STACK``: torch and transformers), then freeze the heap out of the
    collector's sight."""
    exec(compile(code, "<preload>", "exec"), {})  # noqa: S102 a fixed string of ours
    gc.freeze()


def exit_at_shutdown(shell=None) -> bool:
    """In a Jupyter kernel (``shell``: its IPython shell, else the running one), end the process
    at once when the kernel is shut down; False where there is no kernel (plain Python, a
    terminal IPython)."""
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    if kernel is None or not hasattr(kernel, "do_shutdown"):
        return False
    if getattr(kernel, ARMED, False):
        return True
    do_shutdown = kernel.do_shutdown

    def shutting_down(restart):
        if not restart:
            atexit.register(exit_now)  # registered last: runs first, and runs the others itself
        # its reply as it was (a dict, or an awaitable in a newer ipykernel)
        return do_shutdown(restart)

    kernel.do_shutdown = shutting_down
    setattr(kernel, ARMED, True)
    return True


def exit_now() -> None:
    """Run the other exit handlers, flush the standard streams, end the process with status 0."""
    gc.freeze()  # IPython's reset at exit collects: nothing left to free in a process that ends now
    # a handler stays listed once called: off it, or it would call itself again
    atexit.unregister(exit_now)
    # the rest, as the interpreter would run them (one registered after this one,
    atexit._run_exitfuncs()
    # while the kernel shut down, has run already and runs again: ipykernel registers none there)
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001,S110 a stream already closed has nothing left to flush
            pass
    os._exit(0)
