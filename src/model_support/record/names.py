"""Identifiers that become paths: checked to be plain names, and model ids mapped to file names one
to one.

Why: a sweep id comes from the command line, from ``sweep.json`` and from records, and a model id
from a sweep definition; each becomes part of a path under the data folder. An id such as
``../../elsewhere`` would make the tool write outside it, and a mapping that is not one to one
(``tiny+opt`` and ``tiny_opt`` both ``tiny_opt``) would make two models share one record file, one
overwriting the other or resume skipping one.
"""

from __future__ import annotations

import hashlib
import re

from ..errors import UserError

#: A model id whose legacy file name (``safe_name``) can be read back to it alone: a Hub id
#: (``org/name`` or ``name``) or a local model (``local:name``), each part starting and ending with
#: a letter or digit. Those keep the names they always had; every other id gets its legacy name plus
#: ``~`` and a hash of the id (``~`` never appears in the first kind), so no two ids share a name.
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9.-]|_(?!_))*(?<![_.])"
_PLAIN_ID = re.compile(rf"(?:local:)?{_PART}(?:/{_PART})?")
_MAX = 100


def check_name(value: object, what: str, where: str) -> str:
    """``value`` when it is a plain name (a single path component: no separator, not ``.`` or
    ``..``, no NUL, not empty, at most 200 characters); else one sentence naming ``what`` and
    ``where`` it came from."""
    text = value if isinstance(value, str) else ""
    if (
        not text
        or text in (".", "..")
        or "/" in text
        or "\\" in text
        or "\0" in text
        or len(text) > 200
        or text != text.strip()
    ):
        raise UserError(
            f"{where}: {what} {value!r} is not a plain name (no '/', no '..', not empty, not "
            "absolute); refused before any path is built from it: give the id as "
            "`model-support list` shows it."
        )
    return text


#: A plain word: what a sweep's name must be so that its id (``<name>-<time>-<hex>``) and folder
#: carry it as written (``latest:NAME`` finds it, the reports show it): letters, digits, ``.``,
#: ``_`` and ``-``, a letter or digit first.
PLAIN_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def is_plain_word(text: object) -> bool:
    """Whether ``text`` is a ``PLAIN_WORD`` (at most 100 characters)."""
    return isinstance(text, str) and PLAIN_WORD.fullmatch(text) is not None


def safe_name(text: str) -> str:
    """Text as a file name (one folder/file per sanitized id, as lm-eval does): a sweep's name in
    its id, a variant in a record's name, and the name a model's record had before names were one
    to one (``legacy_name``), still read."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", text.strip("/").replace("/", "__"))
    if len(name) > 120:
        name = name[:100] + "-" + hashlib.sha1(text.encode()).hexdigest()[:10]
    return name


def model_file_name(model_id: str) -> str:
    """The file name of a model's record, notebook and log: one to one with the id. A Hub or
    local id of the plain kind keeps its legacy name (``org__model``, ``local_tiny-opt``); any
    other gets the legacy name shortened, ``~`` and 16 hex characters of the id's SHA-256."""
    if (
        len(model_id) <= _MAX
        and _PLAIN_ID.fullmatch(model_id)
        and not model_id.startswith("local_")
    ):
        return safe_name(model_id)
    digest = hashlib.sha256(model_id.encode()).hexdigest()[:16]
    return f"{safe_name(model_id)[:80]}~{digest}"


#: The file name this tool gave a model id before names were one to one: ``safe_name`` itself.
legacy_name = safe_name
