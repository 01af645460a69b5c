"""The notebook engine: one notebook executed with papermill on a kernel that talks over IPC
sockets.

The bottom room that the sweep (one probe notebook per model), render (the report notebook) and
debug (the debug notebook) share; it knows nothing of models, records or sweeps.
"""
