"""Compiled runs read through the adapter's profiler: per-operator time and host syncs where no
dispatch mode sees.

Why: the census, its timing and the flight recorder are dispatch modes, and torch.compile traces the
forward with its own dispatch machinery, so in the compile modes (the TPU's normal path) they see
nothing. A stack whose adapter offers a profiler for compiled runs (``Adapter.profiler_activities``:
torch.profiler's CPU and CUDA activities on CUDA, its CPU activity on the CPU; none elsewhere, whose
rows read "not measured") has the verdict's generation run under torch.profiler, from the prompt's
arrival at the step timer to the generation's end (the timer starts and stops it: not the load, not
the eager comparison after it), cheaply (no stacks, no shapes, no memory). Afterwards it reads:

- **per-operator time** (``profiled_ops``, ``profiled_ops_calls``, ``profiled_ops_s``): each aten
  operator event's self time (self device time where a device activity is recorded, self CPU time on
  the CPU), under the profiler's names (no overload). Inductor fuses operators into kernels: what
  the profiler sees is the aten calls that remain plus the compiled graphs, whose own kernels are
  counted as their graph's region (``Torch-Compiled Region: 0/1``, frame 0, its second compilation).
  Events inside the compiler (dynamo's ``(dynamo_timed)`` ranges: a recompile for the decode's
  shapes) are left out. These are no census (``ops``, its coverage and the porting plan stay
  eager's): ``ops_device_s`` stays null and ``ops_time_source`` says where the times are.
- **host syncs per decode token**: ``aten::_local_scalar_dense`` calls (``.item()``, ``bool()`` of a
  tensor) and, with a device activity, copies to the host (a ``Memcpy DtoH`` kernel) outside one,
  between the marks the step timer writes as each token arrives: per decode token, the prefill
  apart, as ``host_cost`` counts them. The probe's own syncs are the harness's: those inside its
  timer's device sync, and the copy to the host just before a token's mark (the token transformers
  copies for the streamer). CPU fallbacks a profiler does not tell: null. On the CPU, the host
  itself, the count is of the calls that would sync a device (the note says so).

The flight recorder stays "not measured" in the compile modes: a profiler's data dies with a crashed
process.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

from .. import probe_core
from . import host_cost

#: The record's per-operator fields of a profiled compiled run (parallel lists, first call first).
FIELDS = ("profiled_ops", "profiled_ops_calls", "profiled_ops_s")
#: ``ops_time_source`` of a profiled compiled run.
SOURCE = (
    "torch.profiler (compiled: fused kernels counted as their graph; per operator in profiled_ops)"
)
#: The marks the step timer writes into the trace: a token's arrival, the probe's own device sync.
TOKEN, HARNESS = "model_support::token", "model_support::harness"
#: What a sync to the host is in a trace: the scalar read every ``.item()`` ends in, a
#: device-to-host copy's kernel.
SCALAR, COPY_TO_HOST = "aten::_local_scalar_dense", "Memcpy DtoH"
#: A compiled graph's region (dynamo's frame/compilation), inductor's call of its graph, the
#: compiler's own ranges.
REGION, GRAPH_CALL, COMPILING = "Torch-Compiled Region", "## Call CompiledFxGraph", "(dynamo_timed)"
_OPERATORS = ("aten::", "prims::")


def not_profiled(why: str) -> dict:
    """The per-operator fields of a compiled run nobody profiled, with the reason."""
    return {
        **dict.fromkeys(FIELDS),
        "ops_device_s": None,
        "ops_sig_device_s": None,
        "ops_time_source": why,
    }


def profiler_for(adapter, mode: str, counted: bool) -> tuple[Profiled | None, str | None]:
    """(a profiler for the verdict's generation, None) or (None, why none): only in compile mode
    (the eager modes have their census), only where the adapter offers a profiler, only where the
    backend's own counters do not count the host cost already (``counted``: they hold the step
    timer)."""
    if mode != "compile":
        return None, f"not a compiled run ({mode})"
    activities = tuple(adapter.profiler_activities)
    if not activities:
        return None, f"the {adapter.type} adapter offers no profiler for compiled runs"
    if counted:
        return (
            None,
            f"the {adapter.type} backend's own counters hold the step timer (no profiler read)",
        )
    return Profiled(activities, adapter.type), None


def activities(names) -> list:
    """torch.profiler's activities for the names an adapter offers
    (``Adapter.profiler_activities``: ``cpu``, ``cuda``, torch.profiler's own names, looked up on
    ``ProfilerActivity``): no backend is named here. Also what the perf phase's trace
    (``performance``) profiles with."""
    from torch.profiler import ProfilerActivity

    return [getattr(ProfilerActivity, name.upper()) for name in names]


class Profiled:
    """torch.profiler over one generation, started and stopped by the step timer it makes
    (``timer``); held with ``with`` so that a generation that raised stops it too."""

    def __init__(self, activities: tuple[str, ...], device_type: str):
        self.activities, self.device_type = activities, device_type
        # a device activity: device times, device copies
        self.device = any(a != "cpu" for a in activities)
        self.profile: Any = None
        self.events: list | None = None

    def __enter__(self) -> Profiled:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def timer(self, synchronize: Callable[[], None] | None) -> probe_core.StepTimer:
        """The step timer for the verdict's generation: starts the profiler, marks each token,
        stops at the end."""
        return _Timer(self, synchronize)

    def start(self) -> None:
        from torch.profiler import profile

        # no shapes, stacks or memory
        self.profile = profile(activities=activities(self.activities))
        self.profile.start()

    def stop(self) -> None:
        if self.profile is not None and self.events is None:
            self.profile.stop()
            self.events = self._kept(self.profile.events())
            self.profile = None

    def _kept(self, events) -> list:
        """The host-side events outside the compiler, in time order (a device's kernels hang on
        their launches)."""
        from torch.autograd import DeviceType

        host = sorted(
            (e for e in events if e.device_type == DeviceType.CPU), key=lambda e: e.time_range.start
        )
        compiling: list[tuple[float, float]] = []
        for e in host:
            if e.name.endswith(COMPILING) and not (
                compiling and e.time_range.start < compiling[-1][1]
            ):
                compiling.append((e.time_range.start, e.time_range.end))
        starts = [s for s, _ in compiling]

        def compiler(e) -> bool:
            i = bisect.bisect_right(starts, e.time_range.start) - 1
            return i >= 0 and e.time_range.start < compiling[i][1]

        return [e for e in host if not compiler(e)]

    def ops_fields(self) -> dict:
        """``profiled_ops`` (first call first), their calls and seconds, with
        ``ops_time_source``; why not when the generation was not profiled to its end."""
        if self.events is None:
            return not_profiled("not measured: the profiled generation did not finish")
        calls: dict[str, int] = {}
        seconds: dict[str, float] = {}
        for e in self.events:
            if _inside(e, HARNESS):
                continue
            owner = _owner(e)
            if owner is None:
                continue
            # a graph call's time is its region's
            calls[owner] = calls.get(owner, 0) + (owner == e.name)
            own = e.self_device_time_total if self.device else e.self_cpu_time_total
            seconds[owner] = seconds.get(owner, 0.0) + own / 1e6
        ops = [op for op in calls if calls[op]]
        return {
            "profiled_ops": ops,
            "profiled_ops_calls": [calls[op] for op in ops],
            "profiled_ops_s": [seconds.get(op, 0.0) for op in ops],
            "ops_device_s": None,
            "ops_sig_device_s": None,
            "ops_time_source": SOURCE,
        }

    def host_fields(self) -> dict:
        """The host-cost fields (``host_cost.FIELDS``) per decode token from the trace's token
        marks."""
        if self.events is None:
            return host_cost.not_measured("the profiled generation did not finish")
        marks = [e.time_range.start for e in self.events if e.name == TOKEN]
        if len(marks) < 3:  # the prompt's, the first token's, one decode token's
            return host_cost.not_measured("fewer than two new tokens: no decode step to count")
        syncs = [e for e in self.events if self._sync(e)]
        run, harness = [0] * len(marks), [0] * len(marks)  # syncs after each mark, up to the next
        last: dict[int, Any] = {}  # the last sync before each mark: a copy there is the streamer's
        for e in syncs:
            i = bisect.bisect_right(marks, e.time_range.start) - 1
            if i < 0:
                continue
            last[i + 1] = e
            if _inside(e, HARNESS):
                harness[i] += 1
            else:
                run[i] += 1
        for mark, e in last.items():
            if 1 <= mark < len(marks) and e.name != SCALAR and not _inside(e, HARNESS):
                run[mark - 1] -= 1
                harness[mark - 1] += 1
        steps = len(marks) - 2
        what = "aten::_local_scalar_dense calls" + (
            " and copies to the host (Memcpy DtoH)" if self.device else ""
        )
        host = (
            ""
            if self.device
            else "; the CPU is the host: these are the calls that would sync a device"
        )
        return {
            **dict.fromkeys(host_cost.FIELDS),
            "host_syncs_per_token": sum(run[1:-1]) / steps,
            "harness_syncs_per_token": sum(harness[1:-1]) / steps,
            "prefill_host_syncs": run[0],
            "host_cost_note": f"counted by torch.profiler in the compiled run over {steps} decode tokens: "
            f"{what}, the probe's own syncs apart; CPU fallbacks not counted (a profiler does "
            f"not tell them){host}",
        }

    def _sync(self, e) -> bool:
        if e.name == SCALAR:
            return True
        return (
            self.device
            and any(k.name.startswith(COPY_TO_HOST) for k in e.kernels)
            and not _inside(e.cpu_parent, SCALAR)
        )


class _Timer(probe_core.StepTimer):
    """``StepTimer`` that profiles the generation: started at the prompt, a mark at each token,
    stopped at the end."""

    def __init__(self, profiled: Profiled, synchronize: Callable[[], None] | None):
        def wait() -> None:
            from torch.profiler import record_function

            with record_function(HARNESS):
                synchronize()  # type: ignore[misc]  # only made when there is one

        super().__init__(wait if synchronize else None)
        self.profiled = profiled

    def put(self, value):
        from torch.profiler import record_function

        if self.profiled.profile is None and self.profiled.events is None:
            self.profiled.start()
        with record_function(TOKEN):
            pass
        super().put(value)

    def end(self):
        self.profiled.stop()
        super().end()


def _inside(e, name: str) -> bool:
    """Whether event ``e`` or one of its parents is named ``name``."""
    while e is not None:
        if e.name == name:
            return True
        e = e.cpu_parent
    return False


def _owner(e) -> str | None:
    """Whose time event ``e``'s self time is: the innermost operator or compiled region it runs
    in (a compiled graph's call is its region's), or None (the harness's Python)."""
    while e is not None:
        name = e.name
        if name.startswith(_OPERATORS) or name.startswith(REGION):
            return name
        if name.startswith(GRAPH_CALL):
            region = e.cpu_parent
            while region is not None and not region.name.startswith(REGION):
                region = region.cpu_parent
            return region.name if region is not None else "compiled graph"
        e = e.cpu_parent
    return None
