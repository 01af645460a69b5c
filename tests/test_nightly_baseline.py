"""The nightly gates from its second night on whatever ``reruns`` says (issue 46, Why 1): with
``reruns: 0`` the runner used to record no baseline, and the nightly read that as "nothing to
gate against" and exited 0 over a PASS -> FAIL(gen). Two real nights of one tiny model on the
pretend device, the second missing the operator the model's activation needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from helpers import REPO
from model_support.record import store


def _night(definition, data, config: dict) -> subprocess.CompletedProcess:
    env = {**os.environ, "MODEL_SUPPORT_PRETEND": json.dumps(config)}
    command = [
        sys.executable,
        "-m",
        "model_support.cli",
        "nightly",
        str(definition),
        "--data-dir",
        str(data),
    ]
    return subprocess.run(
        [*command, "--no-report", "--no-bisect"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )


@pytest.mark.slow
def test_a_nightly_with_no_reruns_gates_against_the_last_night_and_names_it(
    tmp_path, fixture_models
):
    data = tmp_path / "data"
    definition = tmp_path / "nightly.yaml"
    probe = {
        "device": "pretend",
        "max_new_tokens": 4,
        "reference": "none",
        "judge": False,
        "perf": False,
    }
    model = str(REPO / "data" / "models" / "tiny-llama")  # SiLU: aten::silu
    definition.write_text(
        yaml.safe_dump({"name": "nightly", "probe": probe, "reruns": 0, "models": [model]})
    )
    first = _night(definition, data, {})
    assert first.returncode == 0, first.stderr[-3000:]
    assert "nothing to gate against" in first.stdout
    (a,) = store.list_sweeps(data)
    assert store.read_sweep(data, a).baseline == ""  # chosen, and none: recorded as such
    second = _night(definition, data, {"missing_ops": ["aten::silu"]})
    (b,) = set(store.list_sweeps(data)) - {a}
    assert store.read_sweep(data, b).baseline == a
    assert second.returncode == 1, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"gate:     {b} against {a}" in second.stdout
    assert "regression: local:tiny-llama [eager+dynamic+4t]: PASS -> FAIL(gen)" in second.stdout
    assert "gate: FAILED: 1 regression" in second.stdout
