"""``model-support diff A B --fail-on ... --expect FILE``: the gate a CI runs, with expected verdicts."""

from __future__ import annotations

import datetime as _dt
import subprocess
import sys

import pytest

from model_support.analysis import gate
from model_support.errors import UserError
from model_support.record import schema, store
from model_support.record.sweep_meta import ModelEntry, SweepMeta

A, B = "nightly-20261204T000000Z-aaaa", "nightly-20261205T000000Z-bbbb"
BEFORE = {"org/m1": "PASS", "org/m2": "PASS", "org/m3": "FAIL(gen)", "org/m5": "FAIL(gen)"}
AFTER = {"org/m1": "PASS", "org/m2": "FAIL(gen)", "org/m3": "FAIL(gen)", "org/m4": "FAIL(load)", "org/m5": "PASS"}


@pytest.fixture
def sweeps(tmp_path):
    for day, (sweep_id, statuses) in enumerate(((A, BEFORE), (B, AFTER)), 4):
        SweepMeta(
            sweep_id=sweep_id,
            name="nightly",
            created_at=f"2026-12-0{day}T00:00:00+00:00",
            probe={},
            models=[ModelEntry(m) for m in statuses],
        ).write(store.sweep_dir(tmp_path, sweep_id))
        for model_id, status in statuses.items():
            failed = status != "PASS"
            record = schema.empty_record(
                sweep_id=sweep_id,
                model_id=model_id,
                status=status,
                device_type="cpu",
                failure_signature="RuntimeError: boom" if failed else None,
                numerics=None if failed else "match",
            )
            store.store_result(tmp_path, sweep_id, record, None, "")
        store.compact(tmp_path, sweep_id)
    return tmp_path


def expect(tmp_path, text: str):
    path = tmp_path / "expect.yaml"
    path.write_text(text)
    return gate.load_expectations(path)


def test_new_failures_and_regressions_fail_the_gate_and_expectations_make_them_known(sweeps, tmp_path):
    found = gate.gate(sweeps, A, B, ["new-failures"])
    assert found.failing == [
        "new failure: org/m2 [eager+dynamic]: PASS -> FAIL(gen): RuntimeError: boom",
        "new failure: org/m4 [eager+dynamic]: not in " + A + " -> FAIL(load): RuntimeError: boom",
    ]  # m3 failed before too: not new; m5 passes now
    assert [line.split(":")[1] for line in gate.gate(sweeps, A, B, ["regressions"]).failing] == [
        " org/m2 [eager+dynamic]"
    ]
    every = expect(
        tmp_path,
        "org/m2: {verdict: FAIL(gen), reason: 'https://example.org/issue/1'}\n"
        "org/m4: {verdict: FAIL(load), reason: needs a vision tower}\n"
        "org/m5: {verdict: FAIL(gen), reason: 'fixed upstream?'}\n",
    )
    known = gate.gate(sweeps, A, B, ["new-failures", "regressions"], every)
    assert not known.failed and len(known.known) == 2
    assert known.notes == ["unexpectedly passing: org/m5 [eager+dynamic] (expected FAIL(gen)): remove the expectation"]
    wrong = expect(
        tmp_path,
        "org/m2: {verdict: FAIL(other), reason: r}\norg/m4: {verdict: FAIL(load), reason: r, until: 2026-01-01}\n",
    )
    stale = gate.gate(sweeps, A, B, ["new-failures"], wrong, today=_dt.date(2026, 12, 5))
    assert [line.split(":")[1] for line in stale.failing] == [" org/m2 [eager+dynamic]", " org/m4 [eager+dynamic]"]
    assert "(expected FAIL(other), got FAIL(gen))" in stale.failing[0]
    assert stale.notes == ["expired expectation: org/m4 (until 2026-01-01): renew or remove it"]


def test_the_command_exits_1_naming_the_model_and_0_when_every_failure_is_expected(sweeps, tmp_path):
    (tmp_path / "all.yaml").write_text(
        "org/m2: {verdict: FAIL(gen), reason: r}\norg/m4: {verdict: FAIL(load), reason: r}\n"
    )
    (tmp_path / "some.yaml").write_text("org/m2: {verdict: FAIL(gen), reason: r}\n")
    base = [
        sys.executable,
        "-m",
        "model_support.cli",
        "diff",
        A,
        B,
        "--data-dir",
        str(sweeps),
        "--fail-on",
        "new-failures",
    ]
    ok = subprocess.run([*base, "--expect", str(tmp_path / "all.yaml")], capture_output=True, text=True)
    assert ok.returncode == 0 and "gate (new-failures): passed" in ok.stdout, ok.stderr
    one = subprocess.run([*base, "--expect", str(tmp_path / "some.yaml")], capture_output=True, text=True)
    assert one.returncode == 1 and "new failure: org/m4 [eager+dynamic]" in one.stdout
    assert "gate (new-failures): FAILED, 1 regression(s)" in one.stdout


def test_a_bad_expectations_file_and_an_unknown_gate_are_one_sentence(tmp_path):
    with pytest.raises(UserError, match="2 mistakes: .*verdict 'FAIL' is not one of .*an expectation needs a reason"):
        expect(tmp_path, "org/a: {verdict: FAIL, reason: r}\norg/b: {verdict: PASS}\n")
    with pytest.raises(UserError, match="'speed' is not one of regressions, new-failures, perf"):
        gate.gate(tmp_path, "a", "b", ["speed"])


def test_a_models_support_card_comes_from_the_dataset(sweeps):
    import shutil

    import model_support

    shutil.rmtree(sweeps / "sweeps")  # the dataset alone, as pulled from the Hub
    (card,) = model_support.support("org/m2", sweeps)
    assert (card["device_type"], card["variant"], card["verdict"], card["sweep_id"]) == (
        "cpu",
        "eager+dynamic",
        "FAIL(gen)",
        B,
    )
    assert (card["sweeps"], card["agreeing"], card["failure_signature"]) == (2, 1, "RuntimeError: boom")
    (five,) = model_support.support("org/m5", sweeps)
    assert (five["verdict"], five["check"], five["suspect"]) == ("PASS", "agrees", False)
    with pytest.raises(UserError, match="No row of 'org/m9'.*did you mean org/m"):
        model_support.support("org/m9", sweeps)
    done = subprocess.run(
        [sys.executable, "-m", "model_support.cli", "support", "org/m2", "--data-dir", str(sweeps)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and "FAIL(gen), last verified" in done.stdout and "1 of 2 sweeps agree" in done.stdout


def test_a_definitions_expectations_and_reruns_are_checked_before_anything_runs(tmp_path):
    """``expect:`` is relative to the definition and read into sweep.json's form; a missing file, a bad rerun count
    and a bad entry are each one sentence, before a sweep is written."""
    from model_support.analysis import expectations
    from model_support.sweep import definition

    folder = tmp_path / "defs"
    folder.mkdir()
    (folder / "d.yaml").write_text("name: n\nmodels: [org/m]\nexpect: nope.yaml\nreruns: -1\n")
    with pytest.raises(UserError, match=r"(?s)2 mistakes.*line 3: expect 'nope.yaml' is no file.*line 4: reruns"):
        definition.load(folder / "d.yaml", check_device=False)
    (folder / "e.yaml").write_text(
        "org/m: {verdict: FAIL(gen), reason: r, until: 2027-01-31}\norg/n: {verdict: FAIL}\n"
    )
    (folder / "d.yaml").write_text("name: n\nmodels: [org/m]\nexpect: e.yaml\nreruns: 2\n")
    params = definition.load(folder / "d.yaml", check_device=False)
    assert params.reruns == 2 and params.expectations["file"] == str(folder / "e.yaml")
    assert params.expectations["entries"]["org/m"]["until"] == "2027-01-31"  # JSON for sweep.json
    with pytest.raises(UserError, match=r"2 mistakes: .*e.yaml: org/n: verdict 'FAIL' is not one of"):
        expectations.from_meta(params.expectations)
