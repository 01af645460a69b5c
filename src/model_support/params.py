"""Sweep definitions (YAML in ``params/``), validated before anything runs.

A typo must never become a silently ignored setting: papermill only warns about an unknown
parameter, so every probe setting is checked against the parameters that ``notebooks/probe.ipynb``
declares (``papermill.inspect_notebook``), and every other key against the keys below. Each problem
is one sentence that names it and lists what is accepted.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .provenance import REPO_ROOT

PROBE_NOTEBOOK = REPO_ROOT / "notebooks" / "probe.ipynb"
#: Probe parameters the runner sets itself, per model; a sweep file may not set them.
RUNNER_OWNED = ("model_id", "record_path", "sweep_id", "notebook_path")
TOP_KEYS = {
    "name": str, "description": str, "models": list, "exclude": list, "probe": dict, "timeout_s": (int, float),
    "workers": int, "executor": str, "models_from_hub": dict,
}
MODEL_KEYS = {"id": str, "overrides": dict, "timeout_s": (int, float), "exclude": str}
EXCLUDE_KEYS = {"id": str, "reason": str}
HUB_KEYS = {"task": str, "sort": str, "limit": int}
HUB_SORTS = ("downloads", "trending", "likes")
EXECUTORS = ("local", "ray")
TYPE_NAMES = {"str": str, "int": int, "bool": bool, "float": (int, float)}


class SweepConfigError(ValueError):
    """A sweep definition is wrong; the message is one sentence naming what and how to fix it."""


@dataclass
class ModelSpec:
    model_id: str
    overrides: dict = field(default_factory=dict)
    timeout_s: float | None = None


@dataclass
class SweepParams:
    name: str
    models: list[ModelSpec]
    excluded: dict[str, str]
    probe: dict
    timeout_s: float = 900.0
    workers: int | None = None
    executor: str = "local"
    source: str = ""
    description: str = ""


@functools.cache
def probe_parameters() -> dict[str, str]:
    """Parameter name -> declared type name, read from the probe notebook itself."""
    import papermill

    return {name: p["inferred_type_name"] for name, p in papermill.inspect_notebook(str(PROBE_NOTEBOOK)).items()}


def _type_label(expected) -> str:
    if isinstance(expected, tuple):
        return " or ".join(t.__name__ for t in expected)
    return expected.__name__


def _check_keys(where: str, mapping: dict, accepted: dict) -> None:
    if not isinstance(mapping, dict):
        raise SweepConfigError(f"{where} must be a mapping with keys {', '.join(accepted)}, not {type(mapping).__name__}.")
    for key, value in mapping.items():
        if key not in accepted:
            raise SweepConfigError(f"{where}: unknown key {key!r}; accepted keys are {', '.join(accepted)}.")
        expected = accepted[key]
        if isinstance(value, bool) and expected is not bool and bool not in (expected if isinstance(expected, tuple) else (expected,)):
            raise SweepConfigError(f"{where}: {key!r} must be {_type_label(expected)}, not a bool ({value!r}).")
        if not isinstance(value, expected):
            raise SweepConfigError(
                f"{where}: {key!r} must be {_type_label(expected)}, not {type(value).__name__} ({value!r})."
            )


def check_probe_settings(where: str, settings: dict) -> None:
    """Every key must be a probe notebook parameter of the declared type, and not one the runner owns."""
    declared = probe_parameters()
    accepted = [name for name in declared if name not in RUNNER_OWNED]
    for key, value in settings.items():
        if key in RUNNER_OWNED:
            raise SweepConfigError(f"{where}: {key!r} is set by the sweep runner for each model; remove it.")
        if key not in declared:
            raise SweepConfigError(
                f"{where}: {key!r} is not a parameter of notebooks/probe.ipynb; accepted: {', '.join(accepted)}."
            )
        expected = TYPE_NAMES.get(declared[key])
        if expected is None:
            continue
        wrong_bool = isinstance(value, bool) and expected is not bool
        if wrong_bool or not isinstance(value, expected):
            raise SweepConfigError(
                f"{where}: probe setting {key!r} must be {declared[key]}, not {type(value).__name__} ({value!r})."
            )


def resolve_model_id(model_id: str, base: Path) -> str:
    """A local folder (relative to ``base``) becomes an absolute path; anything else is a Hub id."""
    candidate = Path(model_id).expanduser()
    if not candidate.is_absolute():
        candidate = base / candidate
    if candidate.exists():
        return str(candidate.resolve())
    return model_id


def transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP client's base error (huggingface_hub has used requests, httpx and httpx2)."""
    import importlib

    found = []
    for module, name in (("httpx2", "HTTPError"), ("httpx", "HTTPError"), ("requests", "RequestException")):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def hub_models(spec: dict) -> list[str]:
    """Model ids from the Hub's rankings for a task (needs network; offline says so)."""
    from huggingface_hub import list_models

    sort = {"downloads": "downloads", "trending": "trending_score", "likes": "likes"}[spec.get("sort", "downloads")]
    try:
        return [m.id for m in list_models(pipeline_tag=spec.get("task", "text-generation"), sort=sort, limit=spec.get("limit", 50))]
    except (OSError, *transport_errors()) as exc:  # each means the same here: no Hub
        raise SweepConfigError(
            f"models_from_hub: could not list models from the Hugging Face Hub ({type(exc).__name__}); "
            "this machine may have no Hub access, so list the models explicitly under 'models'."
        ) from exc


def parse(raw: dict, source: str = "<params>", base: Path | None = None) -> SweepParams:
    """Validate a loaded YAML mapping into ``SweepParams``; raise SweepConfigError on the first problem."""
    base = base or Path.cwd()
    if not isinstance(raw, dict):
        raise SweepConfigError(f"{source}: the file must hold a mapping with keys {', '.join(TOP_KEYS)}.")
    _check_keys(source, raw, TOP_KEYS)
    if "name" not in raw:
        raise SweepConfigError(f"{source}: 'name' is missing; give the sweep a short name such as 'smoke'.")
    executor = raw.get("executor", "local")
    if executor not in EXECUTORS:
        raise SweepConfigError(f"{source}: executor {executor!r} is not one of {', '.join(EXECUTORS)}.")
    probe = dict(raw.get("probe") or {})
    check_probe_settings(f"{source}: probe", probe)

    models: list[ModelSpec] = []
    excluded: dict[str, str] = {}
    for index, entry in enumerate(raw.get("models") or []):
        where = f"{source}: models[{index}]"
        if isinstance(entry, str):
            entry = {"id": entry}
        _check_keys(where, entry, MODEL_KEYS)
        if "id" not in entry:
            raise SweepConfigError(f"{where}: 'id' is missing; give a Hub id or a local folder.")
        check_probe_settings(f"{where}: overrides", entry.get("overrides") or {})
        model_id = resolve_model_id(entry["id"], base)
        if "exclude" in entry:
            excluded[model_id] = entry["exclude"]
            continue
        models.append(ModelSpec(model_id, dict(entry.get("overrides") or {}), entry.get("timeout_s")))
    for index, entry in enumerate(raw.get("exclude") or []):
        where = f"{source}: exclude[{index}]"
        _check_keys(where, entry, EXCLUDE_KEYS)
        if "id" not in entry or "reason" not in entry:
            raise SweepConfigError(f"{where}: an exclusion needs both 'id' and 'reason'.")
        excluded[resolve_model_id(entry["id"], base)] = entry["reason"]
    if "models_from_hub" in raw:
        _check_keys(f"{source}: models_from_hub", raw["models_from_hub"], HUB_KEYS)
        if raw["models_from_hub"].get("sort", "downloads") not in HUB_SORTS:
            raise SweepConfigError(f"{source}: models_from_hub.sort must be one of {', '.join(HUB_SORTS)}.")
        known = {m.model_id for m in models}
        models += [ModelSpec(m) for m in hub_models(raw["models_from_hub"]) if m not in known and m not in excluded]
    ids = [m.model_id for m in models]
    duplicates = sorted({m for m in ids if ids.count(m) > 1})
    if duplicates:
        raise SweepConfigError(f"{source}: model {duplicates[0]!r} is listed twice; list each model once.")
    models = [m for m in models if m.model_id not in excluded]
    if not models:
        raise SweepConfigError(f"{source}: no models to run; list some under 'models'.")
    workers = raw.get("workers")
    if workers is not None and workers < 1:
        raise SweepConfigError(f"{source}: workers must be at least 1, not {workers}.")
    return SweepParams(
        name=raw["name"], models=models, excluded=excluded, probe=probe,
        timeout_s=float(raw.get("timeout_s", 900)), workers=workers, executor=executor,
        source=source, description=raw.get("description", ""),
    )


def load(path: Path) -> SweepParams:
    """Read and validate a params YAML file."""
    path = Path(path)
    if not path.is_file():
        raise SweepConfigError(f"Sweep definition {str(path)!r} does not exist; pass a YAML file such as params/smoke.yaml.")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SweepConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]}).") from exc
    return parse(raw, source=str(path), base=Path.cwd())
