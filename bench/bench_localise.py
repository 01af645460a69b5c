"""The localiser's time (``model-support localise``) on the smoke list's tiny models and on SmolLM2-135M.

Each model gets a one-model sweep on the pretend device whose stack has bf16-sized noise on every matrix product
(``wrong_ops`` {aten::mm, aten::bmm, aten::addmm: 0.0039}): the command a user types, timed end to end in a fresh
process (imports, the model's load as the probe does, one forward with every operator replayed on the CPU, the
result stored), goal under a minute each; and, on real models, no false alarm (nothing may be flagged under that
noise). Then SmolLM2 once more with every matmul off by 2%, which must be named (``aten::mm`` in the first
projection). Models whose processor this environment cannot build (torchvision missing) are listed as skipped.

    .venv/bin/python bench/bench_localise.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import REPO, fixtures, write_results

NOISE = {"wrong_ops": {"aten::mm": 0.0039, "aten::bmm": 0.0039, "aten::addmm": 0.0039}}
TWO_PERCENT = {"wrong_ops": {"aten::mm": 0.02, "aten::addmm": 0.02}}
GOAL_S = 60.0


def smoke_models() -> list[str]:
    """The smoke list's tiny models (their folder names), and SmolLM2-135M-Instruct."""
    listed = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())["models"]
    names = [Path(m if isinstance(m, str) else m["id"]).name for m in listed]
    return [n for n in names if n.startswith("tiny-")] + ["SmolLM2-135M-Instruct"]


def one_model_sweep(data: Path, name: str, path: str, config: dict) -> None:
    from model_support.probe.records import new_record
    from model_support.record import store
    from model_support.record.sweep_meta import ModelEntry, SweepMeta

    SweepMeta(
        sweep_id="s",
        name="s",
        created_at="2026-12-01T00:00:00+00:00",
        probe={"device": "pretend", "dtype": "bfloat16"},
        models=[ModelEntry(f"local:{name}", path)],
        device_config={"MODEL_SUPPORT_PRETEND": json.dumps(config)},
    ).write(store.sweep_dir(data, "s"))
    record = new_record(
        f"local:{name}", {"device": "pretend"}, sweep_id="s", status="PASS", device_type="pretend"
    )
    store.store_result(data, "s", record, None, "")


def localise(name: str, path: str, config: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        one_model_sweep(data, name, path, config)
        env = {
            **os.environ,
            "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
            "MODEL_SUPPORT_PRETEND": json.dumps(config),
        }
        command = [
            sys.executable,
            "-m",
            "model_support.cli",
            "localise",
            "s",
            name,
            "--json",
            "--data-dir",
            str(data),
        ]
        started = time.perf_counter()
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, cwd=REPO, timeout=900
        )
        seconds = time.perf_counter() - started
    if done.returncode != 0:
        return {"skipped": (done.stderr.strip().splitlines() or ["?"])[-1][:200]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "command_s": round(seconds, 2),
        "forward_s": result["seconds"],
        "ops_checked": result["ops_checked"],
        "operator": result["operator"],
        "module": result["module"],
        # checked up to there only
        "forward_raised": (result["forward_failure"] or {}).get("error_message"),
    }


def main() -> None:
    models = fixtures()
    rows = {}
    for name in smoke_models():
        rows[name] = localise(name, models[name]["path"], NOISE)
        print(name, rows[name], flush=True)
    found = localise("SmolLM2-135M-Instruct", models["SmolLM2-135M-Instruct"]["path"], TWO_PERCENT)
    print("SmolLM2 with 2%:", found, flush=True)
    timed = [r for r in rows.values() if "command_s" in r]
    write_results(
        "localise",
        {
            "noise": NOISE,
            "two_percent": TWO_PERCENT,
            "goal_s": GOAL_S,
            "models": rows,
            "smollm2_two_percent": found,
            "met": {
                "under_a_minute_each": all(r["command_s"] < GOAL_S for r in timed),
                "no_false_alarm_under_bf16_noise": all(r["operator"] is None for r in timed),
                "two_percent_named": found.get("operator") == "aten::mm",
            },
        },
    )


if __name__ == "__main__":
    main()
