"""Execute one of the package's notebooks with papermill over an ipc-transport kernel.

The sweep's probe processes, the report and the debug command all run their notebooks through
``run_notebook``, so every notebook run of ours uses the same kernel set-up (``kernels.ipc_kernel``)
and the same papermill options. A cell that raises makes papermill raise
``PapermillExecutionError``; the executed notebook is still written and shows the error.
"""

from __future__ import annotations

from pathlib import Path

from .kernels import ipc_kernel


def run_notebook(
    notebook: Path | str,
    out: Path | str,
    parameters: dict,
    *,
    timeout: float | None = None,
    km=None,
    log_output: bool = False,
    kernel_name: str = "python3",
) -> Path:
    """Execute ``notebook`` into ``out`` with ``parameters``; ``km`` is a started-or-not kernel
    manager to use (a warm one), else a fresh ipc kernel is started and shut down here."""
    import papermill

    if km is None:
        with ipc_kernel(kernel_name) as fresh:
            return run_notebook(
                notebook,
                out,
                parameters,
                timeout=timeout,
                km=fresh,
                log_output=log_output,
                kernel_name=kernel_name,
            )
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    papermill.execute_notebook(
        str(notebook),
        str(out),
        parameters=parameters,
        kernel_name=kernel_name,
        progress_bar=False,
        log_output=log_output,
        execution_timeout=timeout,
        km=km,
    )
    return Path(out)
