"""Issue 56's acceptance on SmolLM2-135M-Instruct, as the issue states it: a fault from position 600 is caught there
by the long text and missed by the 8-token verdict.

The pretend device with ``_safe_softmax`` wrong once attention reads 600 key positions (``wrong_past_length``):

1. the verdict, a real papermill probe (``helpers``-free: ``run.run_probe`` as a sweep's kernel runs it) on the
   pretend device with the CPU reference: PASS, numerics ``match`` (its prompt and 8 tokens never reach 600);
2. the long text over 640 positions on the same device (``long_text.run_paths`` then ``checks.check_pass``, as the
   probe's device phase and host checks run them): the decode path diverges at position 599 or 600, the gated rate
   collapses, the one prefill over 640 positions is wrong from its start.

The suite checks the same on tiny-llama from position 160 of 256 (tests/test_long_text.py: seconds, where this is
minutes of the pretend device's Python dispatch over SmolLM2's 30 layers).

    .venv/bin/python bench/bench_long_text_late_fault.py [--late 600] [--tokens 640]

Results: bench/results/long_text_late_fault.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from common import REPO, fixtures, write_results

CHILD = """
import json, sys
import torch
from model_support.probe import checks, devices, probe_core, probe_params
from model_support.probe.run import DEFAULTS, run_probe
from model_support.record import schema
model, tokens, work = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(1)
verdict = run_probe(model, record_path=work + "/verdict.json", device="pretend", reference="cpu", judge=False,
                    perf="off")
adapter = devices.resolve("pretend")
settings = {**DEFAULTS, "device": "pretend", "long_text": "on", "long_text_tokens": tokens, "judge": False,
            "load_from": model, "model_id": model}
result = probe_core.run_stages(model_id=model, **probe_params.stage_settings(settings), device=adapter.torch_device,
                               synchronize=adapter.synchronize, keep_model=True)
record = schema.empty_record(model_id="local:" + model.rsplit("/", 1)[-1], device_type="pretend",
                             status=result["status"], num_params=result["num_params"],
                             output_token_ids=result["output_token_ids"])
found = checks.long_text_on_device(record, settings, result, adapter)
checks.check_pass(record, settings, result["step_scores"], result["input_ids"], found)
print(json.dumps({"verdict": {k: verdict[k] for k in ("status", "numerics", "numerics_note", "tokens_in",
                                                       "tokens_out")},
                  "long_text": {k: v for k, v in record.items() if k.startswith("long_text")}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument(
        "--late", type=int, default=600, help="the key position the fault starts at"
    )
    parser.add_argument("--tokens", type=int, default=640, help="the long text's length")
    args = parser.parse_args()
    model = fixtures()[args.model]["path"]
    work = tempfile.mkdtemp(prefix="bench-late-fault-")
    fault = {"wrong_past_length": {"aten::_safe_softmax": args.late}}
    env = {
        **os.environ,
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
        "HF_HUB_OFFLINE": "1",
        "MODEL_SUPPORT_PRETEND": json.dumps(fault),
        "MODEL_SUPPORT_DATA_DIR": work,
    }
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(model), str(args.tokens), work],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=7200,
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    found = json.loads(done.stdout.strip().splitlines()[-1])
    found.update(
        model=args.model,
        late=args.late,
        tokens=args.tokens,
        wall_s=round(time.perf_counter() - began, 1),
    )
    lt, verdict = found["long_text"], found["verdict"]
    caught = lt["long_text_decode_diverges_at"] in (args.late - 1, args.late)
    missed = verdict["status"] == "PASS" and verdict["numerics"] == "match"
    found["shown"] = caught and missed
    write_results("long_text_late_fault", found)
    print(
        f"verdict: {verdict['status']}, numerics {verdict['numerics']} ({verdict['tokens_in']} "
        f"+ {verdict['tokens_out']} tokens); long text: {lt['long_text_note']}; shown: "
        f"{found['shown']}"
    )
    if not found["shown"]:
        raise SystemExit("the late fault was not caught where it starts, or the verdict saw it")


if __name__ == "__main__":
    main()
