"""The localiser's dispatch mode: every operator that reaches the device replayed on the CPU from
the device's own inputs and judged (``localise``'s module docstring). Apart from ``localise`` so
that importing that imports no torch.
"""

from __future__ import annotations

import contextlib

from ..probe.census_mode import Census
from . import op_check
from .findings import MAX_LISTED, Localised, cannot_run
from .tracer import ROOT_LABEL


class OperatorCheckMode(Census):
    """The localiser's dispatch mode over one forward, or a replayed run (``localise``'s module
    docstring): ``tracer`` is its ``ModuleTracer``, whose stack names the module each operator
    runs in and whose root calls count the steps."""

    def __init__(self, device_type: str, tracer):
        super().__init__(device_type)
        self.tracer = tracer
        self.found = Localised(device_type=device_type)
        self.hushed = 0
        self.check_from = 0  # the steps before it run unchecked (``Replay.check_from``)
        # a replayed run (``localise_run``): each operator named with its step
        self.replaying = False
        self.step_starts: dict[int, int] = {}  # step -> the index of its first operator

    def __enter__(self):
        super().__enter__()
        self.enter("forward")  # the census's own switch: on the dispatch stack from here
        return self

    @contextlib.contextmanager
    def quiet(self):
        """The localiser's own operators on the device (forcing a token, the stop flag): run,
        never judged."""
        self.hushed += 1
        try:
            yield
        finally:
            self.hushed -= 1

    def _module(self) -> tuple[str, str | None]:
        if not self.tracer.stack:
            return "(outside the model)", None
        top = self.tracer.stack[-1]
        return top["name"] or ROOT_LABEL, type(top["module"]).__name__

    def current_step(self) -> int:
        """The step an operator runs in: the forwards begun before it, less one (the generation's
        own operators after a forward are that step's; those before the first, the prompt's)."""
        return max(self.tracer.root_calls - 1, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.hushed or (self.check_from and self.current_step() < self.check_from):
            return func(*args, **kwargs)
        if self._composite(func) or not self._reaches_device(args, kwargs):
            # decomposed: its parts come back here
            return super().__torch_dispatch__(func, types, args, kwargs)
        name = func._schema.name
        if name in op_check.NOT_REPLAYED:
            return super().__torch_dispatch__(func, types, args, kwargs)
        self.step_starts.setdefault(self.current_step(), self.found.checked + self.found.not_judged)
        # in place (a cache update): its inputs kept before it writes them
        writes = func._schema.is_mutable
        encoded = op_check.encode((args, kwargs), self.device_type, copy=writes)
        # the census counts it, the device runs it
        out = super().__torch_dispatch__(func, types, args, kwargs)
        on_device = op_check.to_cpu(out)
        try:
            cpu_args, cpu_kwargs = op_check.place(encoded, fresh=writes)
            reference = op_check.replay(func, cpu_args, cpu_kwargs, on_device)
        except Exception as exc:  # noqa: BLE001 the CPU cannot run it (no kernel, a dtype it lacks): not judged
            self._not_judged(func, encoded, exc)
            return out
        self.found.checked += 1
        judged = op_check.judge(on_device, reference, name)
        if judged["not_judged"] and name not in self.found.outputs_not_judged:
            self.found.outputs_not_judged[name] = {
                "outputs": list(judged["not_judged"]),
                "reason": op_check.unjudged_outputs(judged["not_judged"]),
            }
        if judged["wrong"]:
            # the first one's inputs for its repro: copies of its own (an input on the CPU may
            # change later)
            kept = (
                encoded
                if writes or self.found.wrong
                else op_check.encode((args, kwargs), self.device_type)
            )
            self._flag(func, kept, judged)
        return out

    def _entry(self, func) -> dict:
        """What names an operator in the finding: itself, its module, its place among the
        operators run (in the whole run, ``index``, and in its step's forward, ``step_index``),
        its step."""
        module, module_class = self._module()
        index = self.found.checked + self.found.not_judged - 1
        entry = {
            "operator": func._schema.name,
            "overload": func._overloadname,
            "module": module,
            "module_class": module_class,
            "index": index,
        }
        if self.replaying:
            step = self.current_step()
            entry.update(step=step, step_index=index - self.step_starts.get(step, 0))
        return entry

    def _flag(self, func, encoded, judged: dict) -> None:
        self.found.flagged += 1
        if len(self.found.wrong) >= MAX_LISTED:
            return
        shapes, dtypes = op_check.describe(encoded)
        self.found.wrong.append(
            {
                **self._entry(func),
                "shapes": shapes,
                "dtypes": dtypes,
                **{
                    k: judged[k]
                    for k in ("max_abs_error", "max_rel_error", "rms_rel_error", "reason")
                },
                "not_judged_before": self.found.not_judged,
            }
        )
        if self.found.first_inputs is None:
            self.found.first_inputs = encoded

    def _not_judged(self, func, encoded, exc: Exception) -> None:
        """An operator the CPU could not replay: listed with why, so that it never counts as
        agreeing."""
        self.found.not_judged += 1
        if len(self.found.unjudged) >= MAX_LISTED:
            return
        shapes, dtypes = op_check.describe(encoded)
        entry = {**self._entry(func), "shapes": shapes, "dtypes": dtypes, "reason": cannot_run(exc)}
        self.found.unjudged.append(entry)
