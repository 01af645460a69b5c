"""A run's result: the empty result ``run_sharded`` fills, and ``merge_outcome``, which reads the
rank reports, the launcher's outcome and the progress files of the run folder and decides which
failure is the probe's (a timeout, a rank that died, a rank whose stages raised); the exceptions
that name it."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from .. import probe_core
from .protocol import STAGE_KEYS, STOP_SIGNALS


class RankDied(RuntimeError):
    """A rank process ended without a result (a signal such as the OOM killer's SIGKILL, a
    crash)."""


class RankTimeout(TimeoutError):
    """Ranks did not finish within the probe's timeout; all of them were killed."""


class LaunchFailed(RuntimeError):
    """The launcher itself failed before any rank could report (rendezvous, a bad interpreter)."""


class RankError(Exception):
    """Base of the exceptions rebuilt from a rank's report: same class name and message; its
    ``__cause__`` carries the rank's traceback text."""


class _RankTraceback(Exception):
    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text}\n"""'


def empty_result(world_size: int, device_type: str) -> dict:
    result = dict.fromkeys(STAGE_KEYS)
    result.update(
        error_type=None,
        error_message=None,
        traceback=None,
        failed_rank=None,
        device_type=device_type,
        devices_used=world_size,
        parallelism=None,
        parallelism_details=None,
        distributed_config=None,
        tp_size=1,
        ep_size=1,
        fsdp_size=1,
        num_params_estimate=None,
        memory_estimate_bytes=None,
        memory_per_device_bytes=None,
        load_s_per_rank=None,
        generate_s_per_rank=None,
        peak_device_mem_mb=None,
        peak_device_mem_mb_per_rank=None,
        device_mem_source=None,
        peak_host_mem_mb=None,
        cpu_threads=None,
        local_param_bytes_per_rank=None,
        local_experts_per_rank=None,
        ranks_agree=None,
        rank_pids=[],
        launcher_pid=None,
        wall_s=None,
        rank_log_tail=None,
        rank_errors=None,
    )
    return result


def fail_result(
    result: dict, status: str, stage: str, exc: BaseException, rank: int | None = None
) -> dict:
    result.update(
        status=status,
        failure_stage=stage,
        exception=exc,
        error_type=type(exc).__name__,
        error_message=str(exc),
        traceback=probe_core.trimmed_traceback(exc),
        failed_rank=rank,
    )
    return result


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "ended with no exit status"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        why = (
            " (what the kernel's OOM killer sends when memory runs out)"
            if -exitcode == signal.SIGKILL
            else ""
        )
        return f"was killed by {name}{why}"
    return f"exited with status {exitcode} without a result"


def _where(progress: dict | None, max_new_tokens: int) -> str:
    if not progress:
        return "before it started its stages"
    stage = progress.get("stage")
    if stage == "generate":
        return f"during generate, after {progress.get('tokens', 0)} of {max_new_tokens} new tokens"
    return f"during {stage}"


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _log_tail(run_dir: Path, ranks, chars: int = 4000) -> str | None:
    """The end of these ranks' stderr logs (their Python stacks, after a timeout), each under a
    header."""
    parts = []
    for rank in ranks:
        for path in sorted(run_dir.glob(f"logs/**/attempt_*/{rank}/stderr.log")):
            text = path.read_text(errors="replace").strip()
            if text:
                parts.append(f"--- rank {rank} stderr ---\n{text[-chars:]}")
    return "\n".join(parts) or None


def _rebuild(report: dict) -> BaseException:
    """The rank's exception as an object: same class name (a RankError) and message, its
    traceback as the cause."""
    cls = type(
        report["error_type"] or "RankError",
        (RankError,),
        {"__module__": report.get("error_module") or "builtins"},
    )
    exc = cls(report["error_message"])
    exc.__cause__ = _RankTraceback(f"rank {report['rank']}:\n{report['traceback']}")
    return exc


def _one_line(report: dict) -> str:
    first = (report.get("error_message") or "").strip().splitlines()
    return (
        f"rank {report['rank']}: {report['status']} at {report['failure_stage']}: "
        f"{report['error_type']}: {first[0] if first else ''}"
    )[:500]


def _from_reports(result: dict, done: dict[int, dict], world_size: int) -> None:
    """What the ranks that reported measured: per rank (a missing rank's entries null) and
    overall (the peaks, the slowest load), rank 0's stage results (or the lowest rank's that
    reported), and whether every rank generated the same tokens (unknown while one is missing)."""
    per_rank = [done.get(r) or {} for r in range(world_size)]
    result["load_s_per_rank"] = [rep.get("load_s") for rep in per_rank]
    result["generate_s_per_rank"] = [rep.get("generate_s") for rep in per_rank]
    result["peak_device_mem_mb_per_rank"] = [rep.get("peak_device_mem_mb") for rep in per_rank]
    result["local_param_bytes_per_rank"] = [rep.get("local_param_bytes") for rep in per_rank]
    result["local_experts_per_rank"] = [rep.get("local_experts") for rep in per_rank]
    peaks = [p for p in result["peak_device_mem_mb_per_rank"] if p is not None]
    result["peak_device_mem_mb"] = max(peaks) if peaks else None
    sources = [rep["device_mem_source"] for rep in done.values() if rep.get("device_mem_source")]
    result["device_mem_source"] = sources[0] if sources else None
    hosts = [
        rep["peak_host_mem_mb"] for rep in done.values() if rep.get("peak_host_mem_mb") is not None
    ]
    result["peak_host_mem_mb"] = max(hosts) if hosts else None
    threads = [rep["cpu_threads"] for rep in done.values() if rep.get("cpu_threads") is not None]
    # the ranks' are equal: one launcher set them
    result["cpu_threads"] = max(threads) if threads else None
    base = done.get(0) or done[min(done)]
    for key in STAGE_KEYS:
        if key not in ("status", "failure_stage", "exception", "model", "tokenizer"):
            result[key] = base.get(key)
    loads = [t for t in result["load_s_per_rank"] if t is not None]
    result["load_s"] = max(loads) if loads else None
    outputs = [rep.get("output_token_ids") for rep in done.values()]
    result["ranks_agree"] = (
        all(o == outputs[0] for o in outputs) if len(done) == world_size else None
    )


def merge_outcome(result: dict, run_dir: Path, world_size: int, outcome: dict) -> None:
    """The run's result from the rank reports, the launcher's outcome and the progress files.

    Which failure is the probe's: a timeout first (the ranks that did not finish), then a rank that
    died without a report (a signal, a crash), then the first rank whose stages raised (the others
    usually only saw it go: a closed connection in a collective). What every failed rank said is
    kept in ``rank_errors``."""
    job = _read_json(run_dir / "job.json") or {}  # written before the launch: always there
    max_new = job["settings"]["max_new_tokens"]
    reports = {r: _read_json(run_dir / f"rank{r}.json") for r in range(world_size)}
    progress = {r: _read_json(run_dir / f"rank{r}.progress.json") for r in range(world_size)}
    done = {r: rep for r, rep in reports.items() if rep is not None}
    missing = [r for r in range(world_size) if r not in done]
    if done:
        _from_reports(result, done, world_size)
    raised = sorted(
        (rep for rep in done.values() if rep.get("status") != probe_core.PASS),
        key=lambda rep: rep["failed_at"],
    )
    result["rank_errors"] = [_one_line(rep) for rep in raised] or None
    failures = {int(r): f for r, f in (outcome.get("failures") or {}).items()}

    def stage_of(rank):
        return (progress.get(rank) or {}).get("stage") or "runner"

    if outcome.get("timed_out"):
        behind = sorted(missing, key=lambda r: (progress[r] or {}).get("t") or 0)
        where = "; ".join(f"rank {r}: {_where(progress[r], max_new)}" for r in missing)
        label = f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
        message = (
            f"{label} did not finish within {job['timeout_s']:g} s ({where}); all {world_size} "
            "ranks were killed"
        )
        rank = behind[0] if behind else None
        fail_result(result, probe_core.FAIL_OTHER, stage_of(rank), RankTimeout(message), rank=rank)
        result["rank_log_tail"] = _log_tail(run_dir, missing)
        return
    died = [r for r in missing if (failures.get(r) or {}).get("exitcode")]
    crashed = [r for r in died if -failures[r]["exitcode"] not in STOP_SIGNALS]
    stopped = [r for r in died if r not in crashed]
    # a rank that died by itself (a crash, the OOM killer) comes first: the others only saw it go; a
    # rank the agent stopped (SIGTERM, once another rank failed) is the cause only when nothing else
    # is
    causes = crashed or ([] if raised else stopped)
    if causes:
        rank = min(causes, key=lambda r: (failures[r].get("timestamp") or 0, r))
        others = f"the other rank{'s were' if world_size > 2 else ' was'} stopped"
        message = (
            f"rank {rank} {_describe_exit(failures[rank]['exitcode'])} "
            f"{_where(progress[rank], max_new)}; {others}"
        )
        fail_result(result, probe_core.FAIL_OTHER, stage_of(rank), RankDied(message), rank=rank)
        result["rank_log_tail"] = _log_tail(run_dir, [rank])
        return
    if raised:
        report = raised[0]
        result.update(
            status=report["status"],
            failure_stage=report["failure_stage"],
            exception=_rebuild(report),
            error_type=report["error_type"],
            error_message=report["error_message"],
            traceback=f"rank {report['rank']}:\n{report['traceback']}",
            failed_rank=report["rank"],
            failed_step=report.get("failed_step"),
        )
        return
    if missing or outcome.get("launcher_error"):
        if missing:
            rank = missing[0]
            launcher = (
                outcome.get("launcher_error") or f"exit status {outcome.get('launcher_exit')}"
            )
            exc: Exception = RankDied(
                f"rank {rank} wrote no result {_where(progress[rank], max_new)} (launcher: "
                f"{launcher})"
            )
        else:
            rank, exc = None, LaunchFailed(outcome["launcher_error"])
        fail_result(result, probe_core.FAIL_OTHER, stage_of(rank), exc, rank=rank)
        launcher_log = run_dir / "launcher.log"
        result["rank_log_tail"] = _log_tail(run_dir, missing) or (
            launcher_log.read_text(errors="replace")[-4000:] if launcher_log.exists() else None
        )
        return
    result["status"] = probe_core.PASS
