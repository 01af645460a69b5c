"""The probe's parameters, declared once: name, type, default, allowed values or range, help.

The probe notebook's parameters cell is generated from this declaration (a test checks that the
notebook says exactly this), the sweep validation checks every probe setting against it, the debug
notebook and the CLI follow it, and the probe itself checks its arguments with it: the probe
notebook's first cell after the parameters refuses a name papermill was given that is not declared
(with the closest declared one) and a bad value (``refuse_mistakes``). A bad value is refused with
one sentence naming the value and what is accepted, before anything runs.

Standard library only: the probe kernel, the sweep runner and the CLI all import it cheaply.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import math
import re
from dataclasses import dataclass
from typing import Any

from ..errors import UserError
from .agreement import DEFAULT_BOUND, DEFAULT_MARGIN
from .long_text import CHOICES as LONG_TEXT_CHOICES
from .long_text import DEFAULT_TOKENS as LONG_TEXT_TOKENS
from .long_text import MIN_TOKENS as LONG_TEXT_MIN_TOKENS
from .probe_core import DEFAULT_IMAGE_PROMPT, TASKS, VERDICT_TOKENS, run_stages

DEFAULT_PROMPT = "The future of AI is"
#: auto: the Hub's pipeline_tag when known, else the config (``probe_core.task_of_config``).
TASK_CHOICES = ("auto", *TASKS)
#: A device: cpu, auto, or the name torch gives an accelerator (cuda, tpu, xpu, mps, a PrivateUse1
#: backend's); whether this machine has it is the device adapters' question (``devices.resolve``),
#: not the declaration's.
DEVICE_NAME = r"[a-z][a-z0-9_]*"
#: torch's floating-point dtypes a model can be loaded in (a test checks each against torch).
FLOAT_DTYPES = ("bfloat16", "float16", "float32", "float64", "half", "float", "double")
CHAT_TEMPLATES = ("auto", "none", "required")
#: eager; fused: TorchTPU's deferred-and-fused eager (tpu only); compile: torch.compile.
MODES = ("eager", "fused", "compile")
CACHES = ("dynamic", "static")
#: The probe settings a sweep's ``matrix:`` may cross with every model; they name a record's
#: variant.
MATRIX_AXES = ("mode", "cache", "max_new_tokens")
REFERENCES = ("cpu", "none")
#: Where a probe's host checks run: in its own process, or after its device phase, in a host
#: process.
CHECKS = ("here", "after")
#: The perf phase: on, off, or auto (on for an accelerator, off on the CPU); true and false read as
#: on and off.
PERF_CHOICES = ("auto", "on", "off")


class ParameterError(UserError):
    """A probe parameter has a wrong name, type or value."""


@dataclass(frozen=True)
class Param:
    name: str
    type: type
    default: Any
    help: str
    choices: tuple | None = None
    minimum: int | float | None = None  # inclusive
    # set by the sweep runner for each model; a sweep file may not set it
    runner_owned: bool = False
    integers: bool = False  # a str parameter that also takes an integer (devices: 2 or "auto")
    # a str parameter of choices on/off that also takes true/false (perf: false)
    booleans: bool = False
    pattern: str | None = None  # a str parameter's values: this regular expression, whole
    pattern_words: str = ""  # ... in words
    # a setting of the run; False: the runner's bookkeeping (where the record goes, ...)
    setting: bool = True

    def accepted(self) -> str:
        """What is accepted, in words."""
        if self.pattern_words:
            return self.pattern_words
        if self.choices:
            return "one of " + ", ".join(map(str, self.choices))
        if self.minimum is not None:
            return f"{'an integer' if self.type is int else 'a number'} >= {self.minimum}"
        return {
            str: "a string",
            bool: "true or false",
            int: "an integer",
            float: "a number",
            dict: "a mapping",
        }[self.type]

    def problem(self, value: Any, where: str = "") -> str | None:
        """Why ``value`` is not acceptable (one sentence naming it and what is accepted), or
        None. A float must be finite: ``nan`` passes every ``<`` comparison, so a range alone
        would let it through."""
        prefix = f"{where}: " if where else ""
        if self.integers and isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if self.booleans and isinstance(value, bool):
            value = "on" if value else "off"
        wrong_bool = isinstance(value, bool) and self.type is not bool
        number_ok = self.type is float and isinstance(value, int)
        if wrong_bool or not (isinstance(value, self.type) or number_ok):
            return (
                f"{prefix}probe parameter {self.name!r} must be {self.accepted()}, not "
                f"{type(value).__name__} {value!r}."
            )
        if self.type is float and not math.isfinite(value):
            return f"{prefix}{self.name}={value!r} is not a finite number; use {self.accepted()}."
        if self.pattern and not re.fullmatch(self.pattern, value):
            return f"{prefix}{self.name}={value!r} is not accepted; use {self.accepted()}."
        if self.choices and value not in self.choices:
            return f"{prefix}{self.name}={value!r} is not accepted; use {self.accepted()}."
        if self.minimum is not None and value < self.minimum:
            return f"{prefix}{self.name}={value!r} is too small; use {self.accepted()}."
        return None

    def check(self, value: Any, where: str = "") -> Any:
        """The value if acceptable, else a ParameterError naming it and what is accepted
        (``problem``)."""
        problem = self.problem(value, where)
        if problem:
            raise ParameterError(problem)
        if self.booleans and isinstance(value, bool):
            return "on" if value else "off"
        return (
            str(value)
            if self.integers and isinstance(value, int) and not isinstance(value, bool)
            else value
        )


#: In the order the notebook's parameters cell lists them.
PROBE_PARAMS: tuple[Param, ...] = (
    Param("model_id", str, "data/models/SmolLM2-135M-Instruct", "Hub id or local folder"),
    Param("revision", str, "", "branch, tag or commit; empty means the default branch"),
    Param(
        "device",
        str,
        "auto",
        "cpu; auto: the accelerator torch reports, else cpu; or an accelerator's name (cuda, "
        "tpu, xpu, mps, ...)",
        pattern=DEVICE_NAME,
        pattern_words="cpu, auto or an accelerator's name in lower case (cuda, tpu, xpu, mps, ...)",
    ),
    Param(
        "dtype",
        str,
        "bfloat16",
        "torch floating dtype the model is loaded in",
        choices=FLOAT_DTYPES,
    ),
    Param(
        "task",
        str,
        "auto",
        "auto: the Hub's pipeline_tag, else the config; image-text-to-text adds the probe image",
        choices=TASK_CHOICES,
    ),
    Param("prompt", str, DEFAULT_PROMPT, "rendered through the chat template when there is one"),
    Param(
        "image_prompt",
        str,
        DEFAULT_IMAGE_PROMPT,
        "image-text-to-text: the prompt beside the probe image",
    ),
    Param("max_new_tokens", int, VERDICT_TOKENS, "greedy new tokens", minimum=1),
    Param(
        "mode",
        str,
        "eager",
        "eager; fused: TorchTPU's deferred-and-fused eager (tpu only); compile: torch.compile "
        "with the device's backend",
        choices=MODES,
    ),
    Param(
        "cache",
        str,
        "dynamic",
        "the KV cache: dynamic, or static (transformers' static cache)",
        choices=CACHES,
    ),
    Param(
        "devices",
        str,
        "1",
        "1, a power of two, or auto: the fewest devices that hold the model",
        choices=("1", "2", "4", "8", "16", "32", "auto"),
        integers=True,
    ),
    Param(
        "device_memory_gb",
        float,
        0.0,
        "memory per device for devices auto; 0 asks the device",
        minimum=0,
    ),
    Param(
        "chat_template",
        str,
        "auto",
        "auto uses it when the tokenizer has one",
        choices=CHAT_TEMPLATES,
    ),
    Param("trust_remote_code", bool, False, "off unless a sweep explicitly turns it on"),
    Param(
        "reference",
        str,
        "cpu",
        "cpu checks a PASS's logits against the CPU's, teacher-forced on the device's tokens",
        choices=REFERENCES,
    ),
    Param(
        "reference_max_params",
        int,
        3_000_000_000,
        "skip the CPU reference above this many parameters",
        minimum=0,
    ),
    Param(
        "numerics_margin",
        float,
        DEFAULT_MARGIN,
        "nats: a flip where the reference ranks the device's token at most this far below its "
        "best is a near-tie",
        minimum=0,
    ),
    Param(
        "numerics_bound",
        float,
        DEFAULT_BOUND,
        "nats: a step whose KL divergence from the reference exceeds this diverges",
        minimum=0,
    ),
    Param(
        "long_text",
        str,
        "off",
        "agreement over a long real text after a PASS (A Tale of Two Cities, teacher-forced "
        "on the device as one prefill and token by token through the KV cache, each "
        "position's top token against the CPU reference's top 5, cached per model revision in "
        "the data folder): on or off; off by default, since its 1,024 decode steps cost the "
        "device about 85 times a probe's device phase (bench/bench_long_text.py); true and "
        "false read as on and off",
        choices=LONG_TEXT_CHOICES,
        booleans=True,
    ),
    Param(
        "long_text_tokens",
        int,
        LONG_TEXT_TOKENS,
        "long_text: the text's length in tokens (at most the model's positions); each is one "
        "decode step on the device",
        minimum=LONG_TEXT_MIN_TOKENS,
    ),
    Param(
        "judge",
        bool,
        True,
        "score a PASS's text for fluency with a small language model on the CPU",
    ),
    Param(
        "judge_model",
        str,
        "",
        "the judge; empty means data/models/SmolLM2-135M-Instruct when built, else "
        "HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    Param("seed", int, 0, "torch seed before generation", minimum=0),
    Param(
        "perf",
        str,
        "auto",
        "time a PASS on its device after the verdict (TTFT, TPOT, tokens/s over repeats, "
        "bandwidth use): on, off, or auto: on for an accelerator, off on the CPU (the stack "
        "ported is not the CPU's, and CPU sweeps pay for every second); true and false read "
        "as on and off",
        choices=PERF_CHOICES,
        booleans=True,
    ),
    Param(
        "perf_tokens",
        int,
        1,
        "perf: new tokens per timed repeat: the first prices the prompt (a warm TTFT), each "
        "after it adds a TPOT step to the verdict's (at least 4 where the verdict gives none: "
        "the host's clock, compile mode; 16 on the CPU); fixed, so two sweeps' repeats compare",
        minimum=1,
    ),
    Param(
        "perf_repeats",
        int,
        10,
        "perf: at most this many timed repeats of its own (two always run: TTFT's noise); "
        "fewer when TPOT's spread reaches perf_spread or the next would pass perf_budget",
        minimum=1,
    ),
    Param(
        "perf_spread",
        float,
        0.05,
        "perf: stop repeating once TPOT's spread, (max - min) / median over its samples (the "
        "verdict's steps, or each generation's median step), is at most this; 0 runs every "
        "repeat perf_repeats and perf_budget allow",
        minimum=0,
    ),
    Param(
        "perf_budget",
        float,
        0.25,
        "perf: no repeat, once two ran and TPOT has three samples, that would take the "
        "phase's device time past this share of the probe's device time before it (on the CPU "
        "the whole probe so far); 0: no limit",
        minimum=0,
    ),
    Param(
        "perf_trace",
        bool,
        False,
        "perf: profile one more generation after the timed ones with the adapter's profiler "
        "and keep its Chrome trace (Perfetto opens it) beside the record",
    ),
    Param(
        "recompile_check",
        str,
        "auto",
        "compile mode: also generate from 2 more prompt lengths, automatic dynamic shapes off "
        "then on, counting recompiles: on, off, or auto: on for an accelerator, off on the "
        "CPU (there each extra length costs 10-25 s of inductor); true and false read as on "
        "and off",
        choices=PERF_CHOICES,
        booleans=True,
    ),
    # the probe's instruments, each at most 5% of a probe or off by default
    # (bench/bench_instruments.py)
    Param(
        "census",
        str,
        "sampled",
        "the operator census (eager and fused modes): sampled counts the load, the prefill "
        "and the decode steps until two in a row dispatch the same operators, the later "
        "steps' calls extrapolated (ops_time_source says so); full counts every step; off "
        "takes none (ops null); false reads as off",
        choices=("sampled", "full", "off"),
        booleans=True,
    ),
    Param(
        "flight_recorder",
        str,
        "auto",
        "the operator a dead kernel died in: auto records nothing in the probe's own run and "
        "reruns a silent abort once under the recorder (synchronously where the stack can); "
        "on records the probe's own run too (a crash that may not come back); off: neither; "
        "true and false read as on and off",
        choices=("auto", "on", "off"),
        booleans=True,
    ),
    Param(
        "host_cost",
        str,
        "on",
        "count a PASS's host syncs and CPU fallbacks per decode token where the backend keeps "
        "counters: on or off; true and false read as on and off",
        choices=("on", "off"),
        booleans=True,
    ),
    Param(
        "host_ops",
        str,
        "",
        "a what-if run: these aten operators run on the host's CPU kernels (comma-separated: "
        "aten::rsqrt,aten::gelu), or missing: every operator the stack lacks; its record is "
        "kept apart (the what_if config), never the stack's verdict; empty: the stack as it is",
        pattern=r"|missing|(aten::[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)?)(, ?aten::[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)?)*",
        pattern_words="empty, missing, or aten operators separated by commas (aten::rsqrt,aten::add.Tensor)",
    ),
    Param(
        "record_path",
        str,
        "",
        "where to write the record as JSON; empty means only inside this notebook",
        runner_owned=True,
        setting=False,
    ),
    Param("sweep_id", str, "", "set by the sweep runner", runner_owned=True, setting=False),
    Param(
        "snapshot",
        str,
        "",
        "set by the sweep runner: a local folder with the model's files, downloaded ahead; "
        "empty means download here",
        runner_owned=True,
        setting=False,
    ),
    Param(
        "notebook_path",
        str,
        "",
        "set by the sweep runner: where this executed notebook is kept",
        runner_owned=True,
        setting=False,
    ),
    Param(
        "timeout_s",
        float,
        900.0,
        "set by the sweep runner: the model's timeout; ranks of a run over several devices "
        "get what is left of it",
        minimum=1,
        runner_owned=True,
    ),
    Param(
        "hub_facts",
        dict,
        {},
        "set by the sweep runner: the Hub's metadata and download facts for the record "
        "(schema groups hub, download)",
        runner_owned=True,
        setting=False,
    ),
    Param(
        "stack_name",
        str,
        "",
        "set by the sweep runner: the stack (a `stacks:` entry of the definition) this probe "
        "ran on; names its variant (eager+dynamic@NAME); empty: the sweep has one stack",
        pattern=r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}|",
        pattern_words="a stack's name: letters, digits, '.', '_' and '-', starting with a letter or digit",
        runner_owned=True,
    ),
    Param(
        "checks",
        str,
        "here",
        "set by the sweep runner: here runs the host checks (CPU reference, judge, "
        "attribution) in this process; after leaves them to a host process once the device is "
        "released (probe.phases)",
        choices=CHECKS,
        runner_owned=True,
    ),
)
BY_NAME = {p.name: p for p in PROBE_PARAMS}
#: What a sweep definition may set in ``probe:`` or a model's ``overrides:``.
SETTABLE = tuple(p.name for p in PROBE_PARAMS if not p.runner_owned and p.name != "model_id")
#: The settings a probe runs with: every parameter but the model and the runner's bookkeeping
#: (``setting``).
SETTINGS = tuple(p.name for p in PROBE_PARAMS if p.setting and p.name != "model_id")
#: The parameters the probe resolves before its stages get them: the folder to load, the torch
#: device.
_RESOLVED = ("model_id", "device")
#: The settings ``probe_core.run_stages`` takes as they are: every parameter it names, but the
#: resolved ones.
STAGE_SETTINGS = tuple(
    name
    for name in SETTINGS
    if name in inspect.signature(run_stages).parameters and name not in _RESOLVED
)
#: The settings of the reference check (the CPU reference after a PASS, attribution after a FAIL).
REFERENCE_SETTINGS = ("reference", "reference_max_params", "numerics_margin", "numerics_bound")

#: The debug notebook: the probe's loading and generation parameters (a what-if run's ``host_ops``
#: too), plus its own.
DEBUG_PARAMS: tuple[Param, ...] = (
    Param("model_id", str, "data/models/diverge-bf16-overflow", "Hub id or local folder"),
    *(
        BY_NAME[n]
        for n in (
            "revision",
            "device",
            "dtype",
            "task",
            "prompt",
            "image_prompt",
            "chat_template",
            "trust_remote_code",
        )
    ),
    Param(
        "reference_dtype", str, "float32", "dtype of the CPU reference copy", choices=FLOAT_DTYPES
    ),
    Param(
        "tolerance",
        float,
        0.2,
        "relative: max abs difference over the reference's max abs value",
        minimum=0,
    ),
    *(
        BY_NAME[n]
        for n in (
            "max_new_tokens",
            "seed",
            "mode",
            "cache",
            "numerics_margin",
            "numerics_bound",
            "host_ops",
        )
    ),
)


def defaults(params: tuple[Param, ...] = PROBE_PARAMS) -> dict:
    return {p.name: p.default for p in params}


def values(namespace: dict, params: tuple[Param, ...] = PROBE_PARAMS) -> dict:
    """Every declared parameter's value in ``namespace`` (a notebook's ``globals()`` after its
    parameters cell): the notebook's call passes them all, so a parameter declared here reaches
    the probe."""
    return {p.name: namespace[p.name] for p in params}


def stage_settings(settings: dict) -> dict:
    """``run_stages``' keyword arguments that are plain probe settings (``STAGE_SETTINGS``), from
    ``settings``."""
    return {name: settings[name] for name in STAGE_SETTINGS}


def closest(name: str, names) -> str | None:
    """The declared name ``name`` most likely meant (a typo: ``devcie`` for ``device``), or None."""
    found = difflib.get_close_matches(str(name), list(names), n=1, cutoff=0.6)
    return found[0] if found else None


def unknown_name(name: str, accepted, notebook: str = "probe.ipynb", where: str = "") -> str:
    """The sentence for a parameter the notebook does not declare: the closest declared one when
    there is one (a typo), else every accepted name."""
    prefix = f"{where}: " if where else ""
    meant = closest(name, accepted)
    hint = f"did you mean {meant!r}?" if meant else f"accepted: {', '.join(accepted)}."
    return f"{prefix}{name!r} is not a parameter of notebooks/{notebook}; {hint}"


def problems(
    settings: dict,
    where: str = "",
    params: tuple[Param, ...] = PROBE_PARAMS,
    settable_only: bool = False,
) -> list[str]:
    """Every mistake in ``settings`` (names and values), one sentence each, in their order.
    ``settable_only`` refuses the runner-owned ones and model_id (what a sweep file may not set)."""
    declared = {p.name: p for p in params}
    accepted = [n for n in declared if not settable_only or n in SETTABLE]
    notebook = "debug.ipynb" if params is DEBUG_PARAMS else "probe.ipynb"
    prefix = f"{where}: " if where else ""
    found = []
    for name, value in settings.items():
        param = declared.get(name)
        if param is None:
            found.append(unknown_name(name, accepted, notebook, where))
        elif settable_only and name not in SETTABLE:
            found.append(f"{prefix}{name!r} is set by the sweep runner for each model; remove it.")
        else:
            found.append(param.problem(value, where) or "")
    return [sentence for sentence in found if sentence]


def check(
    settings: dict, where: str = "", params: tuple[Param, ...] = PROBE_PARAMS, settable_only=False
) -> dict:
    """Check every setting (names and values, ``problems``); return them, or raise a
    ParameterError with the first mistake."""
    found = problems(settings, where, params, settable_only)
    if found:
        raise ParameterError(found[0])
    return settings


#: The first line of the cell papermill injects after the parameters cell (its
#: ``injected-parameters`` cell).
INJECTED_HEADER = "# Parameters"


def injected_names(namespace: dict) -> list[str]:
    """The names papermill's ``injected-parameters`` cell assigned (the ``-p`` names), read from
    IPython's input history (``In``) in the notebook's ``namespace``. Papermill only warns about
    a name the notebook does not declare, and a kernel's globals cannot tell an injected name
    from any other (a warm kernel holds its imports), so the cell's own source says what was
    given. [] outside IPython."""
    history = namespace.get("In") or []
    cell = next((c for c in reversed(history) if c.splitlines()[:1] == [INJECTED_HEADER]), None)
    if cell is None:
        return []
    names = []
    for node in ast.parse(cell).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names


def refuse_mistakes(
    namespace: dict, params: tuple[Param, ...] = PROBE_PARAMS, notebook: str = "probe.ipynb"
) -> None:
    """The notebook's first call, after its parameters: every name papermill was given must be
    declared (a mistyped one would leave its parameter at the default, silently), and every
    declared parameter's value acceptable (a bad one would otherwise become a FAIL(other) record,
    the user's typo as a verdict). A ParameterError lists every mistake, one sentence each:
    papermill then exits non-zero, before anything ran and with no record written."""
    declared = [p.name for p in params]
    found = [
        unknown_name(n, declared, notebook) for n in injected_names(namespace) if n not in declared
    ]
    found += problems(
        {p.name: namespace[p.name] for p in params if p.name in namespace}, params=params
    )
    if len(found) == 1:
        raise ParameterError(found[0])
    if found:
        raise ParameterError(
            f"{len(found)} mistakes in the parameters of notebooks/{notebook}:\n" + "\n".join(found)
        )


def parameters_cell(params: tuple[Param, ...] = PROBE_PARAMS, notebook: str = "probe.ipynb") -> str:
    """The notebook's parameters cell, as the declaration says (typed, commented; nothing in it is
    computed from another parameter, so papermill's overrides never leave a stale value)."""
    lines = [
        f"# Parameters (papermill overrides any of them: papermill {notebook} out.ipynb -p "
        "model_id X)"
    ]
    for p in params:
        help_text = p.help + (f" ({' | '.join(map(str, p.choices))})" if p.choices else "")
        default = (
            f"{p.default:_}" if p.type is int and abs(p.default) >= 10_000 else repr(p.default)
        )
        lines.append(f"{p.name}: {p.type.__name__} = {default}  # {help_text}")
    return "\n".join(lines)


def combinations(matrix: dict | None, stacks: dict | None = None) -> list[dict]:
    """A sweep's ``matrix:`` ({axis: [values]}) -> its combinations of probe settings, in a
    stable order ([{}] without a matrix), each on every one of its ``stacks:`` (``stack_name``,
    stack by stack): one probe, notebook and record each, per model."""
    import itertools

    matrix = matrix or {}
    axes = list(matrix)
    combos = (
        [dict(zip(axes, combo)) for combo in itertools.product(*(matrix[a] for a in axes))]
        if axes
        else [{}]
    )
    return [{**c, "stack_name": name} for name in stacks for c in combos] if stacks else combos


#: How a matrix axis reads in a variant label: its value as it is, or ``<n>t`` for max_new_tokens.
_LABEL_SUFFIX = {"max_new_tokens": "t"}
#: Between a variant's settings and the stack it ran on, in a sweep of several stacks
#: (``eager+dynamic@no-rsqrt``).
STACK_MARK = "@"
#: The axes a label always names (the rest only when not at their declared default).
_ALWAYS_LABELLED = ("mode", "cache")


def parse_variant(label: str) -> dict:
    """``compile+static+32t`` -> {"mode": "compile", "cache": "static", "max_new_tokens": 32}
    (and ``...@NAME`` -> its ``stack_name``); the inverse of ``variant``; one sentence
    (ParameterError) for a label that is none."""
    settings_part, _, stack = label.partition(STACK_MARK)
    parts = settings_part.split("+")
    try:
        if stack:
            BY_NAME["stack_name"].check(stack)
        settings: dict[str, Any] = {"stack_name": stack} if stack else {}
        settings |= dict(zip(_ALWAYS_LABELLED, parts[: len(_ALWAYS_LABELLED)], strict=True))
        for part in parts[len(_ALWAYS_LABELLED) :]:
            axis = next(
                a
                for a, suffix in _LABEL_SUFFIX.items()
                if part.endswith(suffix) and a not in settings
            )
            settings[axis] = BY_NAME[axis].type(part.removesuffix(_LABEL_SUFFIX[axis]))
        check(settings)
    except (ValueError, StopIteration):
        raise ParameterError(
            f"{label!r} is not a variant; variants read like eager+dynamic, compile+static or "
            "eager+dynamic+32t."
        ) from None
    return settings


def variant(settings: dict) -> str:
    """A record's short, stable variant label: ``eager+dynamic``, ``compile+static``,
    ``eager+dynamic+32t``: each ``MATRIX_AXES`` setting, mode and cache always, the others only
    when not at their declared default."""
    parts = []
    for axis in MATRIX_AXES:
        value = settings.get(axis, BY_NAME[axis].default)
        if axis in _ALWAYS_LABELLED or value != BY_NAME[axis].default:
            parts.append(f"{value}{_LABEL_SUFFIX.get(axis, '')}")
    stack = settings.get("stack_name") or ""
    return "+".join(parts) + (f"{STACK_MARK}{stack}" if stack else "")


def write_parameters_cells() -> None:
    """Rewrite the probe and debug notebooks' parameters cells from the declaration (after
    changing it: ``python -m model_support.probe.probe_params``). Plain JSON, as nbformat writes
    it, so nothing else moves."""
    import json

    from ..paths import notebook

    for name, declared in (("probe", PROBE_PARAMS), ("debug", DEBUG_PARAMS)):
        path = notebook(name)
        nb = json.loads(path.read_text())
        cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
        cell["source"] = parameters_cell(declared, f"{name}.ipynb").splitlines(keepends=True)
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    write_parameters_cells()
