"""The Jupyter kernel every notebook run of ours uses: ipc transport, its exit status kept, and
always shut down.

Why ipc: several probes run at once on one host, and TCP kernels pick ports that can collide
between processes; ipc sockets are files in a private folder. Why shut it down ourselves: nbclient
leaves running a kernel it was handed (``km=``). Why remember the exit status: a kernel that dies
(segfault, OOM kill, a model's code calling SIGKILL) is only known to nbclient as "dead"; the
record should say which signal. Why a provisioner of our own: where a warm zygote answers
(``engine.zygote``), the kernel is a fork of it, not a fresh Python importing torch again.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import tempfile
import uuid

from jupyter_client.manager import AsyncKernelManager
from jupyter_client.provisioning.local_provisioner import LocalProvisioner

from . import zygote


class ForkingProvisioner(LocalProvisioner):
    """The local provisioner, but the kernel is forked by this process's zygote when one answers
    and its environment allows (``zygote.fork_kernel``); otherwise launched as the local
    provisioner does."""

    async def launch_kernel(self, cmd: list[str], **kwargs):
        env = dict(os.environ if kwargs.get("env") is None else kwargs["env"])
        if not kwargs.get("independent"):
            # as jupyter_client's launcher sets it (no banner, no orphan)
            env["JPY_PARENT_PID"] = str(os.getpid())
        forked = zygote.fork_kernel(
            cmd, env, kwargs.get("cwd"), kwargs.get("stdout"), kwargs.get("stderr")
        )
        if forked is None:
            return await super().launch_kernel(cmd, **kwargs)
        self.process = forked  # type: ignore[assignment]  # a Popen in all the provisioner uses of it
        self.pid = self.pgid = forked.pid  # it calls setsid: its own group
        self.cwd = kwargs.get("cwd", pathlib.Path.cwd())
        return self.connection_info


class RecordingKernelManager(AsyncKernelManager):
    """Remembers the kernel's exit status when it is found dead."""

    exit_status: int | None = None
    #: The kernel was forked by a zygote that ended under it (so it died too): nothing the model
    #: did.
    harness_lost: bool = False

    async def _async_is_alive(self):
        alive = await super()._async_is_alive()
        process = getattr(self.provisioner, "process", None) if self.provisioner else None
        if not alive and process is not None and self.exit_status is None:
            self.exit_status = process.poll()
            self.harness_lost = getattr(process, "lost", False)
        return alive

    is_alive = _async_is_alive  # the kernel client calls the private name, nbclient the public one

    async def _async_pre_start_kernel(self, **kw):
        named = (
            (self.kernel_spec.metadata or {}).get("kernel_provisioner")
            if self.kernel_spec
            else None
        )
        if self.provisioner is None and not named:  # ours in place of the default local one
            self.kernel_id = self.kernel_id or kw.pop("kernel_id", str(uuid.uuid4()))
            self.provisioner = ForkingProvisioner(
                kernel_id=self.kernel_id, kernel_spec=self.kernel_spec, parent=self
            )
        return await super()._async_pre_start_kernel(**kw)


def _shutdown(km: AsyncKernelManager) -> None:
    from jupyter_core.utils import run_sync

    async def stop():
        if km.has_kernel and await km.is_alive():
            await km.shutdown_kernel(now=True)

    run_sync(stop)()


@contextlib.contextmanager
def ipc_kernel(kernel_name: str = "python3"):
    """A kernel manager to pass to ``papermill.execute_notebook(km=...)``; shut down on exit."""
    # ipc socket paths must stay short (< 108 bytes)
    ipc_dir = tempfile.mkdtemp(prefix="k", dir="/tmp")
    km = RecordingKernelManager(
        kernel_name=kernel_name, transport="ipc", ip=os.path.join(ipc_dir, "s")
    )
    try:
        yield km
    finally:
        _shutdown(km)
        shutil.rmtree(ipc_dir, ignore_errors=True)
