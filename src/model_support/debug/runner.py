"""Run the debug notebook for one model of a sweep, with that sweep's settings.

``run_debug_notebook`` executes ``notebooks/debug.ipynb`` (through ``worker.notebooks``, as every
notebook run of ours) into ``<sweep_dir>/debug/<safe_name>.ipynb``. Its parameters follow the one
declaration in ``probe_params.DEBUG_PARAMS``.
"""

from __future__ import annotations

from pathlib import Path

from .. import paths
from ..errors import UserError
from ..probe import probe_params
from ..record import store
from ..record.sweep_meta import ModelEntry, SweepMeta, safe_name

_MAX_CANDIDATES_LISTED = 12


def _listing(ids: list[str]) -> str:
    shown = ", ".join(ids[:_MAX_CANDIDATES_LISTED])
    more = len(ids) - _MAX_CANDIDATES_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def resolve_model(meta: SweepMeta, model: str) -> ModelEntry:
    """The sweep's model entry for ``model``: its full id, its folder name (``safe_name``), or a
    fragment of either that matches exactly one model (case-insensitive). UserError otherwise."""
    ids = [entry.model_id for entry in meta.models]
    for entry in meta.models:
        if model in (entry.model_id, safe_name(entry.model_id)):
            return entry
    needle = model.lower()
    matches = [
        entry
        for entry in meta.models
        if needle and (needle in entry.model_id.lower() or needle in safe_name(entry.model_id).lower())
    ]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UserError(f"No model of sweep {meta.sweep_id} matches {model!r}; candidates: {_listing(ids) or 'none'}.")
    raise UserError(
        f"{model!r} matches {len(matches)} models of sweep {meta.sweep_id}, give more of the id: "
        f"{_listing([m.model_id for m in matches])}."
    )


def debug_notebook_path(data_dir, sweep_id: str, model_id: str, out_dir=None, variant: str | None = None) -> Path:
    """Where ``run_debug_notebook`` writes: ``<out_dir or sweep_dir/debug>/<model[@variant]>.ipynb``."""
    folder = Path(out_dir) if out_dir is not None else store.sweep_dir(data_dir, sweep_id) / "debug"
    return folder / f"{store.stem(model_id, variant)}.ipynb"


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

    ``model``: the full model id or a unique fragment of it (e.g. its folder name). Parameters are
    ``debug_parameters``. Writes ``<sweep_dir>/debug/<safe_name>.ipynb`` (or into ``out_dir``) and
    returns its path. When a cell raises, papermill's ``PapermillExecutionError`` propagates; the
    executed notebook is still written at ``debug_notebook_path(...)`` and shows the error."""
    from ..engine.notebooks import run_notebook
    from ..probe.probe_core import NOT_AVAILABLE, fused_eager_missing

    meta = store.read_sweep(data_dir, sweep_id)
    entry = resolve_model(meta, model)
    if variant:  # the variant's settings (mode, cache, tokens), under any explicit -p override
        try:
            parameters = {**probe_params.parse_variant(variant), **(parameters or {})}
        except probe_params.ParameterError as exc:
            raise UserError(str(exc)) from None
    params = debug_parameters(meta, entry, parameters)
    if params.get("mode") == "fused" and params.get("device") not in ("tpu", "auto"):  # a TPU's mode only
        raise UserError(f"{NOT_AVAILABLE}: {fused_eager_missing(params['device'])}.")
    out = debug_notebook_path(data_dir, sweep_id, entry.model_id, out_dir, variant)
    return run_notebook(paths.notebook("debug"), out, params, timeout=execution_timeout)
