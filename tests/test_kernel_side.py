"""The kernel's side of a notebook run (engine.kernel_side): the stack frozen out of the collector's
sight, and a kernel that ends at once when shut down, its exit handlers run, its status 0.

Real kernels started as papermill's command starts them (jupyter_client's own kernel manager, no
engine of ours).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import run_sync

#: An object freed only when the interpreter tears itself down, which then takes 3 s more.
SLOW_FINALIZATION = (
    "import builtins, time\n"
    "class Slow:\n"
    # bound now: IPython's reset empties the namespace at exit
    "    def __del__(self, sleep=time.sleep):\n"
    "        sleep(3)\n"
    "builtins._slow_to_free = Slow()\n"
)


def _run_then_shut_down(tmp_path: Path, code: str) -> tuple[float, int | None]:
    """Start a kernel as papermill does, run ``code``, shut it down as papermill does (a shutdown
    request): (seconds from the request until the process was gone, its exit status)."""

    async def run():
        km = AsyncKernelManager(kernel_name="python3")
        await km.start_kernel(cwd=str(tmp_path))
        client = km.client()
        client.start_channels()
        try:
            await client.wait_for_ready(timeout=120)
            reply = await client.execute_interactive(
                code, timeout=120, output_hook=lambda msg: None
            )
            assert reply["content"]["status"] == "ok", reply["content"]
        finally:
            client.stop_channels()
        process = km.provisioner.process
        started = time.perf_counter()
        await km.shutdown_kernel(now=False)
        return time.perf_counter() - started, process.wait(timeout=30)

    return run_sync(run)()


def test_a_shut_down_kernel_ends_at_once_after_its_exit_handlers(tmp_path):
    ran = tmp_path / "exit-handler-ran"
    code = (
        f"import atexit, pathlib, tempfile\n{SLOW_FINALIZATION}"
        f"atexit.register(pathlib.Path({str(ran)!r}).write_text, 'yes')\n"
        # removed by weakref.finalize's exit handler
        "kept = tempfile.TemporaryDirectory(dir='.')\n"
        "from model_support.engine import kernel_side\n"
        # twice: armed once
        "assert kernel_side.exit_at_shutdown() and kernel_side.exit_at_shutdown()\n"
    )
    took, status = _run_then_shut_down(tmp_path, code)
    assert status == 0  # not jupyter_client's SIGTERM, sent after 2.5 s (below)
    assert ran.read_text() == "yes"  # the exit handlers ran as always
    assert [p.name for p in tmp_path.iterdir()] == [ran.name]  # the temporary folder too
    assert took < 2.0, f"{took:.2f} s: the interpreter's finalization was not skipped"


def test_a_kernel_not_armed_tears_itself_down(tmp_path):
    """The same kernel without ``exit_at_shutdown``: its finalization runs, as before, until
    jupyter_client loses patience (half its 5 s ``shutdown_wait_time``) and terminates it."""
    took, status = _run_then_shut_down(tmp_path, SLOW_FINALIZATION)
    assert took >= 2.5 and status in (-15, -9)


def test_outside_a_kernel_nothing_is_armed():
    from model_support.engine import kernel_side

    assert kernel_side.exit_at_shutdown() is False  # no IPython kernel in pytest's process


def test_preload_imports_the_stack_and_freezes_it():
    script = (
        "import gc, sys\n"
        "from model_support.engine import kernel_side\n"
        "kernel_side.preload()\n"
        "assert 'transformers' in sys.modules and 'torch._dynamo' in sys.modules\n"
        "assert gc.get_freeze_count() > 100_000, gc.get_freeze_count()\n"
        # nothing of the stack's is garbage, and a collection no longer walks it
        "assert gc.collect() == 0\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
