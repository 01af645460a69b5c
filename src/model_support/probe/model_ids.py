"""Model ids as records show them: a Hub id as it is, a local folder as ``local:<folder name>``.

A local folder's absolute path names a machine, not a model, so it never becomes a record's
``model_id`` (nor lands in Parquet, a report or the explorer); the sweep keeps the path in
``sweep.json`` to load from, and a record's repro script takes it as an argument.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from ..errors import UserError
from ..record.names import model_file_name, safe_name
from .hub_fetch import is_local

LOCAL_PREFIX = "local:"
#: How many ids a sentence of ``resolve`` lists before "and N more".
_MAX_LISTED = 12


def portable_id(source: str) -> str:
    """What a record calls the model loaded from ``source``."""
    if source.startswith(LOCAL_PREFIX) or not is_local(source):
        return source
    return LOCAL_PREFIX + Path(source).expanduser().resolve().name


def display_name(model_id: str) -> str:
    """``local:tiny-llama`` -> ``tiny-llama``; a Hub id as it is."""
    return model_id.removeprefix(LOCAL_PREFIX)


def _exact_names(model_id: str) -> tuple[tuple[str, ...], ...]:
    """The names that name ``model_id`` exactly, strongest first: the id itself (and its file
    names), then its display name (``local:tiny-gemma`` -> ``tiny-gemma``) or the name after a
    Hub id's organisation (``org/gpt2`` -> ``gpt2``)."""
    shown = display_name(model_id)
    # the display name and the name after the organisation are one tier: ``tiny-gemma`` names
    # ``org/tiny-gemma`` as exactly as ``local:tiny-gemma`` (review: the display name had won
    # without a word)
    return (model_id, safe_name(model_id), model_file_name(model_id)), (
        shown,
        shown.rsplit("/", 1)[-1],
    )


def _listing(ids: list[str]) -> str:
    more = len(ids) - _MAX_LISTED
    return ", ".join(ids[:_MAX_LISTED]) + (f" and {more} more" if more > 0 else "")


def resolve(ids: list[str], model: str, where: str) -> str:
    """The one of ``ids`` that ``model`` names, as every command taking a MODEL argument reads
    it: an exact name first (``_exact_names``: the id or its file name, then its display name or
    the name after its organisation; as typed, then ignoring case), else a fragment of the id or
    its file name that matches exactly one id (ignoring case). So ``tiny-gemma`` is
    ``local:tiny-gemma`` even beside ``local:tiny-gemma3``. A UserError otherwise, naming
    ``where`` the ids are from: the ids it matches, or, matching none, the closest ids (else them
    all, up to a dozen)."""
    names = {model_id: _exact_names(model_id) for model_id in ids}
    for fold in (str, str.lower):
        for tier in range(2):
            exact = [i for i in ids if fold(model) in {fold(name) for name in names[i][tier]}]
            if len(exact) == 1:
                return exact[0]
            if exact:
                raise UserError(
                    f"{model!r} is the name of {len(exact)} models of {where}; give the whole "
                    f"id: {_listing(exact)}."
                )
    needle = model.lower()
    matches = [i for i in ids if needle and (needle in i.lower() or needle in safe_name(i).lower())]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise UserError(
            f"{model!r} matches {len(matches)} models of {where}, give more of the id: "
            f"{_listing(matches)}."
        )
    close = difflib.get_close_matches(model, ids, n=3, cutoff=0.4)
    if close:
        raise UserError(
            f"No model of {where} matches {model!r}; did you mean {' or '.join(close)}?"
        )
    raise UserError(
        f"No model of {where} matches {model!r}; candidates: {_listing(ids) or 'none'}."
    )


def machine_paths(source: str) -> dict[str, str]:
    """A local model folder's paths (as given and resolved) -> its portable id, for scrubbing."""
    if portable_id(source) == source:
        return {}
    return {
        str(Path(source).expanduser().resolve()): portable_id(source),
        source: portable_id(source),
    }


class ModelUnavailable(UserError):
    """The model asked for is not there: no such local folder, or a Hub id the Hub did not give
    (not on it, no access, unreachable). The user's to fix, not the model's verdict: no record is
    made."""


def check_there(model_id: str) -> None:
    """A local path that is no folder here is a typo or a missing download, refused in one
    sentence naming the closest folder beside it; a Hub id is checked when it is fetched
    (``unavailable``)."""
    if not is_local(model_id):
        return
    folder = Path(model_id).expanduser()
    if folder.is_dir():
        return
    parent = folder.parent
    near = difflib.get_close_matches(
        folder.name, [p.name for p in parent.iterdir()] if parent.is_dir() else [], 1
    )
    hint = (
        f"did you mean {str(parent / near[0])!r}?"
        if near
        else "check the path, or give a Hub id (org/name)."
    )
    raise ModelUnavailable(f"model_id {model_id!r} is no folder on this machine: {hint}")


def unavailable(model_id: str, problem: Exception) -> ModelUnavailable:
    """A Hub model the Hub did not give (``hub_fetch``'s NotOnHub, NoAccess, EnvironmentProblem)
    as one sentence: what was asked, what the Hub said, what to do."""
    said = str(problem).rstrip(".")
    kind = str(getattr(problem, "kind", ""))  # EnvironmentProblem's: network or disk
    todo = {
        "network": "check the network (HF_ENDPOINT, HF_HUB_OFFLINE, a proxy) and run the probe again",
        "disk": "make room on the Hub cache's disk (HF_HUB_CACHE) and run the probe again",
    }.get(kind, "check the id and HF_TOKEN, or give a local folder")
    return ModelUnavailable(f"model_id {model_id!r} could not be fetched: {said}; {todo}.")
