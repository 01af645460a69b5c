"""What every exported row, support card and drafted bug report says of a run (issue 54, item 5:
what a new user met).

- Each row carries the command that reproduces that model and variant (``repro.command``:
  ``model-support repro SWEEP MODEL --variant V > run.py && python run.py``), not the path of the
  repro body every row of one code version shares.
- A stack names the backend that ran: the pretend distribution on a pretend row, torch_tpu and
  libtpu only on a TPU row (from ``backend_versions``; an older TPU row from its ``versions``),
  nothing of a backend on a CPU row, though torch_tpu is installed here and ``versions`` says so on
  every row.

Built from records directly (no probe runs): a compacted sweep whose ``sweeps/`` folder is then
removed, as pulled.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import xml.etree.ElementTree as ET

import pytest

from model_support.analysis.support import support
from model_support.probe import repro
from model_support.record import schema, store
from model_support.record.sweep_meta import ModelEntry, SweepMeta
from model_support.render import bug_reports, exports

SWEEP = "nightly-20261206T000000Z-beef"
PRETEND, TPU = "model-support-pretend 0.1.0", ["torch_tpu 0.2.0", "libtpu 0.0.52"]
#: What ``versions`` holds on every row of this environment: torch_tpu is installed, whatever ran.
VERSIONS = {"torch": "2.9.0", "torch_tpu": "0.2.0", "libtpu": "0.0.52", "transformers": "5.25.0"}
# one body for every row of this code: what the exports gave before, the same on each row
BODY = "a" * 64
ROWS = {
    "org/on-pretend": {
        "device_type": "pretend",
        "backend_versions": [PRETEND],
        "status": "FAIL(gen)",
    },
    "org/on-cpu": {"device_type": "cpu", "backend_versions": [], "status": "PASS"},
    "org/on-tpu": {
        "device_type": "tpu",
        "backend_versions": TPU,
        "status": "PASS",
        "variant": "compile+static",
    },
    # before the field
    "org/older-tpu": {"device_type": "tpu", "backend_versions": None, "status": "FAIL(other)"},
}
#: The backend each row names (None: torch alone).
BACKENDS = {
    "org/on-pretend": PRETEND,
    "org/on-cpu": None,
    "org/on-tpu": ", ".join(TPU),
    "org/older-tpu": ", ".join(TPU),
}


@pytest.fixture
def dataset(tmp_path):
    SweepMeta(
        sweep_id=SWEEP,
        name="nightly",
        created_at="2026-12-06T00:00:00+00:00",
        probe={},
        models=[ModelEntry(m) for m in ROWS],
        excluded={"org/gated": "no access"},
    ).write(store.sweep_dir(tmp_path, SWEEP))
    for model_id, fields in ROWS.items():
        record = schema.empty_record(
            sweep_id=SWEEP,
            model_id=model_id,
            versions=VERSIONS,
            repro_sha256=BODY,
            repro_settings="{}",
            duration_s=1.0,
            **fields,
        )
        store.store_result(tmp_path, SWEEP, record, None, "")
    store.compact(tmp_path, SWEEP)
    shutil.rmtree(tmp_path / "sweeps")
    return tmp_path


def variant(model_id: str) -> str:
    return ROWS[model_id].get("variant", "eager+dynamic")


def test_each_row_carries_the_command_that_reproduces_that_model_and_variant(dataset):
    rows = {r["model_id"]: r for r in json.loads(exports.export(dataset, SWEEP, "json"))}
    for model_id in ROWS:
        expected = (
            f"model-support repro {SWEEP} {model_id} --variant {variant(model_id)} --data-dir "
            f"{dataset}"
        )
        assert rows[model_id]["repro"] == f"{expected} > run.py && python run.py"
        assert repro.command(SWEEP, model_id, variant(model_id), dataset) == rows[model_id]["repro"]
    assert rows["org/gated"]["repro"] is None  # excluded: nothing ran, nothing to reproduce
    table = list(csv.DictReader(io.StringIO(exports.export(dataset, SWEEP, "csv"))))
    assert {r["model_id"]: r["repro"] for r in table} == {
        m: r["repro"] or "" for m, r in rows.items()
    }
    text = exports.export(dataset, SWEEP, "markdown")
    # whole, not cut at 160
    assert BODY not in text and all(f"`{rows[m]['repro']}`" in text for m in ROWS)
    suite = ET.fromstring(exports.export(dataset, SWEEP, "junit")).find("testsuite")
    failure = {c.get("name"): c.find("failure") for c in suite.findall("testcase")}[
        "org/on-pretend [eager+dynamic]"
    ]
    assert (
        failure.text.endswith(f"repro: {rows['org/on-pretend']['repro']}")
        and BODY not in failure.text
    )
    # a support card, from the dataset alone: the command of its latest run
    (card,) = support("org/on-tpu", dataset)
    assert card["repro"] == repro.command(SWEEP, "org/on-tpu", "compile+static", dataset)
    # the default data folder is left out; a model probed from a local folder is given it
    assert repro.command("s", "local:tiny-llama", "eager+dynamic", "data") == (
        "model-support repro s local:tiny-llama --variant eager+dynamic > run.py && python "
        "run.py /path/to/tiny-llama"
    )


def test_the_stack_names_the_backend_that_ran(dataset):
    rows = {r["model_id"]: r for r in json.loads(exports.export(dataset, SWEEP, "json"))}
    assert {m: rows[m]["backend"] for m in ROWS} == BACKENDS
    # no column of a backend that only was installed
    assert all("torch_tpu" not in r for r in rows.values())
    table = list(csv.DictReader(io.StringIO(exports.export(dataset, SWEEP, "csv"))))
    assert "torch_tpu" not in table[0] and {
        r["model_id"]: r["backend"] for r in table if r["model_id"] in ROWS
    } == {m: b or "" for m, b in BACKENDS.items()}
    lines = {
        line.split(" | ")[0][2:]: line
        for line in exports.export(dataset, SWEEP, "markdown").splitlines()
    }
    assert (
        f"| {PRETEND} |" in lines["org/on-pretend"] and "torch_tpu" not in lines["org/on-pretend"]
    )
    assert "torch_tpu" not in lines["org/on-cpu"] and "pretend" not in lines["org/on-cpu"]
    suite = ET.fromstring(exports.export(dataset, SWEEP, "junit")).find("testsuite")
    failure = {c.get("name"): c.find("failure") for c in suite.findall("testcase")}[
        "org/on-pretend [eager+dynamic]"
    ]
    assert (
        "stack: pretend: torch 2.9.0, model-support-pretend 0.1.0, transformers 5.25.0"
        in failure.text
    )


def draft_stack(**row) -> str:
    regression = bug_reports.Regression(
        "org/m", "eager+dynamic", "PASS", "FAIL(gen)", "sig", versions=VERSIONS, **row
    )
    text = bug_reports.draft("b", "a", row.get("device_type") or "auto", "", [regression])
    return text.split("## Stack\n\n", 1)[1].strip()


def test_a_drafted_bug_reports_stack_names_the_backend_that_ran():
    pretend = draft_stack(device_type="pretend", backend_versions=[PRETEND])
    assert PRETEND in pretend and "torch_tpu" not in pretend and "libtpu" not in pretend
    assert "torch 2.9.0" in pretend and "transformers 5.25.0" in pretend
    cpu = draft_stack(device_type="cpu", backend_versions=[])
    assert "backend" not in cpu and "torch_tpu" not in cpu and "torch 2.9.0" in cpu
    tpu = draft_stack(device_type="tpu", backend_versions=TPU)
    assert "torch_tpu 0.2.0" in tpu and "libtpu 0.0.52" in tpu
    # an older row: from its versions, a TPU's only
    assert "torch_tpu 0.2.0" in draft_stack(device_type="tpu")
    # ... never on another device's row
    assert "torch_tpu" not in draft_stack(device_type="pretend")
    text = bug_reports.draft(
        SWEEP,
        "a",
        "pretend",
        "",
        [bug_reports.Regression("org/m", "eager+dynamic", "PASS", "FAIL(gen)", "sig")],
    )
    assert f"`{repro.command(SWEEP, 'org/m', 'eager+dynamic')}`" in text and "repro/" not in text
