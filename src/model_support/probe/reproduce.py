"""What a repro script runs, and the reference check the probe runs too.

A record's repro script is a header that sets ``SETTINGS`` (the probe's settings as it ran them)
followed by its body: the source of ``hub_fetch``, ``probe_core``, ``agreement`` and this module
(``repro.body``), then ``sys.exit(main(SETTINGS, sys.argv))``. In the script the four modules share
one namespace, so the ``from .<module> import ...`` lines below are dropped when the body is built;
this module imports nothing else of the package (an import contract keeps it so), only the standard
library, torch and transformers.

``reference_check`` is the probe's own check of a PASS (``checks.run_reference`` calls it) and the
script's: the CPU reference, teacher-forced on the device's tokens, compared with the device's best
logits.
"""

import json
import os
import sys
from typing import Any

from .agreement import RECORD_KEYS, compare, reference_dtype, teacher_forced_logits
from .hub_fetch import fetch, is_local
from .probe_backend import StepTimer, device_clock, load_backend, synchronizer
from .probe_compile import NOT_AVAILABLE, compile_forward, execution_context, fused_eager_missing
from .probe_core import PASS, load, prompt_inputs, run_stages, trimmed_traceback

#: What the script prints of a run (one JSON line), beside the reference's numerics after a PASS.
SHOWN = (
    "status",
    "task",
    "failure_stage",
    "error_type",
    "error_message",
    "tokens_in",
    "tokens_out",
    "image_tokens",
    "output_token_ids",
    "failed_step",
    "generated_text",
)
#: What a rank of the script's sharded run reports (JSON), for rank 0's line and its reference
#: check.
RANK_REPORT = (*SHOWN, "num_params", "input_ids", "step_scores")
#: ``run_stages`` parameters the script passes itself rather than from SETTINGS.
_GIVEN = ("model_id", "device", "synchronize", "compile_backend", "load_kwargs")


class ReferenceFailed(RuntimeError):
    """The reference could not run: ``stage`` says where (load, template, forward); no verdict
    either way."""

    def __init__(self, stage: str, exc: BaseException):
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.stage = stage


def reference_check(
    load_from: str,
    settings: dict,
    dtype: str,
    prompt_ids: list[int] | None,
    output_ids: list[int] | None,
    device_steps: list | None,
) -> dict:
    """Is a PASS right? The model again on the CPU in ``dtype``, one forward pass over the prompt
    plus the device's own tokens (teacher forcing), compared step by step with the device's best
    logits (``agreement.compare``, with ``settings``' numerics_margin and numerics_bound):
    ``RECORD_KEYS``. ``settings``: the probe's (revision, trust_remote_code, task, prompt,
    image_prompt, chat_template). ReferenceFailed when the reference itself cannot load, template
    or run."""
    import torch

    stage = "load"
    try:
        info: dict = {}
        model, tokenizer = load(
            load_from,
            settings["revision"],
            dtype,
            settings["trust_remote_code"],
            torch.device("cpu"),
            info,
            task=settings["task"],
        )
        # the same prompt inputs (an image-text-to-text model's image among them)
        stage = "template"
        tokenizer, _ids, _mask, extra_inputs = prompt_inputs(
            model,
            tokenizer,
            info,
            settings["prompt"],
            settings["image_prompt"],
            settings["chat_template"],
        )
        stage = "forward"
        logits = teacher_forced_logits(model, prompt_ids, output_ids, extra_inputs)
    except Exception as exc:  # noqa: BLE001 the caller says what it means
        raise ReferenceFailed(stage, exc) from exc
    found = compare(
        device_steps,
        logits,
        settings["numerics_margin"],
        settings["numerics_bound"],
        tokenizer.decode,
        dtype=settings.get("dtype"),
    )
    return {key: found[key] for key in RECORD_KEYS}


def _numerics(settings: dict, load_from: str, result: dict) -> dict:
    """The probe's check of a PASS, again (``reference_check``), as the script prints it."""
    if result["status"] != PASS or settings["reference"] != "cpu":
        return {}
    if (result["num_params"] or 0) > settings["reference_max_params"]:
        return {
            "numerics": None,
            "numerics_note": f"no reference: above reference_max_params={settings['reference_max_params']}",
        }
    dtype = reference_dtype(settings["device"], settings["dtype"])
    run = {**settings, "task": result.get("task") or settings["task"]}
    try:
        found = reference_check(
            load_from,
            run,
            dtype,
            result["input_ids"],
            result["output_token_ids"],
            result["step_scores"],
        )
    except ReferenceFailed as exc:
        return {
            "numerics": None,
            "numerics_note": f"no reference: reference failed at {exc.stage}: {exc}",
        }
    return {"reference_device": f"cpu:{dtype}", **found}


def _staged(settings: dict) -> dict:
    """The settings ``run_stages`` takes as they are."""
    import inspect

    names = set(inspect.signature(run_stages).parameters) - set(_GIVEN)
    return {name: value for name, value in settings.items() if name in names}


def _error(result: dict) -> dict:
    exc = result["exception"]
    return {
        "error_type": type(exc).__name__ if exc is not None else None,
        "error_message": str(exc)[:2000] if exc is not None else None,
    }


def launch_ranks(
    world_size: int,
    run_id: str,
    entry_args: list[str],
    log_dir: str | None = None,
    shutdown_timeout: int = 5,
) -> dict:
    """The sharded launcher, the probe's (``sharded.run_sharded``'s launcher process) and a repro
    script's: torch.distributed's elastic agent starting ``world_size`` rank processes on this
    host, ``python *entry_args`` each (rendezvous on a free local port, no restart, spawned).
    Each rank's output goes to ``log_dir`` when given (the probe reads it), else to this
    process's. Returns the ranks that failed: {rank: {exitcode, pid, timestamp}}."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    logs = DefaultLogsSpecs(log_dir=log_dir, redirects=Std.ALL) if log_dir else DefaultLogsSpecs()
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=world_size,
        run_id=run_id,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # a free port: several sharded probes may run on one host
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
        local_addr="localhost",
        shutdown_timeout=shutdown_timeout,
        logs_specs=logs,
    )
    try:
        elastic_launch(config, sys.executable)(*entry_args)
    except ChildFailedError as exc:
        return {
            str(rank): {
                "exitcode": failure.exitcode,
                "pid": failure.pid,
                "timestamp": failure.timestamp,
            }
            for rank, failure in exc.failures.items()
        }
    return {}


def _rank(settings: dict, folder: str, load_from: str) -> int:
    """One rank of a repro script's sharded run (``python run.py --rank FOLDER MODEL``, started
    by ``launch_ranks``): its environment as the probe's device adapter set it up, its own
    device, the probe's process group, the stages on its shard of the model; its report into
    ``folder``."""
    rank = int(os.environ["LOCAL_RANK"])
    # the device adapter's environment for this rank (a TPU rank: its chip)
    pinned = settings["rank_env"][rank]
    os.environ.update(pinned)
    import torch
    import torch.distributed as dist
    from transformers import DistributedConfig

    kind = settings["device"]
    load_backend(kind)
    device = torch.device("cpu")
    # each rank its own device, as the probe's ranks; a pinned rank takes its process's one
    if kind != "cpu":
        index = torch.accelerator.current_device_index() if pinned else rank
        torch.accelerator.set_device_index(index)
        # a backend the generic call does not reach
        if torch.accelerator.current_device_index() != index:
            getattr(torch, kind).set_device(index)
        device = torch.device(kind, index)
    # the probe's process group, as its device adapter named it
    backend = settings["distributed_backend"]
    dist.init_process_group(backend=backend, device_id=device if backend == "nccl" else None)
    result = run_stages(
        load_from,
        device=device,
        load_kwargs={"distributed_config": DistributedConfig(**settings["distributed"])},
        **_staged(settings),
    )
    report = {**{key: result.get(key) for key in RANK_REPORT}, **_error(result)}
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as handle:
        json.dump(report, handle)
    dist.destroy_process_group()
    return 0


def run_ranks(settings: dict, load_from: str, script: str) -> int | str:
    """A sharded probe's ranks again, launched as the probe launched them (``launch_ranks``: one
    process per rank, this ``script`` with ``--rank``), each on its own device as the probe ran
    them; rank 0's line."""
    import tempfile

    world = max(v for k, v in settings["distributed"].items() if k.endswith("_size"))
    folder = tempfile.mkdtemp(prefix="repro-ranks-")
    failed = launch_ranks(
        world, f"repro-{os.getpid()}", [os.path.abspath(script), "--rank", folder, load_from]
    )
    try:
        with open(os.path.join(folder, "rank0.json")) as handle:
            result = json.load(handle)
    except OSError:
        return f"rank 0 wrote no result (failed ranks: {failed or 'none'})"
    print(_verdict_line(result))
    print(
        json.dumps(
            {**{key: result.get(key) for key in SHOWN}, **_numerics(settings, load_from, result)}
        )
    )
    return 0 if result["status"] == PASS else 1


#: The flag that runs a repro script on the stack as this environment has it: the backend's settings
#: left as they are here instead of set as the probe ran them (a porting team checking its fix;
#: ``python run.py --stack-as-found``).
AS_FOUND_FLAG = "--stack-as-found"
#: The same as an environment variable, =1 (what the bisect sets for each step, and what older
#: scripts read).
KEEP_CONFIG_VAR = "MODEL_SUPPORT_REPRO_KEEP_CONFIG"
#: The exit status of a script that reaches no verdict because this stack cannot run it (its device,
#: its backend or a mode is not here), said in one sentence: apart from 0 (PASS) and 1 (a FAIL), so
#: a rerun says which it was.
NO_VERDICT_STATUS = 2


def stack_as_found(argv: list[str]) -> tuple[bool, list[str]]:
    """(whether the script runs on the stack as found: ``AS_FOUND_FLAG`` among ``argv`` or
    ``KEEP_CONFIG_VAR``=1, ``argv`` without the flag)."""
    rest = [arg for arg in argv if arg != AS_FOUND_FLAG]
    return len(rest) < len(argv) or os.environ.get(KEEP_CONFIG_VAR) == "1", rest


def apply_device_config(config: dict | None, argv: list[str]) -> list[str]:
    """The backend's configuration as the probe ran it (``device_config``: LIBTPU_INIT_ARGS,
    XLA_FLAGS, a test backend's faults, ...), set before the backend loads, each change said on
    stdout with the command that runs on this environment's stack as found instead; on the stack
    as found (``stack_as_found``) nothing is set and what differs from the recorded settings is
    said. Returns ``argv`` without the flag."""
    import shlex

    flagged = AS_FOUND_FLAG in argv
    as_found, argv = stack_as_found(argv)
    differs = {
        name: value for name, value in (config or {}).items() if os.environ.get(name) != value
    }
    for name, value in differs.items():
        here = f"{os.environ[name]!r}" if name in os.environ else "unset"
        if as_found:
            print(f"on the stack as found: {name} stays {here}, not {value!r} as the probe ran it")
        else:
            print(f"setting {name}={value!r} as the probe ran it (here it was {here})")
            os.environ[name] = value
    if differs and as_found and not flagged:
        print(f"({KEEP_CONFIG_VAR}=1 is the same as {AS_FOUND_FLAG})")
    elif differs and not as_found:
        command = shlex.join(["python", *argv, AS_FOUND_FLAG])
        print(
            "to run on this environment's stack as found instead (its own settings, e.g. to "
            f"check a fix): {command}"
        )
    sys.stdout.flush()  # before anything the backend or the run write on stderr
    return argv


def set_up_backend(settings: dict, argv: list[str]) -> tuple[list[str], str | None]:
    """The device's backend as the script runs on it: the recorded configuration set
    (``apply_device_config``, or not, on the stack as found), the backend loaded
    (``load_backend``), the device asked for. Returns (``argv`` without the flag, None), or
    (``argv``, the sentence that says why this stack cannot run the script) where the backend
    does not load or the device is not here: no traceback, no verdict."""
    config = settings.get("device_config") or {}
    argv = apply_device_config(config, argv)
    kind = settings["device"]
    if kind == "cpu":
        return argv, None
    import torch

    # on the stack as found
    unset = {name: value for name, value in config.items() if os.environ.get(name) != value}
    hint = (
        f"; the probe ran it with {', '.join(f'{n}={v!r}' for n, v in unset.items())}: without "
        f"{AS_FOUND_FLAG} this script sets that"
        if unset
        else ""
    )
    where = "on this stack as found" if unset else "here"
    try:
        load_backend(kind)
    except Exception as exc:  # noqa: BLE001 a backend that refuses its configuration: one sentence
        first = (str(exc).strip().splitlines() or [""])[0][:500]
        return (
            argv,
            f"the {kind!r} backend did not load {where}: {type(exc).__name__}: {first}{hint}",
        )
    here = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if getattr(here, "type", None) != kind:
        return (
            argv,
            f"device {kind!r} is not available {where} (torch reports "
            f"{here or 'no accelerator'}){hint}",
        )
    return argv, None


#: Set to a number of repeats to time that many greedy generations after a PASS (``bisect
#: --metric``): the JSON line then holds ``perf``, each repeat's TTFT, TPOT and tokens/s, named as
#: the record's repeats.
PERF_VAR = "MODEL_SUPPORT_REPRO_PERF"


def timed_repeats(settings: dict, result: dict, device, synchronize, repeats: int) -> dict:
    """The perf phase's figures, again, on this environment: one warm-up generation of
    ``perf_tokens`` greedy tokens (at least 4, 16 on the CPU, so each repeat gives TPOT) from the
    probe's prompt (compilation paid there in mode compile), then ``repeats`` timed ones, each
    token stamped after a device sync (``StepTimer``). A small loop of its own rather than
    ``probe.performance``, which the repro body cannot import; it measures as that does: TTFT the
    first token, TPOT the median gap after it, tokens/s over the whole generation, end of
    sequence suppressed so every repeat decodes as many tokens; on the device's own clock where
    it has one (``device_clock``), as the perf phase times."""
    import statistics
    import time

    import torch

    model, tokenizer = result["model"], result["tokenizer"]
    # as the perf phase's repeats where they give TPOT (``performance.repeat_tokens``: at least 4,
    # 16 on the CPU): the perf phase's default of 1 token takes TPOT from the verdict's steps, which
    # this loop does not time
    tokens = max(int(settings.get("perf_tokens") or 1), 16 if settings["device"] == "cpu" else 4)
    ids = torch.tensor([result["input_ids"]], dtype=torch.long)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    mode = settings["mode"]
    eager_forward = (
        compile_forward(model, settings["compile_backend"] or "inductor")
        if mode == "compile"
        else None
    )
    clock = device_clock(settings["device"], settings["mode"]) or time.perf_counter
    out: dict = {
        "perf_tokens": tokens,
        "ttft_s_repeats": [],
        "tpot_s_repeats": [],
        "perf_tokens_per_s_repeats": [],
    }
    try:
        with execution_context(mode):
            for n in range(repeats + 1):  # the first is the warm-up
                timer = StepTimer(synchronize, clock)
                if synchronize:
                    synchronize()
                start = clock()
                with torch.inference_mode():
                    model.generate(
                        input_ids=ids.to(device),
                        attention_mask=torch.ones_like(ids).to(device),
                        max_new_tokens=tokens,
                        min_new_tokens=tokens,
                        do_sample=False,
                        pad_token_id=pad,
                        streamer=timer,
                    )
                if n == 0:
                    continue
                times = timer.times
                gaps = [after - before for before, after in zip(times, times[1:])]
                out["ttft_s_repeats"].append(times[0] - start)
                out["tpot_s_repeats"].append(statistics.median(gaps) if gaps else None)
                out["perf_tokens_per_s_repeats"].append(len(times) / (times[-1] - start))
    finally:
        if eager_forward is not None:
            model.forward = eager_forward
    return out


def _perf_repeats() -> int:
    """The repeats ``PERF_VAR`` asks for (0: none)."""
    raw = os.environ.get(PERF_VAR) or "0"
    return int(raw) if raw.isdigit() else 0


def _perf(settings: dict, result: dict, device, synchronize) -> dict:
    """``{"perf": ...}`` after a PASS when ``PERF_VAR`` asks for repeats (a note where the timing
    raised)."""
    repeats = _perf_repeats()
    if repeats <= 0 or result["status"] != PASS or result.get("model") is None:
        return {}
    try:
        return {"perf": timed_repeats(settings, result, device, synchronize, repeats)}
    except Exception as exc:  # noqa: BLE001 a timing beside the verdict, never a change of it
        return {"perf": None, "perf_note": f"the timing raised {type(exc).__name__}: {exc}"[:2000]}


def _no_verdict(sentence: str) -> int:
    """Nothing could run on this stack: the one sentence that says why, on stderr, and
    ``NO_VERDICT_STATUS``."""
    print(f"no verdict: {sentence}", file=sys.stderr)
    return NO_VERDICT_STATUS


def _verdict_line(result: dict) -> str:
    """The run's verdict in words, before its JSON line: the verdict, where and why it failed,
    the exit status."""
    line = f"verdict: {result['status']}"
    if result["status"] != PASS:
        said = (str(result.get("error_message") or "").strip().splitlines() or [""])[0][:300]
        line += (
            f" at {result.get('failure_stage') or '?'}: {result.get('error_type') or 'no error'}"
        )
        line += f": {said}" if said else ""
    return line + f" (exit status {0 if result['status'] == PASS else 1})"


def main(settings: dict, argv: list[str]) -> int | str:
    """The probe again, with plain python: the download stage (a Hub model), the stages on the
    device in the probe's mode, the reference check after a PASS; its verdict in words, then one
    JSON line. The backend's settings as the probe ran them are set first, each said on stdout
    (``apply_device_config``; ``AS_FOUND_FLAG`` anywhere in ``argv`` runs on the stack as found
    instead). A model probed from a local folder takes the folder as its argument. Exit status 0
    on PASS, 1 on a FAIL (or a sentence for a command-line mistake), ``NO_VERDICT_STATUS`` with
    one sentence where this stack cannot run it (its device or backend not here, a mode it
    lacks)."""
    if len(argv) > 3 and argv[1] == "--rank":  # a rank of this script's sharded run (``run_ranks``)
        return _rank(settings, argv[2], argv[3])
    argv, why = set_up_backend(settings, argv)
    if why:
        return _no_verdict(why)
    import torch

    load_from = settings["model_id"]
    if len(argv) > 1:
        load_from = argv[1]
    elif load_from.startswith("local:"):
        return f"{load_from} was a local folder: pass its path, python {argv[0]} /path/to/folder"
    if not is_local(load_from):  # the download stage, as the probe ran it
        got = fetch(
            load_from,
            settings["revision"],
            trust_remote_code=settings["trust_remote_code"],
            log=lambda line: print(line, file=sys.stderr),
        )
        load_from = got["path"]
    # a sharded probe: its ranks again, one process each, as the probe ran them
    if settings["distributed"]:
        if settings["rank_env"] is None or settings["distributed_backend"] is None:
            return _no_verdict(
                "the probe's ranks could not be set up on this device (the record's error says why)"
            )
        return run_ranks(settings, load_from, argv[0])
    missing = fused_eager_missing(settings["device"]) if settings["mode"] == "fused" else None
    if missing:
        return _no_verdict(f"{NOT_AVAILABLE}: {missing}")
    device, synchronize = torch.device(settings["device"]), synchronizer(settings["device"])
    result: dict[str, Any] = run_stages(
        load_from,
        device=device,
        synchronize=synchronize,
        # torch.compile's in mode compile: the adapter's
        compile_backend=settings["compile_backend"] or "inductor",
        keep_model=_perf_repeats() > 0,  # timed again after the verdict (``_perf``)
        **_staged(settings),
    )
    # the environment (a missing torchvision), not the model: no verdict
    if result["exclusion_reason"]:
        return _no_verdict(result["exclusion_reason"])
    result.update(_error(result))
    # the failure's own traceback, said as such, before the verdict's lines
    if result["exception"] is not None:
        print(f"the {result['status']} this run met, its traceback (trimmed):", file=sys.stderr)
        print(trimmed_traceback(result["exception"]), file=sys.stderr)
        sys.stderr.flush()
    timed = _perf(settings, result, device, synchronize)
    # the device's copy let go before the CPU reference loads its own
    result["model"] = result["tokenizer"] = None
    print(_verdict_line(result))
    print(
        json.dumps(
            {
                **{key: result[key] for key in SHOWN},
                **timed,
                **_numerics(settings, load_from, result),
            }
        )
    )
    return 0 if result["status"] == PASS else 1
