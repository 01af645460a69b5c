"""The nightly, end to end, for real: `model-support nightly` run twice on the pretend device
from overlay environments (a wheelhouse written by the test), the second night with a backend
fault added, a package changed as well (tinydecoy 1.0 -> 1.1, which no model reads) and one model
made flaky. It exits 1, names the regression, exports JUnit and Markdown, and drafts one bug
report, naming the setting the bisect found (not the package), and none for the flaky model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import yaml

from fixtures.wheelhouse import wheelhouse
from helpers import REPO
from model_support.bisect.envs import Overlays
from model_support.record import store

PRETEND = "MODEL_SUPPORT_PRETEND"


def night(
    overlays: Overlays, pins: dict, definition, data, wheels, config: dict
) -> subprocess.CompletedProcess:
    env = {**os.environ, PRETEND: json.dumps(config)}
    command = [str(overlays.python(pins)), "-m", "model_support.cli", "nightly", str(definition)]
    # no report: an overlay environment's prefix has no nbconvert templates (its sweeps' reports
    # render from .venv)
    command += ["--data-dir", str(data), "--find-links", str(wheels), "--no-report"]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=900)


@pytest.mark.slow
def test_the_nightly_fails_on_the_regression_drafts_one_report_naming_the_setting_and_none_for_a_flake(
    tmp_path, fixture_models
):
    wheels = wheelhouse(tmp_path / "wheels", ["1.0"], broken_from="9.0")
    data = tmp_path / "data"
    # the bisect's default cache: it finds these there
    overlays = Overlays(data / "bisect-envs", wheels)
    definition = tmp_path / "nightly.yaml"
    definition.write_text(
        yaml.safe_dump(
            {
                "name": "nightly",
                "probe": {
                    "device": "pretend",
                    "max_new_tokens": 4,
                    "reference": "none",
                    "judge": False,
                    "perf": False,
                },
                "workers": 2,
                "reruns": 1,
                "models": [
                    str(REPO / "data" / "models" / "tiny-llama"),  # RMSNorm: aten::rsqrt
                    # calls neither: passes both nights
                    str(REPO / "data" / "models" / "tiny-gpt2"),
                    str(REPO / "data" / "models" / "tiny-opt"),  # ReLU: made flaky the second night
                ],
            }
        )
    )
    first = night(overlays, {"tinydecoy": "1.0"}, definition, data, wheels, {"devices": 2})
    assert first.returncode == 0, first.stderr[-3000:]
    assert "nothing to gate against" in first.stdout
    (a,) = store.list_sweeps(data)
    faulty = {
        "devices": 2,
        "missing_ops": ["aten::rsqrt"],
        # every second process that calls it misses it: FAIL then PASS
        "flaky_ops": {"aten::relu": 2},
        "flaky_file": str(tmp_path / "flaky-count"),
    }
    second = night(overlays, {"tinydecoy": "1.1"}, definition, data, wheels, faulty)
    assert second.returncode == 1, second.stderr[-3000:]
    (b,) = set(store.list_sweeps(data)) - {a}
    out = second.stdout
    failing = [
        line.strip()
        for line in out.splitlines()
        if line.strip().startswith(("regression:", "new failure:"))
    ]
    assert failing == [
        f"regression: local:tiny-llama [eager+dynamic+4t]: PASS -> FAIL(gen): {_signature(data, b)}"
    ]
    assert (
        "flaky: local:tiny-opt [eager+dynamic+4t]: FAIL(gen) then PASS: not counted as a change"
        in out
    )
    suite = ET.parse(data / "reports" / f"{b}.junit.xml").getroot().find("testsuite")
    assert suite.get("tests") == "3" and (data / "reports" / f"{b}.md").read_text().startswith(
        f"## Sweep {b}"
    )
    drafts = sorted((data / "reports" / f"{b}-bugs").glob("*.md"))
    assert len(drafts) == 1, drafts
    text = drafts[0].read_text()
    assert "local:tiny-llama" in text and "tiny-opt" not in text and "tiny-gpt2" not in text
    assert "packages that differ: tinydecoy 1.0 -> 1.1" in text  # what changed, both of them ...
    assert (
        "local:tiny-llama [eager+dynamic+4t]: changed by a backend setting: MODEL_SUPPORT_PRETEND"
        in text
    )
    # ... and the bisect names the setting, not the package
    assert "changed by tinydecoy" not in text
    assert f"model-support repro {b} local:tiny-llama --variant eager+dynamic+4t" in text
    assert "aten::rsqrt" in text


def _signature(data, sweep_id: str) -> str:
    (record,) = [
        r for r in store.read_records(data, sweep_id) if r["model_id"] == "local:tiny-llama"
    ]
    return record["failure_signature"]


#: The nightly from Python, as docs/nightly.md shows it: a few lines, its exit status the process's.
FROM_PYTHON = """
import sys
from model_support import workflows
sys.exit(workflows.nightly(sys.argv[1], sys.argv[2], bisect=False, report=False))
"""


@pytest.mark.slow
def test_a_nightly_from_python_says_and_exits_as_the_command_does(tmp_path, fixture_models):
    """The second night of tiny-llama with aten::rsqrt missing, run twice from the same first
    night: once as ``model-support nightly``, once as ``workflows.nightly`` from Python. Both
    exit 1 and name the same regression."""
    definition = tmp_path / "nightly.yaml"
    probe = {
        "device": "pretend",
        "max_new_tokens": 4,
        "reference": "none",
        "judge": False,
        "perf": False,
    }
    models = [fixture_models["tiny-llama"]["path"]]
    definition.write_text(
        yaml.safe_dump({"name": "nightly", "probe": probe, "reruns": 0, "models": models})
    )
    cli = [
        os.path.join(os.path.dirname(sys.executable), "model-support"),
        "nightly",
        str(definition),
    ]
    first = tmp_path / "first"

    def run(command: list[str], fault: dict) -> subprocess.CompletedProcess:
        # the stack's fault, for this night's probes only
        env = {**os.environ, PRETEND: json.dumps(fault)}
        return subprocess.run(
            command, capture_output=True, text=True, cwd=REPO, env=env, timeout=900
        )

    ran = run([*cli, "--data-dir", str(first), "--no-report", "--no-bisect"], {})
    assert ran.returncode == 0, ran.stderr[-3000:]
    shutil.copytree(first, tmp_path / "python")
    fault = {"missing_ops": ["aten::rsqrt"]}
    command = run([*cli, "--data-dir", str(first), "--no-report", "--no-bisect"], fault)
    python = run(
        [sys.executable, "-c", FROM_PYTHON, str(definition), str(tmp_path / "python")], fault
    )
    assert command.returncode == python.returncode == 1, (
        command.stderr[-2000:],
        python.stderr[-2000:],
    )

    def regressions(done: subprocess.CompletedProcess) -> list[str]:
        lines = [line.strip() for line in done.stdout.splitlines()]
        return [line.split("FAIL(")[0] for line in lines if line.startswith("regression:")]

    assert (
        regressions(command)
        == regressions(python)
        == ["regression: local:tiny-llama [eager+dynamic+4t]: PASS -> "]
    )
