"""Models bigger than one chip: the probe over N devices, tensor or expert parallel, one process per
device.

A model that one device cannot hold runs on the fewest devices that can (``plan_devices``, from the
parameter count ``estimate_params`` reads off the safetensors headers), split by transformers' own
plans (``parallelism_for``) and launched here, one rank per device, with torch.distributed's elastic
launch API (``run_sharded``; no external ``torchrun``). Each rank runs the probe's stages; rank 0's
result is the probe's result, plus how it was split and what every rank measured.

How transformers 5.24 is asked to split a model (``from_pretrained(distributed_config=...)``), as
checked on 2 gloo ranks on the CPU:

- ``tp``: a model whose config has a ``base_model_tp_plan``: ``DistributedConfig(tp_size=N)``.
  Weights become DTensors sharded by the plan (attention and MLP column/row-wise, embeddings and
  head on the vocabulary); every rank holds the whole batch and ends with the same tokens.
- ``ep``: a model with an expert plan (``base_model_ep_plan``: the MoE models). Every MoE config of
  5.24 that has one also has a tensor plan (``zaya`` is the one exception), but that tensor plan's
  expert rule (``moe_tp_experts``) cuts *every* expert across the ranks; expert parallelism keeps
  each expert whole on one rank (``grouped_gemm`` shards the expert dimension). Two layouts work:
    * dense layers by the tensor plan: ``DistributedConfig(tp_size=N, ep_size=N)``. The EP group is
      the TP group, so the ranks share one batch and transformers' ``auto`` EP implementation runs
      ``AllReduceEP`` (each rank runs its own experts on the whole batch, masked, and the outputs
      are summed with an all-reduce).
    * no tensor plan: ``DistributedConfig(fsdp_size=N, ep_size=N)``, the dense layers FSDP2-sharded
      and the tokens exchanged with ``AllToAllEP``. FSDP2 refuses inference tensors ("RuntimeError:
      Inference tensors do not track version counter."), so that layout generates under
      ``torch.no_grad()`` instead of the probe's ``torch.inference_mode()``.
  Refused by transformers: ``ep_size`` alone ("ValueError: `ep_size` must divide `fsdp_size *
  tp_size`."), and experts-only over a TP group, ``tp_size=N, tp_plan={}, ep_size=N``, which is also
  what the deprecated ``enable_expert_parallel=True`` sets ("ValueError: `tp_size=2` was requested,
  but `MixtralForCausalLM` has no `tp_plan`. ..."). Mixtral's own tensor plan, ``tp_size=N`` alone,
  works (every expert split in two).
- ``None``: no tensor and no expert plan (gpt2, opt, ...): such a model runs on one device or not at
  all; asked for more, the probe is ``FAIL(other)`` with one sentence saying so (no rank starts).

Processes: ``run_sharded`` starts a launcher process (its own session) that runs the elastic agent;
the agent starts one rank process per device (``python -m model_support.probe.sharded --rank DIR``).
A rank pins itself to its device through the environment before it imports torch (the adapter's
``rank_env``: on TPU its one chip of the probe's grant, ``TPU_VISIBLE_DEVICES``, and the launch
environment torch_tpu's ``set_tpu_launch_env`` set up in the probe process before the launcher
started, which torch_tpu's runtime requires of a process with ``WORLD_SIZE`` set; checked against
the installed torch_tpu, not run on a chip here; ``LOCAL_RANK`` selects the GPU on CUDA), writes its
progress and its result as JSON into the run folder, and dies with its parent. A rank that crashes,
is killed (the OOM killer's SIGKILL), or does not finish within the timeout ends the probe as
``FAIL(other)`` naming the rank and why; every process of the run is killed before ``run_sharded``
returns, whatever happened.

``run_sharded(settings, world_size)`` takes the probe's settings as a plain dict and returns a plain
dict (plus the rebuilt exception), so a standalone script can call it as well as the probe can. This
module imports no torch at import time.
"""

from ..devices import tpu_rank_env
from .device_plan import (
    DEFAULT_MARGIN,
    DTYPE_BYTES,
    DoesNotFit,
    NoParallelPlan,
    config_params,
    distributed_config,
    dtype_bytes,
    estimate_params,
    memory_estimate_bytes,
    no_plan_sentence,
    parallelism_for,
    plan_devices,
    safetensors_params,
)
from .launch import run_sharded
from .protocol import (
    RANK_DEFAULTS,
    RANK_FAILED_EXIT,
    RANK_KEYS,
    SHUTDOWN_GRACE_S,
    STACKS_SIGNAL,
    STAGE_KEYS,
    STOP_SIGNALS,
    TEST_FAULT_ENV,
)
from .rank_results import LaunchFailed, RankDied, RankError, RankTimeout

# Their public home, as when this package was one module: a result's traceback text names them so.
for _cls in (DoesNotFit, NoParallelPlan, RankDied, RankTimeout, LaunchFailed, RankError):
    _cls.__module__ = __name__
del _cls

__all__ = [name for name in dir() if not name.startswith("_")]
