"""The probe's cost for a vision-language model against a text model of about the same size, on the CPU.

Pairs of offline fixtures whose language models have the same widths and depth (the VLM adds a 2-layer
vision tower and a projector, about 15% more parameters): tiny-llama / tiny-llava and tiny-llama /
tiny-idefics3. Two measurements, alternating text and VLM runs so that the shared machine's load falls on
both alike:

- the probe's stages in one warm process (``probe_core.run_stages``, timed at each stage's start through its
  ``on_stage`` hook): load (the processor included for the VLM), template (the chat template, and for the VLM
  the probe image drawn and preprocessed), first token, generation, decode tokens/s, tokens in;
- the command users type, ``papermill notebooks/probe.ipynb out.ipynb -p model_id X`` (with the CPU reference
  check, as a sweep runs it): wall seconds per model.

    .venv/bin/python bench/bench_tasks.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, fixtures, spread, write_results

TEXT = "tiny-llama"
VLMS = ("tiny-llava", "tiny-idefics3")
REPS = 5
COMMAND_REPS = 3


def stages(path: str) -> dict:
    """One probe's stages in this process: seconds per stage, and what the result says."""
    from model_support.probe import probe_core

    marks = {}
    result = probe_core.run_stages(
        path, device="cpu", on_stage=lambda name: marks.setdefault(name, time.perf_counter())
    )
    assert result["status"] == "PASS", result["exception"]
    return {
        "load_s": marks["template"] - marks["load"],
        "template_s": marks["generate"] - marks["template"],
        "first_token_s": result["first_token_s"],
        "generate_s": result["generate_s"],
        "decode_tokens_per_s": result["decode_tokens_per_s"],
        "tokens_in": result["tokens_in"],
        "image_tokens": result["image_tokens"],
        "num_params": result["num_params"],
    }


def command(path: str, work: Path) -> float:
    """Wall seconds of ``papermill notebooks/probe.ipynb`` for one model (CPU reference check
    on)."""
    papermill = os.path.join(os.path.dirname(sys.executable), "papermill")
    name = Path(path).name
    record = work / f"{name}.json"
    start = time.perf_counter()
    subprocess.run(
        [
            papermill,
            "notebooks/probe.ipynb",
            str(work / f"{name}.ipynb"),
            "-p",
            "model_id",
            path,
            "-p",
            "device",
            "cpu",
        ]
        + ["-p", "record_path", str(record)],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=900,
    )
    wall = time.perf_counter() - start
    assert json.loads(record.read_text())["status"] == "PASS"
    return wall


def main() -> None:
    from model_support.probe import probe_core

    found = fixtures()
    names = (TEXT, *VLMS)
    stages(found[TEXT]["path"])  # warm-up: imports and the first load of each library path
    stages(found[VLMS[0]]["path"])
    runs = {name: [] for name in names}
    for _ in range(REPS):
        for name in names:
            runs[name].append(stages(found[name]["path"]))
    start = time.perf_counter()
    for _ in range(REPS):
        probe_core.probe_image()
    image_s = (time.perf_counter() - start) / REPS
    work = Path(tempfile.mkdtemp(prefix="bench-tasks-"))
    walls = {name: [] for name in names}
    for _ in range(COMMAND_REPS):
        for name in names:
            walls[name].append(command(found[name]["path"], work))
    models = {}
    for name in names:
        metrics = {
            key: spread([r[key] for r in runs[name]]) for key in runs[name][0] if key.endswith("_s")
        }
        metrics["decode_tokens_per_s"] = spread([r["decode_tokens_per_s"] for r in runs[name]])
        models[name] = {
            "task": "text-generation" if name == TEXT else "image-text-to-text",
            "num_params": runs[name][0]["num_params"],
            "tokens_in": runs[name][0]["tokens_in"],
            "image_tokens": runs[name][0]["image_tokens"],
            "stages": metrics,
            "command_s": spread(walls[name]),
        }
        print(
            name, json.dumps(models[name]["stages"]["load_s"]), models[name]["command_s"]["median"]
        )
    ratios = {
        vlm: {
            key: round(
                models[vlm]["stages"][key]["median"] / models[TEXT]["stages"][key]["median"], 2
            )
            for key in ("load_s", "template_s", "first_token_s", "generate_s")
        }
        | {
            "command_s": round(
                models[vlm]["command_s"]["median"] / models[TEXT]["command_s"]["median"], 2
            )
        }
        for vlm in VLMS
    }
    write_results(
        "tasks",
        {
            "text": TEXT,
            "vlms": list(VLMS),
            "reps": REPS,
            "command_reps": COMMAND_REPS,
            "models": models,
        }
        | {"ratios": ratios, "probe_image_s": round(image_s, 4)},
    )


if __name__ == "__main__":
    main()
