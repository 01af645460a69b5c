"""A probe process that died or ran out of time, as a record: what its exit status means, which
stage it was in, and the attribution of its death (the CPU reference run apart, in a child
process of its own)."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time

from ... import backend_env
from ...engine import children
from ...probe.checks import NO_WEIGHTS_ATTRIBUTION
from ...probe.records import fail, new_record
from ...record import schema
from ...record.schema import Record
from ...redact import redact_record
from .task import ProbeTask

LOG_TAIL_CHARS = 3000


def describe_exit(code: int | None) -> str:
    if code is None:
        return "unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


#: Whose failure it is, for the failures the probe could not attribute itself (see
#: ``probe.attribute``).
_ATTRIBUTION_OF_STAGE = {
    "runner": {
        "reference_note": "attribution not run: the probe did not finish (timeout, dead kernel, no record), so "
        "there is no failure to rerun on the reference"
    },
    "download": NO_WEIGHTS_ATTRIBUTION,
}


def runner_failure(
    task: ProbeTask,
    error_type: str,
    message: str,
    log: str,
    started: float,
    status: str = schema.FAIL_OTHER,
    stage: str = "runner",
    traceback: str | None = None,
    left: dict | None = None,
) -> Record:
    """A record for a probe that could not write its own: FAIL(other) at stage runner (the kernel
    died, a timeout), or what the download stage found (FAIL(load) at stage download). Made where
    the probe makes its own (``records.new_record``), from the same task: its probe task is the
    one the sweep decided (``with_task``), else unknown (the probe decides auto from the config).
    ``left``: what the probe left before it died (``checks.write_started``): its repro script,
    and how to attribute its death."""
    tail = log[-LOG_TAIL_CHARS:]
    record = new_record(
        task["model_id"],
        task["params"],
        task["sweep_id"],
        task["notebook_path"],
        task.get("facts"),
        device_type=task["params"].get("device"),
        started_at=time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(started)),
        duration_s=time.time() - started,
        **_ATTRIBUTION_OF_STAGE[stage],
    )
    # the script as the probe kept it: its settings and body's hash, so the store keeps the body
    # once
    if left:
        for key in ("repro_script", "repro_settings", "repro_sha256"):
            record[key] = left["record"].get(key)
    traceback = traceback or f"(no traceback: the probe wrote no record)\n--- log tail ---\n{tail}"
    fail(record, stage, status, error_type, message, traceback, placed=False)
    # its death is rerun on the reference, as a failure would be
    if left and error_type == "DeadKernelError":
        if left["record"].get("device_type") in (None, "cpu"):
            record["reference_note"] = (
                "attribution not run: the kernel died on the CPU, where the reference runs too"
            )
        else:
            schema.fill(record, _attribute_death(left, task["timeout_s"]))
    return schema.check_record(redact_record(record, task.get("scrub")))


def _attribute_death(started: dict, timeout_s: float) -> dict:
    """``checks.attribute_dead`` in a child process (the runner never loads a model): the fields
    whose failure a dead probe's was, or the reason it could not say."""
    if (
        started["record"].get("num_params") is None
        and started["record"].get("hub_num_params") is None
    ):
        started = {
            **started,
            "record": {**started["record"], "num_params": _estimate_params(started["settings"])},
        }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as file:
        json.dump(started, file)
    env = backend_env.child_environ()  # the CPU only: no device backend loaded
    try:
        argv = [children.interpreter(), "-m", "model_support.probe.checks", file.name]
        return children.last_json(argv, "the reference", timeout_s, env=env)
    except children.ChildFailed as exc:
        if exc.timed_out:
            return {"reference_note": f"attribution not run: {exc}"}
        return {
            "reference_note": f"attribution not run: the reference's process failed ({exc})"[:2000]
        }
    finally:
        os.unlink(file.name)


def _estimate_params(settings: dict) -> int | None:
    """The model's parameter count from its safetensors headers, for the reference's size limits."""
    from ...probe import sharded

    try:
        return sharded.estimate_params(
            settings["load_from"], settings["revision"], settings["trust_remote_code"]
        )
    except Exception:  # noqa: BLE001 unknown: the reference's limits then go by none
        return None


def last_words(text: str) -> str | None:
    """The last line a process wrote (its stderr): what a device runtime says as it aborts."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:500] if lines else None
