"""Failure signatures and secret redaction.

A failure signature groups failures by cause across models (docs/design.md, "Failure signatures"):
the error type plus the first line of the message, with the parts that change from one model or
run to the next (numbers, sizes, paths, URLs, hex addresses, request ids, repo ids, model types,
config classes, quoted names) replaced by placeholders. What names the cause (operator names such
as ``aten::xxx``, backends, memory spaces, option names, plain words) is kept, so that different
causes keep different signatures. Only the stdlib is used so the module loads anywhere.
"""

from __future__ import annotations

import os
import re

#: Signatures are grouping keys for tables and reports, so they stay short.
MAX_SIGNATURE_LEN = 160
#: Only this much of the first line is normalised: it bounds the regex work on huge messages,
#: and the tail would be cut anyway.
_MAX_INPUT_LEN = 1000

#: Environment variables whose values are Hugging Face tokens (redacted wherever they appear).
TOKEN_ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN")
_HF_TOKEN = re.compile(r"hf_[A-Za-z0-9]{20,}")
#: Shorter env values are left alone: replacing e.g. "1" everywhere would wreck the text.
_MIN_SECRET_LEN = 8

_TRAILING = ".,;:!?"

# Each rule is (pattern, replacement), applied in order: the wide matches (URLs, paths) come
# before the narrow ones (numbers) so that a URL is not first cut up into numbers.
_RULES: list[tuple[re.Pattern[str], object]] = [
    (re.compile(r"(?i)(request[ _-]?id\s*[:=]\s*)[^\s)]+"), r"\1<id>"),
    (re.compile(r"[a-z][a-z0-9+.-]*://[^\s'\"`<>()]+"), lambda m: _keep_tail(m, "<url>")),
    # <class 'transformers.models.t5.configuration_t5.T5Config'> -> T5Config (then <config>).
    (re.compile(r"<class '(?:[\w.]*\.)?(\w+)'>"), r"\1"),
    (re.compile(r"(?<![\w.:/<>-])(?:~|\.{1,2})?/[^\s'\"`<>()]+"), lambda m: _keep_tail(m, "<path>")),
    (re.compile(r"\b[A-Za-z]:\\[^\s'\"`<>()]+"), lambda m: _keep_tail(m, "<path>")),
    (re.compile(r"(?<![\w.:/<>-])(?:[\w.-]+/){2,}[\w.-]*[A-Za-z0-9]"), "<path>"),
    (re.compile(r"(?<![\w./:<>-])[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9](?![\w/])"), lambda m: _repo(m)),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"), "<hex>"),
    (re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b"), "<hex>"),
    (re.compile(r"(?i)(model[ _]type\s*:?\s*)`[^`\n]*`"), r"\1`<model_type>`"),
    (re.compile(r"\b[A-Z]\w*Config\b"), "<config>"),
    (re.compile(r"(?<!\w)(['\"])([^'\"\n]+)\1(?!\w)"), lambda m: _quoted(m)),
    (re.compile(r"\b\d+(?:\.\d+)?\s?(?:[KMGTPE]i?B|[KMGTPE]|bytes?)\b"), "<size>"),
    # HTTP status codes name the cause (401 gated, 404 missing, 429 rate limit): kept.
    (re.compile(r"\b\d+(?:\.\d+)?\b(?! (?:Client|Server) Error)"), "<n>"),
    (re.compile(r"\s+"), " "),
]


def _keep_tail(match: re.Match[str], placeholder: str) -> str:
    """Replace a URL or path but keep the sentence punctuation that the greedy match swallowed."""
    text = match.group(0)
    stripped = text.rstrip(_TRAILING)
    return placeholder + text[len(stripped) :]


def _repo(match: re.Match[str]) -> str:
    """``owner/name`` is a repo id unless it reads as words ("selective/custom", "and/or").

    Repo ids almost always carry a digit, a capital, ``-``, ``_`` or ``.``; all-lowercase
    ids such as ``bigscience/bloom`` are a known gap, accepted to keep word pairs intact.
    """
    text = match.group(0)
    owner, name = text.split("/", 1)
    if not (re.search(r"[A-Za-z]", owner) and re.search(r"[A-Za-z]", name)):
        return text  # "1/2" and the like: left for the number rule.
    return "<repo>" if re.search(r"[^a-z/]", text) else text


def _quoted(match: re.Match[str]) -> str:
    """Quoted names vary by model; quoted operators, backends and placeholders name the cause."""
    quote, inner = match.group(1), match.group(2)
    after = match.string[match.end() : match.end() + 8].lower()
    if "::" in inner or after.startswith(" backend") or re.fullmatch(r"<\w+>", inner):
        return match.group(0)
    return f"{quote}<name>{quote}"


def _first_line(message: str) -> str:
    """The first non-empty line: later lines hold long 'should be one of ...' lists or traces."""
    for line in message.splitlines():
        if line.strip():
            return line.strip()
    return ""


def normalize_message(message: str | None) -> str:
    """The first line of ``message`` with its volatile parts replaced by placeholders."""
    text = _first_line(redact(message) or "")[:_MAX_INPUT_LEN]
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)  # type: ignore[arg-type]
    return text.strip()


def failure_signature(error_type: str | None, message: str | None) -> str | None:
    """A short, stable key for the cause of a failure; None when there is no error at all.

    The error type is reduced to its last dotted part, because the same exception is raised
    under different module paths (``torch.OutOfMemoryError``, ``torch.cuda.OutOfMemoryError``).
    The result is at most ``MAX_SIGNATURE_LEN`` characters, cut at a word boundary.
    """
    etype = (error_type or "").strip().rsplit(".", 1)[-1]
    norm = normalize_message(message)
    if not etype and not norm:
        return None
    signature = f"{etype}: {norm}" if etype and norm else etype or norm
    if len(signature) > MAX_SIGNATURE_LEN:
        cut = signature[:MAX_SIGNATURE_LEN]
        head, sep, _ = cut.rpartition(" ")
        signature = head if sep and len(head) > MAX_SIGNATURE_LEN // 2 else cut
    return signature.rstrip()


def redact(text: str | None) -> str | None:
    """Remove Hugging Face tokens from ``text``, for every stored text field and every log.

    Both the ``hf_...`` token shape and the literal values of the token environment variables
    (read at call time, so a token set after import is still caught) become ``***``.
    """
    if not text:
        return text
    for name in TOKEN_ENV_VARS:
        value = os.environ.get(name, "").strip()
        if len(value) >= _MIN_SECRET_LEN:
            text = text.replace(value, "***")
    return _HF_TOKEN.sub("***", text)


def redact_record(record: dict, replace: dict[str, str] | None = None) -> dict:
    """Every text field of a record through ``redact``, in place (the one redaction pass a record
    gets before it is stored anywhere); returns the record. ``replace`` maps machine-specific
    strings (a local model folder's absolute path) to what the record says instead."""
    pairs = sorted((replace or {}).items(), key=lambda kv: -len(kv[0]))
    for key, value in record.items():
        if isinstance(value, str):
            for old, new in pairs:
                if old:
                    value = value.replace(old, new)
            record[key] = redact(value)
    return record
