"""Secrets out of everything written: Hugging Face tokens (their shape, and the values of the
token environment variables) and machine-specific strings, in every record, log, notebook and
file a push sends.

At the bottom of the package: the probe, the worker, the sweep and publishing all redact through
it."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, TypeVar, overload

#: A record (record.schema.Record) or any other dict of fields: redacted in place, the same object
#: back.
_Fields = TypeVar("_Fields", bound=Mapping[str, object])

#: Environment variables whose values are Hugging Face tokens (redacted wherever they appear).
TOKEN_ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN")


_HF_TOKEN = re.compile(r"hf_[A-Za-z0-9]{20,}")


#: Shorter env values are left alone: replacing e.g. "1" everywhere would wreck the text.
_MIN_SECRET_LEN = 8


@overload
def redact(text: str, replace: dict[str, str] | None = None) -> str: ...


@overload
def redact(text: None, replace: dict[str, str] | None = None) -> None: ...


def redact(text: str | None, replace: dict[str, str] | None = None) -> str | None:
    """Remove Hugging Face tokens from ``text``, for every stored text field and every log.

    Both the ``hf_...`` token shape and the literal values of the token environment variables (read
    at call time, so a token set after import is still caught) become ``***``. ``replace`` maps
    machine-specific strings (a local model folder's absolute path) to what the text says instead
    (longest first, so a path is replaced before a shorter prefix of it).
    """
    if not text:
        return text
    for old, new in sorted((replace or {}).items(), key=lambda kv: -len(kv[0])):
        if old:
            text = text.replace(old, new)
    for name in TOKEN_ENV_VARS:
        value = os.environ.get(name, "").strip()
        if len(value) >= _MIN_SECRET_LEN:
            text = text.replace(value, "***")
    return _HF_TOKEN.sub("***", text)


def redact_record(record: _Fields, replace: dict[str, str] | None = None) -> _Fields:
    """Every text field of a record (and every text of a list field) through ``redact`` (with
    ``replace``: machine-specific strings such as a local model folder's absolute path -> what
    the record says instead), in place (the one redaction pass a record gets before it is stored
    anywhere); returns it."""

    def clean(value):
        if isinstance(value, list):
            return [clean(item) for item in value]
        return redact(value, replace) if isinstance(value, str) else value

    fields: Any = record  # a TypedDict is a Mapping to the type checker, a dict at run time
    for key, value in record.items():
        fields[key] = clean(value)
    return record
