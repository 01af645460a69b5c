"""The host checks of a probe: what is said about its verdict without changing it.

Is a PASS right (the CPU reference, teacher-forced on the device's own tokens, then the fluency
judge), and whose failure a FAIL is (the same stages rerun in the reference configuration). They
need only the device's tokens and step logits, which the record already carries, so they can run
after the device is released.
"""

from __future__ import annotations

import contextlib
import gc
import json
import sys
from pathlib import Path

from ..fileio import atomic_write_json
from ..record import schema
from ..record.schema import Record
from . import agreement, census, judge, long_text, probe_core, probe_params, reproduce
from .signatures import failure_signature


def _reference_dtype(device_type: str | None, dtype: str) -> str:
    """On a CPU-only run the reference must still differ from the run it checks: use another
    dtype."""
    if device_type != "cpu":
        return dtype
    return "float32" if dtype != "float32" else "bfloat16"


def first_divergence(device_ids: list[int], reference_ids: list[int]) -> int | None:
    """Index of the first generated token that differs (a length difference counts), None if
    equal."""
    for index, (a, b) in enumerate(zip(device_ids, reference_ids)):
        if a != b:
            return index
    if len(device_ids) != len(reference_ids):
        return min(len(device_ids), len(reference_ids))
    return None


def _on_the_reference(settings: dict, dtype: str, mode: str = "eager", counted=None) -> dict:
    """The probe's stages again, on the CPU in ``dtype``, with the run's KV cache and in ``mode``
    (eager, or compile with inductor: a compiled failure is rerun compiled, so that its
    attribution compares like with like; TorchTPU's fused eager has no CPU counterpart but plain
    eager). ``counted``: a CPU ``census_mode.Census`` held over the stages."""
    import torch

    with counted or contextlib.nullcontext():
        return probe_core.run_stages(
            model_id=settings["load_from"],
            **{**probe_params.stage_settings(settings), "dtype": dtype, "mode": mode},
            device=torch.device("cpu"),
            compile_backend="inductor",
            on_stage=counted.enter if counted else None,
        )


def run_reference(
    record: Record, settings: dict, device_steps: list | None, prompt_ids: list[int] | None
) -> None:
    """Is a PASS right? The CPU reference, teacher-forced: one forward pass over the prompt plus
    the device's own tokens, compared step by step with the device's best logits
    (``agreement.compare``): ``numerics`` match / ties / diverges with its figures,
    ``reference_match`` and ``first_divergence``. Null with the reason (``reference_note``,
    ``numerics_note``) when it cannot run. Never changes the verdict."""
    ref_dtype = agreement.reference_dtype(record["device_type"], settings["dtype"])
    skip = reference_skip(record, settings, ref_dtype)
    if skip is None and not device_steps:
        skip = "skipped: the device kept no logits for its generated steps"
    if skip:
        record["reference_note"] = skip
        record["numerics_note"] = f"no reference: {skip}"
        return
    record["reference_device"] = f"cpu:{ref_dtype}"
    try:  # the reference check a repro script runs too
        found = reproduce.reference_check(
            settings["load_from"],
            settings,
            ref_dtype,
            prompt_ids,
            record["output_token_ids"],
            device_steps,
        )
    # the reference failing is no verdict: recorded, with its reason
    except reproduce.ReferenceFailed as exc:
        record["reference_note"] = f"reference failed at {exc.stage}: {exc}"[:2000]
        record["numerics_note"] = f"no reference: {record['reference_note']}"
        return
    for key in agreement.RECORD_KEYS:
        record[key] = found[key]


def check_pass(
    record: Record,
    settings: dict,
    device_steps: list | None,
    prompt_ids: list[int] | None,
    long_text_found: dict | None = None,
) -> None:
    """Everything said about a PASS beyond its verdict: the reference's view of its logits, the
    long text's agreement (``long_text_found``: what ``long_text_on_device`` kept in the device
    phase), the judge's view of its text (for every PASS: the only check where no reference
    runs). None changes the PASS: a check that raises (the comparison, the long text's reference,
    the judge's scoring) leaves its fields null with the reason in its note."""
    try:
        run_reference(record, settings, device_steps, prompt_ids)
    except Exception as exc:  # noqa: BLE001 a check that cannot run is a note beside the PASS, never its verdict
        for key in agreement.RECORD_KEYS:
            record[key] = None
        record["reference_note"] = (
            f"the reference check could not run: {type(exc).__name__}: {exc}"[:2000]
        )
        record["numerics_note"] = f"no reference: {record['reference_note']}"[:2000]
    try:
        run_long_text(record, settings, long_text_found)
    except Exception as exc:  # noqa: BLE001 as above: the long text's failure is its note
        for key in long_text.RECORD_FIELDS:
            record[key] = None
        record["long_text_note"] = (
            f"the long-text check could not run: {type(exc).__name__}: {exc}"[:2000]
        )
    if settings.get("judge") and settings.get("reference") != "none":
        # the reference model is freed before the judge loads (0.38 s a walk: only when both load)
        gc.collect()
    try:
        judge.judge_record(record, settings)
    except Exception as exc:  # noqa: BLE001 as above: the judge's failure is its note
        record["fluent"] = record["fluency_score"] = None
        record["fluency_note"] = f"the judge could not run: {type(exc).__name__}: {exc}"[:2000]


def long_text_on_device(record: Record, settings: dict, result: dict, adapter) -> dict | None:
    """The long text's device half (``long_text.on_device``), in the device phase after a PASS
    and its perf phase, on the model the stages kept: None when ``long_text`` is off, else what
    ``run_long_text`` needs after the release. The CPU reference's limits (``reference_skip``)
    are asked first, so the device is not held for a text nothing can judge (unless an earlier
    sweep's reference top-k is in the data folder)."""
    if not long_text.wanted(settings):
        return None
    skip = reference_skip(
        record, settings, agreement.reference_dtype(record["device_type"], settings["dtype"])
    )
    return long_text.on_device(record, settings, result, adapter, skip)


def run_long_text(record: Record, settings: dict, found: dict | None) -> None:
    """Agreement over the long text, the host's half (``long_text.check``): the device's paths
    against the CPU reference's top-k per position, read from the data folder or computed there
    once; null fields with the reason in ``long_text_note`` where it did not run. Never changes
    the verdict."""
    skip = None
    if found is not None and "note" not in found:
        skip = reference_skip(
            record, settings, agreement.reference_dtype(record["device_type"], settings["dtype"])
        )
        gc.collect()  # the verdict's reference model is freed before this one loads
    long_text.check(record, settings, found, skip)


#: A repo with no loadable weights fails on every device: the model's failure, nothing to rerun.
NO_WEIGHTS_ATTRIBUTION = {
    "attribution": "model",
    "reference_note": "the repo has no weights transformers can load, on any device: nothing to rerun",
}


#: Stages whose failure is rerun in the reference configuration to say whose failure it is.
ATTRIBUTED_STAGES = ("load", "template", "compile", "generate")


def reference_skip(record: Record, settings: dict, dtype: str) -> str | None:
    """Why the CPU reference cannot run for this model (switched off, above the size limit, more
    than the host's free memory), or None. The same limits serve the reference check and
    attribution."""
    if settings["reference"] == "none":
        return "switched off (reference='none')"
    params = record["num_params"] or record.get("hub_num_params")
    if params is not None and params > settings["reference_max_params"]:
        return (
            f"skipped: {params} parameters is above "
            f"reference_max_params={settings['reference_max_params']}"
        )
    if params is not None:
        import psutil

        need = (
            params
            * (4 if dtype in ("float32", "float") else 8 if dtype in ("float64", "double") else 2)
            * 1.2
        )
        free = psutil.virtual_memory().available
        if need > free:
            return (
                f"skipped: about {need / 2**30:.1f} GiB for the CPU reference, {free / 2**30:.1f} "
                "GiB of host memory free"
            )
    return None


def attribute(record: Record, settings: dict) -> None:
    """Whose failure it is: the same stages rerun in the reference configuration (the CPU; the
    run's dtype on accelerators, float32 on CPU-only runs; the run's KV cache, and compiled when
    the run was). ``stack``: the reference passes; ``model``: it fails with the same signature;
    ``both``: with another (kept in ``reference_signature``); null with the reason in
    ``reference_note`` when it could not run. The verdict never changes."""
    if record["failure_stage"] not in ATTRIBUTED_STAGES:
        return
    ref_dtype = _reference_dtype(record["device_type"], settings["dtype"])
    skip = reference_skip(record, settings, ref_dtype)
    if skip:
        record["reference_note"] = f"attribution {skip}"
        return
    record["reference_device"] = f"cpu:{ref_dtype}"
    mode = "compile" if settings["mode"] == "compile" else "eager"
    # the run stopped: what its reference alone calls, when it completes, is added to the row's
    # partial census
    from .census_mode import Census  # imports torch: this module imports none at its top

    counted = (
        Census("cpu")
        if record["ops_source"] == census.PARTIAL and census.takes_census(mode)
        else None
    )
    ref = _on_the_reference(settings, ref_dtype, mode, counted)
    if ref["exclusion_reason"]:  # the reference's environment, not a verdict either way
        record["reference_note"] = f"attribution not run: {ref['exclusion_reason']}"[:2000]
        return
    if ref["exception"] is None:
        record["attribution"] = "stack"
        if counted is not None:
            schema.fill(record, census.completed(record, counted.fields(census.REFERENCE)))
        return
    exc = ref["exception"]
    signature = failure_signature(type(exc).__name__, str(exc), probe_core.trimmed_traceback(exc))
    record["attribution"] = "model" if signature == record["failure_signature"] else "both"
    if record["attribution"] == "both":
        record["reference_signature"] = signature
        record["reference_note"] = (
            f"the reference fails at {ref['failure_stage']}: {type(exc).__name__}: {exc}"[:2000]
        )


#: The record fields a probe that died early leaves for its stand-in record and its attribution.
STARTED_FIELDS = (
    "repro_script",
    "repro_settings",
    "repro_sha256",
    "device_type",
    "num_params",
    "hub_num_params",
)


def started_path(record_path: str | Path) -> Path:
    """Where a probe writing its record to ``record_path`` leaves what it knows before it runs
    (``write_started``): ``record.json`` -> ``record.started.json``."""
    path = Path(record_path)
    return path.with_name(f"{path.stem}.started.json")


def write_started(record_path: str | None, record: Record, settings: dict) -> None:
    """What the probe knows before its stages run (its repro script, its settings), beside the
    record it will write: a process that dies on the way (a device runtime abort, a kill) leaves
    it for the runner's stand-in record, which then has the repro script and is attributed
    (``attribute_dead``)."""
    if not record_path:
        return
    fields = {key: record.get(key) for key in STARTED_FIELDS}
    atomic_write_json(started_path(record_path), {"record": fields, "settings": settings})


def attribute_dead(started: dict) -> dict:
    """Whose failure a probe's death was (its process killed by a signal: a device runtime
    abort): the same stages rerun in the reference configuration, as ``attribute`` does for a
    failure the probe caught. The CPU does not abort: ``stack`` when the reference passes,
    ``both`` with its signature when it fails (another failure than the death); null with the
    reason in ``reference_note`` when it could not run. The fields to fill the stand-in record
    with."""
    record, settings = dict(started["record"]), started["settings"]
    ref_dtype = _reference_dtype(record["device_type"], settings["dtype"])
    skip = reference_skip(record, settings, ref_dtype)  # type: ignore[arg-type]
    if skip:
        return {"reference_note": f"attribution {skip}"}
    found = {"reference_device": f"cpu:{ref_dtype}", "reference_note": None}
    ref = _on_the_reference(
        settings, ref_dtype, "compile" if settings["mode"] == "compile" else "eager"
    )
    if ref["exclusion_reason"]:
        return {**found, "reference_note": f"attribution not run: {ref['exclusion_reason']}"[:2000]}
    if ref["exception"] is None:
        return {**found, "attribution": "stack"}
    exc = ref["exception"]
    return {
        **found,
        "attribution": "both",
        "reference_signature": failure_signature(
            type(exc).__name__, str(exc), probe_core.trimmed_traceback(exc)
        ),
        "reference_note": f"the reference fails at {ref['failure_stage']}: {type(exc).__name__}: {exc}"[
            :2000
        ],
    }


# python -m model_support.probe.checks STARTED_JSON: attribute_dead's fields, as JSON
if __name__ == "__main__":
    print(json.dumps(attribute_dead(json.loads(Path(sys.argv[1]).read_text()))))
