"""Model ids as records show them: a Hub id as it is, a local folder as ``local:<folder name>``.

A local folder's absolute path names a machine, not a model, so it never becomes a record's
``model_id`` (nor lands in Parquet, a report or the explorer); the sweep keeps the path in
``sweep.json`` to load from, and a record's repro script takes it as an argument.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from ..errors import UserError
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


class ModelUnavailable(UserError):
    """The model asked for is not there: no such local folder, or a Hub id the Hub did not give (not on it,
    no access, unreachable). The user's to fix, not the model's verdict: no record is made."""


def check_there(model_id: str) -> None:
    """A local path that is no folder here is a typo or a missing download, refused in one sentence
    naming the closest folder beside it; a Hub id is checked when it is fetched (``unavailable``)."""
    if not is_local(model_id):
        return
    folder = Path(model_id).expanduser()
    if folder.is_dir():
        return
    parent = folder.parent
    near = difflib.get_close_matches(folder.name, [p.name for p in parent.iterdir()] if parent.is_dir() else [], 1)
    hint = f"did you mean {str(parent / near[0])!r}?" if near else "check the path, or give a Hub id (org/name)."
    raise ModelUnavailable(f"model_id {model_id!r} is no folder on this machine: {hint}")


def unavailable(model_id: str, problem: Exception) -> ModelUnavailable:
    """A Hub model the Hub did not give (``hub_fetch``'s NotOnHub, NoAccess, EnvironmentProblem) as one
    sentence: what was asked, what the Hub said, what to do."""
    said = str(problem).rstrip(".")
    kind = str(getattr(problem, "kind", ""))  # EnvironmentProblem's: network or disk
    todo = {
        "network": "check the network (HF_ENDPOINT, HF_HUB_OFFLINE, a proxy) and run the probe again",
        "disk": "make room on the Hub cache's disk (HF_HUB_CACHE) and run the probe again",
    }.get(kind, "check the id and HF_TOKEN, or give a local folder")
    return ModelUnavailable(f"model_id {model_id!r} could not be fetched: {said}; {todo}.")
