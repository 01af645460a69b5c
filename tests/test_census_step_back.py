"""A generation that fails after the sampled census stepped off torch's dispatch stack leaves torch
as it found it.

The census steps off once two decode steps in a row dispatch alike (``Census.following``) and back
on when the generation's streamer ends; generate() ends its streamer only when it finishes, so a
later step that raised left the Python dispatch key switched on with no mode to take it, inside
``inference_mode``'s restore: every later operator of the process (the attribution's CPU rerun)
failed on an internal assert and the failure read as both stacks'. Found in review with a sliding
window of 8 (its mask's ``aten::le.Tensor`` first dispatched past it) that the device lacks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from helpers import REPO

CHILD = """
import json, sys
import torch
from model_support.probe.run import run_probe
r = run_probe(sys.argv[1], device="pretend", reference="none", judge=False, perf="off", max_new_tokens=12)
try:
    ok = (torch.ones(2) + 1).tolist() == [2.0, 2.0]
except Exception as exc:
    ok = f"{type(exc).__name__}: {exc}"[:200]
print(json.dumps({"status": r["status"], "stage": r["failure_stage"], "torch_after": ok}))
"""


def test_a_step_failing_after_the_census_stepped_off_leaves_torch_working(tmp_path, fixture_models):
    model = tmp_path / "mistral-window-8"
    shutil.copytree(fixture_models["tiny-mistral"]["path"], model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "sliding_window": 8}))
    env = {
        **os.environ,
        "MODEL_SUPPORT_PRETEND": json.dumps({"missing_ops": ["aten::le.Tensor"]}),
    }
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(model)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert (out["status"], out["stage"]) == ("FAIL(gen)", "generate") and out[
        "torch_after"
    ] is True, out
