"""Run the debug notebook for one model of a sweep, with that sweep's settings.

``run_debug_notebook`` executes ``notebooks/debug.ipynb`` (through ``engine.notebooks``, as every
notebook run of ours) into ``<sweep_dir>/debug/<safe_name>.ipynb`` (then ``-2``, ``-3``...: an
earlier debug notebook is never overwritten). Its parameters follow the one declaration in
``probe_params.DEBUG_PARAMS``. Before it runs, ``prepare_debug`` compares this environment's stack
with the sweep's (``stack``): the notebook runs on the stack here, which in a porting loop is often
not the sweep's. A what-if sweep's ``host_ops`` (operators on the host's CPU kernels,
``probe.what_if``) is one of its parameters: the notebook runs with them on the host (``hosting``),
and ``prepare_debug`` says so, or refuses a setting that cannot run, before it runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .. import fileio, paths
from ..errors import UserError
from ..probe import model_ids, probe_params
from ..record import store
from ..record.sweep_meta import ModelEntry, SweepMeta


def resolve_id(ids: list[str], model: str, where: str) -> str:
    """The one of ``ids`` that ``model`` names, as every command taking a MODEL argument reads
    it: an exact name before any fragment (``model_ids.resolve``: ``tiny-gemma`` is not ambiguous
    beside ``tiny-gemma3``)."""
    return model_ids.resolve(ids, model, where)


def resolve_model(meta: SweepMeta, model: str) -> ModelEntry:
    """The sweep's model entry for ``model`` (``resolve_id`` over the sweep's models)."""
    model_id = resolve_id(
        [entry.model_id for entry in meta.models], model, f"sweep {meta.sweep_id}"
    )
    return next(entry for entry in meta.models if entry.model_id == model_id)


def debug_notebook_path(
    data_dir, sweep_id: str, model_id: str, out_dir=None, variant: str | None = None
) -> Path:
    """Where the next ``run_debug_notebook`` of this model writes: ``<out_dir or
    sweep_dir/debug>/<model[@variant]>.ipynb`` for the first, then ``<model[@variant]>-2.ipynb``,
    ``-3``...: an earlier debug notebook (of another stack, other parameters) is never
    overwritten."""
    folder = Path(out_dir) if out_dir is not None else store.sweep_dir(data_dir, sweep_id) / "debug"
    name = store.stem(model_id, variant)
    path, number = folder / f"{name}.ipynb", 1
    while path.exists():
        number += 1
        path = folder / f"{name}-{number}.ipynb"
    return path


def _reserve(data_dir, sweep_id: str, model_id: str, out_dir, variant: str | None) -> Path:
    """``debug_notebook_path``, created empty at once (two debug runs started together take two
    numbers)."""
    while True:
        path = debug_notebook_path(data_dir, sweep_id, model_id, out_dir, variant)
        if fileio.create_new(path):
            return path


def debug_parameters(meta: SweepMeta, entry: ModelEntry, extra: dict | None = None) -> dict:
    """The notebook parameters for one model: the sweep's probe settings, then the model's
    overrides, then ``extra``, keeping only what the debug notebook declares. ``extra`` must be
    declared and acceptable (``probe_params.DEBUG_PARAMS``): a typo or a bad value is refused."""
    try:
        probe_params.check(extra or {}, "debug", params=probe_params.DEBUG_PARAMS)
    except probe_params.ParameterError as exc:
        raise UserError(str(exc)) from None
    declared = {p.name for p in probe_params.DEBUG_PARAMS}
    merged = {**meta.probe, **entry.overrides, **(extra or {}), "model_id": entry.source}
    return {key: value for key, value in merged.items() if key in declared}


@dataclass
class DebugRun:
    """One debug run, prepared: the model's entry, the notebook's parameters, where it writes,
    the sentence to print before it runs when this environment's stack is not the sweep's
    (``stack.stack_difference``), and the one when it runs operators on the host, or the sweep
    did and it does not (``hosting.before_running``)."""

    entry: ModelEntry
    parameters: dict
    out: Path
    stack_note: str | None
    host_note: str | None = None


def prepare_debug(
    data_dir,
    sweep_id: str,
    model: str,
    out_dir=None,
    *,
    parameters: dict | None = None,
    variant: str | None = None,
) -> DebugRun:
    """Everything ``run_debug_notebook`` checks and decides before the notebook runs (bad input
    is a UserError); the output path is reserved (created empty)."""
    from ..probe import devices
    from ..probe.probe_compile import NOT_AVAILABLE
    from .hosting import before_running
    from .stack import stack_difference

    meta = store.read_sweep(data_dir, sweep_id)
    entry = resolve_model(meta, model)
    if variant:  # the variant's settings (mode, cache, tokens), under any explicit -p override
        try:
            parameters = {**probe_params.parse_variant(variant), **(parameters or {})}
        except probe_params.ParameterError as exc:
            raise UserError(str(exc)) from None
    params = debug_parameters(meta, entry, parameters)
    device, mode = params.get("device"), params.get("mode")
    # a backend's own mode
    if device and device != "auto" and mode and not devices.adapter_class(device).offers(mode):
        raise UserError(f"{NOT_AVAILABLE}: {devices.adapter_for(device).mode_unavailable(mode)}.")
    # a refusal: one sentence, nothing written
    host_note = before_running({**meta.probe, **entry.overrides}, params)
    note = stack_difference(meta, _recorded(data_dir, sweep_id, entry.model_id, variant))
    out = _reserve(data_dir, sweep_id, entry.model_id, out_dir, variant)
    return DebugRun(entry, params, out, note, host_note)


def _recorded(data_dir, sweep_id: str, model_id: str, variant: str | None) -> dict | None:
    path = store.find_record(data_dir, sweep_id, model_id, variant)
    if path is None:
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def execute_debug(run: DebugRun, *, execution_timeout: float | None = None) -> Path:
    """Execute ``notebooks/debug.ipynb`` as ``run`` prepared it; returns ``run.out``. A run that
    wrote nothing (the kernel never started) leaves no empty file behind."""
    from ..engine.notebooks import run_notebook

    try:
        return run_notebook(
            paths.notebook("debug"), run.out, run.parameters, timeout=execution_timeout
        )
    except BaseException:
        if run.out.exists() and run.out.stat().st_size == 0:
            fileio.remove(run.out)
        raise


def run_debug_notebook(
    data_dir,
    sweep_id: str,
    model: str,
    out_dir=None,
    *,
    parameters: dict | None = None,
    execution_timeout: float | None = None,
    variant: str | None = None,
) -> Path:
    """Execute ``notebooks/debug.ipynb`` for one model of a sweep, with the sweep's settings.

    ``model``: the full model id or a unique fragment of it (e.g. its folder name). Parameters
    are ``debug_parameters``. Writes ``debug_notebook_path(...)``
    (``<sweep_dir>/debug/<safe_name>.ipynb``, then ``-2``, ``-3``...; or into ``out_dir``) and
    returns its path. When a cell raises, papermill's ``PapermillExecutionError`` propagates; the
    executed notebook is still written and shows the error. ``prepare_debug`` and
    ``execute_debug`` are the two halves (the command prints between them)."""
    run = prepare_debug(data_dir, sweep_id, model, out_dir, parameters=parameters, variant=variant)
    return execute_debug(run, execution_timeout=execution_timeout)
