"""A rank process of ``run_sharded`` (``python -m model_support.probe.sharded --rank DIR``): pins
itself to its device (the device adapter's ``rank_env``) before torch is imported, runs the
probe's stages on its shard of the model, writes its progress and its report as JSON into the run
folder, and dies with its parent."""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
from pathlib import Path

from ...fileio import atomic_write_json
from .. import devices, probe_core, probe_params
from .protocol import (
    RANK_FAILED_EXIT,
    RANK_KEYS,
    STACKS_SIGNAL,
    STAGE_KEYS,
    TEST_FAULT_ENV,
    die_with_launcher,
)


class _Progress:
    """The rank's stage and token count, in a file the parent reads when the rank never reports."""

    def __init__(self, run_dir: Path, rank: int):
        self.path = run_dir / f"rank{rank}.progress.json"
        self.state = {"stage": "runner", "tokens": 0}

    def __call__(self, **changes) -> None:
        self.state.update(changes, t=time.time())
        atomic_write_json(self.path, self.state)


def _test_fault(rank: int) -> tuple[str, int] | None:
    """The test-only fault for this rank (``TEST_FAULT_ENV``), or None."""
    value = os.environ.get(TEST_FAULT_ENV, "")
    if not value:
        return None
    action, fault_rank, step = value.split(":")
    return (action, int(step)) if int(fault_rank) == rank else None


class _RankTimer(probe_core.StepTimer):
    """The probe's step timer, also writing progress (and acting out the test-only fault)."""

    def __init__(self, synchronize, progress: _Progress, fault):
        super().__init__(synchronize)
        self.progress = progress
        self.fault = fault

    def put(self, value):
        seen = self._seen_prompt
        super().put(value)
        if not seen:
            return
        self.progress(tokens=len(self.times))
        if self.fault and len(self.times) == self.fault[1]:
            if self.fault[0] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            while self.fault[0] == "hang":
                time.sleep(1)


def _init_process_group(adapter, device, timeout_s: float) -> None:
    import datetime

    import torch

    backend = adapter.distributed_backend()
    torch.distributed.init_process_group(
        backend=backend,
        device_id=device if backend == "nccl" else None,
        timeout=datetime.timedelta(seconds=max(30.0, float(timeout_s))),
    )


def _local_footprint(model) -> tuple[int, list[int] | None]:
    """Bytes of parameters this rank holds, and its experts per expert-parallel module (None if
    none)."""
    total = 0
    for param in model.parameters():
        local = param.to_local() if hasattr(param, "to_local") else param
        total += local.numel() * local.element_size()
    experts = [m.num_experts for m in model.modules() if getattr(m, "_is_expert_parallel", False)]
    return total, experts or None


def _rank_body(
    job: dict,
    rank: int,
    local_rank: int,
    progress: _Progress,
    pin_error: BaseException | None = None,
) -> dict:
    """The probe's stages on this rank (``probe_core.run_stages``, the model split by the job's
    ``DistributedConfig``); every exception lands in the report with its stage (``pin_error``:
    why this rank could not be given its device, a set-up failure)."""
    import resource

    import torch

    settings, device_type, world_size = job["settings"], job["device_type"], job["world_size"]
    report = dict.fromkeys(STAGE_KEYS + RANK_KEYS)
    for key in ("exception", "model", "tokenizer"):
        report.pop(key)
    report["rank"] = rank
    adapter = None
    try:  # set-up: a failure here is the harness's (stage runner)
        import transformers  # noqa: F401  imported before load_s starts, as the probe's warmed-up kernel has it
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401
        from transformers.distributed import DistributedConfig
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        if rank != 0:
            hf_logging.set_verbosity_error()
        if pin_error is not None:
            raise pin_error
        # loads the device's backend (torch_tpu: with its tpu_dist)
        adapter = devices.resolve(device_type)
        device = adapter.rank_device(local_rank)
        if world_size > 1:
            _init_process_group(adapter, device, job["timeout_s"])
        adapter.reset_peak_memory()
        synchronize = adapter.synchronize if device_type != "cpu" else None
        split = job["distributed_config"]
        result = probe_core.run_stages(
            model_id=settings["model"],
            **probe_params.stage_settings(settings),
            device=device,
            synchronize=synchronize,
            load_kwargs={"distributed_config": DistributedConfig(**split)} if split else None,
            timer=_RankTimer(synchronize, progress, _test_fault(rank)),
            on_stage=lambda stage: progress(
                stage=stage, **({"tokens": 0} if stage == "generate" else {})
            ),
            on_load=lambda model: report.update(
                zip(("local_param_bytes", "local_experts"), _local_footprint(model))
            ),
            no_grad=job["no_grad"],
        )
    except Exception as setup_exc:  # noqa: BLE001 the set-up failed: no stage ran
        result = {
            "status": probe_core.classify("runner", setup_exc),
            "failure_stage": "runner",
            "exception": setup_exc,
        }
    exc = result.pop("exception")
    report.update({k: v for k, v in result.items() if k in report})
    if exc is None:
        progress(stage="done")
    else:
        report.update(
            error_type=type(exc).__name__,
            error_module=type(exc).__module__,
            error_message=str(exc)[:4000],
            traceback=probe_core.trimmed_traceback(exc),
            failed_at=time.time(),
        )
    if adapter is not None:
        try:
            report["peak_device_mem_mb"], report["device_mem_source"] = adapter.peak_memory_mb()
        except Exception:  # noqa: BLE001 memory is informative only
            pass
    report["peak_host_mem_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # the launcher's share of the probe's (timings depend on it)
    report["cpu_threads"] = torch.get_num_threads()
    return report


def rank_main(run_dir: Path) -> int:
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    job = json.loads((run_dir / "job.json").read_text())
    # before torch (and the backend) is imported: this rank's device only (a TPU rank: its chip of
    # the probe's grant, and the launch environment the launcher's parent set up, which the rank
    # inherited)
    try:
        os.environ.update(
            devices.adapter_for(job["device_type"]).rank_env(
                local_rank, job["world_size"], os.environ
            )
        )
        pin_error = None
    except Exception as exc:  # noqa: BLE001 the rank's report says why it has no device
        pin_error = exc
    die_with_launcher()
    faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True)
    (run_dir / f"rank{rank}.pid").write_text(str(os.getpid()))
    progress = _Progress(run_dir, rank)
    progress()
    report = _rank_body(job, rank, local_rank, progress, pin_error)
    atomic_write_json(run_dir / f"rank{rank}.json", report)
    if report["status"] != probe_core.PASS:
        # at once: the agent stops the others, no collective is left waiting
        os._exit(RANK_FAILED_EXIT)
    import torch

    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0
