"""Recompiles across prompt lengths (issue 38, item 6): does a compiled model recompile for every
prompt length or every token? A PASS that does is slow in production, and ``recompilations`` (one
generation) cannot say so.

After a compile-mode PASS (``recompile_check``), in the device phase, the verdict's model generates
``NEW_TOKENS`` greedy tokens from three prompt lengths (the verdict's prompt, then it lengthened by
``MORE_TOKENS`` of its own tokens), through a fresh ``torch.compile`` of its forward, twice: with
dynamo's automatic dynamic shapes off (every new shape recompiles: what a static-shape compiler
pays) and on (torch's default: a dimension seen with two sizes becomes symbolic). Recompiles are
counted per length from dynamo's compilation metrics
(``torch._dynamo.utils.get_compilation_metrics``: each compile of a frame that already had a graph
has a ``recompile_reason``), prefill (before the first new token, a streamer marks it) apart from
decode. The guards that failed come from dynamo's guard-failure hook (``torch._dynamo.optimize(...,
guard_fail_fn=)``: one reason per graph the frame held).

With automatic dynamic shapes on, the first two lengths are the warm-up (the prefill and the decode
step become symbolic there); the third should compile nothing. A recompile at its prefill flags the
model ``per length``, one in its decode ``per token`` (``recompile_flag``), and ``recompile_guard``
is the guard behind it: of the graphs' failed guards, a symbolic one (a shape-dependent branch:
``(input_ids.size()[1] % 3) != 0  # if ...``) rather than another graph's plain size mismatch.
Without a flag it is the first guard that failed with dynamic shapes on.

Those two series trace with dynamo's ``eager`` backend: recompiles are decided by dynamo's guards,
which that backend does not set (it compiles each graph it is handed), so the counts are the model's
at a fraction of the cost (inductor on this CPU: ~10 s a graph). They are not what the probe's own
compile does where its backend sets guards of its own or its stack patches torch.compile's
``dynamic`` (TorchTPU: ``dynamic=False`` for ``tpu``, so every new shape is a new graph, and past
dynamo's recompile limit the forward runs eagerly). So a third series, ``recompiles_backend``, runs
as the probe compiles (``probe_core.compile_forward``: the adapter's compile backend, the stack's
torch.compile and its dynamic setting, the static KV cache a static compile takes),
``BACKEND_TOKENS`` new tokens per length; its third length sets the flag. Where the probe's backend
is inductor with torch's automatic dynamic shapes (the CPU's, CUDA's), the ``eager`` dynamic series
stands in for it (the same guards, bar inductor's own shape specialisations; a tenth of the cost),
and the note says so. Off by default on the CPU: a tiny model costs ~10 graphs (10-25 s here).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...record import schema
from .. import probe_compile, probe_core

#: Tokens added to the verdict's prompt for the second and third lengths.
MORE_TOKENS = (3, 7)
#: New tokens per generation: a prefill and a decode step, the decode's cache grown once.
NEW_TOKENS = 2
#: The backend the check traces its two model series with (see the module docstring).
BACKEND = "eager"
#: New tokens per generation of the probe's own backend's series: a prefill and two decode steps, so
#: that a recompile at the first decode step only (a new cache length) is per length, one at every
#: step per token.
BACKEND_TOKENS = 3
#: The backend whose series the ``eager`` dynamic series stands in for, with torch's automatic
#: dynamic shapes.
STANDS_IN_FOR = "inductor"
#: The record's fields of this check.
FIELDS = (
    "recompile_lengths",
    "recompiles_static",
    "recompiles_dynamic",
    "recompile_flag",
    "recompile_guard",
    "recompiles_backend",
    "recompile_note",
)
#: How much of a guard's text is kept.
GUARD_CHARS = 500


def not_measured(why: str) -> dict:
    """The check's fields of a probe it did not run, with the reason."""
    return {**dict.fromkeys(FIELDS), "recompile_note": f"not measured: {why}"}


def why_not(record: Mapping[str, Any], settings: dict) -> str | None:
    """Why this probe's recompiles are not checked, or None."""
    if settings.get("mode") != "compile":
        return "not a compile-mode probe"
    check = settings.get("recompile_check", "auto")
    if check in (False, "off"):
        return "recompile_check=off"
    if check in ("auto", None) and record.get("device_type") == "cpu":
        return (
            "recompile_check=auto, off on the CPU (each extra length costs 10-25 s there; "
            "recompile_check=on checks)"
        )
    if record.get("status") != schema.PASS:
        return "not a PASS"
    if record.get("task") == schema.IMAGE_TEXT_TO_TEXT:
        return "image-text-to-text runs are not checked yet"
    return None


def recompile_fields(record: Mapping[str, Any], settings: dict, result: dict, adapter) -> dict:
    """The fields for ``record`` (its verdict's ``result`` holds the model, still on the device):
    measured, or why not; a check that raises is a note, never a verdict change."""
    why = why_not(record, settings)
    if why is not None:
        return not_measured(why)
    if result.get("model") is None:
        return not_measured("the verdict's model was not kept")
    try:
        return measure(
            result["model"], result["tokenizer"], result["input_ids"], settings["cache"], adapter
        )
    except Exception as exc:  # noqa: BLE001 a measurement beside the verdict
        return not_measured(f"the check raised {type(exc).__name__}: {exc}"[:2000])


class _Marks:
    """A generation streamer that notes how many recompiles dynamo had made when each put came
    (the prompt first, then each new token)."""

    def __init__(self, count):
        self.count = count
        self.at: list[int] = []

    def put(self, value) -> None:
        self.at.append(self.count())

    def end(self) -> None:
        pass


def _series(
    model, tokenizer, prompts, cache, device, dynamic: bool
) -> list[tuple[int, int, list[list[str]]]]:
    """Per prompt: (prefill recompiles, decode recompiles, the failed guards of each recompile),
    through a fresh compile of ``model.forward`` with automatic dynamic shapes ``dynamic``."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics

    # (recompiles before it, reason): one recompile's failures share the first
    failed: list[tuple[int, str]] = []

    def recompiles() -> int:
        return sum(1 for m in get_compilation_metrics() if m.recompile_reason is not None)

    torch._dynamo.reset()
    clear_compilation_metrics()
    eager = model.forward
    hook = lambda fail: failed.append((recompiles(), fail.reason))  # noqa: E731
    model.forward = torch._dynamo.optimize(BACKEND, guard_fail_fn=hook)(eager)

    out = []
    try:
        with torch._dynamo.config.patch(automatic_dynamic_shapes=dynamic, recompile_limit=64):
            for ids in prompts:
                marks, before, seen = _Marks(recompiles), recompiles(), len(failed)
                probe_core.generate(
                    model, tokenizer, ids, torch.ones_like(ids), NEW_TOKENS, device, marks, cache
                )
                first = marks.at[1] if len(marks.at) > 1 else recompiles()
                out.append((first - before, recompiles() - first, _grouped(failed[seen:])))
    finally:
        model.forward = eager
        torch._dynamo.reset()
    return out


def _grouped(failed: list[tuple[int, str]]) -> list[list[str]]:
    """The failed guards, one list per recompile (each reports the failure of every graph the
    frame held, "0/2: ..." naming the graph): grouped by the recompiles made before them."""
    groups: dict[int, list[str]] = {}
    for before, reason in failed:
        groups.setdefault(before, []).append(reason)
    return list(groups.values())


def _symbolic_first(guards: list[str]) -> str | None:
    """Of one recompile's failed guards, a symbolic one (a shape-dependent branch) rather than a
    graph's plain size or type mismatch; else the first."""
    plain = ("size mismatch", "expected type", "tensor type", "len(kwargs)")
    symbolic = [g for g in guards if not any(word in g for word in plain)]
    found = (symbolic or [g for g in guards if "size mismatch" in g] or guards)[:1]
    return found[0][:GUARD_CHARS] if found else None


def _backend_series(
    model, tokenizer, prompts, cache, device, backend
) -> list[tuple[list[int], list[list[str]]]]:
    """Per prompt: (the recompiles of the prefill, then of each decode step; the failed guards of
    each recompile), as the probe compiles (``probe_core.compile_forward`` with its backend: the
    stack's torch.compile, its dynamic setting, its cache), ``BACKEND_TOKENS`` new tokens. The
    guards come from dynamo's guard-failure hook, handed to dynamo's ``optimize`` as the stack's
    torch.compile calls it; dynamo's recompile limit is raised while it runs, so every recompile
    is counted (``probe_core.compile_counts`` says whether the verdict's own generation passed
    it)."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics

    failed: list[tuple[int, str]] = []

    def recompiles() -> int:
        return sum(1 for m in get_compilation_metrics() if m.recompile_reason is not None)

    optimize = torch._dynamo.optimize

    def hooked(*args, **kwargs):
        return optimize(
            *args, guard_fail_fn=lambda fail: failed.append((recompiles(), fail.reason)), **kwargs
        )

    clear_compilation_metrics()
    torch._dynamo.optimize = hooked
    try:
        eager = probe_core.compile_forward(model, backend)
    finally:
        torch._dynamo.optimize = optimize
    out = []
    try:
        with torch._dynamo.config.patch(recompile_limit=64):
            for ids in prompts:
                marks, before, seen = _Marks(recompiles), recompiles(), len(failed)
                mask = torch.ones_like(ids)
                probe_core.generate(
                    model, tokenizer, ids, mask, BACKEND_TOKENS, device, marks, cache
                )
                at = [*marks.at[1:], recompiles()]  # after the prefill, after each decode step
                steps = [b - a for a, b in zip([before, *at], at)][:BACKEND_TOKENS]
                out.append((steps, _grouped(failed[seen:])))
    finally:
        model.forward = eager
        torch._dynamo.reset()
    return out


def _flags(prefill: int, decode: list[int]) -> list[str]:
    """``per length`` (the prefill recompiled, or the decode's first step only: a new cache
    length) and/or ``per token`` (every decode step recompiled) of one length's recompiles."""
    flags = []
    if prefill or (decode and decode[0] and not all(decode)):
        flags.append("per length")
    if len(decode) > 1 and all(decode):
        flags.append("per token")
    return flags


def measure(model, tokenizer, prompt_ids: list[int], cache: str, adapter) -> dict:
    """The check's fields, measured on ``adapter``'s device with the verdict's ``model`` and
    prompt."""
    import torch

    lengths = [len(prompt_ids), *(len(prompt_ids) + more for more in MORE_TOKENS)]
    longest = (prompt_ids * (lengths[-1] // max(1, len(prompt_ids)) + 1))[: lengths[-1]]
    prompts = [torch.tensor([longest[:n]], dtype=torch.long) for n in lengths]
    device = adapter.torch_device
    static = _series(model, tokenizer, prompts, cache, device, dynamic=False)
    dynamic = _series(model, tokenizer, prompts, cache, device, dynamic=True)
    backend = adapter.compile_backend()
    dynamic_setting = probe_compile.compile_dynamic(backend)
    if backend == STANDS_IN_FOR and dynamic_setting is None:
        prefill, decode, groups = dynamic[-1]
        flags = [word for word, count in (("per length", prefill), ("per token", decode)) if count]
        on_backend = [p + d for p, d, _ in dynamic]
        how = (
            f"the probe's {backend} backend with automatic dynamic shapes: the {BACKEND} "
            "backend's dynamic series stands in for it (the same guards, bar inductor's own "
            "shape specialisations)"
        )
    else:
        own = _backend_series(model, tokenizer, prompts, cache, device, backend)
        steps, groups = own[-1]
        flags = _flags(steps[0], steps[1:])
        on_backend = [sum(each) for each, _ in own]
        kv = probe_core.compile_settings(model, backend, cache)["compile_cache"]
        how = (
            f"{BACKEND_TOKENS} new tokens per length on the probe's own {backend} backend (dynamic="
            f"{dynamic_setting}, as this stack's torch.compile sets it; {kv} KV cache)"
        )
    if flags:
        guard = _symbolic_first(groups[0] if groups else [])
    else:
        every = [g for _, _, run in (*dynamic, *static) for group in run for g in group[:1]]
        guard = every[0][:GUARD_CHARS] if every else None
    return {
        "recompile_lengths": lengths,
        "recompiles_static": [p + d for p, d, _ in static],
        "recompiles_dynamic": [p + d for p, d, _ in dynamic],
        "recompile_flag": ", ".join(flags) or None,
        "recompile_guard": guard,
        "recompiles_backend": on_backend,
        "recompile_note": (
            f"{NEW_TOKENS} new tokens from each prompt length, automatic dynamic shapes off "
            f"then on, dynamo's guards traced with the {BACKEND} backend; recompiles as the "
            f"probe compiles: {how}; the third length "
            + ("recompiled: " + " and ".join(flags) if flags else "compiled nothing")
        ),
    }
