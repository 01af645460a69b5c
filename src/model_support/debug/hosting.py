"""The debug notebook of a what-if run: the operators the setting ``host_ops`` names on the host's
CPU kernels.

A what-if sweep (``probe.what_if``) ran its models with some operators on the host, through kernels
registered for the device's dispatch key (``probe.host_ops``). Its debug notebook must show that
run, not the stack as it is, and say so. ``Hosting`` is the notebook's handle on it: made once in
the set-up cell (a setting that cannot run is refused there in one sentence, as the probe refuses
it, before anything runs), then entered around each cell's device-side work (``with hosting:``: the
traced forward, the localised forward, the device's generation, the compiled explanation; never the
CPU reference, whose operators no device kernel serves), the same kernels each time, their calls
counted across cells. ``fields`` are the probe record's own what-if fields (``what_if.fill``),
written into the notebook's result; ``sentence`` says it in words. Empty ``host_ops``: nothing
registered, nothing said, the notebook as it was.

``before_running`` is the command's side: the sentence ``model-support debug`` prints before the
notebook runs, and the refusal of a setting that cannot run (one sentence, no notebook written).
"""

from __future__ import annotations

import contextlib
import html

from ..probe import host_ops, what_if


class Hosting(contextlib.AbstractContextManager):
    """The operators ``setting`` puts on the host for ``adapter``'s device, for the notebook's
    device-side cells.

    ``setting``: as the sweep (or ``-p host_ops``) gave it; ``names``: the operators chosen
    (``what_if.operators``: the named ones, or what the stack lacks for ``missing``); ``said``:
    that choice in words. Raises ``what_if.HostOpsError`` (one sentence) when the setting cannot
    run, before anything is registered."""

    def __init__(self, setting: str | None, adapter):
        self.setting = setting or ""
        self.device_type = adapter.type
        # as a what-if sweep refuses it
        refused = what_if.refusal(self.setting, adapter, missing_too=True)
        if refused:
            raise what_if.HostOpsError(refused)
        self.names, self.said = (
            what_if.operators(self.setting, adapter) if self.setting else ([], "")
        )
        self.hosted = host_ops.on_host(adapter.type, self.names) if self.names else None
        self._depth = 0

    def __enter__(self) -> Hosting:
        # the same kernels, registered again, their calls kept
        if self.hosted is not None and self._depth == 0:
            self.hosted.__enter__()
        self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self.hosted is not None and self._depth == 0:
            self.hosted.close()

    def fields(self) -> dict:
        """The probe record's what-if fields for this run (``what_if.fill``: ``what_if``,
        ``host_ops``, ``host_ops_run``, ``host_ops_note``, ``host_op_names``, ``host_op_calls``);
        {} without ``host_ops``. The calls are every device step's of the notebook so far (the
        load, two forwards, the generation), so ``host_op_calls_per_token`` is None: the probe's
        per token counts its generation alone."""
        if not self.setting:
            return {}
        found: dict = {"tokens_out": None}
        what_if.fill(found, self.setting, self.hosted, self.said)  # type: ignore[arg-type]
        found.pop("tokens_out")
        return found

    def announce(self) -> str | None:
        """What goes to the host, said in the set-up cell before anything runs; None without
        ``host_ops``."""
        if not self.setting:
            return None
        return (
            f"A what-if run (host_ops={self.setting!r}): {self.said or 'nothing on the host'} "
            f"(kernels registered for {self.device_type}'s dispatch key); the CPU reference "
            "runs as it is."
        )


def sentence(fields: dict) -> str | None:
    """A debug result's what-if fields (``Hosting.fields``) in one sentence, or None when it had
    none."""
    if not fields.get("host_ops"):
        return None
    run = fields.get("host_ops_run") or []
    calls = dict(
        zip(fields.get("host_op_names") or [], fields.get("host_op_calls") or [], strict=False)
    )
    counted = ", ".join(f"{name} {count}" for name, count in calls.items()) or "none called"
    where = (
        f"{', '.join(run)} ran on the host's CPU kernels, not the device's (calls: {counted})"
        if run
        else ""
    )
    note = fields.get("host_ops_note") or ""
    if note.startswith("on the host as asked:"):  # the operators named, said already
        note = note.partition("; ")[2]
    said = "; ".join(part for part in (where, note) if part) or "nothing went to the host"
    return (
        f"A what-if run (host_ops={fields['host_ops']!r}): {said}. What it finds is not the stack "
        "as it is."
    )


def with_host_ops(result: dict, hosting: Hosting) -> dict:
    """``result`` (``build_result``'s) with the run's what-if fields (``Hosting.fields``; none
    without host_ops)."""
    return {**result, **hosting.fields()}


def show_host_ops(slot, result: dict) -> None:
    """Below the conclusion at the top (``conclusion_slot``), the what-if sentence of a run with
    ``host_ops``."""
    from IPython.display import HTML

    from .views import conclusion_html

    said = sentence(result)
    if said:
        slot.update(
            HTML(
                conclusion_html(result)
                + f"<p><b>Operators on the host</b>: {html.escape(said)}</p>"
            )
        )


def before_running(meta_probe: dict, params: dict) -> str | None:
    """The sentence ``model-support debug`` prints before the notebook runs when ``host_ops`` is
    set, in the sweep or in the run (``params``, the notebook's parameters): the run is a what-if
    run, or the sweep's was and this one is not. Raises ``what_if.HostOpsError`` when the setting
    cannot run on the device asked (a device named, not ``auto``: the notebook checks again on
    the one it resolves)."""
    from ..probe import devices

    asked, recorded = params.get("host_ops") or "", meta_probe.get("host_ops") or ""
    if not asked and not recorded:
        return None
    if not asked:
        return (
            "host_ops is empty here: the debug notebook runs the stack as it is, not the "
            f"sweep's what-if run (host_ops={recorded!r}), so what it finds can differ from "
            "the sweep's record."
        )
    device = params.get("device") or "auto"
    adapter = devices.adapter_for(device) if device != "auto" else None
    refused = what_if.refusal(asked, adapter, missing_too=True)
    if refused and adapter is not None and not adapter.host_kernels()[0]:
        refused += (
            f" Give -p host_ops '' to debug it on {adapter.type} with no operator on the host."
        )
    if refused:
        raise what_if.HostOpsError(refused)
    which = (
        "every operator the stack lacks (the notebook names them)"
        if asked.strip() == what_if.MISSING
        else ", ".join(what_if.named(asked))
    )
    source = (
        "as the sweep's what-if run did"
        if asked == recorded
        else (
            f"host_ops={recorded!r} in the sweep"
            if recorded
            else "the sweep ran the stack as it is"
        )
    )
    return (
        f"A what-if debug run (host_ops={asked!r}, {source}): {which} on the host's CPU "
        "kernels for the device's dispatch key, not the device's own."
    )
