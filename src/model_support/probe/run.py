"""One model, one record: the probe notebook's single call.

``run_probe`` resolves the device adapter, runs the guarded stages of ``probe_core`` on it, runs the
CPU reference check, and turns everything into one record with exactly the schema's fields: verdict,
stage, error and signature, tokens, timings, memory, provenance and the reproduction script. Any
failure, the harness's own included, becomes the record rather than an exception, so the sweep
always gets a verdict. ``show`` displays it in the notebook and stores it in the output.
"""

from __future__ import annotations

import contextlib
import gc
import os
import resource
import time
from pathlib import Path

from .. import display
from ..fileio import atomic_write_json
from ..record import schema
from ..record.schema import Record
from ..redact import redact_record
from . import (
    census,
    devices,
    hub,
    hub_fetch,
    long_text,
    performance,
    phases,
    probe_compile,
    probe_core,
    probe_params,
    probe_vision,
    what_if,
)
from .checks import (
    NO_WEIGHTS_ATTRIBUTION,
    attribute,
    long_text_on_device,
    started_path,
    write_started,
)
from .instruments import flight_recorder, host_cost, profiled, recompiles
from .model_ids import check_there, machine_paths, portable_id, unavailable
from .records import fail, new_record
from .repro import set_repro

#: The flag under which the record is stored in an executed notebook (``display.read_tagged``).
RECORD_FLAG = "record"
#: The probe's settings with their defaults (``probe_params.SETTINGS``: not the model, not the
#: runner's bookkeeping).
DEFAULTS = {k: v for k, v in probe_params.defaults().items() if k in probe_params.SETTINGS}
#: What of the model's timeout is kept back from a sharded run's ranks (a tenth, at least 15 s), for
#: the record and the reference: the ranks time out, saying where each one was, before the probe is
#: killed.
RANKS_KEEP_BACK, RANKS_KEEP_BACK_MIN_S = 0.1, 15.0


def _peak_host_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def record_failure(
    record: Record, stage: str, exc: BaseException, status: str | None = None
) -> Record:
    """Fill the failure fields of ``record`` from an exception raised in ``stage``."""
    status = status or probe_core.classify(stage, exc)
    return fail(
        record, stage, status, type(exc).__name__, str(exc), probe_core.trimmed_traceback(exc)
    )


#: The sharded result's fields a record keeps as they are (its own group, the peak over the ranks
#: with its source, and the ranks' CPU threads).
SHARDED_FIELDS = (*schema.SHARDED_FIELDS, "peak_device_mem_mb", "device_mem_source", "cpu_threads")
#: The stage results a record keeps as they are (status and failure_stage are set with the error).
STAGE_FIELDS = tuple(
    k for k in probe_core.RESULT_KEYS if k in schema.FIELDS and k not in ("status", "failure_stage")
)


def resolve_task(record: Record, settings: dict) -> bool:
    """``task`` auto with the Hub's ``pipeline_tag`` known: the tag decides (a tag of a task the
    probe does not run is an exclusion, no verdict: returns False). Without a tag the config
    decides, in the load stage."""
    if settings["task"] != "auto":
        return True
    try:
        settings["task"] = probe_core.task_of_pipeline_tag(record.get("pipeline_tag")) or "auto"
    except probe_core.NotAProbedTask as exc:
        record["exclusion_reason"] = str(exc)
        return False
    return True


def stage_outcome(record: Record, settings: dict, result: dict) -> None:
    """What the stages learned, onto the record: the task they ran (the reference then runs the
    same one) and the prompt it used; an environment failure (``exclusion_reason``) leaves the
    record without a verdict."""
    if result.get("task"):
        record["task"] = settings["task"] = result["task"]
    image_task = record["task"] == probe_core.IMAGE_TEXT_TO_TEXT
    record["prompt"] = settings["image_prompt"] if image_task else settings["prompt"]


def _repro(record: Record, settings: dict, adapter, **more) -> None:
    """The record's repro script and its settings, from the settings as they stand: the device
    adapter's type and compile backend, the record's model id and sweep (``more``: a sharded
    run's ``distributed`` config)."""
    chosen = {
        **settings,
        "device": adapter.type,
        "compile_backend": adapter.compile_backend(),
        # the backend's own, set by the script
        "device_config": adapter.configuration(shown_only=True) or None,
        "model_id": record["model_id"],
        **more,
    }
    set_repro(record, chosen)


def _set_repro(record: Record, settings: dict, adapter, **more) -> None:
    """The record's repro script (``_repro``), also written at once beside the record
    (``checks.write_started``): a process that dies before its record (a device runtime abort)
    leaves it."""
    _repro(record, settings, adapter, **more)
    write_started(settings.get("record_path"), record, settings)


def _rank_setup(adapter, count: int) -> dict:
    """How the device adapter set up a sharded run's ranks, for its repro script: each rank's
    environment (``rank_env``, from this probe process's own, which the ranks inherit) and the
    process group's backend. Either is None where the adapter refused it: the ranks failed on
    that, as the record says."""
    try:
        backend = adapter.distributed_backend()
    except devices.DeviceUnavailable:
        backend = None
    try:
        rank_env = [adapter.rank_env(rank, count, os.environ) for rank in range(count)]
    except ValueError:  # e.g. a TPU slice of a size one host does not have
        rank_env = None
    return {"distributed_backend": backend, "rank_env": rank_env}


def _sharded(record: Record, settings: dict, adapter) -> bool:
    """``devices`` other than 1: the probe over N devices (``sharded.run_sharded``, one rank per
    device, tensor or expert parallel by the model's own plan); ``auto`` picks the fewest that
    hold the model. True when it ran (the record is complete), False when one device is the
    answer."""
    devices = str(settings["devices"])
    if devices == "1":
        return False
    from . import sharded

    params = sharded.estimate_params(
        settings["load_from"], settings["revision"], settings["trust_remote_code"]
    )
    record["memory_estimate_bytes"] = sharded.memory_estimate_bytes(params, settings["dtype"])
    if devices == "auto":
        memory = int(settings["device_memory_gb"] * 1e9) or adapter.device_memory_bytes()
        try:
            count = sharded.plan_devices(
                params, settings["dtype"], memory, adapter.devices_present()
            )
        except sharded.DoesNotFit as exc:
            record_failure(record, "runner", exc, status=schema.FAIL_OTHER)
            return True
        if count == 1:
            return False
    else:
        count = int(devices)
    if settings["mode"] != "eager":
        refused = probe_params.ParameterError(
            f"devices={devices} runs in eager mode only; drop mode={settings['mode']}."
        )
        record_failure(record, "runner", refused, status=schema.FAIL_OTHER)
        return True
    keep = max(settings["timeout_s"] * RANKS_KEEP_BACK, RANKS_KEEP_BACK_MIN_S)
    left = settings["timeout_s"] - keep - (time.perf_counter() - settings["started"])
    with phases.device_work():  # the ranks, on their devices
        result = sharded.run_sharded(settings, count, adapter.type, timeout_s=max(left, 1.0))
    # its repro script launches the same ranks, as the adapter set them up
    if result.get("distributed_config"):
        _set_repro(
            record,
            settings,
            adapter,
            distributed=result["distributed_config"],
            **_rank_setup(adapter, count),
        )
    schema.fill(record, {key: result.get(key) for key in (*STAGE_FIELDS, *SHARDED_FIELDS)})
    stage_outcome(record, settings, result)
    record["peak_host_mem_mb"] = _peak_host_mb()
    if record["exclusion_reason"]:
        return True
    if result["exception"] is not None:
        record_failure(
            record, result["failure_stage"], result["exception"], status=result["status"]
        )
        # one CPU process would not test what failed here
        if result.get("error_type") == "NoParallelPlan":
            record["reference_note"] = (
                "attribution not run: the model needs more devices than one and has no plan"
            )
        else:
            phases.checks(record, settings, "attribute")
        return True
    record["status"] = schema.PASS
    # why not: several devices
    schema.fill(record, performance.perf_fields(record, settings, {}, adapter))
    phases.checks(record, settings, "pass", result.get("step_scores"), result.get("input_ids"))
    return True


def run_probe(
    model_id: str,
    record_path: str = "",
    sweep_id: str = "",
    notebook_path: str = "",
    snapshot: str = "",
    hub_facts: dict | None = None,
    **overrides,
) -> Record:
    """Probe one model and return its record (also written to ``record_path`` when given).

    A bad parameter value is this run's outcome (FAIL(other) at stage runner, with the one
    sentence that names it): a notebook always ends with a verdict. Sweeps refuse such values
    before any model runs. A Hub model is loaded from ``snapshot`` when the sweep downloaded it
    ahead (with the ``hub_facts`` it learned then, for the record), else its download stage runs
    here. A model that is not there (a local path that is no folder, a Hub id the Hub does not
    give: not on it, no access, the network or the disk failing) is the user's to fix, not a
    verdict: ``model_ids.ModelUnavailable`` (one sentence, a ``UserError``) is raised before any
    record is made, and none is written."""
    unknown = sorted(set(overrides) - set(DEFAULTS))
    if unknown:
        raise TypeError(
            f"unknown probe parameter(s): {', '.join(unknown)}; accepted: {', '.join(DEFAULTS)}"
        )
    check_there(snapshot or model_id)
    started = time.perf_counter()
    settings = {
        **DEFAULTS,
        **overrides,
        "model_id": model_id,
        "load_from": snapshot or model_id,
        "started": started,
        "record_path": record_path,
    }
    from transformers.utils import logging as hf_logging

    # per-shard progress bars only clutter notebooks and sweep logs
    hf_logging.disable_progress_bar()
    record = new_record(portable_id(model_id), settings, sweep_id, notebook_path, hub_facts)
    phases.start()
    try:
        _probe(record, settings)
    except (hub_fetch.EnvironmentProblem, hub_fetch.NoAccess, hub_fetch.NotOnHub) as exc:
        # the model is not there: not a verdict, no record
        raise unavailable(model_id, exc) from exc
    except Exception as exc:  # noqa: BLE001 a harness bug must still yield a record, never a lost model
        record_failure(record, "runner", exc, status=schema.FAIL_OTHER)
    record["duration_s"] = time.perf_counter() - started
    schema.check_record(redact_record(record, machine_paths(model_id)))
    if record_path:
        atomic_write_json(Path(record_path), record)
        started_path(record_path).unlink(missing_ok=True)  # the record says it all now
    # the device phase's timings; with checks "after", the checks' inputs
    phases.save(record, record_path)
    return record


def _probe(record: Record, settings: dict) -> None:
    import torch

    try:
        probe_params.check({k: v for k, v in settings.items() if k in probe_params.BY_NAME})
        adapter = devices.resolve(settings["device"])
    except (probe_params.ParameterError, devices.DeviceUnavailable) as exc:
        record["device_type"] = settings["device"]
        record_failure(record, "runner", exc, status=schema.FAIL_OTHER)
        return
    record.update(
        {
            "device_type": adapter.type,
            "device_name": adapter.device_name(),
            "device_count": adapter.device_count(),
            "cpu_threads": torch.get_num_threads(),  # a sharded run's ranks say theirs
            # the backend of the device resolved (``auto``: now known)
            **devices.backend_identity(adapter.type),
        }
    )
    missing = adapter.mode_unavailable(settings["mode"])
    if missing:  # no verdict: this stack has no such mode (an ``excluded`` row in a sweep)
        record["exclusion_reason"] = f"{probe_compile.NOT_AVAILABLE}: {missing}"
        return
    refused = what_if.refusal(settings.get("host_ops"), adapter)
    # one sentence before anything runs (a sweep refuses it before it starts: sweep.definition)
    if refused:
        record["exclusion_reason"] = refused
        return
    broken = probe_vision.torchvision_broken()
    if broken:  # transformers would fail every model's load with it: the environment, no verdict
        record["exclusion_reason"] = broken
        return
    _set_repro(record, settings, adapter)
    if settings["load_from"] == settings["model_id"] and not hub_fetch.is_local(
        settings["model_id"]
    ):
        try:  # the download stage, run here when no sweep fetched the files ahead
            got = hub_fetch.fetch(
                settings["model_id"],
                settings["revision"],
                trust_remote_code=settings["trust_remote_code"],
            )
        except hub_fetch.NoLoadableWeights as exc:  # a real answer about the model
            record_failure(record, "download", exc, status=schema.FAIL_LOAD)
            schema.fill(record, NO_WEIGHTS_ATTRIBUTION)
            return
        schema.fill(
            record, {**{k: got[k] for k in schema.DOWNLOAD_FIELDS}, **hub.metadata(got["info"])}
        )
        settings["load_from"] = got["path"]
        # the Hub's pipeline_tag, now known, decides an auto task
        if not resolve_task(record, settings):
            return
        _set_repro(record, settings, adapter)  # from the downloaded files, the task resolved
    if settings.get("host_ops") and _sharded_what_if(record, settings, adapter):
        return
    if _sharded(record, settings, adapter):
        return
    # a what-if run: the operators it names on the host
    with what_if.hosting(record, settings, adapter):
        _on_device(record, settings, adapter)


def _sharded_what_if(record: Record, settings: dict, adapter) -> bool:
    """A what-if run that would put operators on the host over several devices (or
    ``devices=auto``, which may be several) is not run yet: said as its exclusion (no verdict),
    True."""
    if (
        str(settings.get("devices", "1")) == "1"
        or not what_if.operators(settings["host_ops"], adapter)[0]
    ):
        return False
    record["exclusion_reason"] = (
        "host_ops runs on one device only for now: ask devices=1 for a what-if run"
    )
    return True


def _on_device(record: Record, settings: dict, adapter) -> None:
    """The probe on one device: its stages under the instruments, the verdict, the perf phase,
    the checks."""
    record.update({"devices_used": 1, "parallelism": "none"})
    adapter.reset_peak_memory()
    # the instruments, each at most 5% of a probe or off by default (bench/bench_instruments.py):
    # the census (sampled: it steps out once the decode steps repeat), the flight recorder (armed; a
    # crash is rerun under it) and the host meter imports torch: this module imports none until the
    # device is set up
    from .census_mode import Census

    counted = (
        Census(adapter.type, adapter.synchronous_ops, adapter.perf_clock(settings["mode"]))
        if census.takes_census(settings["mode"]) and settings["census"] != census.OFF
        else None
    )
    # the flight recorder first: under the census, it sees the operators as the census counts them
    recorder = flight_recorder.recorder_for(
        settings, adapter, census.takes_census(settings["mode"])
    )
    meter, no_meter = host_cost.meter_for(adapter, settings["mode"], settings["host_cost"])
    # a compiled run, which no dispatch mode sees: the adapter's profiler over its generation, where
    # it offers one
    profiler, no_profiler = profiled.profiler_for(adapter, settings["mode"], meter is not None)
    sync = adapter.synchronize if adapter.type != "cpu" else None
    watchers = [hook.enter for hook in (counted, recorder) if hook is not None]
    # counts the host cost as tokens arrive (the backend's counters, else the profiler's trace)
    timer = (
        meter.timer(adapter.synchronize) if meter else profiler.timer(sync) if profiler else None
    )
    if counted is not None and settings["census"] == census.SAMPLED:  # the census hears each token
        timer = counted.following(timer or probe_core.StepTimer(sync), settings["max_new_tokens"])
    with (
        recorder or contextlib.nullcontext(),
        counted or contextlib.nullcontext(),
        profiler or contextlib.nullcontext(),
        phases.device_work(),
    ):
        result = probe_core.run_stages(
            model_id=settings["load_from"],
            **probe_params.stage_settings(settings),
            device=adapter.torch_device,
            synchronize=sync,
            compile_backend=adapter.compile_backend(),
            on_stage=phases.stages(_each(watchers)),  # the host's loading off the device clock
            timer=timer,
            on_device=phases.to_device,  # the weights move: the device's work again
            # the perf phase times it again, the recompile check compiles it again, still on the
            # device
            keep_model=performance.wanted(settings, adapter.type) is None
            or recompiles.why_not({"status": schema.PASS, "device_type": adapter.type}, settings)
            is None
            or long_text.wanted(settings),
        )
    if not result["exclusion_reason"]:
        _operators(record, settings, result, counted, profiler, no_profiler)
    if settings["mode"] == "compile":
        record["compile_backend"] = adapter.compile_backend()
    schema.fill(record, {key: result[key] for key in STAGE_FIELDS})
    stage_outcome(record, settings, result)
    record["peak_host_mem_mb"] = _peak_host_mb()
    record["peak_device_mem_mb"], record["device_mem_source"] = adapter.peak_memory_mb()
    record["compile_cache_hits"], record["compile_cache_misses"] = adapter.compile_cache_stats()
    if record["exclusion_reason"]:
        return
    if result["exception"] is not None:
        record_failure(
            record, result["failure_stage"], result["exception"], status=result["status"]
        )
        # why not: not a PASS
        schema.fill(record, performance.perf_fields(record, settings, {}, adapter))
        # the failed model (held by the exception's frames) is freed before the reference loads
        del result
        _attributed(record, settings, adapter)
        return
    record["status"] = schema.PASS
    if meter is None and profiler is not None and settings["host_cost"] != "off":
        schema.fill(record, profiler.host_fields())
    else:
        schema.fill(record, meter.fields() if meter else host_cost.not_measured(no_meter or ""))
    _coverage(record, adapter)
    # the perf phase: the same model timed again on its device, before the release
    with phases.device_work():
        schema.fill(record, performance.perf_fields(record, settings, result, adapter))
        # recompiles across prompt lengths (recompile_check), or why not
        if settings["mode"] == "compile":
            # the device's work, said apart in the sweep's device time
            with phases.part("recompiles"):
                schema.fill(record, recompiles.recompile_fields(record, settings, result, adapter))
        # the long text through both paths, said apart in the sweep's device time
        with phases.part("long_text"):
            long_found = long_text_on_device(record, settings, result, adapter)
    device_steps, prompt_ids = result["step_scores"], result["input_ids"]
    del result  # the device's model is freed before the reference loads
    phases.checks(record, settings, "pass", device_steps, prompt_ids, long_found)


def _operators(
    record: Record, settings: dict, result: dict, counted, profiler, no_profiler: str | None
) -> None:
    """The run's operators and their times: the census's (the run's own, or partial where it
    stopped), else the profiler's (a compiled run), else why there are none."""
    if counted is not None:
        schema.fill(
            record, counted.fields(census.RUN if result["exception"] is None else census.PARTIAL)
        )
        schema.fill(
            record,
            counted.times() if result["exception"] is None else counted.not_timed("not a PASS"),
        )
    elif profiler is not None:
        schema.fill(
            record,
            profiler.ops_fields()
            if result["exception"] is None
            else census.not_timed("not a PASS"),
        )
    elif census.takes_census(settings["mode"]):
        schema.fill(record, census.not_timed("census=off"))
    else:
        schema.fill(
            record, census.not_timed(f"no census in mode {settings['mode']}, and {no_profiler}")
        )


def _attributed(record: Record, settings: dict, adapter) -> None:
    """A failed run's attribution: in the device phase where the reference's census completes the
    partial one (its coverage asks the device's stack), else among the host checks."""
    if record["ops"] is not None:
        gc.collect()  # the failed model freed before the reference loads
        attribute(record, settings)
        _coverage(record, adapter)
    else:
        phases.checks(record, settings, "attribute")


def _each(hooks: list):
    """One ``on_stage`` hook calling each of ``hooks`` (the census', the flight recorder's); None
    for none."""
    if not hooks:
        return None

    def each(stage: str) -> None:
        for hook in hooks:
            hook(stage)

    return each


def _coverage(record: Record, adapter) -> None:
    """What the device's stack does with each operator of the census (the adapter's
    ``op_coverage``): ``ops_missing``, ``ops_fallback``, ``ops_unknown``; the operator that
    stopped a stack's failure is missing."""
    if record["ops"] is not None:
        coverage = adapter.op_coverage(record["ops"])
        schema.fill(
            record, census.coverage_fields(record["ops"], coverage, census.stopped_by(record))
        )


def summary_html(record: Record) -> str:
    """The verdict, the generated text and the timings at a glance."""

    def fmt(value, unit=""):
        if value is None:
            return "-"
        return f"{value:.3f}{unit}" if isinstance(value, float) else f"{value}{unit}"

    rows = [
        ("model", record["model_id"]),
        ("device", f"{record['device_type']} ({record['device_name']})"),
        ("task", record["task"]),
        ("stage", record["failure_stage"]),
        (
            "error",
            f"{record['error_type']}: {record['error_message']}" if record["error_type"] else None,
        ),
        (
            "generated",
            repr(record["generated_text"]) if record["generated_text"] is not None else None,
        ),
        (
            "tokens in / out",
            f"{record['tokens_in']} / {record['tokens_out']}"
            + (
                f" ({record['image_tokens']} of them the image's)"
                if record["image_tokens"] is not None
                else ""
            ),
        ),
        ("load", fmt(record["load_s"], " s")),
        ("first token (incl. compile)", fmt(record["first_token_s"], " s")),
        ("generate", fmt(record["generate_s"], " s")),
        ("decode", fmt(record["decode_tokens_per_s"], " tok/s")),
        (
            "peak host / device memory",
            f"{fmt(record['peak_host_mem_mb'], ' MiB')} / "
            f"{fmt(record['peak_device_mem_mb'], ' MiB')}",
        ),
        (
            "CPU reference",
            f"{record['reference_device']}: {record['numerics']} ({record['numerics_note']})"
            if record["numerics"]
            else record["numerics_note"] or record["reference_note"],
        ),
        ("fluency judge", record["fluency_note"]),
    ]
    if record["exclusion_reason"]:  # no verdict: e.g. a mode this stack does not offer
        rows.insert(2, ("excluded", record["exclusion_reason"]))
    status = record["status"] or ("excluded" if record["exclusion_reason"] else "?")
    return display.kv_table(rows, title=status, color=schema.verdict_color(record["status"]))


def show(record: Record):
    """Display the summary and store the record in the output, tagged so readers find it: all of
    it but its repro script's body, which its ``repro_sha256`` names (``repro.script_of`` puts
    the script together)."""
    kept = {**record, "repro_script": None} if record["repro_sha256"] else record
    display.show_tagged(
        RECORD_FLAG, summary_html(record), kept, f"{record['status']} {record['model_id']}"
    )


def record_from_notebook(path: Path) -> dict | None:
    """The record an executed probe notebook holds."""
    return display.read_tagged(path, RECORD_FLAG)
