"""Many models: the sweep definition, the runner, the worker process, the device scheduler, disk
room."""
