"""``sweep.json`` declared once, and sweep ids parsed in one place.

``sweep.json`` is written first when a sweep is created: its settings, frozen model list (Hub
rankings resolved once), exclusions, stack versions, the whole installed stack (``stack``: every
distribution and its version, version 3; older files read it as empty) and host. Real sweeps, the
synthetic history and the tests all write it through ``SweepMeta``; ``SweepMeta.from_dict`` also
reads the older shapes (version 1: ``probe`` with model dicts; the synthetic history's ``settings``
with plain model ids), so readers never see more than one shape.

A sweep id is ``<name>-<UTC time YYYYmmddTHHMMSSZ>-<4 hex>``: it sorts by time within a name,
and two sweeps started in the same second still differ. ``parse_sweep_id`` splits one.
"""

from __future__ import annotations

import datetime as _dt
import re
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..fileio import atomic_write_json
from .names import safe_name

VERSION = 3
_SWEEP_ID = re.compile(r"^(?P<name>.+?)-(?P<time>\d{8}T\d{6})Z?(?:-(?P<suffix>[0-9a-f]{4,}))?$")


def new_sweep_id(name: str, now: _dt.datetime | None = None) -> str:
    stamp = (now or _dt.datetime.now(_dt.UTC)).strftime("%Y%m%dT%H%M%SZ")
    return f"{safe_name(name)}-{stamp}-{secrets.token_hex(2)}"


@dataclass(frozen=True)
class SweepId:
    name: str
    time: _dt.datetime | None
    suffix: str | None

    @property
    def label(self) -> str:
        """``smoke 2026-12-02 17:30``: what a chart axis or a table shows."""
        return f"{self.name} {self.time:%Y-%m-%d %H:%M}" if self.time else self.name


def parse_sweep_id(sweep_id: str) -> SweepId:
    """Name, UTC time and suffix of a sweep id; an id in no known shape is all name."""
    match = _SWEEP_ID.match(sweep_id)
    if not match:
        return SweepId(sweep_id, None, None)
    time = _dt.datetime.strptime(match["time"], "%Y%m%dT%H%M%S").replace(tzinfo=_dt.UTC)
    return SweepId(match["name"], time, match["suffix"])


@dataclass
class ModelEntry:
    """One model of a sweep: its record id (a Hub id, or ``local:<folder>``), where to load it
    from (the same Hub id, or the local folder's path), per-model settings and Hub metadata."""

    model_id: str
    source: str = ""
    overrides: dict = field(default_factory=dict)
    timeout_s: float | None = None
    hub: dict = field(default_factory=dict)

    def __post_init__(self):
        self.source = self.source or self.model_id


@dataclass
class SweepMeta:
    sweep_id: str
    name: str
    created_at: str
    probe: dict
    models: list[ModelEntry]
    timeout_s: float = 900.0
    excluded: dict[str, str] = field(default_factory=dict)
    description: str = ""
    params_file: str = ""
    executor: str = "local"
    workers: int | None = None
    prefetch: int = 1
    cache: dict = field(default_factory=dict)
    matrix: dict = field(default_factory=dict)
    #: ``stacks:``: name -> {"env": {VAR: value}}: every model and variant ran on each, its rows'
    #: ``stack_name`` and variant (``eager+dynamic@NAME``) naming it; {} for a sweep of one stack
    #: (and sweeps before it existed).
    stacks: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    stack: dict[str, str] = field(default_factory=dict)
    #: The device backends' own configuration the sweep ran with (``devices.stack_configuration``);
    #: None in sweeps written before it was recorded.
    device_config: dict | None = None
    host: str = ""
    #: how the last run used its devices (``sweep.device_time``: held-idle share, utilisation, where
    #: the rest went)
    device_time: dict = field(default_factory=dict)
    #: The expectations the definition named (``expect:``): {"file": path, "entries": {model:
    #: {verdict, reason, until}}} as the file held them when the sweep was created
    #: (``analysis.expectations``); {} for none.
    expect: dict = field(default_factory=dict)
    #: How often a verdict that differs from the baseline's is rerun before it counts
    #: (``sweep.reruns``).
    reruns: int = 1
    #: The sweep those verdicts were compared with (chosen at the first run, kept for ``--resume``);
    #: None: none.
    baseline: str | None = None
    version: int = VERSION

    def to_dict(self) -> dict:
        return asdict(self)

    def write(self, folder: Path) -> Path:
        path = Path(folder) / "sweep.json"
        atomic_write_json(path, self.to_dict())
        return path

    @classmethod
    def from_dict(cls, raw: dict) -> SweepMeta:
        """Any shape ever written (see the module docstring) -> the current one."""
        probe = raw.get("probe") or raw.get("settings") or {}
        models = []
        for entry in raw.get("models") or []:
            if isinstance(entry, str):
                entry = {"model_id": entry}
            models.append(
                ModelEntry(
                    **{
                        k: entry[k]
                        for k in ("model_id", "source", "overrides", "timeout_s", "hub")
                        if entry.get(k) is not None
                    }
                )
            )
        sweep_id = raw["sweep_id"]
        created = raw.get("created_at") or ""
        if not created:
            parsed = parse_sweep_id(sweep_id).time
            created = parsed.isoformat(timespec="seconds") if parsed else ""
        known = {f for f in cls.__dataclass_fields__} - {
            "probe",
            "models",
            "sweep_id",
            "created_at",
            "name",
            "version",
        }
        rest = {k: raw[k] for k in known if raw.get(k) is not None}
        return cls(
            sweep_id=sweep_id,
            name=raw.get("name") or parse_sweep_id(sweep_id).name,
            created_at=created,
            probe=dict(probe),
            models=models,
            version=VERSION,
            **rest,
        )

    def model(self, model_id: str) -> ModelEntry | None:
        for entry in self.models:
            if entry.model_id == model_id:
                return entry
        return None
