"""Drafted bug reports: one Markdown file per failure signature the nightly's gate failed on.

Models failing the same way share one report (same signature: same cause, ``probe.signatures``).
Each says what changed between the two sweeps (packages and backend settings), what the bisect named
as the first bad release or setting for each model (or that it was not bisected, and why), the
error, how to reproduce it (the ``model-support repro`` command), the first wrong operator where it
was localised, and the stack it ran on: the packages, and of a device backend the one that ran (its
``backend_versions``, as its adapter named them; nothing of a backend on the CPU). A draft: a person
reads it, then files it against the stack.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..bisect.answers import answer_line
from ..probe import repro, reproduce
from ..probe.devices import registered

#: At most this much of an error message or traceback goes into a draft.
MAX_ERROR_CHARS = 1500
#: A title longer than this is cut at a word (the whole signature follows it).
TITLE_CHARS = 100


@dataclass
class Regression:
    """One (model, variant) the gate failed on, with what its row and the bisect said of it."""

    model_id: str
    variant: str
    before: str | None
    after: str
    signature: str | None
    error: str = ""
    attribution: str | None = None
    repro_sha256: str | None = None
    bisect: dict | None = None  # the bisect's answer (``bisect.search``), None: not bisected
    localised: dict | None = None  # ``model-support localise``'s result, None: not localised
    versions: dict = field(default_factory=dict)
    # the row's device type; None: the draft's device where it names one
    device_type: str | None = None
    # the row's backend that ran (``name version``); None: older rows
    backend_versions: list[str] | None = None


def stack_line(versions: dict, device_type: str | None, backend_versions: list[str] | None) -> str:
    """The stack a row ran on, in one line: its ``versions`` (python, torch, transformers, ...)
    without any device backend's packages, then the backend that ran: its ``backend_versions`` as
    its adapter named them, or, for a row from before them, what ``versions`` held of the
    packages ``device_type``'s adapter declares; nothing of a backend where none ran (the CPU) or
    it is unknown, never a backend that was only installed."""
    adapters = registered()
    backend_fields = {name for adapter in adapters.values() for name in adapter.backend_packages}
    shown = [f"{k} {v}" for k, v in sorted(versions.items()) if v and k not in backend_fields]
    if backend_versions is None:
        declared = adapters[device_type].backend_packages if device_type in adapters else ()
        backend_versions = [f"{name} {versions[name]}" for name in declared if versions.get(name)]
    backend = (
        f"; backend ({device_type or 'device'}): {', '.join(backend_versions)}"
        if backend_versions
        else ""
    )
    return ", ".join(shown) + backend


def group_key(r: Regression) -> str:
    """What one report covers: the failure signature (a suspect PASS: its verdict)."""
    return r.signature or r.after


def slug(text: str, limit: int = 60) -> str:
    """A file-name-safe short form of a signature."""
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:limit] or "failure"


def draft(
    sweep_id: str,
    baseline: str,
    device: str,
    changed: str,
    group: list[Regression],
    bisect_note: str = "",
) -> str:
    """The Markdown of one report: ``group`` shares one signature; ``changed`` says what differs
    between the two sweeps' stacks (``bisect.stacks.changes_line``); ``bisect_note`` why nothing
    was bisected, if so."""
    first = group[0]
    title = group_key(first)
    short = (
        title if len(title) <= TITLE_CHARS else title[: TITLE_CHARS - 1].rsplit(" ", 1)[0] + " …"
    )
    lines = [
        f"# {short} on {device} ({len(group)} model{'s' if len(group) != 1 else ''})",
        "",
        f"Drafted by `model-support nightly`: sweep `{sweep_id}` against `{baseline}`.",
        "",
        f"Signature: `{title}`",
        "",
        "## What changed between the two sweeps",
        "",
        changed or "nothing recorded differs between the two stacks",
        "",
        "## What the bisect names",
        "",
    ]
    for r in group:
        lines.append(
            f"- {answer_line(r.bisect)}"
            if r.bisect
            else f"- {r.model_id} [{r.variant}]: not bisected"
        )
    if bisect_note:
        lines += ["", bisect_note]
    lines += [
        "",
        "## Models",
        "",
        "| model | variant | before | after | whose |",
        "|---|---|---|---|---|",
    ]
    for r in group:
        lines.append(
            f"| {r.model_id} | {r.variant} | {r.before or 'not run'} | {r.after} | "
            f"{r.attribution or '-'} |"
        )
    if first.error:
        error = (
            first.error
            if len(first.error) <= MAX_ERROR_CHARS
            else first.error[:MAX_ERROR_CHARS] + " ..."
        )
        lines += ["", f"## Error ({first.model_id})", "", "```", error, "```"]
    lines += ["", "## Reproduce", ""]
    for r in group:
        lines.append(f"- `{repro.command(sweep_id, r.model_id, r.variant)}`")
    lines += [
        "",
        "Each script sets the backend's settings as the probe ran them, and says so; to run "
        f"it on the stack as found instead (to check a fix), add `{reproduce.AS_FOUND_FLAG}` "
        "to its python command.",
    ]
    found = [r for r in group if r.localised and r.localised.get("operator")]
    if found:
        lines += ["", "## First wrong operator", ""]
        for r in found:
            loc = r.localised or {}
            lines.append(
                f"- {r.model_id}: `{loc['operator']}` ({loc.get('overload') or 'default'}) in "
                f"`{loc.get('module')}`, shapes {loc.get('shapes')}, dtypes "
                f"{loc.get('dtypes')}, max abs error {loc.get('max_abs_error')}"
                + (f"; one-operator script `{loc['repro']}`" if loc.get("repro") else "")
            )
    if first.versions or first.backend_versions:
        device_type = first.device_type or (device if device not in ("", "auto") else None)
        lines += [
            "",
            "## Stack",
            "",
            stack_line(first.versions, device_type, first.backend_versions),
        ]
    return "\n".join(lines) + "\n"


def drafts(
    sweep_id: str,
    baseline: str,
    device: str,
    changed: str,
    regressions: list[Regression],
    bisect_note: str = "",
) -> list[tuple[str, str]]:
    """(file name, Markdown) per signature, the one with the most models first."""
    groups: dict[str, list[Regression]] = {}
    for r in regressions:
        groups.setdefault(group_key(r), []).append(r)
    ordered = sorted(groups.values(), key=lambda g: (-len(g), group_key(g[0])))
    return [
        (
            f"{n:02d}-{slug(group_key(g[0]))}.md",
            draft(sweep_id, baseline, device, changed, g, bisect_note),
        )
        for n, g in enumerate(ordered, 1)
    ]
