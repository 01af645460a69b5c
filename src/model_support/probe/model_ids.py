"""Model ids as records show them: a Hub id as it is, a local folder as ``local:<folder name>``.

A local folder's absolute path names a machine, not a model, so it never becomes a record's
``model_id`` (nor lands in Parquet, a report or the explorer); the sweep keeps the path in
``sweep.json`` to load from, and a record's repro script takes it as an argument.
"""

from __future__ import annotations

from pathlib import Path

from .hub_fetch import is_local

LOCAL_PREFIX = "local:"


def portable_id(source: str) -> str:
    """What a record calls the model loaded from ``source``."""
    if source.startswith(LOCAL_PREFIX) or not is_local(source):
        return source
    return LOCAL_PREFIX + Path(source).expanduser().resolve().name


def display_name(model_id: str) -> str:
    """``local:tiny-llama`` -> ``tiny-llama``; a Hub id as it is."""
    return model_id.removeprefix(LOCAL_PREFIX)


def machine_paths(source: str) -> dict[str, str]:
    """A local model folder's paths (as given and resolved) -> its portable id, for scrubbing."""
    if portable_id(source) == source:
        return {}
    return {str(Path(source).expanduser().resolve()): portable_id(source), source: portable_id(source)}
