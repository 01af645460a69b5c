"""The worker: the process that runs one probe notebook, its Jupyter kernel, and the one
papermill-over-ipc runner that the sweep, the report and the debug command all use."""
