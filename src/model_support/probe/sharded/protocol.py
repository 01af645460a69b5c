"""What ``run_sharded``, its launcher process and its rank processes agree on: the settings a rank
uses, what a rank reports, the signals and exit status between them, the test-only fault switch."""

from __future__ import annotations

import signal

from .. import probe_core, probe_params

#: Test-only switch, read by every rank: ``ACTION:RANK:STEP`` makes rank RANK, once it has generated
#: STEP new tokens, ``kill`` itself (SIGKILL, as the OOM killer would) or ``hang`` (sleep forever).
#: Never set outside tests.
TEST_FAULT_ENV = "MODEL_SUPPORT_SHARDED_TEST_FAULT"
#: Seconds the elastic agent gives the other ranks to stop after one failed, before SIGKILL.
SHUTDOWN_GRACE_S = 5
#: Sent to the ranks still running at the timeout: each writes its Python stacks to its log.
STACKS_SIGNAL = signal.SIGUSR1
#: The signals the elastic agent stops the other ranks with once one failed (a rank ended by one of
#: these is the cause of the failure only when no rank crashed or raised).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: Exit status of a rank whose stages raised (its result file says what): the agent stops the
#: others.
RANK_FAILED_EXIT = 3
#: The probe settings a rank uses (run_stages' own, ``probe_params.STAGE_SETTINGS``) with their
#: declared defaults; plus this module's own.
RANK_DEFAULTS = {
    **{name: probe_params.BY_NAME[name].default for name in probe_params.STAGE_SETTINGS},
    # "auto": parallelism_for's choice; "tp" or "ep" force one (transformers refuses what the model
    # lacks).
    "parallelism": "auto",
    # for "ep": "auto" (the tensor plan when there is one, else FSDP), "tp" or "fsdp".
    "ep_dense": "auto",
}
#: The keys of probe_core.run_stages' result, in its order (the objects model/tokenizer stay None).
STAGE_KEYS = probe_core.RESULT_KEYS
#: What a rank reports (JSON) beyond the stage keys.
RANK_KEYS = (
    "rank",
    "error_type",
    "error_module",
    "error_message",
    "traceback",
    "failed_at",
    "peak_device_mem_mb",
    "device_mem_source",
    "peak_host_mem_mb",
    "cpu_threads",
    "local_param_bytes",
    "local_experts",
)


def die_with_launcher() -> None:
    """Linux: SIGKILL this process when its parent dies, so nothing of a run outlives its caller
    (the one helper, ``engine.children.die_with_parent``)."""
    from ...engine.children import die_with_parent

    die_with_parent()
