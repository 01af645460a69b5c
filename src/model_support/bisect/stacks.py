"""Two sweeps' stacks and what differs between them; the rows whose verdict changed; a row's repro
script.

A sweep's stack is ``sweep.json``'s ``stack`` (every installed distribution, by canonical name). An
older ``sweep.json`` has only ``versions`` (torch, transformers, ...): its stack reads as those few
packages, so the header of a diff still names what it can, as it did before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl
from packaging.utils import canonicalize_name

from .. import analysis
from ..analysis.frames import variant_col
from ..errors import UserError
from ..probe import model_ids, repro
from ..record import store
from ..record.sweep_meta import SweepMeta

#: Distributions never swapped: the project itself (a repro script imports nothing of it).
NOT_SWAPPED = frozenset({"model-support"})
#: Keys of ``versions`` that name no distribution.
NOT_PACKAGES = ("python", "git_commit", "model_support")


def sweep_stack(meta: SweepMeta) -> dict[str, str]:
    """{distribution: version} of the sweep's environment; the few ``versions`` for an older
    sweep.json."""
    if meta.stack:
        return dict(meta.stack)
    return {
        canonicalize_name(k): v for k, v in meta.versions.items() if v and k not in NOT_PACKAGES
    }


@dataclass(frozen=True)
class Change:
    """One distribution whose version differs between two stacks (None: not installed there)."""

    name: str
    before: str | None
    after: str | None

    def __str__(self) -> str:
        return f"{self.name} {self.before or '(none)'} -> {self.after or '(none)'}"


def stack_changes(before: dict[str, str], after: dict[str, str]) -> list[Change]:
    """The distributions whose versions differ between two stacks, by name."""
    names = sorted(set(before) | set(after))
    return [Change(n, before.get(n), after.get(n)) for n in names if before.get(n) != after.get(n)]


def sweep_stack_changes(data_dir: Path | str, a: str, b: str) -> list[Change]:
    """What differs between sweep ``a``'s stack and sweep ``b``'s."""
    return stack_changes(
        sweep_stack(store.read_sweep(Path(data_dir), a)),
        sweep_stack(store.read_sweep(Path(data_dir), b)),
    )


@dataclass(frozen=True)
class SettingChange:
    """One setting of the device backend's own configuration (an environment variable its adapter
    declares: ``LIBTPU_INIT_ARGS``, ``XLA_FLAGS``) that differs between two sweeps (None: not set
    there)."""

    name: str
    before: str | None
    after: str | None

    def __str__(self) -> str:
        def shown(value) -> str:
            text = value if isinstance(value, str) else json.dumps(value)
            return (
                "(unset)"
                if value is None
                else repr(text if len(text) <= 120 else text[:117] + "...")
            )

        keys = self.keys()
        if keys:  # a structured setting: the keys that changed, not the whole value
            return f"{self.name}: " + ", ".join(f"{k} {shown(a)} -> {shown(b)}" for k, a, b in keys)
        return f"{self.name} {shown(self.before)} -> {shown(self.after)}"

    def keys(self) -> list[tuple[str, object, object]]:
        """The keys that changed inside a structured setting: a JSON object (a Python backend's
        whole configuration in one variable), or flags (``--name=value``, as LIBTPU_INIT_ARGS and
        XLA_FLAGS hold them); [] for a plain value."""
        a, b = _structured(self.before), _structured(self.after)
        if a is None or b is None:
            return []
        return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _structured(value: str | None) -> dict | None:
    """A setting's value as {key: value}: {} when unset, a JSON object's items, or
    ``--flag=value`` tokens (a bare ``--flag`` as true); None for anything else."""
    if value is None or not value.strip():
        return {}
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return parsed
    tokens = value.split()
    if all(t.startswith("--") for t in tokens):
        return {
            t[2:].partition("=")[0]: (t.partition("=")[2] if "=" in t else True) for t in tokens
        }
    return None


def sweep_settings(meta: SweepMeta) -> dict[str, str] | None:
    """The backend configuration the sweep recorded (``device_config``); None for a sweep.json
    from before it was recorded (nothing known, so nothing said to differ)."""
    return None if meta.device_config is None else dict(meta.device_config)


def setting_changes(
    before: dict[str, str] | None, after: dict[str, str] | None
) -> list[SettingChange] | None:
    """The backend settings that differ between two sweeps; None (unknown) when either did not
    record them."""
    if before is None or after is None:
        return None
    names = sorted(set(before) | set(after))
    return [
        SettingChange(n, before.get(n), after.get(n))
        for n in names
        if before.get(n) != after.get(n)
    ]


def sweep_setting_changes(data_dir: Path | str, a: str, b: str) -> list[SettingChange] | None:
    """What differs between sweep ``a``'s backend configuration and sweep ``b``'s."""
    meta_a, meta_b = store.read_sweep(Path(data_dir), a), store.read_sweep(Path(data_dir), b)
    return setting_changes(sweep_settings(meta_a), sweep_settings(meta_b))


def changes_line(
    changes: list[Change], limit: int = 8, settings: list[SettingChange] | None = None
) -> str:
    """The header line of a diff: "packages that differ: transformers 5.20.0 -> 5.25.0, ..." and
    the backend's settings that differ ("backend settings that differ: LIBTPU_INIT_ARGS '...' ->
    '...'")."""
    parts = []
    if changes:
        more = f" and {len(changes) - limit} more" if len(changes) > limit else ""
        parts.append(f"packages that differ: {', '.join(str(c) for c in changes[:limit])}{more}")
    if settings:
        parts.append(f"backend settings that differ: {'; '.join(str(s) for s in settings)}")
    if not parts:
        return "same package versions in both sweeps" + (
            " and the same backend settings" if settings == [] else ""
        )
    return "; ".join(parts)


def sweep_changes_line(data_dir: Path | str, a: str, b: str) -> str:
    """``changes_line`` of two sweeps in a data folder, packages and backend settings ("" when
    either sweep.json is missing: a report rendered from Parquet alone)."""
    try:
        return changes_line(
            sweep_stack_changes(data_dir, a, b), settings=sweep_setting_changes(data_dir, a, b)
        )
    except UserError:
        return ""


@dataclass
class Row:
    """One (model, variant) run to bisect: its verdict in both sweeps, how to rerun it."""

    model_id: str
    variant: str
    verdict_a: str | None
    verdict_b: str | None
    script: str
    args: list[str]
    timeout_s: float
    #: A Hub model's download ({model_id, revision, trust_remote_code}), fetched before the steps;
    #: None: local.
    hub: dict | None = None


def repro_of(data_dir: Path | str, sweep_id: str, model_id: str, variant: str) -> str | None:
    """The repro script of a row (the one place that asks for it: ``repro.script_for``, what
    ``model-support repro SWEEP MODEL`` prints)."""
    try:
        return repro.script_for(Path(data_dir), sweep_id, model_id, variant)
    except UserError:
        return None


def hub_download(data_dir: Path, sweep_id: str, model_id: str, variant: str) -> dict | None:
    """What a Hub model's steps load, from its record: the commit its files were downloaded at
    (else the revision asked for) and whether its own code was allowed; None for a local model."""
    path = store.find_record(data_dir, sweep_id, model_id, variant)
    if model_id.startswith("local:") or path is None:
        return None
    record = json.loads(path.read_text())
    revision = record.get("revision_sha") or record.get("revision") or ""
    return {
        "model_id": model_id,
        "revision": revision,
        "trust_remote_code": bool(record.get("trust_remote_code")),
    }


def _verdicts(data_dir: Path, sweep_id: str) -> dict[tuple[str, str], str | None]:
    rows = (
        store.scan(data_dir, "results")
        .filter(pl.col("sweep_id") == sweep_id)
        .with_columns(variant_col())
        .select("model_id", "variant", "status")
        .collect()
    )
    return {(m, v): s for m, v, s in rows.iter_rows()}


def resolve_model(meta: SweepMeta, name: str) -> str:
    """A model id of the sweep from its id, folder name or a unique fragment, an exact name first
    (``model_ids.resolve``, as every command taking a MODEL reads it); one sentence otherwise."""
    return model_ids.resolve([m.model_id for m in meta.models], name, f"sweep {meta.sweep_id}")


def rows_to_bisect(
    data_dir: Path | str,
    a: str | None,
    b: str,
    models: list[str] | tuple = (),
    keys: list[tuple] | None = None,
) -> list[Row]:
    """The rows of sweep ``b`` whose verdict differs from sweep ``a``'s (newly failing or newly
    passing, whatever the attribution), or every variant of the ``models`` named, or the (model,
    variant) ``keys`` given (``bisect --metric``: the slower ones); each with its repro script."""
    data_dir = Path(data_dir)
    meta_b = store.read_sweep(Path(data_dir), b)
    after = _verdicts(data_dir, b)
    before = _verdicts(data_dir, a) if a else {}
    if models:
        wanted = {resolve_model(meta_b, m) for m in models}
        keys = sorted(k for k in after if k[0] in wanted)
        missing = wanted - {k[0] for k in keys}
        if missing:
            raise UserError(f"Sweep {b} has no result row for {', '.join(sorted(missing))}.")
    elif keys is not None:
        keys = sorted(k for k in keys if k in after)
    else:
        keys = sorted(
            k for k, s in after.items() if k in before and before[k] is not None and s != before[k]
        )
    rows = []
    for model_id, variant in keys:
        script = repro_of(data_dir, b, model_id, variant)
        if not script:
            raise UserError(
                f"The row of {model_id} ({variant}) in sweep {b} has no repro script to rerun."
            )
        entry = meta_b.model(model_id)
        local = entry is not None and model_id.startswith("local:")
        rows.append(
            Row(
                model_id=model_id,
                variant=variant,
                verdict_a=before.get((model_id, variant)),
                verdict_b=after[(model_id, variant)],
                script=script,
                args=[entry.source] if local and entry else [],
                timeout_s=float((entry.timeout_s if entry else None) or meta_b.timeout_s),
                hub=None if local else hub_download(data_dir, b, model_id, variant),
            )
        )
    return rows


def require_sweeps(data_dir: Path | str, *sweep_ids: str) -> None:
    """Each sweep has a sweep.json and Parquet rows, or one sentence."""
    sweeps = analysis.sweep_index(Path(data_dir), cache_dir=Path(data_dir) / analysis.SWEEP_CACHE)
    for sweep_id in sweep_ids:
        store.read_sweep(Path(data_dir), sweep_id)
        analysis.require_sweep(sweeps, sweep_id)
