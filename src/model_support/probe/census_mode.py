"""The census's dispatch mode: the operators that reach a device, counted as they run (``census``'s
docstring).

Apart from ``census`` so that the light part (its settings, fields and the runner's reading of them)
imports no torch: the sweep's runner imports that; only the probe's kernel and the localiser import
this.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from .census import (
    ALIKE_STEPS,
    CPU_STAGES,
    DEVICE_CLOCK,
    EXTRAPOLATED,
    HOST_CLOCK,
    TIMED_STAGES,
    composite_on,
    decompose_through,
    dispatch_key,
    dtype_signature,
    names_device,
    not_timed,
)


class _Following:
    """A generation's token streamer (``probe_core.StepTimer``) that tells its census of each
    token first (``Census.following``); everything else is the streamer's own (``times``)."""

    def __init__(self, counted, timer):
        self._counted, self._timer = counted, timer

    def put(self, value) -> None:
        self._counted.token()
        self._timer.put(value)

    def end(self) -> None:
        self._counted.tokens_end()
        self._timer.end()

    def __getattr__(self, name: str):
        return getattr(self._timer, name)

    # the streamer's settings (its device clock) are the streamer's
    def __setattr__(self, name: str, value) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._timer, name, value)


class Census(TorchDispatchMode):
    """A census of the operators that reach ``device_type`` (``census``'s docstring says what it
    counts): hold it (``with``) over the stages, pass its ``enter`` as their ``on_stage`` hook,
    read ``fields(source)``. ``timed``: also the seconds each operator's calls take in the
    generation (``TIMED_STAGES``), on the host clock, or on ``clock`` (the device's own,
    ``Adapter.perf_clock``): only true where a call returns once its work is done (the adapter's
    ``synchronous_ops``). Sampled: hand the generation its ``following(timer)``."""

    def __init__(self, device_type: str, timed: bool = False, clock=None):
        super().__init__()
        self.device_type = device_type
        self.timed = timed
        self.clock = clock or time.perf_counter
        self.time_source = DEVICE_CLOCK if clock else HOST_CLOCK
        # (name, input dtypes, output dtype) -> [calls, min rank, max rank, seconds in the timed
        # stages]
        self.sigs: dict[tuple, list] = {}
        self.key = dispatch_key(device_type)
        self.on_cpu = device_type == "cpu"
        self.stage: str | None = None
        self.recording = not self.on_cpu
        self.active = False  # on torch's dispatch stack
        # name -> [first stage, calls], in the order of first call
        self.seen: dict[str, list[Any]] = {}
        # sampling (``following``): tokens streamed so far (the prompt's first), the token to step
        # back on at (the generation's last), each signature's (calls, seconds) at the last token,
        # the last decode step's calls and seconds per signature, the steps run off the stack not
        # yet added, and those added
        self.tokens = 0
        self.last_token: int | None = None  # the streamer's token at which the census steps back on
        self.mark: dict[tuple, tuple] | None = None
        self.step: dict[tuple, tuple] | None = None
        self.out, self.sampled, self.skipped, self.extrapolated, self.stepped = (
            False,
            False,
            0,
            0,
            False,
        )
        self.steps_alike = 0  # decode steps in a row alike, the last counted among them

    # Held with ``with``, the mode goes onto torch's dispatch stack only once a stage it counts
    # begins (on the CPU the generation: the weights' loading then pays nothing), and comes off at
    # the end of the block.
    def __enter__(self):
        self.active = False
        return self

    def __exit__(self, *exc):
        if self.active:
            self.active = False
            TorchDispatchMode.__exit__(self, *exc)
        self.out = False

    def following(self, timer, max_new_tokens: int | None = None):
        """``timer`` (the verdict's generation's streamer), telling this census of each token: it
        then counts the decode steps until ``ALIKE_STEPS`` in a row are alike and extrapolates
        the rest (sampled, see the module docstring); ``max_new_tokens``: it steps back on at the
        last one."""
        self.sampled = True
        self.last_token = max_new_tokens + 1 if max_new_tokens else None  # the prompt is the first
        return _Following(self, timer)

    def token(self) -> None:
        """A token was streamed (the prompt's first, then each new one): a decode step ended."""
        self.tokens += 1
        if self.out:
            self.skipped += 1
            if self.last_token is not None and self.tokens >= self.last_token:
                self._step_on()
            return
        if not self.sampled or not self.active or self.stage not in TIMED_STAGES:
            return
        mark = {key: (sig[0], sig[3]) for key, sig in self.sigs.items()}
        # the prefill's token was the second: a decode step
        if self.mark is not None and self.tokens >= 3:
            step = {
                key: (
                    calls - self.mark.get(key, (0, 0.0))[0],
                    seconds - self.mark.get(key, (0, 0.0))[1],
                )
                for key, (calls, seconds) in mark.items()
                if calls != self.mark.get(key, (0, 0.0))[0]
            }
            alike = self.step is not None and _calls(step) == _calls(self.step)
            self.step = step
            if alike and self.steps_alike + 1 >= ALIKE_STEPS:
                self._step_off()
            self.steps_alike = self.steps_alike + 1 if alike else 1
        self.mark = mark

    def tokens_end(self) -> None:
        """The generation ended: back on the stack for what follows (its logits read back), the
        rest added."""
        if self.out:
            self._step_on()
        # one generation sampled: any other (fused mode's eager rerun) counted whole
        self.sampled = False

    def _step_off(self) -> None:
        if self.last_token is not None and self.tokens >= self.last_token:
            return  # that was the last token: nothing left to skip
        # another mode above it: it cannot come off alone
        if _get_current_dispatch_mode() is not self:
            return
        TorchDispatchMode.__exit__(self, None, None, None)
        self.active, self.out, self.stepped = False, True, True

    def _step_on(self) -> None:
        self._settle()
        self.out = False
        if self.recording and not self.active:
            self.active = True
            TorchDispatchMode.__enter__(self)

    def _settle(self) -> None:
        """The decode steps run off the stack, added as copies of the last one counted."""
        if not self.skipped or self.step is None:
            return
        n, self.skipped = self.skipped, 0
        self.extrapolated += n
        for key, (calls, seconds) in self.step.items():
            sig = self.sigs[key]
            sig[0] += n * calls
            sig[3] += n * seconds
            self.seen[key[0]][1] += n * calls

    def note(self, text: str) -> str:
        """``text`` (``ops_time_source``), with ``EXTRAPOLATED`` where this census stepped off
        the stack."""
        self._settle()
        return f"{text}; {EXTRAPOLATED}" if self.stepped else text

    def not_timed(self, why: str) -> dict:
        """``not_timed(why)``, saying what was extrapolated (a run that failed after its census
        stepped off)."""
        fields = not_timed(why)
        return {**fields, "ops_time_source": self.note(fields["ops_time_source"])}

    def enter(self, stage: str) -> None:
        self.stage = stage
        if self.on_cpu:
            self.recording = stage in CPU_STAGES
        if self.recording and not self.active:
            self.active = True
            TorchDispatchMode.__enter__(self)

    def _reaches_device(self, args, kwargs) -> bool:
        return self.on_cpu or self._names_device(args) or self._names_device(kwargs)

    def _names_device(self, tree) -> bool:
        return names_device(tree, self.device_type)

    def _composite(self, func) -> bool:
        return composite_on(func, self.key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.recording or not self._reaches_device(args, kwargs):
            return func(*args, **kwargs)
        if self._composite(func):
            # its parts come back through the census
            out = decompose_through(self, func, args, kwargs)
            if out is not NotImplemented:
                return out
        name = func.name()  # aten::add.Tensor; aten::rsqrt for the default overload
        entry = self.seen.get(name)
        if entry is None:
            self.seen[name] = [self.stage, 1]
        else:
            entry[1] += 1
        dtypes, rank = _inputs(args, kwargs)
        named = kwargs.get("dtype")
        timing = self.timed and self.stage in TIMED_STAGES
        began = self.clock() if timing else 0.0
        out: Any = None
        try:
            out = func(*args, **kwargs)
        finally:
            # a factory: the dtype and rank of what it made
            if rank < 0 and isinstance(out, torch.Tensor):
                named, rank = out.dtype if named is None else named, out.dim()
            sig = self.sigs.get((name, dtypes, named))
            if sig is None:
                sig = self.sigs[(name, dtypes, named)] = [0, rank, rank, 0.0]
            sig[0] += 1
            if rank >= 0:
                if rank < sig[1] or sig[1] < 0:
                    sig[1] = rank
                if rank > sig[2]:
                    sig[2] = rank
            if timing:
                sig[3] += self.clock() - began
        return out

    def fields(self, source: str) -> dict:
        """The record's census: ``ops`` in the order of first call, the stage of each first call,
        the calls of each, and where it came from."""
        self._settle()
        sigs = list(self.sigs.items())
        return {
            "ops": list(self.seen),
            "ops_stages": [stage or "load" for stage, _ in self.seen.values()],
            "ops_calls": [calls for _, calls in self.seen.values()],
            "ops_source": source,
            "ops_sig_ops": [name for (name, _, _), _ in sigs],
            "ops_sig_dtypes": [dtype_signature(dtypes, out) for (_, dtypes, out), _ in sigs],
            "ops_sig_calls": [entry[0] for _, entry in sigs],
            "ops_sig_min_rank": [entry[1] if entry[1] >= 0 else None for _, entry in sigs],
            "ops_sig_max_rank": [entry[2] if entry[2] >= 0 else None for _, entry in sigs],
        }

    def times(self) -> dict:
        """``ops_device_s`` (each census operator's seconds in the generation, in ``ops`` order) and
        ``ops_time_source``; null, saying why, for a census not timed (an asynchronous device)."""
        if not self.timed:
            return self.not_timed(
                f"{self.device_type} queues its operators asynchronously (no profiler read)"
            )
        self._settle()
        per_op = dict.fromkeys(self.seen, 0.0)
        for (name, _, _), entry in self.sigs.items():
            per_op[name] += entry[3]
        return {
            "ops_device_s": list(per_op.values()),
            "ops_sig_device_s": [entry[3] for entry in self.sigs.values()],
            "ops_time_source": self.note(self.time_source),
        }


def _calls(step: dict) -> dict:
    return {key: calls for key, (calls, _) in step.items()}


def _inputs(args, kwargs) -> tuple[tuple, int]:
    """The dtypes of a call's tensor arguments in order (a list of tensors as the tuple of its
    distinct dtypes) and their highest rank (-1: no tensor): hand-walked, one level deep, as
    operators take them (cheap)."""
    dtypes: list = []
    rank = -1
    for arg in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(arg, torch.Tensor):
            dtypes.append(arg.dtype)
            if arg.dim() > rank:
                rank = arg.dim()
        elif (type(arg) is list or type(arg) is tuple) and arg:
            inner = []
            for item in arg:
                if isinstance(item, torch.Tensor):
                    if item.dtype not in inner:
                        inner.append(item.dtype)
                    if item.dim() > rank:
                        rank = item.dim()
            if inner:
                dtypes.append(tuple(inner))
    return tuple(dtypes), rank
