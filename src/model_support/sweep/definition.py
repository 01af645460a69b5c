"""Sweep definitions (YAML in ``params/``), validated before anything runs.

A typo or a bad value must never become a silently ignored setting or a FAIL row per model: every
key is checked against the keys below, every probe setting against the probe's one declaration
(``probe_params``: name, type, allowed values or range), local model folders must exist, and the
device must be present on this machine (checked once, up front, with the sentence the probe itself
would record). Each problem is one sentence that names it and says what is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..errors import UserError
from ..probe import devices, probe_core, probe_params
from ..probe.model_ids import is_local, portable_id
from ..record.names import model_file_name
from ..record.sweep_meta import ModelEntry, new_sweep_id, safe_name

TOP_KEYS = {
    "name": str,
    "description": str,
    "models": list,
    "exclude": list,
    "probe": dict,
    "timeout_s": (int, float),
    "workers": int,
    "executor": str,
    "models_from_hub": dict,
    "cache": dict,
    "prefetch": int,
    "matrix": dict,
}
MODEL_KEYS = {"id": str, "overrides": dict, "timeout_s": (int, float), "exclude": str}
EXCLUDE_KEYS = {"id": str, "reason": str}
HUB_KEYS = {"task": str, "sort": str, "limit": int}
HUB_SORTS = ("downloads", "trending", "likes")
CACHE_KEYS = {"dir": str, "max_gb": (int, float), "keep": bool}
EXECUTORS = ("local", "ray")


class SweepConfigError(UserError):
    """A sweep definition is wrong; the message is one sentence naming what and how to fix it."""


@dataclass
class SweepParams:
    name: str
    models: list[ModelEntry]
    excluded: dict[str, str]
    probe: dict
    timeout_s: float = 900.0
    workers: int | None = None
    executor: str = "local"
    source: str = ""
    description: str = ""
    cache: dict = field(default_factory=dict)
    hub_list: dict = field(default_factory=dict)
    prefetch: int = 1
    matrix: dict = field(default_factory=dict)


def _type_label(expected) -> str:
    if isinstance(expected, tuple):
        return " or ".join(t.__name__ for t in expected)
    return expected.__name__


def _check_keys(where: str, mapping: dict, accepted: dict) -> None:
    if not isinstance(mapping, dict):
        raise SweepConfigError(
            f"{where} must be a mapping with keys {', '.join(accepted)}, not {type(mapping).__name__}."
        )
    for key, value in mapping.items():
        if key not in accepted:
            raise SweepConfigError(f"{where}: unknown key {key!r}; accepted keys are {', '.join(accepted)}.")
        expected = accepted[key]
        allowed = expected if isinstance(expected, tuple) else (expected,)
        if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, expected):
            raise SweepConfigError(
                f"{where}: {key!r} must be {_type_label(expected)}, not {type(value).__name__} ({value!r})."
            )


def check_name(source: str, name: str) -> None:
    """A name whose sweep id (``sweep_meta.new_sweep_id``: the name made file-safe, then the time) starts
    with a letter, a digit or ``_``: an empty name (or one of slashes) gives an id starting with ``-``,
    which ``--resume`` then reads as an option, and one starting with ``.`` a hidden folder."""
    safe = safe_name(name)
    if not safe or safe[0] in "-.":
        example = new_sweep_id(name)
        raise SweepConfigError(
            f"{source}: name {name!r} cannot name a sweep (its id would start {example[:12]!r}..., which "
            "`--resume` would read as an option or hide); give a name that starts with a letter or digit, such "
            "as 'smoke'."
        )


def check_probe_settings(where: str, settings: dict) -> None:
    """Every key a settable probe parameter, every value acceptable (``probe_params``)."""
    try:
        probe_params.check(settings, where, settable_only=True)
    except probe_params.ParameterError as exc:
        raise SweepConfigError(str(exc)) from None


def _positive(where: str, key: str, value) -> None:
    if value is not None and value <= 0:
        raise SweepConfigError(f"{where}: {key} must be greater than 0 (seconds), not {value!r}.")


def check_matrix(source: str, matrix: dict) -> dict:
    """``matrix: {mode: [eager, compile], cache: [dynamic, static], max_new_tokens: [8, 32]}``: each axis one
    of ``probe_params.MATRIX_AXES`` with a non-empty list of acceptable, distinct values."""
    for axis, values in matrix.items():
        where = f"{source}: matrix"
        if axis not in probe_params.MATRIX_AXES:
            raise SweepConfigError(
                f"{where}: {axis!r} cannot be a matrix axis; use {', '.join(probe_params.MATRIX_AXES)}."
            )
        if not isinstance(values, list) or not values or len(set(map(str, values))) != len(values):
            raise SweepConfigError(f"{where}: {axis!r} needs a list of distinct values, like [eager, compile].")
        for value in values:
            check_probe_settings(where, {axis: value})
    return dict(matrix)


def resolve_source(model_id: str, base: Path, where: str) -> str:
    """A local folder (relative to ``base``) becomes an absolute path and must exist; a Hub id
    stays as it is."""
    if not is_local(model_id) and not (base / model_id).is_dir():
        return model_id
    candidate = Path(model_id).expanduser()
    if not candidate.is_absolute():
        candidate = base / candidate
    if not candidate.is_dir():
        raise SweepConfigError(
            f"{where}: the local model folder {model_id!r} does not exist; "
            "build the fixtures with `make fixtures` or fix the path."
        )
    return str(candidate.resolve())


def hub_models(spec: dict) -> list[dict]:
    """Model ids (with their metadata) from the Hub's rankings for a task, resolved now."""
    from ..probe import hub_fetch
    from . import budget

    try:
        return budget.list_models(
            spec.get("task", "text-generation"), spec.get("sort", "downloads"), spec.get("limit", 50)
        )
    except (hub_fetch.EnvironmentProblem, hub_fetch.NoAccess) as exc:
        raise SweepConfigError(
            f"models_from_hub: could not list models from the Hugging Face Hub ({exc}); this machine may have "
            "no Hub access, so list the models explicitly under 'models'."
        ) from None


def parse(raw: dict, source: str = "<params>", base: Path | None = None) -> SweepParams:
    """Validate a loaded YAML mapping into ``SweepParams``; raise SweepConfigError on the first problem.
    Long because it reads as the definition's field list, one check after another in the file's order."""
    base = base or Path.cwd()
    if not isinstance(raw, dict):
        raise SweepConfigError(f"{source}: the file must hold a mapping with keys {', '.join(TOP_KEYS)}.")
    _check_keys(source, raw, TOP_KEYS)
    if "name" not in raw:
        raise SweepConfigError(f"{source}: 'name' is missing; give the sweep a short name such as 'smoke'.")
    check_name(source, raw["name"])
    executor = raw.get("executor", "local")
    if executor not in EXECUTORS:
        raise SweepConfigError(f"{source}: executor {executor!r} is not one of {', '.join(EXECUTORS)}.")
    probe = dict(raw.get("probe") or {})
    check_probe_settings(f"{source}: probe", probe)
    _positive(source, "timeout_s", raw.get("timeout_s"))
    workers = raw.get("workers")
    if workers is not None and workers < 1:
        raise SweepConfigError(f"{source}: workers must be at least 1, not {workers}.")
    prefetch = raw.get("prefetch", 1)
    if prefetch < 0:
        raise SweepConfigError(f"{source}: prefetch must be 0 (no download ahead) or more, not {prefetch}.")
    matrix = check_matrix(source, raw.get("matrix") or {})
    cache = dict(raw.get("cache") or {})
    _check_keys(f"{source}: cache", cache, CACHE_KEYS)
    if cache.get("max_gb") is not None and cache["max_gb"] <= 0:
        raise SweepConfigError(f"{source}: cache.max_gb must be greater than 0, not {cache['max_gb']!r}.")

    models: list[ModelEntry] = []
    excluded: dict[str, str] = {}
    for index, entry in enumerate(raw.get("models") or []):
        where = f"{source}: models[{index}]"
        if isinstance(entry, str):
            entry = {"id": entry}
        _check_keys(where, entry, MODEL_KEYS)
        if "id" not in entry:
            raise SweepConfigError(f"{where}: 'id' is missing; give a Hub id or a local folder.")
        check_probe_settings(f"{where}: overrides", entry.get("overrides") or {})
        _positive(where, "timeout_s", entry.get("timeout_s"))
        if "exclude" in entry:
            excluded[portable_id(entry["id"])] = entry["exclude"]
            continue
        path = resolve_source(entry["id"], base, where)
        models.append(ModelEntry(portable_id(path), path, dict(entry.get("overrides") or {}), entry.get("timeout_s")))
    for index, entry in enumerate(raw.get("exclude") or []):
        where = f"{source}: exclude[{index}]"
        _check_keys(where, entry, EXCLUDE_KEYS)
        if "id" not in entry or "reason" not in entry:
            raise SweepConfigError(f"{where}: an exclusion needs both 'id' and 'reason'.")
        excluded[portable_id(entry["id"])] = entry["reason"]
    hub_list = {}
    if "models_from_hub" in raw:
        hub_list = raw["models_from_hub"]
        _check_keys(f"{source}: models_from_hub", hub_list, HUB_KEYS)
        if hub_list.get("sort", "downloads") not in HUB_SORTS:
            raise SweepConfigError(f"{source}: models_from_hub.sort must be one of {', '.join(HUB_SORTS)}.")
        if hub_list.get("task", probe_core.TEXT_GENERATION) not in probe_core.TASKS:
            raise SweepConfigError(
                f"{source}: models_from_hub.task {hub_list['task']!r} is not a task the probe runs; use "
                f"{' or '.join(probe_core.TASKS)}."
            )
        known = {m.model_id for m in models}
        for found in hub_models(hub_list):
            if found["model_id"] not in known and found["model_id"] not in excluded:
                models.append(
                    ModelEntry(found["model_id"], hub={**found, "listed_by": hub_list.get("sort", "downloads")})
                )
    ids = [m.model_id for m in models]
    duplicates = sorted({m for m in ids if ids.count(m) > 1})
    if duplicates:
        raise SweepConfigError(f"{source}: model {duplicates[0]!r} is listed twice; list each model once.")
    files: dict[str, str] = {}  # one to one, and apart on a filesystem that ignores case too
    for model_id in ids:
        other = files.setdefault(model_file_name(model_id).lower(), model_id)
        if other != model_id:
            raise SweepConfigError(
                f"{source}: models {other!r} and {model_id!r} would share one record file on a filesystem that "
                "ignores case; list one of them in a sweep of its own."
            )
    models = [m for m in models if m.model_id not in excluded]
    if not models:
        raise SweepConfigError(f"{source}: no models to run; list some under 'models'.")
    return SweepParams(
        name=raw["name"],
        models=models,
        excluded=excluded,
        probe=probe,
        timeout_s=float(raw.get("timeout_s", 900)),
        workers=workers,
        executor=executor,
        source=source,
        description=raw.get("description", ""),
        cache=cache,
        hub_list=hub_list,
        prefetch=prefetch,
        matrix=matrix,
    )


def check_devices(definition: SweepParams) -> None:
    """Every device the sweep asks for must be present here: refused once, up front, with the
    sentence the probe would record for each model."""
    wanted = {definition.probe.get("device", "auto")}
    wanted |= {m.overrides["device"] for m in definition.models if "device" in m.overrides}
    for device in sorted(wanted):
        problem = devices.check_available(device)
        if problem:
            raise SweepConfigError(problem)


#: How long importing torchvision (and torch) in the check's child process may take.
VISION_CHECK_TIMEOUT_S = 300.0


def check_vision() -> None:
    """An installed torchvision that does not import beside this torch (a build for another torch) makes
    transformers fail every model's load, text models included: refused before the sweep, with the sentence
    that says what to do. Checked in a short-lived child process (the runner must not import torch); only
    when torchvision is installed at all."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        return
    import os
    import subprocess
    import sys

    check = "from model_support.probe.probe_core import torchvision_broken; print(torchvision_broken() or 'ok')"
    env = {**os.environ, devices.AUTOLOAD_VAR: "0"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", check], capture_output=True, text=True, env=env, timeout=VISION_CHECK_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise SweepConfigError(
            f"This environment cannot probe models: importing torchvision did not finish within "
            f"{VISION_CHECK_TIMEOUT_S:g} s; check it with `python -c 'import torchvision'`, or uninstall it "
            "(pip uninstall torchvision) if no model needs it."
        ) from None
    answer = (done.stdout.strip().splitlines() or [f"the check failed: {done.stderr.strip()[-300:]}"])[-1]
    if answer != "ok":
        raise SweepConfigError(f"This environment cannot probe models: {answer}.")


def check_hub(definition: SweepParams, threads: int = 8) -> None:
    """Look every Hub model up once, before the sweep starts: a model or revision that does not exist
    is refused (one sentence); one without access (gated, private), too large for the cache budget
    or the free disk, or listed by the Hub as a task the probe does not run (with task auto) becomes an
    excluded row with that reason; the others keep their Hub facts
    (metadata, resolved commit, size) in ``sweep.json``. When the Hub cannot be reached nothing is
    refused: the models are downloaded (or left pending) when the sweep runs."""
    from concurrent.futures import ThreadPoolExecutor

    from ..probe import hub, hub_fetch
    from . import budget

    remote = [m for m in definition.models if not is_local(m.source)]
    if not remote:
        return
    cache = definition.cache
    cache_budget = budget.CacheBudget(cache.get("dir") or None, cache.get("max_gb"), bool(cache.get("keep", False)))

    def look(entry: ModelEntry):
        revision = entry.overrides.get("revision", definition.probe.get("revision", ""))
        try:
            return hub.model_facts(entry.source, revision, attempts=1, log=lambda _: None)
        except (hub_fetch.EnvironmentProblem, hub_fetch.NoAccess, hub_fetch.NotOnHub) as exc:
            return exc

    with ThreadPoolExecutor(max_workers=threads) as pool:
        found = list(pool.map(look, remote))
    for entry, facts in zip(remote, found):
        if isinstance(facts, hub_fetch.NotOnHub):
            raise SweepConfigError(f"{definition.source}: {facts}")
        if isinstance(facts, hub_fetch.NoAccess):
            definition.excluded[entry.model_id] = str(facts)
        elif isinstance(facts, dict):
            entry.hub = {**entry.hub, **{k: v for k, v in facts.items() if k not in ("files", "planned_files")}}
            reason = facts["planned_bytes"] is not None and cache_budget.too_large_reason(facts["planned_bytes"])
            if reason:
                definition.excluded[entry.model_id] = reason
            reason = _other_task(definition, entry)
            if reason:
                definition.excluded[entry.model_id] = reason
    definition.models = [m for m in definition.models if m.model_id not in definition.excluded]


def _other_task(definition: SweepParams, entry: ModelEntry) -> str | None:
    """Why the model is not probed at all: its task is auto and the Hub lists it as a task the probe does not
    run (``probe_core.task_of_pipeline_tag``), else None. Found before anything is downloaded."""
    if entry.overrides.get("task", definition.probe.get("task", "auto")) != "auto":
        return None
    try:
        probe_core.task_of_pipeline_tag(entry.hub.get("pipeline_tag"))
    except probe_core.NotAProbedTask as exc:
        return str(exc)
    return None


def load(path: Path, check_device: bool = True) -> SweepParams:
    """Read and validate a params YAML file (and, unless told not to, that its device is here and
    that its Hub models exist: ``check_devices``, ``check_hub``)."""
    path = Path(path)
    if not path.is_file():
        raise SweepConfigError(
            f"Sweep definition {str(path)!r} does not exist; pass a YAML file such as params/smoke.yaml."
        )
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SweepConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]}).") from exc
    definition = parse(raw, source=str(path), base=Path.cwd())
    if check_device:
        check_devices(definition)
        check_vision()
        check_hub(definition)
    return definition
