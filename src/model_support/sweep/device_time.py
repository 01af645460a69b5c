"""How a sweep used its devices: the share of held time they were idle, the utilisation, where the
rest went.

Why: a device held while its probe does host work (loading, the CPU reference, the judge, writing
the notebook) is a device no other model can use; on a TPU host a chip is held until its process
ends. The figures come from ``schedule.jsonl``: one row per hold (the devices, granted at ``start``,
released at ``end``), with the probe's own device-phase seconds (``device_s``: weights to the
device, compilation, generation, from ``probe.phases``) and, where the host checks ran after the
release, when they ran (``checks_start``, ``checks_end``).

- held: device-seconds between grant and release, summed over holds;
- device: device-seconds of device phases (a hold over N devices counts N times);
- idle while held: held - device (the process starting, the host-side loading: config, tokenizer,
  weights built in host memory, chat template; the notebook, and with the phases together the host
  checks); its share of held is the figure a TPU host pays for;
- utilisation: device / (devices x span), the span from the first grant to the last release (the
  devices' part of the sweep; the host checks after the last release are ``checks_tail_s``);
- not held: devices x span - held (devices waiting for the host: a process to warm up, a check to
  finish before a worker takes the next model, the sweep's end);
- parts: of the device seconds, those of the device phase's named parts (``device_parts``: ``perf``,
  the perf phase's repeats; ``recompiles``, the recompile check's generations). They are the
  device's work and counted in it, so held-idle stays the host's share; said apart so a sweep shows
  what timing cost its devices.
"""

from __future__ import annotations

from pathlib import Path

from .. import fileio

#: How the sentence names a device phase's parts.
PART_WORDS = {"perf": "the perf phase", "recompiles": "the recompile check"}


def read_rows(sweep_dir: Path, since: float | None = None) -> list[dict]:
    """The sweep's holds (``schedule.jsonl``), those granted at ``since`` or later (this run of
    it)."""
    # a torn line skipped, said once
    rows = list(fileio.read_lines(Path(sweep_dir) / "schedule.jsonl"))
    return [r for r in rows if since is None or r["start"] >= since]


def summarise(rows: list[dict], devices: int) -> dict | None:
    """The figures of the module docstring for ``rows`` on ``devices`` devices; None without a
    device phase timed (no holds, or rows from before the device phase was timed)."""
    timed = [r for r in rows if r.get("device_s") is not None]
    if not timed or devices < 1:
        return None
    first, last = min(r["start"] for r in timed), max(r["end"] for r in timed)
    span = max(last - first, 1e-9)
    tail = max([r.get("checks_end") or last for r in timed]) - last
    held = sum((r["end"] - r["start"]) * len(r["devices"]) for r in timed)
    device = sum(min(r["device_s"], r["end"] - r["start"]) * len(r["devices"]) for r in timed)
    checks = [r for r in timed if r.get("checks_end") is not None]
    parts: dict[str, float] = {}
    for r in timed:
        for name, seconds in (r.get("device_parts") or {}).items():
            parts[name] = parts.get(name, 0.0) + seconds * len(r["devices"])
    return {
        "devices": devices,
        "holds": len(timed),
        "span_s": round(span, 3),
        "held_s": round(held, 3),
        "device_s": round(device, 3),
        "held_idle_s": round(held - device, 3),
        "unheld_s": round(devices * span - held, 3),
        "held_idle_share": round((held - device) / held, 4) if held else None,
        "utilisation": round(device / (devices * span), 4),
        "ideal_span_s": round(device / devices, 3),
        "checks_after_release": len(checks),
        "checks_s": round(sum(r["checks_end"] - r["checks_start"] for r in checks), 3),
        "checks_tail_s": round(max(tail, 0.0), 3),
        "parts_s": {name: round(seconds, 3) for name, seconds in sorted(parts.items())},
    }


def sentence(stats: dict | None) -> str:
    """One line for the terminal and the report."""
    if not stats:
        return ""
    after = stats["checks_after_release"]
    idle = "process start, loading on the host, notebook"
    idle += "" if after == stats["holds"] else ", host checks in the hold"
    parts = stats.get("parts_s") or {}
    within = ", ".join(
        f"{PART_WORDS.get(name, name)} {seconds:.1f} s"
        for name, seconds in parts.items()
        if seconds
    )
    return (
        f"devices: {stats['devices']} held {stats['held_s']:.1f} s over a "
        f"{stats['span_s']:.1f} s span, device phases {stats['device_s']:.1f} "
        f"s{f' (of which {within})' if within else ''}: idle "
        f"{100 * (stats['held_idle_share'] or 0):.0f}% of the held time "
        f"({stats['held_idle_s']:.1f} s: {idle}), utilisation "
        f"{100 * stats['utilisation']:.0f}%, not held {stats['unheld_s']:.1f} s (waiting for "
        f"the host); host checks after the release: {after} of {stats['holds']} probes"
    )
