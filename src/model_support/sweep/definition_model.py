"""A sweep definition's declaration (pydantic) and the YAML reader that keeps each key's line.

Every mistake in a definition is found in one pass and said at once, one sentence each, with its
file and line: pydantic's models forbid unknown keys, take types strictly (``workers: 1.5`` and
``timeout_s: true`` are refused, not rounded or read as 1) and refuse ``.nan`` and ``.inf`` (``nan
<= 0`` is false, so a range alone lets them through), and report every error with its path; the
probe's settings are checked against the probe's one declaration (``probe_params``). The reader
refuses a key given twice (YAML keeps the last: a second ``probe:`` would drop the first's
settings).

Imported only where a definition is read (``definition.parse``): pydantic is not among the CLI's
imports.
"""

import difflib
import typing
from collections.abc import Hashable
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from ..probe import probe_core, probe_params
from ..probe.model_ids import is_local
from ..record.names import is_plain_word
from ..record.sweep_meta import new_sweep_id, safe_name

#: Where in the file each key and list item is: its path (keys and indexes, as pydantic's ``loc``)
#: -> (line, column).
Lines = dict[tuple, tuple[int, int]]

#: A mistake: where it is ((line, column); (0, 0) where unknown: they sort first) and its sentence.
Mistake = tuple[tuple[int, int], str]

# --- the YAML reader ----------------------------------------------------------------------------


class Read(NamedTuple):
    """A definition file as read: its data, each key's line, and the keys given twice."""

    raw: Any
    lines: Lines
    twice: list[Mistake]


def yaml_mistake(exc: yaml.YAMLError, source: str) -> str:
    """A YAML syntax error in one sentence with its line and column (PyYAML's own words, without
    its excerpt)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{source}, line {mark.line + 1}, column {mark.column + 1}" if mark else source
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    return f"{where}: not valid YAML: {problem}{f' ({context})' if context else ''}."


def read(text: str, source: str) -> Read:
    """Parse ``text`` (YAML) keeping each key's line; ``yaml.YAMLError`` when it is not YAML."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return Read(None, {}, [])
        lines: Lines = {}
        twice: list[Mistake] = []
        _walk(loader, node, (), lines, twice, source, set())
        return Read(loader.construct_document(node), lines, twice)
    finally:
        loader.dispose()


def _walk(
    loader, node, path: tuple, lines: Lines, twice: list[Mistake], source: str, above: set
) -> None:
    """Record the line of every key and list item under ``node``, and each key given twice in one
    mapping."""
    if id(node) in above:  # an alias of a node that holds it: walked once
        return
    above = above | {id(node)}
    if isinstance(node, yaml.MappingNode):
        first: dict = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = loader.construct_object(key_node, deep=True)
            at = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            if isinstance(key, Hashable) and key in first:
                said = (
                    f"{source}, line {at[0]}: {dotted(path + (key,))} is given twice (first at "
                    f"line {first[key]}), and the second would replace the first; give it once."
                )
                twice.append((at, said))
            elif isinstance(key, Hashable):
                first[key] = at[0]
                lines[path + (key,)] = at
            _walk(loader, value_node, path + (key,), lines, twice, source, above)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[path + (index,)] = (item.start_mark.line + 1, item.start_mark.column + 1)
            _walk(loader, item, path + (index,), lines, twice, source, above)


# --- local model folders -----------------------------------------------------------------------


def _local_path(model_id: str, base: Path) -> Path | None:
    """The folder ``model_id`` names when it is a local one (a path, or a folder of that name
    under ``base``), else None: a Hub id."""
    if not is_local(model_id) and not (base / model_id).is_dir():
        return None
    candidate = Path(model_id).expanduser()
    return candidate if candidate.is_absolute() else base / candidate


def missing_folder(model_id: str, base: Path) -> str | None:
    """The sentence for a local model folder that does not exist, else None."""
    path = _local_path(model_id, base)
    if path is None or path.is_dir():
        return None
    return (
        f"the local model folder {model_id!r} does not exist; build the fixtures with `make "
        "fixtures` or fix the path."
    )


def local_source(model_id: str, base: Path) -> str:
    """Where the probe loads ``model_id`` from: a local folder (relative to ``base``) as an
    absolute path, a Hub id as it is."""
    path = _local_path(model_id, base)
    return model_id if path is None else str(path.resolve())


# --- the declaration ----------------------------------------------------------------------------


def _mistake(sentence: str, at: str = "parent") -> PydanticCustomError:
    """A validator's own sentence; ``at`` says what the message starts with: the path of its
    parent mapping (``parent``: a probe setting's sentence names the setting), its own path
    (``self``), or its own path as the sentence's subject (``subject``: the sentence goes on from
    it)."""
    return PydanticCustomError("definition", "{sentence}", {"sentence": sentence, "at": at})


def _setting(param: probe_params.Param, value: Any) -> Any:
    """A probe setting, checked by the probe's one declaration (its sentence, e.g.
    ``dtype='float99' is not accepted; use one of ...``)."""
    problem = param.problem(value)
    if problem:
        raise _mistake(problem)
    return value


def _axis(param: probe_params.Param, values: Any) -> Any:
    """A matrix axis: a non-empty list of distinct values, each acceptable for its probe setting."""
    if not isinstance(values, list) or not values or len(set(map(str, values))) != len(values):
        raise _mistake(f"{param.name!r} needs a list of distinct values, like [eager, compile].")
    for value in values:
        _setting(param, value)
    return values


def _settings_model(name: str, check, names: tuple[str, ...]) -> type[BaseModel]:
    """A mapping of probe settings as a model made from the declaration: one field per name,
    checked by ``check``; a key that is none of them is an extra (refused)."""
    fields: dict[str, Any] = {
        n: (Annotated[Any, AfterValidator(partial(check, probe_params.BY_NAME[n]))], None)
        for n in names
    }
    return create_model(name, __config__=ConfigDict(extra="forbid"), **fields)


#: ``probe:`` and a model's ``overrides:``: what a sweep may set (``probe_params.SETTABLE``).
ProbeSettings = _settings_model("ProbeSettings", _setting, probe_params.SETTABLE)
#: ``matrix:``: the settings a sweep may cross with every model.
Matrix = _settings_model("Matrix", _axis, probe_params.MATRIX_AXES)


def _sweep_name(name: str) -> str:
    """A plain word (``names.PLAIN_WORD``), the start of its sweep's id and folder as written: an
    empty name (or one of slashes) would give an id starting with ``-``, which ``--resume`` then
    reads as an option, one starting with ``.`` a hidden folder, and any other character
    (``bad/../x``, a space) would be changed in the id (``bad__..__x``), which ``latest:NAME``
    would then not find."""
    safe = safe_name(name)
    if not safe or safe[0] in "-.":
        raise _mistake(
            f"name {name!r} cannot name a sweep (its id would start "
            f"{new_sweep_id(name)[:12]!r}..., which `--resume` would read as an option or "
            "hide); give a name that starts with a letter or digit, such as 'smoke'."
        )
    if not is_plain_word(name):
        raise _mistake(
            f"name {name!r} is not a plain name (its sweep's id and folder would read "
            f"{safe!r}); use letters, digits, '.', '_' and '-', starting with a letter or "
            "digit, at most 100 characters, such as 'smoke'."
        )
    return name


def _task(task: str) -> str:
    if task not in probe_core.TASKS:
        raise _mistake(
            f"{task!r} is not a task the probe runs; use {' or '.join(probe_core.TASKS)}.",
            at="subject",
        )
    return task


def _expect_file(path: str, info: ValidationInfo) -> str:
    """An expectations file that is there, relative to the definition's folder (its entries are
    checked where the expectations are read: ``analysis.expectations``)."""
    folder = (info.context or {}).get("folder") or Path.cwd()
    if not (Path(folder) / path).is_file():
        raise _mistake(
            f"{path!r} is no file (relative to {str(folder)!r}, the definition's folder); give "
            "an expectations YAML file of MODEL: {verdict, reason, until}.",
            at="subject",
        )
    return path


def _id_alone(entry: Any) -> Any:
    """A model given as its id alone (``- org/model``) is ``{id: org/model}``."""
    return {"id": entry} if isinstance(entry, str) else entry


class _Strict(BaseModel):
    """No unknown key, no type converted (1.5 is no whole number, true no number), no nan or inf."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


Seconds = Annotated[float, Field(gt=0, description="a number of seconds greater than 0")]


class ModelItem(_Strict):
    id: str = Field(
        description="a Hub id or a local folder",
        json_schema_extra={"missing": "give a Hub id or a local folder"},
    )
    overrides: ProbeSettings | None = Field(None, description="a mapping of probe parameters")  # type: ignore[valid-type]
    timeout_s: Seconds | None = Field(None, description="a number of seconds greater than 0")
    exclude: str | None = Field(None, description="the reason it is not probed")

    @model_validator(mode="after")
    def _there(self, info: ValidationInfo) -> "ModelItem":
        """A local model folder must exist (relative to the folder the sweep runs from), unless
        excluded."""
        base = (info.context or {}).get("base") or Path.cwd()
        problem = None if self.exclude is not None else missing_folder(self.id, base)
        if problem:
            raise _mistake(problem, at="self")
        return self


class Exclusion(_Strict):
    id: str = Field(
        description="a Hub id",
        json_schema_extra={"missing": "an exclusion needs both 'id' and 'reason'"},
    )
    reason: str = Field(
        description="why it is not probed",
        json_schema_extra={"missing": "an exclusion needs both 'id' and 'reason'"},
    )


class HubList(_Strict):
    task: Annotated[str, AfterValidator(_task)] = Field(
        probe_core.TEXT_GENERATION, description="a task the probe runs"
    )
    sort: Literal["downloads", "trending", "likes"] = Field(
        "downloads", description="downloads, trending or likes"
    )
    limit: int = Field(50, ge=1, description="a whole number of models, at least 1")


class Cache(_Strict):
    dir: str | None = Field(None, description="a folder")
    max_gb: Annotated[float, Field(gt=0)] | None = Field(
        None, description="a number of GB greater than 0"
    )
    keep: bool = Field(False, description="true or false")


def _stack_name(name: str) -> str:
    """A stack's name names its rows' variant (``eager+dynamic@NAME``) and so their files: a
    plain name."""
    problem = probe_params.BY_NAME["stack_name"].problem(name)
    if problem or not name:
        raise _mistake(
            f"stack name {name!r} is not a plain name; use letters, digits, '.', '_' and '-' "
            "(such as 'no-rsqrt').",
            at="subject",
        )
    return name


class Stack(_Strict):
    """One stack of a sweep that runs its models on several (``stacks:``): the environment
    variables it sets (the backend's settings: ``LIBTPU_INIT_ARGS``, ``XLA_FLAGS``, ...) for its
    probes' processes, and the distributions it pins to other versions (its probes run in an
    overlay environment: ``bisect.envs``)."""

    env: dict[str, str] = Field(
        default_factory=dict, description="a mapping of environment variable names to string values"
    )
    packages: dict[str, str] = Field(
        default_factory=dict, description="a mapping of distributions to versions"
    )

    @model_validator(mode="after")
    def _runnable(self) -> "Stack":
        from packaging.utils import canonicalize_name
        from packaging.version import InvalidVersion, Version

        for dist, version in self.packages.items():
            if canonicalize_name(dist) == "model-support":
                raise _mistake(
                    "a stack cannot pin model-support itself: the probe is this checkout's.",
                    at="self",
                )
            try:
                Version(version)
            except InvalidVersion:
                raise _mistake(
                    f"{dist}: {version!r} is not a version (such as 5.24.0).", at="self"
                ) from None
        for name in self.env:
            if not name or not all(c.isalnum() or c == "_" for c in name) or name[0].isdigit():
                raise _mistake(
                    f"{name!r} is not an environment variable name (letters, digits and '_').",
                    at="self",
                )
        return self


class Definition(_Strict):
    """A sweep definition, as docs/sweeps.md lists its keys."""

    name: Annotated[str, AfterValidator(_sweep_name)] = Field(
        description="a short name such as 'smoke'",
        json_schema_extra={"missing": "give the sweep a short name such as 'smoke'"},
    )
    description: str = Field("", description="a line of text")
    models: list[Annotated[ModelItem, BeforeValidator(_id_alone)]] | None = Field(
        None, description="a list of Hub ids or local folders"
    )
    exclude: list[Exclusion] | None = Field(None, description="a list of {id, reason}")
    probe: ProbeSettings | None = Field(None, description="a mapping of probe parameters")  # type: ignore[valid-type]
    timeout_s: Seconds = 900.0
    workers: Annotated[int, Field(ge=1)] | None = Field(
        None, description="a whole number of at least 1"
    )
    executor: Literal["local", "ray"] = Field("local", description="local or ray")
    models_from_hub: HubList | None = Field(None, description="a mapping {task, sort, limit}")
    cache: Cache | None = Field(None, description="a mapping {dir, max_gb, keep}")
    prefetch: int = Field(1, ge=0, description="0 (no download ahead) or more")
    matrix: Matrix | None = Field(  # type: ignore[valid-type]
        None, description="a mapping of probe parameters to lists of values"
    )
    stacks: dict[Annotated[str, AfterValidator(_stack_name)], Stack] | None = Field(
        None, description="a mapping of stack names to {env, packages}"
    )
    expect: Annotated[str, AfterValidator(_expect_file)] | None = Field(
        None, description="an expectations file (YAML), relative to the definition"
    )
    reruns: int = Field(
        1, ge=0, description="0 (no rerun) or more: how often a changed verdict is rerun"
    )


#: What a list's item is, in words, by the list's key.
ITEM_WORDS = {
    "models": "a Hub id, a local folder or a mapping {id, overrides, timeout_s, exclude}",
    "exclude": "a mapping {id, reason}",
}


def validate(
    raw: Any, source: str, base: Path, lines: Lines
) -> tuple[Definition | None, list[Mistake]]:
    """The definition, or None and every mistake in it (one sentence each, with its line)."""
    try:
        folder = Path(source).parent if Path(source).is_file() else base
        return Definition.model_validate(raw, context={"base": base, "folder": folder}), []
    except ValidationError as exc:
        return None, [
            (_at(tuple(e["loc"]), lines), _sentence(e, source, lines)) for e in exc.errors()
        ]


# --- pydantic's errors in words -----------------------------------------------------------------


def dotted(loc: tuple) -> str:
    """``("models", 2, "timeout_s")`` -> ``models[2].timeout_s``."""
    text = ""
    for part in loc:
        text += (
            f"[{part}]"
            if isinstance(part, int) and not isinstance(part, bool)
            else f"{'.' if text else ''}{part}"
        )
    return text


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    """The model inside a field's type (``list[Annotated[ModelItem, ...]] | None`` -> ModelItem),
    if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The model whose mapping is at ``loc`` (``()``: the definition)."""
    model: type[BaseModel] | None = Definition
    for part in loc:
        if isinstance(part, int):
            continue  # a list's item: the list's own type already names its model
        field = model.model_fields.get(part) if model else None
        model = _inner_model(field.annotation) if field else None
    return model


def _accepted(loc: tuple) -> str:
    """What the value at ``loc`` may be, in words (its field's description)."""
    if loc and isinstance(loc[-1], int) and not isinstance(loc[-1], bool):
        return ITEM_WORDS.get(str(loc[-2]) if len(loc) > 1 else "", "an item of that list")
    model = _model_at(loc[:-1])
    field = model.model_fields.get(str(loc[-1])) if model and loc else None
    return field.description if field is not None and field.description else "something else"


def _at(loc: tuple, lines: Lines) -> tuple[int, int]:
    """Where ``loc`` is in the file, else the nearest mapping or list above it that the file has;
    (0, 0) when unknown (a mapping given in Python, a key missing from the top)."""
    for end in range(len(loc), 0, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return (0, 0)


def _shown(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def _unknown_key(parent: tuple, key: Any) -> str:
    """An unknown key, with the closest known one: a probe setting's sentence comes from the
    probe's declaration."""
    model = _model_at(parent)
    if model is ProbeSettings:
        if key in probe_params.BY_NAME:
            return f"{key!r} is set by the sweep runner for each model; remove it."
        return probe_params.unknown_name(key, probe_params.SETTABLE)
    if model is Matrix:
        return f"{key!r} cannot be a matrix axis; use {', '.join(probe_params.MATRIX_AXES)}."
    accepted = list(model.model_fields) if model else []
    meant = difflib.get_close_matches(str(key), accepted, n=1, cutoff=0.6)
    hint = f" (did you mean {meant[0]!r}?)" if meant else ""
    return f"unknown key {key!r}{hint}; accepted keys are {', '.join(accepted)}."


def _missing(loc: tuple) -> str:
    model = _model_at(loc[:-1])
    field = model.model_fields.get(str(loc[-1])) if model else None
    extra = (
        field.json_schema_extra
        if field is not None and isinstance(field.json_schema_extra, dict)
        else {}
    )
    return f"{loc[-1]!r} is missing; {extra.get('missing', 'give it')}."


def _sentence(error: ErrorDetails, source: str, lines: Lines) -> str:
    """One pydantic error as one sentence: the file and line, where in the definition, what is
    wrong and what is accepted."""
    loc, kind = tuple(error["loc"]), error["type"]
    line, _ = _at(loc, lines)
    where = f"{source}, line {line}" if line else source
    parent = loc[:-1]
    if kind == "definition":
        at = error["ctx"]["at"]
        said = error["ctx"]["sentence"]
        if at == "subject":
            return f"{where}: {dotted(loc)} {said}"
        inside = dotted(loc if at == "self" else parent)
        return f"{where}: {inside + ': ' if inside else ''}{said}"
    if not loc:
        return (
            f"{where}: the file must hold a mapping with keys {', '.join(Definition.model_fields)}."
        )
    prefix = f"{dotted(parent)}: " if parent else ""
    if kind == "extra_forbidden":
        return f"{where}: {prefix}{_unknown_key(parent, loc[-1])}"
    if kind == "missing":
        return f"{where}: {prefix}{_missing(loc)}"
    if kind == "invalid_key":
        return (
            f"{where}: {prefix}the key {error['input']!r} is not a name (YAML reads yes, no, "
            "on and off as true or false); put it in quotes."
        )
    return f"{where}: {dotted(loc)} must be {_accepted(loc)}, not {_shown(error['input'])}."
