"""Flakes screened and failures expected, for real: two pretend sweeps of three tiny models, the
second on a stack where OPT's aten::relu is missing every other process (``flaky_ops``) and
Llama's aten::silu always (``missing_ops``), its definition naming an expectations file. Also: a
sweep stopped between attempts, and flips and streaks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from model_support.analysis import flakes, history
from model_support.record import schema, store
from model_support.record.sweep_meta import ModelEntry, SweepMeta
from model_support.sweep import reruns, runner

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "model_support.cli"]
MODELS = ["data/models/tiny-opt", "data/models/tiny-llama", "data/models/tiny-gpt2"]
EXPECT = (
    "local:tiny-llama: {verdict: FAIL(gen), reason: 'https://example.org/issues/7'}\n"
    "local:tiny-gpt2: {verdict: FAIL(gen), reason: 'fixed upstream?'}\n"
    "local:gone: {verdict: FAIL(load), reason: renamed, until: 2020-01-01}\n"
)


def _sweep(tmp_path: Path, data: Path, name: str, config: dict, **extra) -> str:
    definition = {
        "name": "flakes",
        "probe": {"device": "pretend", "judge": False, "perf": False},
        "models": MODELS,
        **extra,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(definition))
    env = {**os.environ, "MODEL_SUPPORT_PRETEND": json.dumps(config)}
    before = set(store.list_sweeps(data)) if data.exists() else set()
    flags = ["--no-report"] if name == "before" else []
    done = subprocess.run(
        [*CLI, "sweep", str(path), "--data-dir", str(data), *flags],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (sweep_id,) = set(store.list_sweeps(data)) - before
    return sweep_id


@pytest.fixture(scope="module")
def two_sweeps(tmp_path_factory, fixture_models):
    tmp = tmp_path_factory.mktemp("flakes")
    data = tmp / "data"
    a = _sweep(tmp, data, "before", {})
    (tmp / "expect.yaml").write_text(EXPECT)
    flaky = {
        "flaky_ops": {"aten::relu": 2},
        "flaky_file": str(tmp / "turns"),
        "missing_ops": ["aten::silu"],
    }
    b = _sweep(tmp, data, "after", flaky, expect="expect.yaml")
    return tmp, data, a, b


def _diff(data: Path, a: str, b: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            *CLI,
            "diff",
            a,
            b,
            "--data-dir",
            str(data),
            "--fail-on",
            "new-failures,regressions",
            *flags,
        ],
        capture_output=True,
        text=True,
    )


def test_a_flaky_model_is_rerun_marked_flaky_and_not_counted_and_one_failing_twice_counts(
    two_sweeps,
):
    tmp, data, a, b = two_sweeps
    assert {r["status"] for r in store.read_records(data, a)} == {"PASS"}
    rows = {r["model_id"]: r for r in store.read_records(data, b)}
    # one each
    assert len(rows) == 3 and len(list((store.sweep_dir(data, b) / "records").glob("*.json"))) == 3
    opt, llama, gpt2 = rows["local:tiny-opt"], rows["local:tiny-llama"], rows["local:tiny-gpt2"]
    assert [x["status"] for x in json.loads(opt["attempts"])] == ["FAIL(gen)", "PASS"] and opt[
        "flaky"
    ] is True
    # the worse attempt is the record
    assert opt["status"] == "FAIL(gen)" and "aten::relu" in opt["error_message"]
    assert [x["status"] for x in json.loads(llama["attempts"])] == ["FAIL(gen)", "FAIL(gen)"]
    assert llama["flaky"] is False
    assert (gpt2["attempts"], gpt2["flaky"]) == (None, None)  # as the baseline: run once
    assert (tmp / "turns").read_text() == "2"  # OPT's two processes, nobody else's
    assert store.read_sweep(data, b).baseline == a
    log = (store.sweep_dir(data, b) / "logs" / f"{store.stem('local:tiny-opt')}.log").read_text()
    assert "===== attempt 1 of 2: FAIL(gen)" in log and "===== attempt 2 of 2: PASS" in log
    # nothing left between attempts
    assert not list((store.sweep_dir(data, b) / reruns.FOLDER).glob("*"))

    # the definition's expectations, recorded in sweep.json: Llama's failure is known
    ok = _diff(data, a, b)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert (
        "flaky: local:tiny-opt [eager+dynamic]: FAIL(gen) then PASS: not counted as a change"
        in ok.stdout
    )
    assert "known failure: local:tiny-llama [eager+dynamic]: FAIL(gen), expected" in ok.stdout
    (tmp / "none.yaml").write_text("local:other: {verdict: FAIL(gen), reason: r}\n")
    # --expect overrides the recorded ones
    counted = _diff(data, a, b, "--expect", str(tmp / "none.yaml"))
    assert counted.returncode == 1
    failing = [
        line
        for line in counted.stdout.splitlines()
        if line.startswith(("regression:", "new failure:"))
    ]
    assert failing == [
        "regression: local:tiny-llama [eager+dynamic]: PASS -> FAIL(gen): "
        + llama["failure_signature"]
    ]


class _Lists(HTMLParser):
    """The report's known-and-new-failures lists: {heading id: [first cell of each row]}."""

    def __init__(self):
        super().__init__()
        self.lists: dict[str, list[str]] = {}
        self._at: str | None = None
        self._cell: list[str] | None = None
        self._first = False

    def handle_starttag(self, tag, attrs):
        if tag == "h3":
            self._at = dict(attrs).get("id")
            self.lists.setdefault(self._at or "", [])
        elif tag == "tr":
            self._first = True
        elif tag == "td" and self._first and self._at:
            self._cell, self._first = [], False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None and self._at:
            self.lists[self._at].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "h2":
            self._at = None


def test_the_report_shows_known_failures_apart_from_new_ones(two_sweeps):
    _, data, _, b = two_sweeps
    page = _Lists()
    page.feed((data / "reports" / f"{b}.html").read_text())
    lists = page.lists
    assert lists["known-failures"] == ["local:tiny-llama"]
    assert lists["flaky"] == ["local:tiny-opt"]
    assert lists["unexpectedly-passing"] == ["local:tiny-gpt2"]
    assert lists["expired-expectations"] == ["local:gone"]
    assert "new-failures" not in lists
    assert (
        "local:tiny-llama" in lists["flips-and-streaks"]
        and "local:tiny-opt" in lists["flips-and-streaks"]
    )


def test_a_sweep_stopped_between_attempts_resumes_without_doubling(tmp_path):
    """The first attempt is kept apart (no record: --resume probes the model again); the next one
    settles it."""
    sweep_id = "s-20261205T000000Z-aaaa"
    meta = SweepMeta(sweep_id, "s", "2026-12-05T00:00:00+00:00", {}, [ModelEntry("org/m")])
    meta.write(store.sweep_dir(tmp_path, sweep_id))
    screen = flakes.Baseline("base", {("org/m", "eager+dynamic"): ("PASS", False)})
    failed = schema.empty_record(
        sweep_id=sweep_id,
        model_id="org/m",
        variant="eager+dynamic",
        status="FAIL(gen)",
        failure_signature="E: boom",
    )
    assert reruns.settle(tmp_path, sweep_id, failed, b"one", "log 1", screen, 1) is None
    # the sweep is stopped here: the model has no record, so a resumed sweep runs it, as its second
    # attempt
    assert [t["model_id"] for t in runner.tasks_to_run(tmp_path, meta)] == ["org/m"]
    passed = schema.empty_record(
        sweep_id=sweep_id, model_id="org/m", variant="eager+dynamic", status="PASS"
    )
    passed["numerics"] = "match"
    settled = reruns.settle(tmp_path, sweep_id, passed, b"two", "log 2", screen, 1)
    assert (
        settled is not None
        and settled.record["flaky"] is True
        and settled.record["status"] == "FAIL(gen)"
    )
    assert settled.notebook == b"one" and "log 1" in settled.log and "log 2" in settled.log
    store.store_result(tmp_path, sweep_id, settled.record, settled.notebook, settled.log)
    reruns.forget(tmp_path, sweep_id, "org/m", "eager+dynamic")
    assert (
        runner.tasks_to_run(tmp_path, meta) == []
        and len(store.read_records(tmp_path, sweep_id)) == 1
    )
    assert not list((store.sweep_dir(tmp_path, sweep_id) / reruns.FOLDER).iterdir())
    again = schema.empty_record(
        sweep_id=sweep_id, model_id="org/m", variant="eager+dynamic", status="FAIL(gen)"
    )
    # reruns: 0 stores at once
    assert reruns.settle(tmp_path, sweep_id, again, None, "", screen, 0) is not None


def test_history_counts_flips_and_streaks(tmp_path):
    verdicts = ["PASS", "FAIL(gen)", "PASS", "FAIL(gen)", "FAIL(gen)", "FAIL(gen)"]
    ids = [f"nightly-2026120{day}T000000Z-aaaa" for day in range(1, 7)]
    for day, (sweep_id, status) in enumerate(zip(ids, verdicts), 1):
        SweepMeta(
            sweep_id, "nightly", f"2026-12-0{day}T00:00:00+00:00", {}, [ModelEntry("org/m")]
        ).write(store.sweep_dir(tmp_path, sweep_id))
        for model_id, verdict in (("org/m", status), ("org/steady", "PASS")):
            record = schema.empty_record(
                sweep_id=sweep_id, model_id=model_id, status=verdict, device_type="cpu"
            )
            record["numerics"] = "match" if verdict == "PASS" else None
            store.store_result(tmp_path, sweep_id, record, None, "")
        store.compact(tmp_path, sweep_id)
    table = history.model_streaks(store.scan(tmp_path), history.sweep_index(tmp_path))
    rows = {r["model_id"]: r for r in table.iter_rows(named=True)}
    m = rows["org/m"]
    assert (m["flips"], m["outcome"], m["streak"], m["since"], m["sweeps"]) == (
        3,
        "FAIL(gen)",
        4 - 1,
        ids[3],
        6,
    )
    assert (
        history.streak_words(m)
        == f"failing (FAIL(gen)) since {ids[3]}, 3 sweeps in a row; 3 flips in 6 sweeps"
    )
    assert (rows["org/steady"]["flips"], rows["org/steady"]["streak"]) == (0, 6)
