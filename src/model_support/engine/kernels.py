"""The Jupyter kernel every notebook run of ours uses: ipc transport, its exit status kept, and
always shut down.

Why ipc: several probes run at once on one host, and TCP kernels pick ports that can collide
between processes; ipc sockets are files in a private folder. Why shut it down ourselves: nbclient
leaves running a kernel it was handed (``km=``). Why remember the exit status: a kernel that dies
(segfault, OOM kill, a model's code calling SIGKILL) is only known to nbclient as "dead"; the
record should say which signal.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

from jupyter_client.manager import AsyncKernelManager


class RecordingKernelManager(AsyncKernelManager):
    """Remembers the kernel's exit status when it is found dead."""

    exit_status: int | None = None

    async def _async_is_alive(self):
        alive = await super()._async_is_alive()
        process = getattr(self.provisioner, "process", None) if self.provisioner else None
        if not alive and process is not None and self.exit_status is None:
            self.exit_status = process.poll()
        return alive

    is_alive = _async_is_alive  # the kernel client calls the private name, nbclient the public one


def _shutdown(km: AsyncKernelManager) -> None:
    from jupyter_core.utils import run_sync

    async def stop():
        if km.has_kernel and await km.is_alive():
            await km.shutdown_kernel(now=True)

    run_sync(stop)()


@contextlib.contextmanager
def ipc_kernel(kernel_name: str = "python3"):
    """A kernel manager to pass to ``papermill.execute_notebook(km=...)``; shut down on exit."""
    ipc_dir = tempfile.mkdtemp(prefix="k", dir="/tmp")  # ipc socket paths must stay short (< 108 bytes)
    km = RecordingKernelManager(kernel_name=kernel_name, transport="ipc", ip=os.path.join(ipc_dir, "s"))
    try:
        yield km
    finally:
        _shutdown(km)
        shutil.rmtree(ipc_dir, ignore_errors=True)
