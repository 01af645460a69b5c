"""A probe's devices as Ray resources: which devices Ray can hand out (``check_ray_device``), the
device ``auto`` means on a cluster and here, the resources a task asks for (``ray_resources``),
and a request no node of the cluster can satisfy, refused in one sentence naming the ``ray
start`` option that gives it."""

from __future__ import annotations

import json

from ...errors import UserError
from ...probe import devices


def check_ray_device(device: str) -> None:
    """Refuse, in one sentence, a device the Ray executor cannot hand out (its adapter names no Ray
    resource): its probes would reserve no device and share whichever they find (out of memory,
    attributed to the model). "auto" is the cluster's (``ray_auto_device``)."""
    if device != "auto" and devices.adapter_for(device).ray_resources(1) is None:
        raise _not_on_ray(device)


def _not_on_ray(device: str) -> UserError:
    held = [name for name, cls in devices.registered().items() if cls.ray_resource]
    return UserError(
        "The ray executor holds devices as Ray resources, which Ray has for "
        f"{' and '.join(held)} devices only, not for {device!r} devices: run this sweep with "
        f"--executor local (it pins each probe to its own {device} device), or use device "
        f"{', '.join(['auto', 'cpu', *held[:-1]])} or {held[-1]}."
    )


def ray_auto_device(cluster: dict) -> str:
    """Device "auto" on a Ray cluster (``ray.cluster_resources()``): the first accelerator whose
    Ray resource it has (GPUs, then TPU chips), else the CPU, so each probe reserves the device
    it will run on."""
    for name, cls in devices.registered().items():
        if cls.ray_resource and cluster.get(cls.ray_resource):
            return name
    return "cpu"


def local_auto_device() -> str:
    """Device "auto" for a local Ray, before it starts: this host's accelerator
    (``devices.facts``, asked of a child process) when Ray can hand it out as a resource, else
    the CPU: what ``ray_auto_device`` finds on the started Ray, whose resources then follow from
    it."""
    kind = devices.facts("auto").type
    return kind if kind != "cpu" and devices.adapter_for(kind).ray_resource else "cpu"


def ray_resources(device: str, need: int = 1) -> dict:
    """What one probe asks of the Ray cluster: its devices as the adapter's Ray resource (one CPU
    per rank on a CPU sweep, where the ranks are processes)."""
    resources = devices.adapter_for(device).ray_resources(need)
    if resources is None:
        raise _not_on_ray(device)
    return resources


def _as_totals(resources: dict) -> dict[str, float]:
    """``remote.options`` keywords as the resource totals a node reports (``ray.nodes()``)."""
    totals = {
        "CPU": float(resources.get("num_cpus", 0)),
        "GPU": float(resources.get("num_gpus", 0)),
    }
    totals.update({name: float(n) for name, n in (resources.get("resources") or {}).items()})
    return {name: n for name, n in totals.items() if n}


def unsatisfiable(wanted: dict, nodes: list[dict]) -> bool:
    """Whether no alive node of the cluster has every resource ``wanted`` (``remote.options``
    keywords)."""
    need = _as_totals(wanted)
    return not any(
        node.get("Alive", True)
        and all(node.get("Resources", {}).get(name, 0) >= n for name, n in need.items())
        for node in nodes
    )


def _start_option(name: str, count: float) -> str:
    """The ``ray start`` option that gives a node ``count`` of the Ray resource ``name``."""
    if name in ("CPU", "GPU"):
        return f"--num-{name.lower()}s {count:g}"
    return f"--resources '{json.dumps({name: int(count) if count == int(count) else count})}'"


def unsatisfiable_words(
    model_id: str, device: str, need: int, wanted: dict, nodes: list[dict]
) -> str:
    """Why no node can run ``model_id`` (asking Ray for ``wanted``: ``need`` ``device`` devices),
    with the fix: the ``ray start`` options a node needs when none has such a resource at all;
    else how much the largest has, and fewer devices for the model only where it asks for more
    than one."""
    totals = _as_totals(wanted)
    alive = [node.get("Resources", {}) for node in nodes if node.get("Alive", True)]
    missing = [name for name in totals if not any(resources.get(name, 0) for resources in alive)]
    if missing:
        options = " ".join(_start_option(name, totals[name]) for name in missing)
        return (
            f"No node of the Ray cluster has {' or '.join(repr(name) for name in missing)}, "
            f"which {model_id} asks for ({_describe(wanted)}: device {device}); start its "
            f"nodes with `ray start ... {options}` (or add such nodes), or probe on a device "
            "the cluster has (device auto takes the cluster's own)."
        )
    options = " ".join(_start_option(name, count) for name, count in totals.items())
    largest: dict = max(alive, key=lambda r: sum(r.get(n, 0) for n in totals), default={})
    have = ", ".join(f"{name} {largest.get(name, 0):g}" for name in totals)
    most = int(largest.get(devices.adapter_for(device).ray_resource or "CPU", 0))
    fewer = f", or lower its devices (devices: {most})" if need > 1 and most else ""
    return (
        f"{model_id} asks Ray for {_describe(wanted)} and no node of the cluster has that much "
        f"(the largest has {have}); add a node that has (`ray start ... {options}`){fewer}."
    )


def _describe(wanted: dict) -> str:
    return ", ".join(f"{n:g} {name}" for name, n in _as_totals(wanted).items())
