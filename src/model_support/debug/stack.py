"""Whether ``model-support debug`` runs on the stack the sweep ran on.

The debug notebook runs on whatever stack the current environment holds: its package versions and
the device backends' own configuration (``devices.stack_configuration``: the variables each device
adapter names as configuring its backend, e.g. ``LIBTPU_INIT_ARGS``, or a test backend's faults). In
the porting loop of docs/devices.md the environment holds the second sweep's stack while a model of
the first is debugged: the notebook then says "runs and agrees" of a model the sweep recorded as
failing. ``stack_difference`` is the one sentence the command prints before it runs when the two
differ.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from ..probe import provenance
from ..record.sweep_meta import SweepMeta

#: The versions that make the stack (this package's own version and commit are not the stack under
#: test).
STACK_PACKAGES = ("python", *provenance.PACKAGES)


def _shown(value: str | None) -> str:
    return "unset" if value is None else f"'{value}'"


def _same_config(a: str | None, b: str | None) -> bool:
    """Two values of a configuration variable say the same (JSON compared as data: spacing and
    key order aside)."""
    if a is None or b is None:
        return a == b
    try:
        return json.loads(a) == json.loads(b)
    except ValueError:
        return a == b


def differences(meta: SweepMeta, versions: Mapping, config: Mapping[str, str]) -> list[str]:
    """What differs between the sweep's stack and (``versions``, ``config``): one phrase each,
    e.g. ``transformers 5.25.0 here, 5.24.0 in the sweep``. A sweep that did not record its
    device configuration (older sweep.json) is compared on its versions only."""
    found = []
    for name in STACK_PACKAGES:
        then, now = (meta.versions or {}).get(name), versions.get(name)
        if name in (meta.versions or {}) and then != now:
            found.append(
                f"{name} {now or 'not installed'} here, {then or 'not installed'} in the sweep"
            )
    if meta.device_config is not None:
        for var in sorted(set(meta.device_config) | set(config)):
            then, now = meta.device_config.get(var), config.get(var)
            if not _same_config(then, now):
                found.append(f"{var} {_shown(now)} here, {_shown(then)} in the sweep")
    return found


def stack_difference(
    meta: SweepMeta,
    recorded: dict | None = None,
    versions: Mapping | None = None,
    config: Mapping | None = None,
) -> str | None:
    """The sentence to print before debugging a model of ``meta``'s sweep in this environment, or
    None when the stacks agree. ``recorded``: the model's record in the sweep (its verdict is
    named); ``versions`` and ``config`` default to this environment's (``provenance.versions``,
    ``devices.stack_configuration``)."""
    from ..probe import devices

    found = differences(
        meta,
        provenance.versions() if versions is None else versions,
        devices.stack_configuration() if config is None else config,
    )
    if not found:
        return None
    verdict = ""
    if recorded and recorded.get("status"):
        verdict = f" (the sweep recorded {recorded['status']}" + (
            f": {recorded['failure_signature']})" if recorded.get("failure_signature") else ")"
        )
    return (
        f"This environment's stack is not the one sweep {meta.sweep_id} ran on "
        f"({'; '.join(found)}): the debug notebook shows this stack, so what it finds can "
        f"differ from the sweep's verdict{verdict}."
    )
