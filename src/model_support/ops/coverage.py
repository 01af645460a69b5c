"""A sweep's census against a stack: each model's missing and fallback operators, and its predicted verdict.

The census of a row (``ops`` in the order of first call, ``ops_stages``) says what the model needs; a stack's
coverage (operator -> implemented / fallback / missing / unknown) what it has. A model's first missing
operator is where a run on that stack stops, and its stage the verdict (``probe_core.STAGE_VERDICT``: the
generation's is ``FAIL(gen)``, the weights' copy's ``FAIL(load)``); a model with none passes, fallbacks
included. A row with no complete census (the model failed on its own before it ran, everywhere: the
reference failed too) keeps its recorded verdict; a row with no census at all (compile mode, a sharded run,
an older sweep) is ``unknown``.

The coverage of *this machine's* stack comes from its device adapter in a child process
(``python -m model_support.ops DEVICE``, the operators on stdin), as the sweep's runner asks for a
device's facts: the backend is loaded there, never in the command's own process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from ..probe import census
from ..probe.devices import FALLBACK, IMPLEMENTED, MISSING, UNKNOWN
from ..probe.probe_core import STAGE_VERDICT
from ..record import schema, store

#: The prediction where the census cannot tell.
UNKNOWN_VERDICT = "unknown"
#: The row columns the prediction reads.
COLUMNS = (
    "model_id",
    "variant",
    "status",
    "failure_stage",
    "device_type",
    *census.FIELDS,
    "ops_missing",
    "ops_fallback",
    "ops_unknown",
)


@dataclass
class ModelOps:
    """One (model, variant) of a sweep: its recorded verdict, its census, and what a stack lacks of it."""

    key: str  # the model id, plus `` [variant]`` for any variant but the default
    status: str | None
    device_type: str | None
    ops: list[str] | None
    stages: list[str] | None
    calls: list[int] | None
    source: str | None
    ops_missing: list[str] = field(default_factory=list)
    ops_fallback: list[str] = field(default_factory=list)
    ops_unknown: list[str] = field(default_factory=list)
    predicted: str = UNKNOWN_VERDICT
    first_missing: str | None = None

    @property
    def complete(self) -> bool:
        """A census of a run that completed (the row's own, or its CPU reference's)."""
        return self.ops is not None and self.source in (census.RUN, census.REFERENCE)

    def as_json(self) -> dict:
        return {"ops_missing": self.ops_missing, "ops_fallback": self.ops_fallback, "predicted": self.predicted}


def sweep_models(data_dir: Path, sweep_id: str) -> list[ModelOps]:
    """The sweep's result rows (the Parquet dataset: compacted at the end of every sweep), one per (model,
    variant), with their census and the coverage their own stack recorded; none for a sweep with no result
    rows (a caller refuses an unknown id: a pulled dataset has rows and no sweep.json)."""
    import polars as pl

    frame = store.scan(data_dir, "results").filter(pl.col("sweep_id") == sweep_id).select(COLUMNS).sort("model_id")
    rows = frame.collect().rows(named=True)
    return [
        ModelOps(
            key=store.pending_key(r["model_id"], r["variant"]),
            status=r["status"],
            device_type=r["device_type"],
            ops=r["ops"],
            stages=r["ops_stages"],
            calls=r["ops_calls"],
            source=r["ops_source"],
            ops_missing=list(r["ops_missing"] or []),
            ops_fallback=list(r["ops_fallback"] or []),
            ops_unknown=list(r["ops_unknown"] or []),
        )
        for r in rows
    ]


def census_ops(models: list[ModelOps]) -> list[str]:
    """Every operator the models' censuses name, once each."""
    return list(dict.fromkeys(op for m in models for op in (m.ops or [])))


def recorded_coverage(models: list[ModelOps]) -> dict[str, str]:
    """The coverage the sweep's own stack recorded on its rows (``ops_missing``, ``ops_fallback``, ``ops_unknown``;
    every other census operator implemented)."""
    coverage = dict.fromkeys(census_ops(models), IMPLEMENTED)
    for m in models:
        coverage.update(dict.fromkeys(m.ops_unknown, UNKNOWN))
    for m in models:
        coverage.update(dict.fromkeys(m.ops_fallback, FALLBACK))
    for m in models:
        coverage.update(dict.fromkeys(m.ops_missing, MISSING))
    return coverage


def predict(models: list[ModelOps], coverage: dict[str, str] | None = None) -> list[ModelOps]:
    """Each model's missing and fallback operators on the stack ``coverage`` describes (None: the sweep's own,
    as its rows recorded it) and its predicted verdict (see the module docstring). Changes ``models`` in place."""
    coverage = recorded_coverage(models) if coverage is None else coverage
    for m in models:
        if m.ops is None:
            m.predicted = UNKNOWN_VERDICT if m.status == schema.PASS or m.status is None else m.status
            continue
        m.ops_missing = [op for op in m.ops if coverage.get(op) == MISSING]
        m.ops_fallback = [op for op in m.ops if coverage.get(op) == FALLBACK]
        m.ops_unknown = [op for op in m.ops if coverage.get(op, UNKNOWN) == UNKNOWN]
        m.first_missing = m.ops_missing[0] if m.ops_missing else None
        if m.first_missing is not None:
            stage = (m.stages or [])[m.ops.index(m.first_missing)] if m.stages else "generate"
            m.predicted = STAGE_VERDICT.get(stage, schema.FAIL_OTHER)
        elif not m.complete:  # it failed on its own before its census was complete, on the reference too
            m.predicted = m.status or UNKNOWN_VERDICT
        else:
            m.predicted = schema.PASS
    return models


def stack_coverage(device: str, ops: list[str]) -> dict[str, str]:
    """What this machine's ``device`` stack does with each of ``ops``, asked of a child process that loads its
    backend (the device itself need not be present: the registrations are the backend's, a TPU's are read
    without a TPU). One sentence (``UserError``) when the backend cannot be loaded."""
    env = {**os.environ}
    env.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    done = subprocess.run(
        [sys.executable, "-m", "model_support.ops", device],
        input=json.dumps(ops),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1])
    except (IndexError, ValueError):
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"The {device} stack's coverage could not be read here: {why}") from None
    if "problem" in answer:
        raise UserError(answer["problem"])
    return answer["coverage"]


def child(device: str, ops: list[str]) -> dict:
    """In the child: load ``device``'s backend and ask its adapter (``op_coverage``)."""
    from ..probe import devices

    if device == "auto":
        return {"problem": "--on needs a device's name (cpu, cuda, tpu, or a backend's own), not auto."}
    adapter = devices.adapter_for(device)
    if device != "cpu":
        try:
            devices.load_backend(device)
        except devices.DeviceUnavailable as exc:
            return {"problem": str(exc)}
    try:
        return {"coverage": adapter.op_coverage(ops)}
    except devices.DeviceUnavailable as exc:
        return {"problem": str(exc)}
