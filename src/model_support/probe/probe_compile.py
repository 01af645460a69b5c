"""The probe's execution modes, self-contained (part of every repro script's body, as
``probe_core``): fused eager where the stack has it, and torch.compile (dynamic or static shapes)
with its recompile counts."""

import contextlib


def is_compile_error(exc):
    """Raised by torch.compile's machinery (dynamo tracing, the backend compiler), not by the
    model's ops."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__module__.startswith(("torch._dynamo", "torch._inductor")):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


FUSED_EAGER = "torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)"


#: How a record, a repro script or the debug command says a mode does not exist on this stack.
NOT_AVAILABLE = "not available on this stack"


def fused_eager_missing(device_type):
    """Why mode "fused" (TorchTPU's deferred-and-fused eager: ops queue up and run as fused
    programs) cannot run here, or None. It exists only on a TPU, and only where torch_tpu exposes
    it (0.2.0 does, as an experimental API); elsewhere the record says so instead of failing."""
    if device_type != "tpu":
        return (
            "mode 'fused' is TorchTPU's deferred-and-fused eager; it runs on tpu devices only, "
            f"not on {device_type}"
        )
    import torch

    tpu = getattr(torch, "tpu", None)
    if (
        getattr(tpu, "set_eager_mode", None) is None
        or getattr(getattr(tpu, "EagerMode", None), "DEFER_AND_FUSE", None) is None
    ):
        import importlib.metadata as metadata

        try:
            version = metadata.version("torch_tpu")
        except metadata.PackageNotFoundError:
            version = "(not installed)"
        return f"torch_tpu {version} does not expose {FUSED_EAGER}"
    return None


def execution_context(mode):
    """The context generation runs in: TorchTPU's deferred-and-fused eager for mode "fused", else
    none (eager is the default; compile wraps the forward instead, ``compile_forward``)."""

    if mode != "fused":
        return contextlib.nullcontext()
    import torch

    return torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)


def compile_forward(model, backend):
    """``model.forward`` through torch.compile with ``backend`` (inductor on cpu and cuda, tpu on
    TPU), as this stack's torch.compile compiles it; dynamo's counters start from zero. Returns
    the eager forward, to put back.

    Where that compile is static (``compile_dynamic`` False: TorchTPU patches torch.compile to
    ``dynamic=False`` for its ``tpu`` backend), the model generates with transformers' static KV
    cache from here on (``generation_config.cache_implementation``, which every later generate()
    of it reads: the eager rerun, the perf phase, the recompile check, the repro script): a
    dynamic cache grows by one position per token, each length is a new graph, and past dynamo's
    recompile limit (8) the forward runs eagerly, so a "compiled" run would be mostly eager. With
    a static cache the decode steps share one graph: what the mode says it compiles."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    if compile_dynamic(backend) is False:
        config = getattr(model, "generation_config", None)
        if config is not None:
            config.cache_implementation = "static"
    eager = model.forward
    model.forward = torch.compile(eager, backend=backend)
    return eager


def _never_called():
    """What ``compile_dynamic`` hands torch.compile: never traced, never run."""


def compile_dynamic(backend):
    """The ``dynamic`` this stack's torch.compile gives dynamo for ``backend`` when the caller
    names none: None (torch's default: a dimension seen with two sizes becomes symbolic), or what
    a backend package patched in (TorchTPU's torch.compile sets False for ``tpu``: every new
    shape a new graph). Read by handing torch.compile a function while dynamo's ``optimize`` is
    stood in for (nothing is compiled, and what setting the backend up wrote into ``os.environ``,
    inductor's cache folder, is taken back); None where that cannot be read."""
    import os

    import torch
    import torch._dynamo

    seen = []
    optimize, environ = torch._dynamo.optimize, dict(os.environ)

    def noted(*args, **kwargs):
        seen.append(kwargs.get("dynamic"))
        return lambda fn: fn

    torch._dynamo.optimize = noted
    try:
        torch.compile(_never_called, backend=backend)
    except Exception:  # noqa: BLE001 an unknown backend: torch.compile itself says so when the probe calls it
        return None
    finally:
        torch._dynamo.optimize = optimize
        for name in set(os.environ) - set(environ):
            del os.environ[name]
        os.environ.update(environ)
    return seen[0] if seen else None


def compile_settings(model, backend, cache):
    """What a compiled generation ran with: ``compile_dynamic`` (the stack's torch.compile's
    ``dynamic`` for ``backend``) and ``compile_cache`` (the KV cache it used: static where
    ``cache`` asked for it or the compile is static, ``compile_forward``)."""
    config = getattr(model, "generation_config", None)
    static = cache == "static" or getattr(config, "cache_implementation", None) == "static"
    return {
        "compile_dynamic": compile_dynamic(backend),
        "compile_cache": "static" if static else "dynamic",
    }


#: How dynamo says a frame hit its recompile limit (``counters["unimplemented"]``): it runs eagerly
#: from there.
RECOMPILE_LIMIT_HIT = "Dynamo recompile limit exceeded"


def compile_counts():
    """Graphs compiled, graph breaks (and the first reasons) and recompilations, from dynamo's
    counters. Every graph beyond the first is a (re)compilation of the forward: a new shape or a
    failed guard. ``recompile_limit_hit``: a frame recompiled past dynamo's limit
    (``recompile_limit``, 8), and ran eagerly from there: compiled in name only."""
    from torch._dynamo.utils import counters

    graphs = int(counters["stats"].get("unique_graphs", 0))
    breaks = counters["graph_break"]
    return {
        "graphs": graphs,
        "recompilations": max(0, graphs - 1),
        "graph_breaks": int(sum(breaks.values())),
        "graph_break_reasons": [str(reason)[:300] for reason in list(breaks)[:3]],
        "recompile_limit_hit": any(
            str(k).startswith(RECOMPILE_LIMIT_HIT) for k in counters["unimplemented"]
        ),
    }
