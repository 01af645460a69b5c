"""What ``model-support localise`` found for a sweep's models, read back for the porting plan.

``localise`` keeps one answer per (model, variant) in the sweep's own folder,
``sweeps/<id>/localised/<model>.json`` (written atomically; the verdict records are never touched):
the first wrong operator (``operator`` and ``overload``, null when none is wrong), every operator it
flagged (``wrong_ops``, the first ``MAX_LISTED``) and its proof's chain (``proof.chain``: the wrong
operators found one after another with those before on the host). The plan reads them from there:
the sweep's own data, no adapter's knowledge of its faults. A wrong operator is named as the census
names it (``aten::rsqrt``; ``aten::add.Tensor`` for another overload than the default), so a
localised operator and a census entry are one name. A pulled dataset has no sweep folder: nothing is
localised.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..record import schema, store

#: The first wrong operator's overload name when it is the default one (``aten::rsqrt``, not
#: ``aten::rsqrt.default``).
DEFAULT_OVERLOAD = "default"


def folder(data_dir, sweep_id: str) -> Path:
    """A sweep's ``localised/`` folder."""
    return store.sweep_dir(data_dir, sweep_id) / store.LOCALISED


def stored(data_dir, sweep_id: str, model_id: str, variant: str | None = None) -> dict | None:
    """One (model, variant)'s stored answer in a sweep, or None."""
    return _read(folder(data_dir, sweep_id) / f"{store.stem(model_id, variant)}.json")


def answers(data_dir, sweep_id: str) -> dict[str, dict]:
    """Every stored answer of a sweep, by the plan's model key (``store.pending_key``: the model
    id, plus `` [variant]`` for any variant but the default), the folder listed once; {} where
    there is none. An answer made on another stack than the sweep's (its ``stack_note``) is none
    of the sweep's: its wrong operator may be right on the sweep's stack."""
    where = folder(data_dir, sweep_id)
    found: dict[str, dict] = {}
    for path in sorted(where.glob("*.json")) if where.is_dir() else []:
        answer = _read(path)
        if answer and answer.get("model_id") and not answer.get("stack_note"):
            found[store.pending_key(answer["model_id"], answer.get("variant"))] = answer
    return found


def _read(path: Path) -> dict | None:
    try:
        answer = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return answer if isinstance(answer, dict) else None


def op_name(operator: str, overload: str | None) -> str:
    """An operator of an answer as the census names it: ``aten::rsqrt``, ``aten::add.Tensor``."""
    return operator if overload in (None, "", DEFAULT_OVERLOAD) else f"{operator}.{overload}"


def wrong_ops(answer: dict) -> list[str]:
    """The operators an answer found wrong, each once, the first wrong one first, then its
    proof's chain (each operator found wrong with the ones before it on the host: a second wrong
    operator the listed first ``MAX_LISTED`` flags may not reach), then the rest ([] when none
    is)."""
    chain = (answer.get("proof") or {}).get("chain") or []
    entries = [*chain, *(answer.get("wrong_ops") or [])]
    if answer.get("operator"):
        entries = [{"operator": answer["operator"], "overload": answer.get("overload")}, *entries]
    names = (
        op_name(e["operator"], e.get("overload"))
        for e in entries
        if isinstance(e, dict) and e.get("operator")
    )
    return list(dict.fromkeys(names))


def command(sweep_id: str | None, model_id: str, variant: str | None) -> str:
    """The command that localises a (model, variant) of a sweep."""
    tail = "" if variant in (None, schema.DEFAULT_VARIANT) else f" --variant {variant}"
    return f"model-support localise {sweep_id or 'SWEEP'} {model_id}{tail}"
