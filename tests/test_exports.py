"""``model-support export``: a sweep's support matrix as JUnit XML, Markdown, CSV and JSON, from
the dataset alone."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from model_support.errors import UserError
from model_support.record import schema, store
from model_support.record.sweep_meta import ModelEntry, SweepMeta
from model_support.render import exports

SWEEP = "nightly-20261205T000000Z-abcd"
ROWS = {
    "org/good": {"status": "PASS", "numerics": "match", "decode_tokens_per_s": 41.5},
    "org/wrong": {
        "status": "PASS",
        "numerics": "diverges",
        "decode_tokens_per_s": 40.0,
        "perf_tokens_per_s": 2.1,
    }
    | {"perf_tokens_out": 32},
    "org/broken": {
        "status": "FAIL(gen)",
        "failure_stage": "generate",
        "error_message": "Could not run 'aten::rsqrt'",
        "failure_signature": "NotImplementedError: Could not run <op>",
        "attribution": "stack",
    },
}


@pytest.fixture
def dataset(tmp_path):
    """A compacted sweep (two passes, one suspect; a failure; a model excluded before running),
    then its sweeps/ folder removed: a dataset as pulled from the Hub."""
    SweepMeta(
        sweep_id=SWEEP,
        name="nightly",
        created_at="2026-12-05T00:00:00+00:00",
        probe={},
        models=[ModelEntry(m) for m in ROWS],
        excluded={"org/gated": "no access"},
    ).write(store.sweep_dir(tmp_path, SWEEP))
    for model_id, fields in ROWS.items():
        record = schema.empty_record(
            sweep_id=SWEEP, model_id=model_id, device_type="cpu", duration_s=2.5, **fields
        )
        store.store_result(tmp_path, SWEEP, record, None, "")
    store.compact(tmp_path, SWEEP)
    shutil.rmtree(tmp_path / "sweeps")
    return tmp_path


def test_the_junit_export_has_a_case_per_model_and_the_failures_as_failures(dataset):
    suites = ET.fromstring(exports.export(dataset, SWEEP, "junit"))
    (suite,) = suites.findall("testsuite")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    # unique names
    assert sorted(cases) == [f"{m} [eager+dynamic]" for m in sorted([*ROWS, "org/gated"])]
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("4", "1", "1")
    failure = cases["org/broken [eager+dynamic]"].find("failure")
    assert failure is not None and failure.get("type") == "NotImplementedError: Could not run <op>"
    assert "FAIL(gen) at generate" in failure.get("message") and "whose: stack" in failure.text
    assert cases["org/gated [eager+dynamic]"].find("skipped").get("message") == "no access"
    # a suspect PASS: passing, saying so, unless asked to fail it
    wrong = cases["org/wrong [eager+dynamic]"]
    assert (
        wrong.find("failure") is None and wrong.find("system-out").text == "suspect PASS: diverges"
    )
    strict = ET.fromstring(exports.export(dataset, SWEEP, "junit", suspect_fails=True)).find(
        "testsuite"
    )
    assert strict.get("failures") == "2"
    assert cases["org/good [eager+dynamic]"].get("time") == "2.500"


def test_markdown_csv_and_json_say_the_same_rows(dataset):
    rows = json.loads(exports.export(dataset, SWEEP, "json"))
    assert [(r["model_id"], r["status"], r["check"], r["suspect"]) for r in rows] == [
        ("org/broken", "FAIL(gen)", None, False),
        ("org/gated", "excluded", None, False),
        ("org/good", "PASS", "agrees", False),
        ("org/wrong", "PASS", "diverges", True),
    ]
    table = list(csv.DictReader(io.StringIO(exports.export(dataset, SWEEP, "csv"))))
    assert [r["model_id"] for r in table] == [r["model_id"] for r in rows] and table[2][
        "decode_tokens_per_s"
    ] == "41.5"
    text = exports.export(dataset, SWEEP, "markdown")
    assert (
        "PASS: 2, FAIL(load): 0, FAIL(gen): 1, FAIL(other): 0, excluded: 1; suspect passes: 1"
        in text
    )
    assert sum(line.startswith("| org/") for line in text.splitlines()) == 4 and "\\|" not in text


def test_every_exported_speed_names_its_source_and_is_the_perf_phases_where_there_is_one(dataset):
    """Issue 46, Why 11: the Markdown's tokens/s was the verdict's 8-token rate even where the
    perf phase timed a 19-times slower one."""
    rows = {r["model_id"]: r for r in json.loads(exports.export(dataset, SWEEP, "json"))}
    assert (rows["org/wrong"]["tokens_per_s"], rows["org/good"]["tokens_per_s"]) == (2.1, 41.5)
    assert rows["org/wrong"]["tokens_per_s_source"] == "perf phase, median of repeats of 32 tokens"
    assert rows["org/good"]["tokens_per_s_source"] == "the verdict's generation"
    text = exports.export(dataset, SWEEP, "markdown")
    assert "| 2.1 (perf) |" in text and "| 41.5 (verdict) |" in text and "40.0" not in text


def test_the_command_exports_the_latest_sweep_and_refuses_an_unknown_one(dataset):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "model_support.cli",
            "export",
            SWEEP,
            "--format",
            "junit",
            "--data-dir",
            str(dataset),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert ET.fromstring(done.stdout).find("testsuite").get("tests") == "4"
    with pytest.raises(UserError, match="has no rows of sweep 'other'"):
        exports.export(dataset, "other", "csv")
