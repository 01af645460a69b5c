"""A what-if run: the probe with the operators ``host_ops`` names on the host's CPU kernels
(``probe.host_ops``).

Why: a porting plan predicts from the census ("implementing aten::rsqrt unlocks 5 models") and the
localiser blames an operator; neither is checked until the model runs with that operator working.
Running it on the host, through a kernel registered for the device's dispatch key as a C++ backend's
CPU fallback would be, is that check, on the device the stack runs, before anyone writes the kernel.

The setting ``host_ops``: empty (the stack as it is, no what-if), ``missing`` (every operator the
device's adapter says the stack lacks: the model runs to its end, so its census lists everything it
needs, not only the first missing operator), or a comma-separated list of aten operators
(``aten::rsqrt,aten::gelu``; ``aten::add.Tensor`` for one overload). A named operator that cannot
run on the host (a view, a factory, a random operator, a composite a backend never receives, an
unknown name: ``host_ops.refusals``) and a device whose adapter takes no such kernels (the CPU: the
host is the device) are one sentence before anything runs. With ``missing``, what ``host_ops``
cannot put on the host is said in ``host_ops_note``, never dropped silently.

A what-if record says so (``what_if``), keeps the operators it ran on the host and their calls (per
generated token too), and is stored apart (``store.config_of``: the ``what_if`` config): no gate,
export, support card or published ``results`` row counts it as the stack's verdict. Its perf phase
is not run: it would time the host's copies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..errors import UserError
from ..record.schema import Record
from ..record.schema import fill as fill_fields
from . import host_ops

#: The setting's word for every operator the stack lacks.
MISSING = "missing"


class HostOpsError(UserError):
    """``host_ops`` names something that cannot run on the host, or the device takes no host
    kernels."""


def named(setting: str | None) -> list[str]:
    """The operators a ``host_ops`` setting names (none for empty or ``missing``)."""
    if not setting or setting.strip() == MISSING:
        return []
    return [name.strip() for name in setting.split(",") if name.strip()]


def refusal(setting: str | None, adapter=None, missing_too: bool = False) -> str | None:
    """One sentence refusing ``setting`` before anything runs, or None: the device's adapter
    takes no host kernels (where ``adapter`` is known), or a named operator cannot go to the host
    (each by name, with why). ``missing`` where the device takes none puts nothing there: the
    probe runs it as the stack; ``missing_too`` refuses it as well, for a run that is meant to be
    a what-if run (a what-if sweep, a what-if debug run)."""
    if not setting:
        return None
    if adapter is not None and (named(setting) or missing_too):
        takes, why = adapter.host_kernels()
        if not takes:
            return f"host_ops={setting!r} cannot run on {adapter.type}: {why}."
    refused = host_ops.refusals(named(setting))
    return f"host_ops={setting!r}: {host_ops.sentence(refused)}" if refused else None


def operators(setting: str, adapter) -> tuple[list[str], str]:
    """(the operators to put on the host, what was chosen and left out, in words): the named
    ones, or with ``missing`` those of the adapter's lacking ones that can go
    (``host_ops.lacking``), the others said."""
    if setting.strip() != MISSING:
        names = named(setting)
        return names, f"on the host as asked: {', '.join(names)}"
    takes, why = adapter.host_kernels()
    if not takes:
        return [], f"missing: nothing put on the host ({why})"
    lacking = host_ops.lacking(adapter)
    refused = host_ops.refusals(lacking)
    names = [n for n in lacking if n not in refused]
    said = f"missing: the {len(names)} operator(s) the {adapter.type} stack lacks, on the host"
    if refused:
        said += f"; {len(refused)} it lacks cannot go there: {host_ops.sentence(refused)}"
    return names, said


@contextlib.contextmanager
def hosting(record: Record, settings: dict, adapter) -> Iterator[None]:
    """Around the probe's device phase: the host kernels ``settings["host_ops"]`` asks for,
    registered for the run and removed after it, and what ran on the host written into ``record``
    (``fill``). Nothing without the setting."""
    setting = settings.get("host_ops") or ""
    if not setting:
        yield
        return
    names, said = operators(setting, adapter)
    with host_ops.on_host(adapter.type, names) if names else contextlib.nullcontext() as hosted:
        try:
            yield
        finally:
            fill(record, setting, hosted, said)


def fill(record: Record, setting: str, hosted: host_ops.HostOps | None, said: str) -> None:
    """The what-if fields of ``record`` from a finished run's ``hosted`` kernels (None: nothing
    was put there)."""
    left_out = (
        f"; not on the host: {host_ops.sentence(hosted.left_out)}"
        if hosted and hosted.left_out
        else ""
    )
    calls = dict(hosted.calls) if hosted else {}
    tokens = record.get("tokens_out") or 0
    fill_fields(
        record,
        {
            "what_if": True,
            "host_ops": setting,
            "host_ops_run": list(hosted.overloads) if hosted else [],
            "host_ops_note": (said + left_out)[:2000],
            "host_op_names": list(calls),
            "host_op_calls": list(calls.values()),
            "host_op_calls_per_token": sum(calls.values()) / tokens if tokens else None,
        },
    )
