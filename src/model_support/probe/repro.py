"""The standalone script stored in every record's ``repro_script``.

It is the source of ``hub_fetch``, ``probe_core`` and ``agreement`` (the very code the probe ran: its
download, its stages and its reference check) followed by a main block with this
probe's settings, so ``python repro.py`` needs only torch and transformers (plus torch_tpu for a
TPU), no papermill and no install of this project, and reaches the same verdict and tokens.
"""

from __future__ import annotations

import inspect
import pprint

from . import agreement, hub_fetch, probe_core

HEADER = '''#!/usr/bin/env python
"""Reproduce the model-support probe of {model_id!r} on {device!r}{sweep}.

Run with plain python: it loads the model in {dtype} (task {task}), builds the prompt ({chat}),
greedily generates {max_new_tokens} tokens and prints one JSON line with the verdict and the token ids,
and, after a PASS with the CPU reference on, numerics: the reference's logits, teacher-forced on these
tokens, against the device's (match / ties / diverges). Exit status 0 on PASS, 1 otherwise. Needs torch
and transformers; an accelerator torch does not ship (device 'tpu', any PrivateUse1 backend) also needs
the package that provides it (loaded through torch's device-backend entry point) and that backend's own
environment (a TPU VM for 'tpu'); an image-text-to-text model also Pillow: its image is drawn by
probe_image() below, the same bytes (sha256 {image_sha256}) as the probe's.
A model probed from a local folder (a model id 'local:<name>') needs that folder:
    python repro.py /path/to/<name>
"""
import os

SETTINGS = {settings}
# `import torch` would autoload every installed out-of-tree backend; load_backend loads the one needed.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
from transformers.utils import logging as hf_logging  # noqa: E402  (after the autoload switch)

hf_logging.disable_progress_bar()  # transformers' "Loading weights" bars would bury what the script prints
'''

MAIN = """

def _rank(rank, world, port, settings, distributed, folder):
    import json
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    pinned = SETTINGS["rank_env"][rank]  # the device adapter's environment for this rank (a TPU rank: its chip)
    os.environ.update(pinned)
    import torch
    import torch.distributed as dist
    from transformers import DistributedConfig

    kind = SETTINGS["device"]
    load_backend(kind)
    device = torch.device("cpu")
    if kind != "cpu":  # each rank its own device, as the probe's ranks; a pinned rank takes its process's one
        index = torch.accelerator.current_device_index() if pinned else rank
        torch.accelerator.set_device_index(index)
        if torch.accelerator.current_device_index() != index:  # a backend the generic call does not reach
            getattr(torch, kind).set_device(index)
        device = torch.device(kind, index)
    backend = SETTINGS["distributed_backend"]  # the probe's process group, as its device adapter named it
    dist.init_process_group(backend=backend, device_id=device if backend == "nccl" else None)
    result = run_stages(device=device, load_kwargs={"distributed_config": DistributedConfig(**distributed)}, **settings)
    exc = result["exception"]
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as handle:
        json.dump({"status": result["status"], "failure_stage": result["failure_stage"],
                   "error_type": type(exc).__name__ if exc is not None else None,
                   "error_message": str(exc)[:2000] if exc is not None else None,
                   "task": result["task"], "tokens_in": result["tokens_in"], "tokens_out": result["tokens_out"],
                   "image_tokens": result["image_tokens"],
                   "output_token_ids": result["output_token_ids"], "failed_step": result["failed_step"],
                   "generated_text": result["generated_text"], "num_params": result["num_params"],
                   "input_ids": result["input_ids"], "step_scores": result["step_scores"]}, handle)


def run_ranks(settings, distributed):
    \"\"\"One process per rank (torch.multiprocessing), each on its own device as the probe ran them (gloo on the
    CPU, the device backend's process group elsewhere); rank 0's result, printed.\"\"\"
    import json
    import socket
    import tempfile

    import torch.multiprocessing as mp

    world = max(v for k, v in distributed.items() if k.endswith("_size"))
    with socket.socket() as probe_port:
        probe_port.bind(("127.0.0.1", 0))
        port = probe_port.getsockname()[1]
    folder = tempfile.mkdtemp(prefix="repro-ranks-")
    mp.spawn(_rank, args=(world, port, settings, distributed, folder), nprocs=world, join=True)
    with open(os.path.join(folder, "rank0.json")) as handle:
        result = json.load(handle)
    print(json.dumps({**_shown(result), **reference_numerics(settings, result)}))
    return 0 if result["status"] == PASS else 1


SHOWN = ("status", "task", "failure_stage", "error_type", "error_message", "tokens_in", "tokens_out",
         "image_tokens", "output_token_ids", "failed_step", "generated_text")


def _shown(result):
    return {key: result.get(key) for key in SHOWN}


def reference_numerics(settings, result):
    \"\"\"The probe's check of a PASS, again: the CPU reference teacher-forced on this run's tokens, compared with
    the device's best logits step by step (``compare``): numerics match / ties / diverges and its figures.\"\"\"
    import torch

    if result["status"] != PASS or SETTINGS["reference"] != "cpu":
        return {}
    if (result["num_params"] or 0) > SETTINGS["reference_max_params"]:
        return {"numerics": None, "numerics_note": f"no reference: above reference_max_params={SETTINGS['reference_max_params']}"}
    dtype = reference_dtype(SETTINGS["device"], settings["dtype"])
    info = {}
    model, tokenizer = load(settings["model_id"], settings["revision"], dtype, settings["trust_remote_code"],
                            torch.device("cpu"), info, task=result.get("task") or settings.get("task", "auto"))
    tokenizer, _ids, _mask, extra = prompt_inputs(model, tokenizer, info, settings["prompt"],
                                                  settings.get("image_prompt", DEFAULT_IMAGE_PROMPT),
                                                  settings["chat_template"])
    logits = teacher_forced_logits(model, result["input_ids"], result["output_token_ids"], extra)
    found = compare(result["step_scores"], logits, SETTINGS["numerics_margin"], SETTINGS["numerics_bound"],
                    decode=tokenizer.decode)
    return {"reference_device": f"cpu:{dtype}", **{key: found[key] for key in RECORD_KEYS}}


if __name__ == "__main__":
    import json
    import sys

    import torch

    load_backend(SETTINGS["device"])
    here = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if SETTINGS["device"] != "cpu" and getattr(here, "type", None) != SETTINGS["device"]:
        sys.exit(f"device {SETTINGS['device']!r} is not available here (torch reports {here or 'no accelerator'})")
    sync = synchronizer(SETTINGS["device"])
    settings = {k: v for k, v in SETTINGS.items() if k not in ("device", "distributed", "distributed_backend", "rank_env",
                                                           "compile_backend", "reference", "reference_max_params",
                                                           "numerics_margin", "numerics_bound")}
    if len(sys.argv) > 1:
        settings["model_id"] = sys.argv[1]
    elif settings["model_id"].startswith("local:"):
        sys.exit(f"{settings['model_id']} was a local folder: pass its path, python {sys.argv[0]} /path/to/folder")
    if not is_local(settings["model_id"]):  # the download stage, as the probe ran it
        got = fetch(settings["model_id"], settings["revision"], trust_remote_code=settings["trust_remote_code"],
                    log=lambda line: print(line, file=sys.stderr))
        settings["model_id"] = got["path"]
    if SETTINGS["distributed"]:  # a sharded probe: its ranks again, one process each, as the probe ran them
        if SETTINGS["rank_env"] is None or SETTINGS["distributed_backend"] is None:
            sys.exit("the probe's ranks could not be set up on this device (the record's error says why)")
        sys.exit(run_ranks(settings, SETTINGS["distributed"]))
    backend = SETTINGS["compile_backend"] or "inductor"  # torch.compile's, in mode compile: the device adapter's
    missing = fused_eager_missing(SETTINGS["device"]) if settings["mode"] == "fused" else None
    if missing:
        sys.exit(f"{NOT_AVAILABLE}: {missing}")
    result = run_stages(device=torch.device(SETTINGS["device"]), synchronize=sync, compile_backend=backend, **settings)
    exc = result["exception"]
    if result["exclusion_reason"]:  # the environment (a missing torchvision), not the model: no verdict
        sys.exit(f"no verdict: {result['exclusion_reason']}")
    result.update(error_type=type(exc).__name__ if exc is not None else None,
                  error_message=str(exc)[:2000] if exc is not None else None)
    print(json.dumps({**_shown(result), **reference_numerics(settings, result)}))
    if exc is not None:
        print(trimmed_traceback(exc), file=sys.stderr)
    sys.exit(0 if result["status"] == PASS else 1)
"""

#: The reference check's settings (the script runs it after a PASS, as the probe did, and prints ``numerics``).
REFERENCE_SETTINGS = ("reference", "reference_max_params", "numerics_margin", "numerics_bound")
#: The settings a repro script carries: run_stages' parameters, the device type and the reference check's.
SETTING_NAMES = (
    "distributed",
    "distributed_backend",
    "rank_env",
    "model_id",
    "revision",
    "dtype",
    "task",
    "prompt",
    "image_prompt",
    "max_new_tokens",
    "chat_template",
    "trust_remote_code",
    "seed",
    "mode",
    "cache",
    "device",
    *REFERENCE_SETTINGS,
    "compile_backend",
)


def repro_script(settings: dict, sweep_id: str | None = None) -> str:
    """The script for one probe; ``settings`` holds SETTING_NAMES (device is the resolved type,
    compile_backend the device adapter's)."""
    chosen = {name: settings.get(name) for name in SETTING_NAMES}
    header = HEADER.format(
        model_id=chosen["model_id"],
        device=chosen["device"],
        sweep=f" (sweep {sweep_id})" if sweep_id else "",
        dtype=chosen["dtype"],
        task=chosen["task"],
        image_sha256=probe_core.probe_image_sha256(),
        chat="through the chat template when the tokenizer has one" if chosen["chat_template"] != "none" else "raw",
        max_new_tokens=chosen["max_new_tokens"],
        settings=pprint.pformat(chosen, sort_dicts=False),
    )
    body = "\n\n".join(inspect.getsource(module) for module in (hub_fetch, probe_core, agreement))
    return header + "\n" + body + MAIN
