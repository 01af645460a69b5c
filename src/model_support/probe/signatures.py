"""Failure signatures (secrets are redacted first, by ``model_support.redact``).

A failure signature groups failures by cause across models (docs/design.md, "Failure signatures"):
the error type plus the first line of the message, with the parts that change from one model or
run to the next (numbers, sizes, paths, URLs, hex addresses, request ids, repo ids, model types,
config classes, quoted names) replaced by placeholders. What names the cause (operator names such
as ``aten::xxx``, backends, memory spaces, option names, plain words) is kept, so that different
causes keep different signatures. Only the stdlib is used so the module loads anywhere.

Places. One generic message raised in different places is different causes ("The size of tensor a
(<n>) must match the size of tensor b (<n>)" from a model's ``apply_rotary_pos_emb`` is not the one
from ``sdpa_attention_forward``). Given the stored traceback, the signature also says where:
``failure_place`` reads the innermost frame of the model's or the library's code, as
``<file stem>.<function>`` (``modeling_llama.apply_rotary_pos_emb``,
``sdpa_attention.sdpa_attention_forward``). The rule, on the last exception of the text (frames
after its ``Traceback (most recent call last):`` line; a chained cause above it does not count):

1. the innermost frame in transformers (a ``site-packages``/``dist-packages``/``src`` folder
   ``transformers/``) or in a model's custom code (the dynamic modules cache,
   ``.../transformers_modules/...``);
2. else the innermost frame that is none of: the standard library, synthetic files
   (``<frozen ...>``, ``<string>``), this project (``model_support``), torch's call plumbing
   (``torch/nn/modules/module.py``, ``torch/utils/_contextlib.py``: every module call and every
   ``no_grad`` passes through them, so they would name everything the same place), the notebook
   runner (papermill, ipykernel and its cell files, IPython, nbclient, jupyter_client);
3. else no place.

torch's own frames (``torch/nn/functional.py``) can only be the place by rule 2: under rule 1 the
model line that called torch is the place, which is what tells one model's bug from another's.
Only frames in the last ``_MAX_TRACEBACK_LINES`` lines are read, and a trimmed traceback
(``probe_core.trimmed_traceback``: head, ``... (N lines trimmed) ...``, tail) is read from its end
up to the trim line: the head holds the outermost calls, possibly of another exception of a chain.

No place is given where none is meaningful: text that is not a Python traceback (the runner's
records for timeouts and dead kernels carry a log tail; the download stage only ``Type: message``),
and errors whose place is incidental to their cause (``_PLACELESS``): running out of memory (the
allocation that crosses the limit is wherever the sizes add up), interrupts and timeouts (wherever
the code was), and operators missing on a backend or dtype (the message names the operator and
backend already; the calling line would split one backend gap into one signature per model file).

Format: ``<type>: <message> @ <stem>.<function>``. The place goes last so that the signature still
reads, and sorts, by error type and message: the placeless signature of an error is a prefix of
the placed one (unless the message was cut to make room), so old records and new ones of the same
error sit together in a sorted table. ``" @ "`` is rare in messages and never in a place, so the
place is what follows the last one. It is
short and stable: a file stem and a function name, no line numbers (they move with every release
and differ between the copies of a function in each ``modeling_<name>.py``), no folders (venv
paths, machines, the hash folders of the modules cache). ``MAX_SIGNATURE_LEN`` still holds: the
message part is cut, never the place (a place is at most ``MAX_PLACE_LEN``, which real ones are far
under). Function names are written as the traceback does (``forward``, ``<module>``, ``<lambda>``),
so the same function in the same file is one place on every model that runs it."""

from __future__ import annotations

import re

from ..redact import redact

#: Signatures are grouping keys for tables and reports, so they stay short.
MAX_SIGNATURE_LEN = 160
#: A place is a file stem and a function name; anything longer is not a real one and is cut.
MAX_PLACE_LEN = 80
#: Between the message part and the place of a signature.
PLACE_SEP = " @ "
#: Only this much of the first line is normalised: it bounds the regex work on huge messages,
#: and the tail would be cut anyway.
_MAX_INPUT_LEN = 1000


_TRAILING = ".,;:!?"

# Each rule is (pattern, replacement), applied in order: the wide matches (URLs, paths) come
# before the narrow ones (numbers) so that a URL is not first cut up into numbers.
_RULES: list[tuple[re.Pattern[str], object]] = [
    (re.compile(r"(?i)(request[ _-]?id\s*[:=]\s*)[^\s)]+"), r"\1<id>"),
    (re.compile(r"[a-z][a-z0-9+.-]*://[^\s'\"`<>()]+"), lambda m: _keep_tail(m, "<url>")),
    # <class 'transformers.models.t5.configuration_t5.T5Config'> -> T5Config (then <config>).
    (re.compile(r"<class '(?:[\w.]*\.)?(\w+)'>"), r"\1"),
    (
        re.compile(r"(?<![\w.:/<>-])(?:~|\.{1,2})?/[^\s'\"`<>()]+"),
        lambda m: _keep_tail(m, "<path>"),
    ),
    (re.compile(r"\b[A-Za-z]:\\[^\s'\"`<>()]+"), lambda m: _keep_tail(m, "<path>")),
    (re.compile(r"(?<![\w.:/<>-])(?:[\w.-]+/){2,}[\w.-]*[A-Za-z0-9]"), "<path>"),
    (
        re.compile(r"(?<![\w./:<>-])[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9](?![\w/])"),
        lambda m: _repo(m),
    ),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    (
        re.compile(
            r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
        ),
        "<hex>",
    ),
    (re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b"), "<hex>"),
    (re.compile(r"(?i)(model[ _]type\s*:?\s*)`[^`\n]*`"), r"\1`<model_type>`"),
    (re.compile(r"\b[A-Z]\w*Config\b"), "<config>"),
    (re.compile(r"(?<!\w)(['\"])([^'\"\n]+)\1(?!\w)"), lambda m: _quoted(m)),
    (re.compile(r"\b\d+(?:\.\d+)?\s?(?:[KMGTPE]i?B|[KMGTPE]|bytes?)\b"), "<size>"),
    # HTTP status codes name the cause (401 gated, 404 missing, 429 rate limit): kept.
    (re.compile(r"\b\d+(?:\.\d+)?\b(?! (?:Client|Server) Error)"), "<n>"),
    # torch names a device mismatch's two devices in whichever order it met them: one cause, one
    # order.
    (
        re.compile(r"(at least two devices, )([\w:<>]+) and ([\w:<>]+)"),
        lambda m: m[1] + " and ".join(sorted(m.group(2, 3))),
    ),
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
        text = pattern.sub(replacement, text)  # type: ignore[call-overload]
    return text.strip()


def failure_signature(
    error_type: str | None, message: str | None, traceback: str | None = None
) -> str | None:
    """A short, stable key for the cause of a failure; None when there is no error at all.

    The error type is reduced to its last dotted part, because the same exception is raised under
    different module paths (``torch.OutOfMemoryError``, ``torch.cuda.OutOfMemoryError``). With
    ``traceback`` (the formatted traceback a record stores), the place the error was raised is
    appended, `` @ <stem>.<function>`` (module docstring); without one, or where the place is not
    meaningful, the signature is the message-only one. The result is at most ``MAX_SIGNATURE_LEN``
    characters, cut at a word boundary in the message part (a cut inside one long word ends with
    "…").
    """
    etype = (error_type or "").strip().rsplit(".", 1)[-1]
    norm = normalize_message(message)
    if not etype and not norm:
        return None
    signature = f"{etype}: {norm}" if etype and norm else etype or norm
    place = None if _placeless(etype, message) else failure_place(traceback)
    if not place:
        return _cut(signature, MAX_SIGNATURE_LEN)
    return _cut(signature, MAX_SIGNATURE_LEN - len(PLACE_SEP) - len(place)) + PLACE_SEP + place


#: What ends a text cut inside a word (a signature, a table cell): no cut word reads as a whole one.
ELLIPSIS = "…"


def _cut(text: str, limit: int, *, mark: bool = False) -> str:
    """``text`` in at most ``limit`` characters, at a word boundary unless that loses over half.
    A cut inside a word ends with ``ELLIPSIS`` (within the limit); with ``mark``, any cut does. A
    signature marks only the mid-word cut: its words are a key across sweeps, and one cut at a
    word boundary keeps the key it had."""
    text = text.rstrip()
    if len(text) <= limit:
        return text
    head, sep, _ = text[:limit].rpartition(" ")
    if sep and len(head) > limit // 2 and not mark:
        return head.rstrip()
    room = limit - len(ELLIPSIS)
    head, sep, _ = text[:room].rpartition(" ")
    kept = head if sep and len(head) > room // 2 else text[:room]
    return kept.rstrip() + ELLIPSIS


def shorten(text: str, limit: int) -> str:
    """``text`` for a column of at most ``limit`` characters: cut at a word boundary where it can
    be, ending with ``ELLIPSIS`` whenever it is cut."""
    return _cut(text, limit, mark=True)


def _placeless(etype: str, message: str | None) -> bool:
    """Errors whose place is incidental to their cause (module docstring)."""
    if etype in _PLACELESS_TYPES:
        return True
    return bool(_PLACELESS.search(_first_line(message or "")[:_MAX_INPUT_LEN]))


def failure_place(traceback: str | None) -> str | None:
    """Where the last exception of a formatted ``traceback`` was raised, as ``<stem>.<function>``
    (``modeling_llama.apply_rotary_pos_emb``), by the rule in the module docstring; None when the
    text is not a Python traceback or no frame qualifies."""
    if not traceback or _first_line(traceback) != _TRACEBACK_HEADER:
        return None
    fallback = None
    for line in reversed(traceback.splitlines()[-_MAX_TRACEBACK_LINES:]):
        frame = _FRAME.match(line)
        if frame is None:
            if _BLOCK_START.match(line):
                break  # The last exception's frames are all below this line.
            continue
        path = frame.group("file").replace("\\", "/")
        if _LIBRARY.search(path):
            return _place(path, frame.group("func"))
        if fallback is None and not _NOT_A_PLACE.search(path):
            fallback = _place(path, frame.group("func"))
    return fallback


def _place(path: str, func: str) -> str:
    stem = path.rsplit("/", 1)[-1]
    stem = stem[: -len(".py")] if stem.endswith(".py") else stem
    return (redact(f"{stem}.{func.strip()}") or "")[:MAX_PLACE_LEN]


#: A machine's path, up to the folder a reader knows the file by: ``site-packages`` (and
#: ``dist-packages``) dropped, the models' dynamic code cache from ``transformers_modules/``, this
#: project from ``model_support/`` and the standard library from ``lib/pythonX.Y/``; any other path
#: under a home folder from ``~``. (pattern, replacement).
_PATH = r"(?<![\w.~:/\\-])(?:[A-Za-z]:)?[/\\][^\s\"'<>]*[/\\]"
_MACHINE_PATHS = (
    (re.compile(_PATH + r"(?:site|dist)-packages[/\\]"), ""),
    (re.compile(_PATH + r"(transformers_modules[/\\])"), r"\1"),
    (re.compile(_PATH + r"(model_support[/\\])"), r"\1"),
    (re.compile(_PATH + r"(lib[/\\]python\d+(?:\.\d+)?[/\\])"), r"\1"),
    (re.compile(r"(?<![\w.~:/\\-])(?:/home/|/Users/|/root(?=/))[^/\s\"'<>]*"), "~"),
)


def portable_paths(text: str | None) -> str | None:
    """``text`` (a traceback) with its machine paths shortened to the folder a reader knows the
    file by (``/home/me/venv/lib/python3.11/site-packages/transformers/x.py`` ->
    ``transformers/x.py``, ``/srv/repo/src/ model_support/probe/run.py`` ->
    ``model_support/probe/run.py``; ``_MACHINE_PATHS``): what a report or page shows of a
    record's traceback, so it names files, not the machine that ran them. ``failure_place`` reads
    the traceback as recorded (its rule knows ``site-packages/transformers/``), so a record keeps
    it whole and a reader shortens it."""
    if not text:
        return text
    for pattern, replacement in _MACHINE_PATHS:
        text = pattern.sub(replacement, text)
    return text


_TRACEBACK_HEADER = "Traceback (most recent call last):"
#: ``  File "/x/modeling_llama.py", line 147, in apply_rotary_pos_emb``. A SyntaxError's location
#: line has no ``, in``: it is not a frame.
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line \d+, in (?P<func>\S.*?)\s*$')
#: Lines above which frames belong to another exception (an earlier one of a chain) or are the
#: outermost calls kept in the head of a trimmed traceback.
_BLOCK_START = re.compile(
    r"^(?:Traceback \(most recent call last\):"
    r"|The above exception was the direct cause of the following exception:"
    r"|During handling of the above exception, another exception occurred:"
    r"|\.\.\. \(\d+ lines trimmed\) \.\.\.)\s*$"
)
#: Rule 1: transformers (installed, or a source checkout's src/) and models' custom code.
_LIBRARY = re.compile(
    r"(?:^|/)(?:(?:site|dist)-packages|src)/transformers/|(?:^|/)transformers_modules/"
)
#: Rule 2 leaves these out: synthetic files, the standard library, this project, torch's call
#: plumbing, the notebook runner.
_NOT_A_PLACE = re.compile(
    r"^<|(?:^|/)lib/python\d*(?:\.\d+)?(?:\.zip)?/(?!(?:site|dist)-packages/)"
    r"|(?:^|/)model_support/"
    r"|(?:^|/)torch/nn/modules/module\.py$|(?:^|/)torch/utils/_contextlib\.py$"
    r"|(?:^|/)(?:papermill|ipykernel|ipykernel_\d+|IPython|nbclient|jupyter_client)/",
    re.IGNORECASE,
)
#: Only the end of a long traceback is read: the innermost frames are there.
_MAX_TRACEBACK_LINES = 400
#: Error types and first-line messages whose place is incidental to the cause (module docstring).
_PLACELESS_TYPES = frozenset(
    {"OutOfMemoryError", "MemoryError", "KeyboardInterrupt", "TimeoutError"}
)
_PLACELESS = re.compile(
    r"(?i)out of memory|resource[_ ]exhausted|can't allocate memory"
    r"|could not run '[^']*' with arguments from the|not implemented for '\w+'|not currently implemented for the \w+ device"
)
