"""The one place a probe's record is made, and how a failure fills it.

The probe (``run.run_probe``) and the sweep's stand-in for a probe that wrote no record (the kernel
died, the timeout, the download found no loadable weights: ``worker.deaths.runner_failure``) both
start the record here, from the same inputs: who (sweep, model, variant), the settings the probe ran
with, the stack and the host, and the Hub's facts the sweep fetched before the probe started. So
the two kinds of record carry the same fields the same way, and nothing amends a record after the
probe wrote it.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from typing import Any

from ..record import schema
from ..record.schema import Record
from . import devices, probe_params, provenance
from .signatures import failure_signature

#: The probe settings a record has a field of the same name for (the rest are in its
#: ``repro_settings``).
RECORDED_SETTINGS = tuple(name for name in probe_params.SETTINGS if name in schema.FIELDS)
#: Record fields the Hub's facts may fill (what the download stage and the Hub's metadata say).
FACT_FIELDS = (*schema.DOWNLOAD_FIELDS, *schema.HUB_FIELDS)


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def new_record(
    model_id: str,
    settings: Mapping[str, Any],
    sweep_id: str | None = None,
    notebook_path: str | None = None,
    facts: Mapping[str, Any] | None = None,
    **outcome: Any,
) -> Record:
    """A probe's record: ``model_id`` (the portable id), the ``settings`` it ran with
    (``probe_params`` names; defaults fill what is missing), the stack, the host and the start
    time, the Hub's ``facts`` (only ``FACT_FIELDS``), then ``outcome`` (any record field)."""
    settings = {**probe_params.defaults(), **settings}
    task = settings["task"]  # auto: decided later, from the config (the probe's load stage)
    strange = sorted(set(facts or {}) - set(FACT_FIELDS))
    if strange:
        raise KeyError(
            f"not Hub facts of a record: {', '.join(strange)}; they are {', '.join(FACT_FIELDS)}"
        )
    return schema.empty_record(
        **{
            "sweep_id": sweep_id or None,
            "model_id": model_id,
            **{name: settings[name] for name in RECORDED_SETTINGS},
            # as a record says them: no revision is null, an undecided task null, the prompt the one
            # the task uses
            "revision": settings["revision"] or None,
            "stack_name": settings["stack_name"] or None,
            "task": None if task == "auto" else task,
            "prompt": settings["image_prompt"]
            if task == schema.IMAGE_TEXT_TO_TEXT
            else settings["prompt"],
            "variant": probe_params.variant(settings),
            "versions": provenance.versions(),
            "stack_sha": provenance.stack_sha(),
            # the device's backend, as its adapter declares it
            **devices.backend_identity(settings["device"]),
            "host": provenance.host(),
            "started_at": now_iso(),
            "notebook_path": notebook_path or None,
            **(facts or {}),
            **outcome,
        }
    )


def fail(
    record: Record,
    stage: str,
    status: str,
    error_type: str,
    message: str,
    traceback: str,
    placed: bool = True,
) -> Record:
    """Fill the failure fields of ``record``: verdict, stage, error and its signature, with where
    it was raised read off ``traceback`` unless not ``placed`` (the runner's records: their
    traceback is a log)."""
    record.update(
        {
            "status": status,
            "failure_stage": stage,
            "error_type": error_type,
            "error_message": message[:4000],
            "traceback": traceback,
            "failure_signature": failure_signature(
                error_type, message, traceback if placed else None
            ),
        }
    )
    return record
