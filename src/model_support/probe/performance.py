"""How fast a PASS runs on its device: the perf phase, sized by what it measures, after the
verdict's generation.

Why: the verdict's generation times 8 tokens once, compilation included; a team porting a stack asks
how fast a model decodes in steady state and whether that moved. A nightly over thousands of models
pays for every token of it in device hours, so the phase costs the device what its answers need and
no more:

- **The verdict's generation gives TPOT.** In eager and fused modes the verdict ran the very code
  the repeats run, timed per token after a device sync, on the device's own clock too
  (``StepTimer.device_clock``): it is the phase's warm-up (its first token is ``perf_first_call_s``,
  the first call) and, on a device with a clock of its own, its decode steps, the first left out
  (the decode shape's first call), are TPOT's samples (``verdict_steps``). On the host's clock (the
  CPU, a device without one) its steps carry the instruments and the host's noise, and in compile
  mode the forward is compiled again: there a warm-up generation of the phase's own runs first
  (outside the budget) and the repeats give TPOT's steps themselves, each one's median step a
  sample.
- **The repeats give a warm TTFT**: ``perf_tokens`` (1) greedy tokens from the probe's own prompt,
  or where the verdict gives no TPOT at least ``OWN_TPOT_TOKENS`` (4; ``CPU_TPOT_TOKENS``, 16, on
  the CPU: ``repeat_tokens``), timed per token after a device sync: TTFT (the prompt's prefill and
  first token, which the verdict only ran cold), each further token one more TPOT step, and tokens/s
  (over the repeat; with repeats of one token over the verdict's length, a warm TTFT and the
  verdict's TPOT for each token after it: derived, so the gate judges its TTFT and TPOT instead,
  ``tokens_per_s``). The length is a setting, never chosen from timings, so two sweeps stay like
  with like (``analysis.decision.LIKE``).
- **As many as the figures need** (``Plan``): two always (a TTFT of one repeat has no noise to be
  compared by: a gate cannot tell a regression from noise on it); then until TPOT's spread, (max -
  min) / median over all its samples, is within ``perf_spread`` (5%; or a repeat adds no sample), or
  the next repeat (priced as the last) would take the phase past ``perf_budget`` (a quarter) of the
  probe's device time before it (its device phase; on the CPU, where the host is the device, the
  whole probe so far: ``budget``) once TPOT has three samples, or ``perf_repeats`` (10) ran; and
  never past half the time the probe has left before its ``timeout_s``. ``perf_repeats_run`` and
  ``perf_stop`` say how many and why; ``perf_device_s`` is the phase's device time (``probe.phases``
  counts it as the device's work, ``part("perf")``).

Measured (bench/results/perf_cost.json): on 8 tiny models over 2 modelled devices
(bench_perf_cost.py) whose every matrix product takes 250 ms (a decode-bound device), the sweep with
the phase on against ``perf: off``; before this sizing (a 32-token warm-up and 3 repeats of 32
tokens) the phase was ~16 times the verdict's decode work. End of sequence is suppressed
(``min_new_tokens``) so every repeat decodes as many tokens. The model bandwidth utilisation (MBU)
is the bytes a decode step reads (the parameters, only the active experts' share of a mixture of
experts, plus the KV cache at the mean position) over TPOT, against the peak bandwidth the device
adapter declares (``peak_bandwidth_gbs``; none on the CPU).

With ``perf_trace`` on, one more generation after the timed repeats (so the profiler slows none of
them) runs under torch.profiler with the activities the adapter offers
(``Adapter.profiler_activities``, as the compiled runs' ``instruments.profiled``); its Chrome trace
(Perfetto opens it), gzipped, is kept beside the record and named by ``perf_trace_path``. A stack
whose adapter offers no profiler keeps none, and the note says so.

A measurement that cannot run, or raises, is a note (``perf_note``), never a verdict change; so is a
trace that could not be kept. The fields are the record's group ``perf`` (``record.schema``).
"""

from __future__ import annotations

import functools
import gc
import gzip
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..fileio import atomic_write_bytes
from ..record import schema, store
from . import phases, probe_core
from .instruments import profiled

#: The record's performance fields (group ``perf``), null unless measured.
FIELDS = schema.names_in("perf")
#: The host's clock (seconds; ``time.perf_counter``, as the probe's ``started``): the phase's
#: budget, deadline and device seconds, and its repeats where the device has no clock of its own.
#: Read at each call, so a test sets a fake one (``monkeypatch.setattr(performance, "host_clock",
#: clock)``) and asserts exact repeats, not a sleep's.
host_clock: Callable[[], float] = time.perf_counter


def spread(values: list[float]) -> float | None:
    """(max - min) / median of repeated measurements, over every one: how far apart the repeats
    were, relative; None where none can be said (no values, one that is no number, a median of 0
    or less).

    Over every one, none left out: a phase stopped on a spread that leaves out the farthest
    repeat (tried, from four samples and from six, with the budget waiting for as many) leaves
    the gate repeats chosen for agreeing, or more repeats than its noise estimate can read
    honestly. Two reviews' simulations (31 noise models, the same draws for each rule) found
    noise read as slower 2-3 times as often where the budget bought more than four (from four),
    and up to 1.8 times as often under a level shift inside a phase, with a slowdown caught half
    as often under two wild repeats (from six): docs/design.md."""
    if not values or not all(math.isfinite(v) for v in values):
        return None
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else None


def not_measured(why: str) -> dict:
    """The perf fields of a probe whose performance was not measured, with the reason."""
    return {**dict.fromkeys(FIELDS), "perf_note": f"not measured: {why}"}


def wanted(settings: dict, device_type: str | None) -> str | None:
    """Why the perf phase is off for these settings on ``device_type``, or None: ``perf`` off (or
    false), or auto on the CPU: the CPU is not the stack being ported, and the smoke sweep and CI
    pay for every CPU second (the phase there: 6-94% of a warm probe, bench/results/perf.json;
    ``perf=on`` times it)."""
    perf = settings.get("perf", "auto")
    if perf in (False, "off"):
        return "perf=off"
    if perf in ("auto", None) and device_type == "cpu":
        return (
            "perf=auto, off on the CPU (not the stack being ported, and every CPU second is paid "
            "for; perf=on times it)"
        )
    return None


def why_not(record: Mapping[str, Any], settings: dict) -> str | None:
    """Why this probe's performance is not measured, or None: switched off (``wanted``), not a
    PASS, an image-text-to-text model (its image inputs are not kept past the verdict's
    generation)."""
    off = wanted(settings, record.get("device_type"))
    if off is not None:
        return off
    if settings.get("host_ops"):
        return "a what-if run (host_ops): its timings would time the host's copies, not the stack"
    if record.get("status") != schema.PASS:
        return "not a PASS"
    if (record.get("devices_used") or 1) > 1:
        return "runs over several devices are not timed by the perf phase yet"
    if record.get("task") == schema.IMAGE_TEXT_TO_TEXT:
        return "image-text-to-text runs are not timed by the perf phase yet"
    return None


def _one_run(
    model, tokenizer, ids, mask, options: dict, device, synchronize, clock
) -> tuple[float, list[float]]:
    """One greedy generation as ``generate_options`` says: (start, each token's time after a
    device sync), on ``clock`` (the adapter's own, else the host's wall clock)."""
    import torch

    timer = probe_core.StepTimer(synchronize, clock)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if synchronize:
        synchronize()
    start = clock()
    with torch.inference_mode():
        model.generate(
            input_ids=ids.to(device),  # as the verdict's generation: moved inside inference mode
            attention_mask=mask.to(device),
            do_sample=False,
            pad_token_id=pad,
            streamer=timer,
            **options,
        )
    return start, timer.times


def decode_bytes_per_token(model, context: float) -> tuple[int, str]:
    """Bytes one decode step reads at ``context`` positions: every parameter once (for a mixture
    of experts only the routed experts' share: parameters under an ``experts`` module count
    num_experts_per_tok / num_experts of their bytes, the simple average over tokens) plus the KV
    cache (2 x layers x KV heads x head size x the cache's element size x positions). Returns
    (bytes, how: what was assumed)."""
    config = (
        model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    )
    active = getattr(config, "num_experts_per_tok", None)
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    share = active / experts if active and experts else 1.0
    params = 0.0
    for name, p in model.named_parameters():
        size = p.numel() * p.element_size()
        params += size * share if share < 1.0 and ".experts." in f".{name}" else size
    how = f"parameters x {share:.3g} for the experts" if share < 1.0 else "every parameter"
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or (
        getattr(config, "hidden_size", 0) // heads
        if heads and getattr(config, "hidden_size", None)
        else None
    )
    if not (layers and kv_heads and head_dim):
        return int(params), how + ", no KV cache (the config names no layers, heads or head size)"
    element = next(model.parameters()).element_size()
    kv = 2 * layers * kv_heads * head_dim * element * context
    return int(params + kv), how + f" + KV cache at {context:g} positions"


def trace_keeper(
    record: Mapping[str, Any], settings: dict, adapter
) -> tuple[Callable[[bytes], str] | None, str | None]:
    """(keep, None): how to keep a trace (``perf_trace`` on: ``keep_trace``); (None, why): asked
    for, but no trace can be made or kept; (None, None): not asked for."""
    if not settings.get("perf_trace"):
        return None, None
    if not tuple(adapter.profiler_activities):
        return None, f"the {adapter.type} adapter offers no profiler"
    if not settings.get("record_path"):
        return None, "the probe keeps no files without a record_path"
    return (lambda data: keep_trace(data, record.get("sweep_id"), settings["record_path"])), None


def keep_trace(data: bytes, sweep_id: str | None, record_path: str) -> str:
    """Keep a trace's gzipped ``data`` beside the record (``store.TRACES/<sha256>.json.gz`` in
    ``record_path``'s folder: a sweep's driver copies it into the sweep's folder,
    ``store.keep_traces``); returns its path relative to the data folder in a sweep
    (``store.trace_relpath``), else relative to the record's folder."""
    name = store.trace_name(data)
    atomic_write_bytes(Path(record_path).parent / store.TRACES / name, data)
    return store.trace_relpath(sweep_id, name) if sweep_id else f"{store.TRACES}/{name}"


def chrome_trace(run: Callable[[], Any], activities) -> bytes:
    """``run`` (one generation) under torch.profiler with the adapter's ``activities`` (no
    shapes, stacks or memory): its Chrome trace JSON, gzipped (tiny-gpt2's 4 tokens on the CPU:
    450 KB of JSON, 31 KB gzipped). torch's exporter writes a file itself: it goes to a temporary
    folder outside the data folder, whose writes are ``fileio``'s."""
    from torch.profiler import profile

    with profile(activities=profiled.activities(activities)) as prof:
        run()
    with tempfile.TemporaryDirectory(prefix="perf-trace-") as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        # mtime 0: the same trace, the same bytes and name
        return gzip.compress(path.read_bytes(), mtime=0)


def _traced(
    run: Callable[[], Any], adapter, keep: Callable[[bytes], str]
) -> tuple[str | None, str]:
    """(path, note) of the perf phase's profiled generation; a profiler or a write that fails is
    a note."""
    activities = tuple(adapter.profiler_activities)
    try:
        path = keep(chrome_trace(run, activities))
    except Exception as exc:  # noqa: BLE001 the trace is a measurement beside the timed repeats
        return None, f"no profiler trace: {type(exc).__name__}: {exc}"[:500]
    return (
        path,
        f"one more generation profiled ({', '.join(activities)}) after the timed ones: {path}",
    )


@dataclass
class Plan:
    """How far the phase may go: ``cap`` timed repeats of its own at most (``perf_repeats``); at
    least ``MIN_OWN`` (two warm TTFTs: a TTFT with one repeat has no noise to compare by); then
    stop once TPOT's spread over its samples is at most ``goal`` (``perf_spread``; 0: never), or
    where its repeats add no TPOT sample (a repeat of one token), and start no repeat that would
    take the phase's device seconds past ``budget_s`` (``perf_budget`` x the probe's device time
    before it; None: no limit) once TPOT has ``MIN_SAMPLES`` samples: where the repeats are
    TPOT's only source (the host's clock, compile mode) a tiny model's device phase would
    otherwise buy two, and a spread over two is no figure (bench_perf on the CPU: every run
    stopped so, at 0.7-16.7%). Once two ran, whatever else says, no repeat starts that would take
    the phase past ``deadline_s`` (half the time the probe has left before its ``timeout_s``;
    stop "time"), so the phase does not take the time its verdict's checks need. The first two
    run regardless (a single TTFT is "not comparable" to the gate, which would hide a slower
    one), and so do a warm-up and a trace: a probe at its limit can still be timed out.

    Every sample counts, none is chosen: a rule that kept the last three that agreed (tried, and
    reviewed) made the gate's noise estimate 4 times too small, and noise read as a regression
    2-4.5 times as often."""

    cap: int
    goal: float
    budget_s: float | None
    deadline_s: float | None = None

    def stop(
        self, tpot: list[float], own: int, spent_s: float, last_s: float, adds_steps: bool = True
    ) -> str | None:
        """Why no further repeat runs (``STOPS``), or None: go on. ``tpot``: the TPOT samples so
        far (the verdict's decode steps, the repeats' steps); ``own``: the repeats the phase ran
        itself; ``spent_s``: the phase's timed seconds so far; ``last_s``: the last repeat's (the
        next one's price)."""
        if own < min(MIN_OWN, self.cap):
            return None
        said = spread(tpot) if len(tpot) >= MIN_SAMPLES else None
        # none to say (a NaN, a median of 0): not settled
        settled = said is not None and said <= self.goal
        # 0: every repeat the cap and budget allow
        if self.goal > 0 and (settled or not adds_steps):
            return "spread"
        if own >= self.cap:
            return "cap"
        if self.deadline_s is not None and spent_s + last_s > self.deadline_s:
            return "time"
        # a spread needs three samples before the budget counts
        judged = len(tpot) >= MIN_SAMPLES or not adds_steps
        if judged and self.budget_s is not None and spent_s + last_s > self.budget_s:
            return "budget"
        return None


#: Why the repeats stopped (``perf_stop``): TPOT's spread reached the goal (or nothing more could
#: narrow it), the next repeat would pass the budget, the cap on repeats was reached, or the next
#: would pass half the time the probe had left (``Plan.deadline_s``).
STOPS = ("spread", "budget", "cap", "time")
#: Timed repeats the phase always runs itself: two warm first tokens, so TTFT has a noise to be
#: compared by.
MIN_OWN = 2
#: TPOT's spread is judged over at least this many samples (a median of three is not moved by one
#: wild one).
MIN_SAMPLES = 3
#: The repeat's length where the verdict gives no TPOT (the host's clock, compile mode): enough
#: steps for a median. A setting, never chosen from timings (``decision.LIKE`` compares
#: ``perf_tokens_out``).
OWN_TPOT_TOKENS = 4
#: ... on the CPU, where the phase runs only when asked: a tiny model's decode step there is under a
#: millisecond, mostly transformers' Python, and the host's jitter of tens of microseconds moves a
#: median of 3 steps by 5-10% (tiny-llama: 3 repeats' spread 1.8-5.6% with 4 or 8 tokens, 1.3-1.9%
#: with 16; SmolLM2-135M's 21 ms steps: 1-3%).
CPU_TPOT_TOKENS = 16


def repeat_tokens(settings: dict, device_type: str, verdict_gives_tpot: bool) -> int:
    """A timed repeat's new tokens: ``perf_tokens`` where the verdict's steps give TPOT
    (``verdict_steps``), else at least enough for TPOT's own samples (``OWN_TPOT_TOKENS``;
    ``CPU_TPOT_TOKENS`` on the CPU)."""
    asked = int(settings["perf_tokens"])
    if verdict_gives_tpot:
        return asked
    return max(asked, CPU_TPOT_TOKENS if device_type == "cpu" else OWN_TPOT_TOKENS)


def generate_options(tokens: int, settings: dict, verdict: Mapping[str, Any] | None) -> dict:
    """The generate() options of a timed repeat: ``tokens`` new tokens, the probe's KV cache
    (``cache``: static asks transformers' static cache, as the verdict's generation did). End of
    sequence is suppressed (``min_new_tokens``) only where it could come: a greedy repeat no
    longer than the verdict's generation, which reached its length, makes the same tokens, and
    the suppression is work on the device the verdict did not do (7.6% of tiny-llama's step on a
    modelled device's clock), which would set the verdict's steps apart from the repeats'."""
    options: dict[str, Any] = {"max_new_tokens": tokens}
    if settings.get("cache") == "static":
        options["cache_implementation"] = "static"
    if verdict is None or tokens > (verdict.get("tokens_out") or 0):
        options["min_new_tokens"] = tokens
    return options


def tokens_per_s(
    whole: list[float],
    ttft: list[float],
    tokens: int,
    derived_length: int | None,
    tpot_s: float | None,
) -> list[float]:
    """Each timed repeat's tokens/s: ``tokens`` over its whole generation (``whole``: seconds
    from its start to its last token), measured; or, with repeats of one token
    (``derived_length``: the verdict's length), derived over that length from the repeat's warm
    TTFT and the verdict's TPOT median for each token after it.

    Derived, every repeat uses the one TPOT median, so their spread carries TTFT's noise alone,
    none of TPOT's: a pair whose TPOT moved +7% within its noise (bound 18.9%) read as "slower:
    perf_tokens_per_s -5.2% (spread 0.1%)", and noise alone read as slower 2.4% of the time at 5%
    step noise, 11.1% at 8% (0.1% for TPOT alone). The gate therefore does not judge a derived
    tokens/s (``analysis.perf.judged``): it is a function of TTFT and TPOT, which it judges each
    against its own noise, and it cannot get worse by more than the threshold unless one of them
    does. The figure is kept for the report and the explorer."""
    if derived_length is None:
        return [tokens / w for w in whole]
    return [derived_length / (first + (derived_length - 1) * (tpot_s or 0.0)) for first in ttft]


def tpot_samples(decoded: list[list[float]]) -> list[float]:
    """TPOT's samples from each generation's decode steps: each generation's median where two or
    more decoded (the steps of one generation move together with the host's or the device's pace,
    so the spread between generations is the noise a sweep's TPOT has; a pause moves no median);
    where only one did (the verdict's, with repeats of one token), its steps, the only noise
    there is to read (the gate's threshold covers what moves them together)."""
    if len(decoded) >= 2:
        return [statistics.median(steps) for steps in decoded]
    return list(decoded[0]) if decoded else []


def verdict_steps(
    verdict: Mapping[str, Any] | None, settings: dict, own_clock
) -> list[float] | None:
    """The verdict's own decode steps (seconds between its tokens), when its generation is one of
    the phase's repeats: in eager and fused modes (compile mode compiles the forward again, so
    its verdict ran other code), on the device's own clock (the verdict's timer stamps each token
    on it too, ``probe_core.StepTimer.device_clock``; on the host's clock the verdict's steps
    carry its instruments and the host's noise: the CPU's TPOT spread over them was 117-2000% in
    bench_perf), its first decode step left out (the decode shape's first call), with two steps
    or more left; None otherwise."""
    if verdict is None or settings["mode"] == "compile" or own_clock is None:
        return None
    times = verdict.get("token_times") or []
    # the first: the decode shape's first call
    steps = [after - before for before, after in zip(times, times[1:])][1:]
    return steps if len(steps) >= 2 else None


def measure(
    model,
    tokenizer,
    prompt_ids: list[int],
    settings: dict,
    adapter,
    keep: Callable[[bytes], str] | None = None,
    verdict: Mapping[str, Any] | None = None,
    budget_s: float | None = None,
) -> dict:
    """The perf fields of a PASS, measured on ``adapter``'s device with the verdict's ``model``
    (still on it) and prompt (``prompt_ids``), in the probe's mode (compile: its forward compiled
    again, so a warm-up generation pays the compilation first; fused: TorchTPU's
    deferred-and-fused eager). ``verdict``: the verdict's generation (``token_times`` on the
    device's clock, ``first_token_s``): in eager and fused modes it is the warm-up, and on a
    device's own clock its decode steps are TPOT's samples (``verdict_steps``). Timed repeats of
    ``perf_tokens`` then run as ``Plan`` says. ``keep``: profile one more generation after the
    timed ones and keep its trace so (``trace_keeper``)."""
    import torch

    own_clock = adapter.perf_clock(settings["mode"])
    reused = verdict_steps(verdict, settings, own_clock)
    # with the verdict's steps TPOT is had: a repeat need only price the prompt (perf_tokens 1);
    # without, it needs steps
    tokens = repeat_tokens(settings, adapter.type, bool(reused))
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    run = functools.partial(
        _one_run,
        model,
        tokenizer,
        ids,
        torch.ones_like(ids),
        generate_options(tokens, settings, verdict),
        adapter.torch_device,
        adapter.synchronize if adapter.type != "cpu" else None,
        own_clock or host_clock,
    )
    plan = Plan(int(settings["perf_repeats"]), float(settings["perf_spread"]), budget_s)
    eager_forward = (
        probe_core.compile_forward(model, adapter.compile_backend())
        if settings["mode"] == "compile"
        else None
    )
    adapter.reset_peak_memory()
    try:
        timed = _timed_runs(run, plan, settings, tokens, reused, verdict, adapter, keep)
    finally:
        if eager_forward is not None:
            model.forward = eager_forward
    return _fields(timed, plan, tokens, reused, verdict, model, len(prompt_ids), adapter, own_clock)


@dataclass
class _Timed:
    """What the timed repeats measured (``_timed_runs``)."""

    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    # each repeat's whole generation, for tokens/s
    per_repeat: list[float] = field(default_factory=list)
    first_call: float | None = None
    stop: str = ""  # why the repeats stopped (``Plan.stop``)
    trace: tuple[str | None, str] | None = None  # the profiled generation's (path, note), when kept
    phase_s: float = 0.0


def _timed_runs(run, plan, settings: dict, tokens: int, reused, verdict, adapter, keep) -> _Timed:
    """The warm-up (unless the verdict's generation was it), then the timed repeats as ``plan``
    says, then the profiled one when ``keep``; ``run()`` is one generation, returning its start
    and token times."""
    timed = _Timed()
    # each generation's decode steps (seconds)
    decoded: list[list[float]] = [reused] if reused else []
    timed.tpot = tpot_samples(decoded)
    began = host_clock()
    try:
        # the verdict's young garbage freed (a full collection cost 0.2 s a probe outside a kernel)
        gc.collect(1)
        gc.disable()  # as timeit does: no collection inside a repeat
        with probe_core.execution_context(settings["mode"]):
            # a warm-up of its own, on the host's wall clock: a compilation (compile mode; fused
            if reused is None:
                # mode's programs for the repeat's length) is the host's work, and the first repeat
                # after the verdict runs slowest on the host's clock (tiny-llama's first TTFT: +9%
                # over the next two, in review)
                run()
                timed.first_call = host_clock() - began
            else:  # the verdict's generation warmed the model: its first token is the first call
                timed.first_call = (verdict or {}).get("first_token_s")
            # a compilation in the warm-up is the host's, not the budget's
            timed_from, last = host_clock(), 0.0
            plan.deadline_s = _deadline(settings, timed_from)
            while (
                stop := plan.stop(
                    timed.tpot, len(timed.ttft), host_clock() - timed_from, last, tokens > 1
                )
            ) is None:
                went = host_clock()
                start, times = run()
                last = host_clock() - went
                timed.ttft.append(times[0] - start)
                steps = [after - before for before, after in zip(times, times[1:])]
                if steps:
                    decoded.append(steps)
                    timed.tpot = tpot_samples(decoded)
                timed.per_repeat.append(times[-1] - start)
            timed.stop = stop
            gc.enable()
            if keep is not None:  # after the timed repeats: the profiler slows none of them
                timed.trace = _traced(run, adapter, keep)
    finally:
        gc.enable()
    timed.phase_s = host_clock() - began
    return timed


def _fields(
    timed: _Timed, plan, tokens: int, reused, verdict, model, prompt_len: int, adapter, own_clock
) -> dict:
    """The perf fields of what ``timed`` measured, with the note saying how."""
    ttft, tpot = timed.ttft, timed.tpot
    peak_mb, _ = adapter.peak_memory_mb()
    tpot_s = statistics.median(tpot) if tpot else None
    # tokens/s over a generation: measured whole where the repeats decode, else over the verdict's
    # length from a warm TTFT and the verdict's TPOT for each token after it (said in the note)
    derived = bool(reused) and tokens == 1
    length = int((verdict or {}).get("tokens_out") or 1) if derived else tokens
    per_s = tokens_per_s(timed.per_repeat, ttft, tokens, length if derived else None, tpot_s)
    fields: dict[str, Any] = {
        **dict.fromkeys(FIELDS),
        "perf_tokens_out": tokens,
        "perf_first_call_s": timed.first_call,
        "ttft_s": statistics.median(ttft),
        "ttft_s_repeats": ttft,
        "ttft_spread": spread(ttft) if len(ttft) > 1 else None,
        "perf_tokens_per_s": statistics.median(per_s),
        "perf_tokens_per_s_repeats": per_s,
        "perf_peak_device_mem_mb": peak_mb,
        "perf_repeats_run": len(ttft),
        "perf_stop": timed.stop,
        "perf_device_s": timed.phase_s,
    }
    if tpot:
        fields.update(
            tpot_s=tpot_s, tpot_s_repeats=tpot, tpot_spread=spread(tpot) if len(tpot) > 1 else None
        )
    notes = [_sized(plan, timed.stop, tpot, ttft, tokens, bool(reused), timed.phase_s)]
    if derived:
        notes.append(
            f"tokens/s over the verdict's {length} tokens: a warm TTFT, then its TPOT for each "
            "token after (derived: the gate judges its TTFT and TPOT, not it)"
        )
    nbytes, how = decode_bytes_per_token(model, prompt_len + length / 2)
    fields["decode_bytes_per_token"] = nbytes
    peak_gbs, source = adapter.peak_bandwidth_gbs()
    if peak_gbs and fields["tpot_s"]:
        fields["bandwidth_utilisation"] = nbytes / fields["tpot_s"] / (peak_gbs * 1e9)
        notes.append(f"bandwidth: {how}, against {peak_gbs:g} GB/s ({source})")
    else:
        notes.append(f"bandwidth utilisation not measured: {source}")
    if timed.trace is not None:
        fields["perf_trace_path"], said = timed.trace
        notes.append(said)
    clock = (
        f"on the device's own clock (torch.{adapter.type}.perf_clock)"
        if own_clock
        else "on the host's wall clock"
    )
    fields["perf_note"] = f"{notes[0]}, {clock}; " + "; ".join(notes[1:])
    return fields


def _sized(
    plan: Plan,
    stop: str,
    tpot: list[float],
    ttft: list[float],
    tokens: int,
    reused: bool,
    phase_s: float,
) -> str:
    """What the phase ran and why it stopped, in words (the record's ``perf_note``)."""
    ran = f"{len(ttft)} repeats of {tokens} token{'s' if tokens != 1 else ''}"
    if reused:
        ran += "; TPOT from the verdict's decode steps" + (
            " and the repeats'" if tokens > 1 else ""
        )
    said = spread(tpot) if len(tpot) > 1 else None
    spread_words = (
        f"TPOT spread {said:.1%} over {len(tpot)} samples" if said is not None else "no TPOT spread"
    )
    if stop == "spread":
        settled = said is not None and said <= plan.goal
        why = (
            f"{spread_words}, within perf_spread {plan.goal:.0%}"
            if settled
            else f"{spread_words} (a repeat of one token adds no step)"
        )
    elif stop == "time":
        why = (
            "the probe's time limit: another repeat would take the phase past "
            f"{plan.deadline_s:.2f} s (half the time the probe had left before timeout_s), "
            f"{spread_words}"
        )
    elif stop == "budget":
        why = (
            f"the budget: another repeat would take the phase past {plan.budget_s:.2f} s "
            f"(perf_budget of the probe's device phase; {phase_s:.2f} s spent), {spread_words}"
        )
    else:
        why = f"the cap of perf_repeats={plan.cap}, {spread_words} (goal {plan.goal:.0%})"
    return f"{ran}; stopped by {why}"


def budget(settings: dict, verdict: Mapping[str, Any], device_type: str = "") -> float | None:
    """The phase's device seconds at most: ``perf_budget`` x the probe's device time so far; None
    where ``perf_budget`` is 0 (no limit). On an accelerator that is its device phase
    (``phases``: the weights moved, the verdict's generation; where no phase was timed, as a
    probe run outside a sweep's worker may be, the verdict's generation alone). On the CPU the
    host is the device, and everything the probe did so far ran on it (loading, the verdict's
    generation): its device phase alone (a tiny model's 8 tokens, no weights moved) bought two
    repeats, and TPOT's spread over them was 0.7-16.7% (bench_perf)."""
    share = float(settings.get("perf_budget") or 0.0)
    if share <= 0:
        return None
    if device_type == "cpu" and settings.get("started") is not None:
        return share * (host_clock() - float(settings["started"]))
    spent = phases.device_phase()["device_s"] or verdict.get("generate_s") or 0.0
    return share * spent


def _deadline(settings: dict, now: float) -> float | None:
    """Seconds the phase may run from ``now``: half the time the probe has left before
    ``timeout_s`` (the checks after it need the rest); None where the probe knows no start or
    limit (``measure`` called on its own)."""
    started, limit = settings.get("started"), settings.get("timeout_s")
    if started is None or not limit:
        return None
    return max(0.0, 0.5 * (float(limit) - (now - float(started))))


def perf_fields(record: Mapping[str, Any], settings: dict, result: dict, adapter) -> dict:
    """The perf fields for ``record`` (its verdict's ``result`` holds the model, still on the
    device): measured (``measure``), or why not; a measurement that raises is a note, never a
    verdict change."""
    why = why_not(record, settings)
    if why is not None:
        return not_measured(why)
    if result.get("model") is None:
        return not_measured("the verdict's model was not kept")
    reused = verdict_steps(result, settings, adapter.perf_clock(settings["mode"])) is not None
    tokens = repeat_tokens(settings, adapter.type, reused)
    positions, need = probe_core.positions_of(result["model"]), len(result["input_ids"]) + tokens
    if positions is not None and need > positions:  # as the length axis checks max_new_tokens
        return not_measured(
            f"max_position_embeddings={positions} cannot hold the prompt's "
            f"{len(result['input_ids'])} tokens plus the repeats' {tokens} "
            f"(perf_tokens={settings['perf_tokens']}; at most "
            f"{positions - len(result['input_ids'])} fit)"
        )
    keep, no_trace = trace_keeper(record, settings, adapter)
    try:
        with phases.part("perf"):  # the device's work, said apart in the sweep's device time
            fields = measure(
                result["model"],
                result["tokenizer"],
                result["input_ids"],
                settings,
                adapter,
                keep,
                result,
                budget(settings, result, adapter.type),
            )
    except Exception as exc:  # noqa: BLE001 the perf phase is a measurement beside the verdict
        return not_measured(f"the perf phase raised {type(exc).__name__}: {exc}"[:2000])
    if no_trace:
        fields["perf_note"] += f"; no profiler trace: {no_trace}"
    return fields
