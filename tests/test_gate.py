"""``model-support diff A B --fail-on ... --expect FILE``: the gate a CI runs, with expected
verdicts."""

from __future__ import annotations

import datetime as _dt
import subprocess
import sys

import pytest

from helpers import ready_made_sweep
from model_support.analysis import gate
from model_support.errors import UserError
from model_support.record import schema, store
from model_support.record.sweep_meta import ModelEntry, SweepMeta

A, B = "nightly-20261204T000000Z-aaaa", "nightly-20261205T000000Z-bbbb"
BEFORE = {"org/m1": "PASS", "org/m2": "PASS", "org/m3": "FAIL(gen)", "org/m5": "FAIL(gen)"}
AFTER = {
    "org/m1": "PASS",
    "org/m2": "FAIL(gen)",
    "org/m3": "FAIL(gen)",
    "org/m4": "FAIL(load)",
    "org/m5": "PASS",
}


def _sweep(
    data, sweep_id: str, day: int, defined: list[str], rows: dict[str, str], excluded=()
) -> None:
    """A sweep of ready-made records: ``defined`` its definition's models, ``rows`` their
    verdicts, ``excluded`` the models it excluded (an excluded row, the environment's doing)."""
    fields = {m: {"status": status, "device_type": "cpu"} for m, status in rows.items()}
    ready_made_sweep(data, sweep_id, day, fields, defined=defined, excluded=excluded)


@pytest.fixture
def sweeps(tmp_path):
    for day, (sweep_id, statuses) in enumerate(((A, BEFORE), (B, AFTER)), 4):
        _sweep(tmp_path, sweep_id, day, list(statuses), statuses)
    return tmp_path


def expect(tmp_path, text: str):
    path = tmp_path / "expect.yaml"
    path.write_text(text)
    return gate.load_expectations(path)


def test_new_failures_and_regressions_fail_the_gate_and_expectations_make_them_known(
    sweeps, tmp_path
):
    found = gate.gate(sweeps, A, B, ["new-failures"])
    assert found.failing == [
        # a regression is new too
        "regression: org/m2 [eager+dynamic]: PASS -> FAIL(gen): RuntimeError: boom",
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
    assert known.notes == [
        "unexpectedly passing: org/m5 [eager+dynamic] (expected FAIL(gen)): remove the expectation"
    ]
    wrong = expect(
        tmp_path,
        "org/m2: {verdict: FAIL(other), reason: r}\norg/m4: "
        "{verdict: FAIL(load), reason: r, until: 2026-01-01}\n",
    )
    stale = gate.gate(sweeps, A, B, ["new-failures"], wrong, today=_dt.date(2026, 12, 5))
    assert [line.split(":")[1] for line in stale.failing] == [
        " org/m2 [eager+dynamic]",
        " org/m4 [eager+dynamic]",
    ]
    assert "(expected FAIL(other), got FAIL(gen))" in stale.failing[0]
    assert stale.notes == ["expired expectation: org/m4 (until 2026-01-01): renew or remove it"]


def test_the_command_exits_1_naming_the_model_and_0_when_every_failure_is_expected(
    sweeps, tmp_path
):
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
    ok = subprocess.run(
        [*base, "--expect", str(tmp_path / "all.yaml")], capture_output=True, text=True
    )
    assert ok.returncode == 0 and "gate (new-failures): passed" in ok.stdout, ok.stderr
    one = subprocess.run(
        [*base, "--expect", str(tmp_path / "some.yaml")], capture_output=True, text=True
    )
    assert one.returncode == 1 and "new failure: org/m4 [eager+dynamic]" in one.stdout
    assert "gate (new-failures): FAILED: 1 new failure" in one.stdout


def test_a_bad_expectations_file_and_an_unknown_gate_are_one_sentence(tmp_path):
    with pytest.raises(
        UserError,
        match="2 mistakes: .*verdict 'FAIL' is not one of .*an expectation needs a reason",
    ):
        expect(tmp_path, "org/a: {verdict: FAIL, reason: r}\norg/b: {verdict: PASS}\n")
    with pytest.raises(
        UserError, match="'speed' is not one of regressions, new-failures, dropped, perf"
    ):
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
    assert (card["sweeps"], card["agreeing"], card["failure_signature"]) == (
        2,
        1,
        "RuntimeError: boom",
    )
    (five,) = model_support.support("org/m5", sweeps)
    assert (five["verdict"], five["check"], five["suspect"]) == ("PASS", "agrees", False)
    with pytest.raises(UserError, match="No row of 'org/m9'.*did you mean org/m"):
        model_support.support("org/m9", sweeps)
    done = subprocess.run(
        [sys.executable, "-m", "model_support.cli", "support", "org/m2", "--data-dir", str(sweeps)],
        capture_output=True,
        text=True,
    )
    assert (
        done.returncode == 0
        and "FAIL(gen), last verified" in done.stdout
        and "1 of 2 sweeps agree" in done.stdout
    )


def test_a_definitions_expectations_and_reruns_are_checked_before_anything_runs(tmp_path):
    """``expect:`` is relative to the definition and read into sweep.json's form; a missing file,
    a bad rerun count and a bad entry are each one sentence, before a sweep is written."""
    from model_support.analysis import expectations
    from model_support.sweep import definition

    folder = tmp_path / "defs"
    folder.mkdir()
    (folder / "d.yaml").write_text("name: n\nmodels: [org/m]\nexpect: nope.yaml\nreruns: -1\n")
    with pytest.raises(
        UserError, match=r"(?s)2 mistakes.*line 3: expect 'nope.yaml' is no file.*line 4: reruns"
    ):
        definition.load(folder / "d.yaml", check_device=False)
    (folder / "e.yaml").write_text(
        "org/m: {verdict: FAIL(gen), reason: r, until: 2027-01-31}\norg/n: {verdict: FAIL}\n"
    )
    (folder / "d.yaml").write_text("name: n\nmodels: [org/m]\nexpect: e.yaml\nreruns: 2\n")
    params = definition.load(folder / "d.yaml", check_device=False)
    assert params.reruns == 2 and params.expectations["file"] == str(folder / "e.yaml")
    assert params.expectations["entries"]["org/m"]["until"] == "2027-01-31"  # JSON for sweep.json
    with pytest.raises(
        UserError, match=r"2 mistakes: .*e.yaml: org/n: verdict 'FAIL' is not one of"
    ):
        expectations.from_meta(params.expectations)


def test_nothing_vanishes_silently_an_unfinished_sweep_fails_and_exclusions_count_in_neither_direction(
    tmp_path,
):
    """Why 2 and 7: a model with a verdict in A and none in B is named (dropped by the
    definition: failing only ``--fail-on dropped``; left to run: failing every gate, with how to
    finish it; no row and no definition to say why: vanished, a regression); a model excluded in
    A and failing in B counts in neither direction."""
    before = {
        "org/kept": "PASS",
        "org/todo": "PASS",
        "org/dropped": "PASS",
        "org/gone": "FAIL(gen)",
    }
    _sweep(tmp_path, A, 4, list(before) + ["org/excl"], before, excluded=["org/excl"])
    after = {"org/kept": "PASS", "org/excl": "FAIL(gen)", "org/gone": "FAIL(gen)"}
    _sweep(tmp_path, B, 5, ["org/kept", "org/todo", "org/excl", "org/gone"], after)
    found = gate.gate(tmp_path, A, B, ["regressions"])
    assert found.failing == [f"not run: org/todo [eager+dynamic]: {B} has not run it yet"]
    assert found.to_run == [("org/todo", "eager+dynamic")]
    assert f"finish it with `model-support sweep --resume {B}`" in found.notes[-1]
    assert (
        f"dropped: org/dropped [eager+dynamic]: PASS in {A}, left out of {B}'s definition"
        in found.notes
    )
    assert (
        f"excluded: org/excl [eager+dynamic]: excluded in {A} (no access to the gated repo)"
        in found.notes
    )
    assert not any("org/excl" in line for line in found.failing)
    assert any(
        line.startswith("dropped: org/dropped")
        for line in gate.gate(tmp_path, A, B, ["dropped"]).failing
    )
    for line in found.failing + found.notes:
        assert "org/kept" not in line
    import shutil

    shutil.rmtree(tmp_path / "sweeps")  # the dataset alone: no definition says why a row is missing
    pulled = gate.gate(tmp_path, A, B, ["regressions"])
    assert sorted(pulled.failing) == [
        f"vanished: org/dropped [eager+dynamic]: PASS in {A}, no row in {B} (nothing says why)",
        f"vanished: org/todo [eager+dynamic]: PASS in {A}, no row in {B} (nothing says why)",
    ]
    assert pulled.summary() == "FAILED: 2 vanished"


def test_an_expectation_of_a_pass_is_met_by_a_pass_in_the_gate_and_the_report_alike(
    sweeps, tmp_path
):
    """Why 8: ``verdict: PASS`` was "unexpectedly passing" in the gate and nothing in the report."""
    from model_support.analysis import decision, expectations

    known = expect(tmp_path, "org/m1: {verdict: PASS, reason: passes since torch 2.13}\n")
    found = gate.gate(sweeps, A, B, ["regressions"], known)
    assert not any("org/m1" in line for line in found.notes + found.failing)
    table = expectations.standing(decision.read_runs(sweeps, B).runs, known)
    assert "org/m1" not in table["model_id"].to_list()


def test_the_perf_gate_that_compared_nothing_fails(sweeps):
    """Why 2: two sweeps with nothing timed in both used to pass with a "0 run(s) timed" note."""
    found = gate.gate(sweeps, A, B, ["perf"])
    assert found.failed and found.failing[-1].startswith(
        "perf: nothing compared: no run is a PASS timed alike"
    )


def test_the_perf_gate_fails_a_run_timed_in_a_and_not_in_b_and_compares_like_runs_only(tmp_path):
    """Review: B's perf phase breaking (a PASS, "not measured") passed the gate with a note;
    unlike runs compare not."""
    timed = {
        "tpot_s": 0.01,
        "tpot_s_repeats": [0.01, 0.0101, 0.0099],
        "ttft_s": 0.02,
        "ttft_s_repeats": [0.02, 0.0201, 0.0199],
        "perf_tokens_per_s": 100.0,
        "perf_tokens_per_s_repeats": [100.0, 99.0, 101.0],
        "perf_tokens_out": 32,
        "mode": "eager",
        "dtype": "bfloat16",
        "perf_note": "3 repeats of 32 tokens after a warm-up, on the host's wall clock",
    }
    untimed = {"perf_note": "not measured: the perf phase raised OutOfMemoryError"}
    for day, (sweep_id, fields) in enumerate(((A, timed), (B, untimed)), 4):
        SweepMeta(
            sweep_id=sweep_id,
            name="n",
            created_at=f"2026-12-0{day}T00:00:00+00:00",
            probe={},
            models=[ModelEntry("org/m")],
        ).write(store.sweep_dir(tmp_path, sweep_id))
        record = schema.empty_record(
            sweep_id=sweep_id,
            model_id="org/m",
            status="PASS",
            device_type="cuda",
            numerics="match",
            **fields,
        )
        store.store_result(tmp_path, sweep_id, record, None, "")
        store.compact(tmp_path, sweep_id)
    found = gate.gate(tmp_path, A, B, ["perf"])
    assert found.failing[0] == (
        f"perf: not timed: org/m [eager+dynamic]: timed in {A}, not timed in B "
        "(not measured: the perf phase raised OutOfMemoryError)"
    )


def test_the_diffs_table_says_the_gates_words(tmp_path):
    """Review: one `diff` printed a flaky run as "newly failing" and an excluded one as "removed"
    above gate lines saying "flaky" and "excluded"."""
    import json

    from model_support.render.terminal import diff_table

    _sweep(tmp_path, A, 4, ["org/flaky", "org/excl"], {"org/flaky": "PASS", "org/excl": "PASS"})
    _sweep(tmp_path, B, 5, ["org/flaky", "org/excl"], {}, excluded=["org/excl"])
    attempts = json.dumps(
        [{"status": "FAIL(gen)", "suspect": False}, {"status": "PASS", "suspect": False}]
    )
    record = schema.empty_record(
        sweep_id=B,
        model_id="org/flaky",
        status="FAIL(gen)",
        device_type="cpu",
        failure_signature="RuntimeError: boom",
        attempts=attempts,
        flaky=True,
    )
    store.store_result(tmp_path, B, record, None, "")
    store.compact(tmp_path, B)
    table = {r["model_id"]: r["change"] for r in diff_table(tmp_path, A, B).iter_rows(named=True)}
    assert table == {"org/flaky": "flaky", "org/excl": "excluded"}
    assert not gate.gate(tmp_path, A, B, ["regressions", "new-failures"]).failed


def test_a_night_that_excluded_a_model_hides_no_regression_after_it(tmp_path):
    """Review: PASS, then excluded (no access), then FAIL(gen) passed the gate of the last two
    nights for ever."""
    c = "nightly-20261206T000000Z-cccc"
    _sweep(tmp_path, A, 4, ["org/m"], {"org/m": "PASS"})
    _sweep(tmp_path, B, 5, ["org/m"], {}, excluded=["org/m"])
    _sweep(tmp_path, c, 6, ["org/m"], {"org/m": "FAIL(gen)"})
    found = gate.gate(tmp_path, B, c, ["regressions"])
    assert found.failing == [
        f"regression: org/m [eager+dynamic]: PASS (the last verdict before {B}, in {A}) -> "
        "FAIL(gen): RuntimeError: boom"
    ]


# --------------------------------------------------------------------------------------------
# what `make mutation` found no test for (bench/mutation.md)


def test_each_gate_word_is_gated_alone_and_the_rest_said_not_gated(tmp_path):
    """Under ``--fail-on dropped`` a regression and a new failure are said, "not gated", and the
    dropped run after them in the gate's order still fails it; under ``regressions`` the drop is
    said, not failed."""
    _sweep(tmp_path, A, 4, ["org/r", "org/d"], {"org/r": "PASS", "org/d": "PASS"})
    _sweep(tmp_path, B, 5, ["org/r", "org/n"], {"org/r": "FAIL(gen)", "org/n": "FAIL(load)"})
    dropped = gate.gate(tmp_path, A, B, ["dropped"])
    assert dropped.failing == [
        f"dropped: org/d [eager+dynamic]: PASS in {A}, left out of {B}'s definition"
    ]
    assert dropped.notes == [
        "regression: org/r [eager+dynamic]: PASS -> FAIL(gen): RuntimeError: boom (not gated: "
        "add new-failures, regressions to --fail-on)",
        f"new failure: org/n [eager+dynamic]: not in {A} -> FAIL(load): RuntimeError: boom "
        "(not gated: add new-failures to --fail-on)",
    ]
    assert dropped.summary() == "FAILED: 1 dropped" and dropped.changes == []
    regressions = gate.gate(tmp_path, A, B, ["regressions"])
    assert regressions.summary() == "FAILED: 1 regression"
    assert regressions.changes == [
        {"kind": "regression", "model_id": "org/r", "variant": "eager+dynamic", "before": "PASS"}
        | {"after": "FAIL(gen)", "signature": "RuntimeError: boom"}
    ]
    every = gate.gate(tmp_path, A, B, ["regressions", "new-failures", "dropped"])
    assert every.summary() == "FAILED: 1 regression, 1 new failure, 1 dropped"
    assert [(c["kind"], c["before"], c["after"]) for c in every.changes] == [
        ("regression", "PASS", "FAIL(gen)"),
        ("new failure", None, "FAIL(load)"),  # no verdict before: none, not the state "absent"
    ]


def test_a_gate_against_a_sweep_that_is_not_there_is_one_sentence_and_a_bad_word_is_the_first_named(
    tmp_path,
):
    _sweep(tmp_path, B, 5, ["org/m"], {"org/m": "PASS"})
    with pytest.raises(UserError, match=f"No sweep 'nope' in {tmp_path}: nothing to gate against"):
        gate.gate(tmp_path, "nope", B, [])
    with pytest.raises(UserError, match="--fail-on 'speed' is not one of"):
        gate.gate(tmp_path, "nope", B, ["speed", "regressions", "pace"])


def test_the_perf_gates_summary_counts_each_kind_of_failing_line(tmp_path):
    """One run slower, one timed in A and not in B: "FAILED: 1 slower, 1 not timed"; nothing
    compared at all: "1 perf not compared"."""
    timed = {
        "tpot_s_repeats": [0.01, 0.0101, 0.0099],
        "ttft_s_repeats": [0.02, 0.0201, 0.0199],
        "perf_tokens_per_s_repeats": [100.0, 99.0, 101.0],
        "perf_tokens_out": 4,
        "perf_note": "3 repeats of 4 tokens after a warm-up, on the host's wall clock",
    }
    slower = {
        **timed,
        "tpot_s_repeats": [0.013, 0.0131, 0.0129],
        "ttft_s_repeats": [0.026, 0.0261, 0.0259],
    }
    untimed = {"perf_note": "not measured: the perf phase raised OutOfMemoryError"}
    for day, (sweep_id, rows) in enumerate(
        ((A, {"org/s": timed, "org/u": timed}), (B, {"org/s": slower, "org/u": untimed})), 4
    ):
        SweepMeta(
            sweep_id=sweep_id,
            name="n",
            created_at=f"2026-12-0{day}T00:00:00+00:00",
            probe={},
            models=[ModelEntry(m) for m in rows],
        ).write(store.sweep_dir(tmp_path, sweep_id))
        for model_id, fields in rows.items():
            record = schema.empty_record(
                sweep_id=sweep_id,
                model_id=model_id,
                status="PASS",
                device_type="cuda",
                numerics="match",
                **fields,
            )
            store.store_result(tmp_path, sweep_id, record, None, "")
        store.compact(tmp_path, sweep_id)
    found = gate.gate(tmp_path, A, B, ["perf"])
    assert found.summary() == "FAILED: 1 slower, 1 not timed", found.failing
    assert [line.split(":")[0] for line in found.failing] == ["slower", "perf"]
    # B against itself: its timed run within noise, its untimed one unsaid
    same = gate.gate(tmp_path, B, B, ["perf"])
    assert not same.failed and same.summary() == "passed"
