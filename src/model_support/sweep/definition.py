"""Sweep definitions (YAML in ``params/``), validated before anything runs.

A typo or a bad value must never become a silently ignored setting or a FAIL row per model: the
keys, their types and ranges are declared once (``definition_model``, pydantic: unknown keys
forbidden, types strict, no nan or inf), every probe setting is checked against the probe's one
declaration (``probe_params``), local model folders must exist, and the device must be present on
this machine (checked once, up front, with the sentence the probe itself would record). Every
mistake is found in one pass and said at once, one sentence each, naming the file and line, what is
wrong and what is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from ..probe import devices, probe_core
from ..probe.model_ids import is_local, portable_id
from ..record.names import model_file_name
from ..record.sweep_meta import ModelEntry


class SweepConfigError(UserError):
    """A sweep definition is wrong; the message is one sentence per mistake, naming what and how
    to fix it."""


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
    #: The expectations file (absolute; ``expect:``, relative to the definition), "" for none.
    expect: str = ""
    #: How often a verdict that differs from the baseline's is rerun before it counts
    #: (``sweep.reruns``).
    reruns: int = 1
    #: What sweep.json keeps of ``expect``: {"file", "entries": the file's mapping, dates as ISO
    #: text}; checked by ``analysis.expectations.from_meta`` (the CLI, before the sweep is written).
    expectations: dict = field(default_factory=dict)
    #: ``stacks:``: name -> {"env": {VAR: value}, "packages": {dist: version}}; every model and
    #: variant runs on each (empty: one stack)
    stacks: dict = field(default_factory=dict)


def refuse(found: list[tuple[tuple[int, int], str]], source: str) -> None:
    """Raise one SweepConfigError saying every mistake (((line, column), sentence) pairs): one
    sentence, or a count and a sentence a line, in the file's order."""
    mistakes = [sentence for _, sentence in sorted(found, key=lambda mistake: mistake[0])]
    if len(mistakes) == 1:
        raise SweepConfigError(mistakes[0])
    if mistakes:
        raise SweepConfigError(f"{len(mistakes)} mistakes in {source}:\n" + "\n".join(mistakes))


def hub_models(spec: dict) -> list[dict]:
    """Model ids (with their metadata) from the Hub's rankings for a task, resolved now."""
    from ..probe import hub_fetch
    from . import budget

    try:
        return budget.list_models(
            spec.get("task", "text-generation"),
            spec.get("sort", "downloads"),
            spec.get("limit", 50),
        )
    except (hub_fetch.EnvironmentProblem, hub_fetch.NoAccess) as exc:
        raise SweepConfigError(
            f"models_from_hub: could not list models from the Hugging Face Hub ({exc}); this "
            "machine may have no Hub access, so list the models explicitly under 'models'."
        ) from None


def parse(
    raw, source: str = "<params>", base: Path | None = None, lines: dict | None = None, found=()
) -> SweepParams:
    """Validate a loaded YAML mapping into ``SweepParams``; a SweepConfigError says every mistake
    at once (``definition_model``; ``lines``: each key's line in the file, ``found``: mistakes
    its reader found). What needs the definition whole (the Hub's rankings, a model listed twice)
    comes after."""
    from . import definition_model  # pydantic: imported only where a definition is read

    base = base or Path.cwd()
    checked, mistakes = definition_model.validate(raw, source, base, lines or {})
    refuse([*found, *mistakes], source)
    assert checked is not None
    models: list[ModelEntry] = []
    excluded: dict[str, str] = {}
    listed_at: dict[str, str] = {}  # model id -> its file and line
    for index, entry in enumerate(checked.models or []):
        if entry.exclude is not None:
            excluded[portable_id(entry.id)] = entry.exclude
            continue
        # a folder there (checked), or a Hub id
        path = definition_model.local_source(entry.id, base)
        overrides = (
            raw["models"][index].get("overrides")
            if isinstance(raw["models"][index], dict)
            else None
        )
        models.append(ModelEntry(portable_id(path), path, dict(overrides or {}), entry.timeout_s))
        listed_at[portable_id(path)] = _at(source, lines or {}, ("models", index))
    for exclusion in checked.exclude or []:
        excluded[portable_id(exclusion.id)] = exclusion.reason
    hub_list = dict(raw.get("models_from_hub") or {})
    if checked.models_from_hub is not None:  # ``models_from_hub: {}`` lists the defaults' models
        known = {m.model_id for m in models}
        for found_model in hub_models(hub_list):
            if found_model["model_id"] not in known and found_model["model_id"] not in excluded:
                models.append(
                    ModelEntry(
                        found_model["model_id"],
                        hub={**found_model, "listed_by": hub_list.get("sort", "downloads")},
                    )
                )
    _one_each([m.model_id for m in models], lambda model_id: listed_at.get(model_id, source))
    models = [m for m in models if m.model_id not in excluded]
    if not models:
        raise SweepConfigError(f"{source}: no models to run; list some under 'models'.")
    # ``expect:`` is relative to the definition
    folder = Path(source).parent if Path(source).is_file() else base
    expect = str((folder / checked.expect).resolve()) if checked.expect else ""
    return SweepParams(
        name=checked.name,
        models=models,
        excluded=excluded,
        probe=dict(raw.get("probe") or {}),
        timeout_s=checked.timeout_s,
        workers=checked.workers,
        executor=checked.executor,
        source=source,
        description=checked.description,
        cache=dict(raw.get("cache") or {}),
        hub_list=hub_list,
        prefetch=checked.prefetch,
        matrix=dict(raw.get("matrix") or {}),
        expect=expect,
        expectations=_expectations(expect, _at(source, lines or {}, ("expect",))) if expect else {},
        reruns=checked.reruns,
        stacks={
            name: {
                "env": dict(stack.env),
                **({"packages": dict(stack.packages)} if stack.packages else {}),
            }
            for name, stack in (checked.stacks or {}).items()
        },
    )


def _expectations(path: str, where: str) -> dict:
    """The expectations file's mapping as sweep.json keeps it (``SweepParams.expectations``):
    read here, its entries checked by the analysis that reads them (``analysis.expectations``)."""
    import datetime as _dt
    import json

    import yaml

    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as exc:
        raise SweepConfigError(
            f"{where}: expect: {path} is not YAML ({str(exc).splitlines()[0]})."
        ) from None
    if not isinstance(raw, dict):
        raise SweepConfigError(
            f"{where}: expect: {path} must hold a mapping of model id to {{verdict, reason, "
            "until}."
        )
    entries = json.loads(
        json.dumps(raw, default=lambda v: v.isoformat() if isinstance(v, _dt.date) else str(v))
    )
    return {"file": path, "entries": entries}


def _at(source: str, lines: dict, loc: tuple) -> str:
    """``source``, with the line of ``loc`` when the file's lines are known."""
    return f"{source}, line {lines[loc][0]}" if loc in lines else source


def _one_each(ids: list[str], where) -> None:
    """Each model once, and no two whose record files would be one on a filesystem that ignores
    case; ``where`` says where a model is listed (its file and line: the last of those of equal
    ids)."""
    duplicates = sorted({m for m in ids if ids.count(m) > 1})
    if duplicates:
        raise SweepConfigError(
            f"{where(duplicates[0])}: model {duplicates[0]!r} is listed twice; list each model "
            "once."
        )
    files: dict[str, str] = {}  # one to one, and apart on a filesystem that ignores case too
    for model_id in ids:
        other = files.setdefault(model_file_name(model_id).lower(), model_id)
        if other != model_id:
            raise SweepConfigError(
                f"{where(model_id)}: models {other!r} and {model_id!r} would share one record "
                "file on a filesystem that ignores case; list one of them in a sweep of its "
                "own."
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


def check_host_ops(definition: SweepParams) -> None:
    """A ``host_ops`` setting (a what-if sweep, ``probe.what_if``) the device takes and whose
    operators can all run on the host: refused once, up front, naming each operator that cannot
    and why (it imports torch, so only a definition that asks for host operators pays for it)."""
    settings = [definition.probe, *(m.overrides for m in definition.models)]
    mixed = [m.model_id for m in definition.models if m.overrides.get("host_ops")]
    if mixed:
        raise SweepConfigError(
            f"host_ops is set in the overrides of {', '.join(mixed[:3])}: a what-if run "
            "belongs in a sweep of its own (set host_ops under probe:), so no sweep mixes the "
            "stack's verdicts with what-if runs."
        )
    asked = {
        (s.get("device", definition.probe.get("device", "auto")), s["host_ops"])
        for s in settings
        if s.get("host_ops")
    }
    if not asked:
        return
    from ..probe import what_if

    for device, setting in sorted(asked):
        adapter = devices.resolve(device)
        # missing too: nothing could go to the host
        problem = what_if.refusal(setting, adapter, missing_too=True)
        if problem and not adapter.host_kernels()[0]:
            problem = f"{problem.removesuffix('.')}; a what-if sweep needs an accelerator."
        if problem:
            raise SweepConfigError(problem)


#: How long importing torchvision (and torch) in the check's child process may take.
VISION_CHECK_TIMEOUT_S = 300.0


def check_vision() -> None:
    """An installed torchvision that does not import beside this torch (a build for another
    torch) makes transformers fail every model's load, text models included: refused before the
    sweep, with the sentence that says what to do. Checked in a short-lived child process (the
    runner must not import torch); only when torchvision is installed at all."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        return
    import os
    import subprocess
    import sys

    check = (
        "from model_support.probe.probe_vision import torchvision_broken; "
        "print(torchvision_broken() or 'ok')"
    )
    env = {**os.environ, devices.AUTOLOAD_VAR: "0"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", check],
            capture_output=True,
            text=True,
            env=env,
            timeout=VISION_CHECK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise SweepConfigError(
            "This environment cannot probe models: importing torchvision did not finish "
            f"within {VISION_CHECK_TIMEOUT_S:g} s; check it with `python -c 'import "
            "torchvision'`, or uninstall it (pip uninstall torchvision) if no model needs it."
        ) from None
    answer = (
        done.stdout.strip().splitlines() or [f"the check failed: {done.stderr.strip()[-300:]}"]
    )[-1]
    if answer != "ok":
        raise SweepConfigError(f"This environment cannot probe models: {answer}.")


def check_hub(definition: SweepParams, threads: int = 8) -> None:
    """Look every Hub model up once, before the sweep starts: a model or revision that does not
    exist is refused (one sentence); one without access (gated, private), too large for the cache
    budget or the free disk, or listed by the Hub as a task the probe does not run (with task
    auto) becomes an excluded row with that reason; the others keep their Hub facts (metadata,
    resolved commit, size) in ``sweep.json``. When the Hub cannot be reached nothing is refused:
    the models are downloaded (or left pending) when the sweep runs."""
    from concurrent.futures import ThreadPoolExecutor

    from ..probe import hub, hub_fetch
    from . import budget

    remote = [m for m in definition.models if not is_local(m.source)]
    if not remote:
        return
    cache = definition.cache
    cache_budget = budget.CacheBudget(
        cache.get("dir") or None, cache.get("max_gb"), bool(cache.get("keep", False))
    )

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
            entry.hub = {
                **entry.hub,
                **{k: v for k, v in facts.items() if k not in ("files", "planned_files")},
            }
            reason = facts["planned_bytes"] is not None and cache_budget.too_large_reason(
                facts["planned_bytes"]
            )
            if reason:
                definition.excluded[entry.model_id] = reason
            reason = _other_task(definition, entry)
            if reason:
                definition.excluded[entry.model_id] = reason
    definition.models = [m for m in definition.models if m.model_id not in definition.excluded]


def _other_task(definition: SweepParams, entry: ModelEntry) -> str | None:
    """Why the model is not probed at all: its task is auto and the Hub lists it as a task the
    probe does not run (``probe_core.task_of_pipeline_tag``), else None. Found before anything is
    downloaded."""
    if entry.overrides.get("task", definition.probe.get("task", "auto")) != "auto":
        return None
    try:
        probe_core.task_of_pipeline_tag(entry.hub.get("pipeline_tag"))
    except probe_core.NotAProbedTask as exc:
        return str(exc)
    return None


def load(
    path: Path,
    check_device: bool = True,
    overrides: dict | None = None,
    executor: str | None = None,
) -> SweepParams:
    """Read and validate a params YAML file (and, unless told not to, that its device is here and
    that its Hub models exist: ``check_devices``, ``check_hub``). ``overrides``: probe settings
    from the command line (``--device``, ``-p NAME=VALUE``), over the file's ``probe:`` and
    validated with it. ``executor``: the command line's ``--executor``; a sweep that runs on Ray
    has its devices checked on the cluster (``executors.ray``), never on the driver, which may
    have none."""
    import yaml

    from . import definition_model

    path = Path(path)
    if not path.is_file():
        raise SweepConfigError(
            f"Sweep definition {str(path)!r} does not exist; pass a YAML file such as "
            "params/smoke.yaml."
        )
    try:
        read = definition_model.read(path.read_text(), str(path))
    except yaml.YAMLError as exc:
        raise SweepConfigError(definition_model.yaml_mistake(exc, str(path))) from None
    raw = read.raw
    if overrides and isinstance(raw, dict) and isinstance(raw.get("probe") or {}, dict):
        raw = {**raw, "probe": {**(raw.get("probe") or {}), **overrides}}
    definition = parse(raw, source=str(path), base=Path.cwd(), lines=read.lines, found=read.twice)
    if check_device:
        if (executor or definition.executor) != "ray":
            check_devices(definition)
        check_host_ops(definition)
        check_vision()
        check_hub(definition)
    elif any(m.overrides.get("host_ops") for m in definition.models):
        # a sweep mixing what-if runs with the stack's is refused wherever it is read
        check_host_ops(definition)
    return definition
