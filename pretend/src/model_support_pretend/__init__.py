"""The pretend accelerator: a PyTorch PrivateUse1 backend written in Python, named ``pretend``,
whose operators run on the CPU underneath, with a stack's faults on demand.

No accelerator is on the machines that build and test this project; this one makes the accelerator
path run anyway (see docs/devices.md). It is loaded the way torch_tpu is, through torch's
device-backend autoload entry point (group ``torch.backends`` in pyproject.toml), and registers
itself only when ``MODEL_SUPPORT_PRETEND`` is set: elsewhere ``load`` does nothing.

``MODEL_SUPPORT_PRETEND`` holds JSON (``config``): ``devices``, ``memory_gb``, ``missing_ops``,
``unsupported_dtypes``, ``wrong_ops``, ``crash_ops``, ``slow_ops``, ``fallback_ops``,
``matmul_noise``; ``PRETEND_VISIBLE_DEVICES`` pins a process to some of the devices. ``flaky_ops``
(``{"aten::relu": 2}``) with ``flaky_file`` (a path) makes a flaky stack, deterministically: the
processes that call one of those operators count themselves in that file (under a lock, since each
probe attempt is a new process), and the operator is missing in the 1st, (N+1)th, (2N+1)th... of
them, present in the others: with N = 2, a probe fails, its rerun passes (a sweep's flake
screening). ``wrong_ops`` is a list (each output reversed and negated: a kernel with a bug) or maps
operators to a relative error (``{"aten::mm": 0.02}``: every value off by 2%, with a random sign;
``0.0039``, half of bf16's epsilon, is noise the size of bf16 rounding, which ``model-support
localise`` must not flag). ``matmul_noise`` (``0.0039``) is no fault: every matrix product
(``config.MATMUL_OPS``) off by a relative error drawn uniformly within that size at each call, as a
stack that rounds its products differently is; the reference check must not flag it
(tests/test_numbers_faults.py). ``wrong_past_length`` (``{"aten::_safe_softmax": 32}``) makes an
operator wrong once the sequence axis it works over reaches N positions (``config.PAST_LENGTH_AXES``
names each axis): a KV-cache or long-context bug. A ``crash_ops`` operator aborts the process;
``"crash_message": false`` makes the abort silent (no last words on stderr), ``"crash_after": N``
reports it N operators later (an asynchronous runtime's late report), unless
``PRETEND_LAUNCH_BLOCKING=1`` (CUDA_LAUNCH_BLOCKING's counterpart). The backend counts its own
device-to-host syncs and CPU fallbacks (``counters``), read through the adapter's ``host_counters``.
``sdpa_kernel`` (``"flash"``, ``"own"``) runs attention as one fused kernel the CPU has none of
(``attention``), as an accelerator does. A kernel registered through ``torch.library`` for its
dispatch key (PrivateUse1) replaces its own implementation of that operator, faults and all, as the
dispatcher makes it for a C++ backend (``tensor.hosted``; docs/host_ops.md).
"""

from __future__ import annotations

from .config import CONFIG_VAR, NAME, VISIBLE_VAR, Config, PretendConfigError, parse


def load() -> None:
    """torch's autoload entry point: register the backend when ``MODEL_SUPPORT_PRETEND`` is set."""
    from .config import from_environment

    config = from_environment()
    if config is None:
        return
    from .backend import register

    register(config)
