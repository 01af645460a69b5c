"""Stacks side by side: a sweep whose definition lists ``stacks:`` runs every model on each stack (its backend
settings set for its probes), each row naming its stack (``stack_name``, and the variant ``...@NAME``), and the
report shows a column per stack naming the runs whose verdict differs."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from helpers import stored_records
from model_support.sweep import definition
from model_support.sweep.definition import SweepConfigError

REPO = Path(__file__).resolve().parents[1]
PRETEND = "MODEL_SUPPORT_PRETEND"
STACKS = {
    "base": {PRETEND: json.dumps({"devices": 2})},
    "no-rsqrt": {PRETEND: json.dumps({"devices": 2, "missing_ops": ["aten::rsqrt"]})},
}


def cli(args: list, data: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", PRETEND: json.dumps({"devices": 2})}
    return subprocess.run(
        [sys.executable, "-m", "model_support.cli", *args, "--data-dir", str(data)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=900,
    )


def write_definition(folder: Path, stacks: dict, models=("tiny-llama", "tiny-gpt2")) -> Path:
    """RMSNorm's tiny-llama calls aten::rsqrt; LayerNorm's tiny-gpt2 does not."""
    import yaml

    path = folder / "stacks.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "stacks",
                "probe": {"device": "pretend", "max_new_tokens": 4, "reference": "none", "perf": False},
                "workers": 2,
                "stacks": stacks,
                "models": [str(REPO / "data" / "models" / m) for m in models],
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def stacks_sweep(tmp_path_factory, fixture_models) -> dict:
    folder = tmp_path_factory.mktemp("stacks")
    data = folder / "data"
    done = cli(["sweep", str(write_definition(folder, {n: {"env": e} for n, e in STACKS.items()}))], data)
    assert done.returncode == 0, done.stderr[-3000:]
    (sweep,) = [p.name for p in (data / "sweeps").iterdir()]
    return {"data": data, "sweep": sweep, "records": stored_records(data, sweep), "out": done.stdout}


def test_every_model_runs_on_every_stack_with_its_settings(stacks_sweep):
    got = {(r["model_id"], r["stack_name"]): r for r in stacks_sweep["records"]}
    assert sorted(got) == [
        ("local:tiny-gpt2", "base"),
        ("local:tiny-gpt2", "no-rsqrt"),
        ("local:tiny-llama", "base"),
        ("local:tiny-llama", "no-rsqrt"),
    ]
    assert {r["variant"] for r in got.values()} == {"eager+dynamic+4t@base", "eager+dynamic+4t@no-rsqrt"}
    assert got["local:tiny-llama", "base"]["status"] == "PASS"
    failed = got["local:tiny-llama", "no-rsqrt"]
    assert failed["status"] == "FAIL(gen)" and "aten::rsqrt" in failed["error_message"]
    assert got["local:tiny-gpt2", "no-rsqrt"]["status"] == "PASS"
    for (_, stack), record in got.items():  # the repro script sets the stack's own backend configuration
        assert json.loads(record["repro_settings"])["device_config"][PRETEND] == STACKS[stack][PRETEND]


def test_the_report_has_a_column_per_stack_and_names_the_run_that_differs(stacks_sweep):
    data, sweep = stacks_sweep["data"], stacks_sweep["sweep"]
    page = (data / "reports" / f"{sweep}.html").read_text()
    section = page[page.index('id="stacks"') :]
    section = section[: section.index("</table>")]
    header = re.search(r"<tr>(.*?)</tr>", section, re.S).group(1)
    assert [html.unescape(h) for h in re.findall(r"<th[^>]*>(.*?)</th>", header)] == [
        "model",
        "variant",
        "base",
        "no-rsqrt",
    ]
    assert "1 of 2 runs differ between the stacks" in section
    assert "local:tiny-llama</b> [eager+dynamic+4t]: PASS on base, FAIL(gen) on no-rsqrt" in section
    junit = cli(["export", sweep, "--format", "junit"], data)  # unique case names per model, variant and stack
    names = [c.get("name") for c in ET.fromstring(junit.stdout).iter("testcase")]
    assert len(names) == len(set(names)) == 4


def test_a_stack_is_refused_when_it_cannot_run(tmp_path, fixture_models):
    with pytest.raises(SweepConfigError) as refused:
        definition.load(
            write_definition(
                tmp_path,
                {"bad name!": {"env": {}}, "tf": {"packages": {"transformers": "5.24.0"}}, "x": {"env": {"1A": "v"}}},
            )
        )
    said = str(refused.value)
    assert "3 mistakes" in said and "'bad name!' is not a plain name" in said
    assert "a stack's packages are not run by a sweep yet" in said and "'1A' is not an environment variable" in said
