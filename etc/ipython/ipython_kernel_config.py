# The Jupyter kernel's configuration for the project's venv: `make venv` copies this file to
# .venv/etc/ipython/, which IPython reads at every kernel start ({sys.prefix}/etc/ipython; tested in tests/test_quiet.py).
#
# It does one thing. A kernel started by a plain `papermill notebooks/probe.ipynb ...` (or by JupyterLab) talks
# over TCP on 127.0.0.1, jupyter_client's default, and ipykernel 7.4 then logs "Kernel is running over TCP without
# encryption ..." at every start. papermill reads no Jupyter configuration, so its kernel cannot be switched to ipc
# sockets from outside (model-support's own runs use ipc kernels: engine/kernels.py). This filter drops that one
# line from the kernel's log; every other line, warnings and errors included, is printed as before.
import logging


class NoTcpWarning(logging.Filter):
    def filter(self, record):
        return not record.getMessage().startswith("Kernel is running over TCP without encryption")


c.IPKernelApp.logging_config = {  # noqa: F821 - `c` is the config object IPython's loader provides
    "filters": {"no_tcp_warning": {"()": NoTcpWarning}},
    "handlers": {"console": {"filters": ["no_tcp_warning"]}},
}
