"""A what-if sweep is never taken for the stack's (issue 54, item 4): ``latest:NAME`` and every
default that picks a sweep (the report's and the nightly's baseline, the gate's earlier verdicts)
skip it, its exact id or a unique prefix still names it; ``ops`` of one says what it is and where
its answers are; ``list`` shows its own runs' counts, labelled what-if, right after the sweep it
proves.

Sweep folders, records and Parquet files made by hand (no probe runs): two sweeps of the stack
``smoke``, a what-if sweep run by hand under the stack's own name (``sweep -p
host_ops=aten::silu``) whose timed-out stand-in went to ``results`` (as stand-ins did until
review found it), and a what-if sweep ``ops smoke --prove`` ran for the second
(``smoke-what-if``, named in that sweep's proof.json and by its description), with a PASS and a
timeout."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from model_support.errors import UserError
from model_support.record import schema, store
from model_support.record.sweep_meta import ModelEntry, SweepMeta

A, B = "smoke-20261201T000000Z-aaaa", "smoke-20261202T000000Z-bbbb"
BY_HAND = "smoke-20261203T000000Z-cccc"  # sweep -p host_ops=aten::silu, under the stack's name
PROVED = "smoke-what-if-20261204T000000Z-dddd"  # ops B --prove's step 1
# a sweep of the stack after the what-if ones (the baselines' test)
LATER = "smoke-20261205T000000Z-eeee"


def make(data, sweep_id: str, day: int, host_ops: str | None = None, description: str = "") -> None:
    """A sweep of org/a and org/b on the CPU, both stored and compacted: PASS and, for a what-if
    sweep, a timed-out stand-in (carrying the setting only)."""
    probe = {"device": "cpu", **({"host_ops": host_ops, "reference": "cpu"} if host_ops else {})}
    SweepMeta(
        sweep_id=sweep_id,
        name=sweep_id.rsplit("-", 2)[0],
        created_at=f"2026-12-0{day}T00:00:00+00:00",
        probe=probe,
        models=[ModelEntry("org/a"), ModelEntry("org/b")],
        description=description,
    ).write(store.sweep_dir(data, sweep_id))
    hosted = {"what_if": True, "host_ops": host_ops} if host_ops else {}
    rows = [
        schema.empty_record(
            sweep_id=sweep_id, model_id="org/a", status="PASS", device_type="cpu", **hosted
        ),
        schema.empty_record(
            sweep_id=sweep_id,
            model_id="org/b",
            status="FAIL(other)" if host_ops else "PASS",
            error_type="Timeout" if host_ops else None,
            device_type="cpu",
            **({"host_ops": host_ops} if host_ops else {}),
        ),
    ]
    for row in rows:
        store.store_result(data, sweep_id, row, None, "")
    store.compact(data, sweep_id)


def stand_in_in_results(data, sweep_id: str) -> None:
    """The what-if sweep's timed-out stand-in in ``results`` too, as compaction put it before
    review's fix (a pulled history keeps it)."""
    record = schema.empty_record(
        sweep_id=sweep_id,
        model_id="org/b",
        status="FAIL(other)",
        device_type="cpu",
        host_ops="aten::silu",
    )
    store.write_parquet([record], store.parquet_file(data, "results", sweep_id))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from model_support.ops import proof

    data = tmp_path_factory.mktemp("what-if-defaults") / "data"
    make(data, A, 1)
    make(data, B, 2)
    make(data, BY_HAND, 3, "aten::silu")
    stand_in_in_results(data, BY_HAND)
    make(data, PROVED, 4, "aten::rsqrt", proof.description(B, "step 1", "aten::rsqrt"))
    record = proof.read(data, B)
    proof.add_run(
        record, PROVED, "aten::rsqrt", ["org/a [eager+dynamic]", "org/b [eager+dynamic]"], "step 1"
    )
    proof.write(data, B, record)
    return data


def cli(data, *args: str):
    from model_support.cli import main

    return CliRunner().invoke(main, [*args, "--data-dir", str(data)])


def test_latest_of_a_name_is_the_newest_sweep_of_the_stack_and_a_what_if_sweep_is_named_by_its_id(
    data,
):
    # not BY_HAND, newer and of the same name
    assert store.resolve_sweep_id(data, "latest:smoke") == B
    assert store.resolve_sweep_id(data, "latest") == B  # not PROVED, the newest of all
    with pytest.raises(
        UserError,
        match=f"Every sweep named 'smoke-what-if' .* is a what-if sweep .*newest is {PROVED}",
    ):
        store.resolve_sweep_id(data, "latest:smoke-what-if")
    assert store.resolve_sweep_id(data, BY_HAND) == BY_HAND  # its id names it
    assert store.resolve_sweep_id(data, "smoke-20261203") == BY_HAND  # so does a unique prefix
    assert store.resolve_sweep_id(data, "smoke-what-if") == PROVED
    # a command given latest:NAME acts on the stack's sweep
    done = cli(data, "aggregate", "latest:smoke")
    assert done.exit_code == 0 and done.output.startswith(f"{B}: 2 result rows"), done.output


def test_no_default_baseline_is_a_what_if_sweep_even_with_rows_in_results(tmp_path):
    """The report's default baseline, the nightly's (``flakes.baseline_id``) and the gate's
    earlier verdicts all pick by ``previous_sweep_id``: a what-if sweep of the stack's name,
    newer and with a stand-in in results, is none of them."""
    import shutil

    import polars as pl

    from model_support import analysis
    from model_support.analysis import flakes
    from model_support.render import report

    make(tmp_path, A, 1)
    make(tmp_path, BY_HAND, 3, "aten::silu")
    stand_in_in_results(tmp_path, BY_HAND)
    make(tmp_path, LATER, 5)
    sweeps = analysis.sweep_index(tmp_path)
    # it has a results row
    assert sweeps.filter(pl.col("sweep_id") == BY_HAND)["models"].item() == 1
    assert report.previous_sweep(tmp_path, LATER) == A  # the report's default baseline
    assert flakes.baseline_id(tmp_path, store.read_sweep(tmp_path, LATER)) == A  # the nightly's
    assert analysis.previous_sweep_id(sweeps, LATER) == A
    assert analysis.previous_sweep_id(sweeps, BY_HAND) is None  # nor has a what-if sweep one
    assert dict(zip(sweeps["sweep_id"], sweeps["what_if"])) == {
        A: False,
        BY_HAND: True,
        LATER: False,
    }
    pulled = tmp_path / "pulled"  # without sweeps/: its rows say it
    for config in ("results", "excluded", store.WHAT_IF_CONFIG):
        if (tmp_path / config).exists():
            shutil.copytree(tmp_path / config, pulled / config)
    assert analysis.previous_sweep_id(analysis.sweep_index(pulled), LATER) == A


def test_ops_of_a_what_if_sweep_says_what_it_is_and_where_its_answers_are(data):
    """Exit status 0 and one sentence (it is a question with an answer, not bad input); --json
    gives the sentence and its facts; --prove and --complete, which would run it, are refused
    (exit status 2)."""
    done = cli(data, "ops", PROVED)
    said = " ".join(done.output.split())
    assert done.exit_code == 0, done.output
    assert said.startswith(
        f"Sweep {PROVED} is a what-if run of {B} with aten::rsqrt on the host"
    ), said
    assert (
        f"`model-support ops {B}` lists the proof" in said
        and f"`model-support report {PROVED}`" in said
    )
    assert said.count(". ") == 0 and said.endswith(".")  # one sentence
    answer = json.loads(cli(data, "ops", PROVED, "--json").output)
    assert answer | {"said": None} == {
        "sweep_id": PROVED,
        "what_if": True,
        "host_ops": "aten::rsqrt",
        "proves": B,
        "said": None,
    }
    by_hand = " ".join(cli(data, "ops", BY_HAND).output.split())
    assert by_hand.startswith(f"Sweep {BY_HAND} is a what-if run with aten::silu on the host"), (
        by_hand
    )
    assert f"`model-support report {BY_HAND}`" in by_hand
    refused = cli(data, "ops", PROVED, "--prove")
    assert (
        refused.exit_code == 2
        and "--prove and --complete run a plan of the stack's sweep" in refused.output
    )


def test_list_shows_a_what_if_sweeps_own_counts_right_after_the_sweep_it_proves(data):
    rows = json.loads(cli(data, "list", "--json").output)
    assert [r["sweep_id"] for r in rows] == [BY_HAND, B, PROVED, A]  # PROVED, the newest, beside B
    proved = rows[2]
    assert proved["what_if"] == {
        "host_ops": "aten::rsqrt",
        "proves": B,
        "PASS": 1,
        "FAIL(load)": 0,
        "FAIL(gen)": 0,
        "FAIL(other)": 1,  # the timed-out stand-in: one of its runs
    }
    assert [proved[v] for v in schema.VERDICTS] == [0, 0, 0, 0]  # never a verdict of the stack
    assert proved["state"] == "complete, what-if: 2 run(s) with aten::rsqrt on the host"
    # by hand: proves none
    assert rows[0]["what_if"]["proves"] is None and rows[0]["what_if"]["PASS"] == 1
    assert "what_if" not in rows[1] and rows[1]["PASS"] == 2  # the stack's sweep, as before
    table = cli(data, "list").output
    starts = {s: table.index(f"│ {s} ") for s in (A, B, BY_HAND, PROVED)}  # each row's first line
    assert sorted(starts, key=starts.get) == [BY_HAND, B, PROVED, A], table
    line = {s: table[starts[s] :].splitlines()[0] for s in starts}
    assert (
        "↳ smoke-what-if" in line[PROVED]
        and "what-if 1" in line[PROVED]
        and "what-if 0" in line[PROVED]
    ), table
    assert "what-if" not in line[B] and "↳" not in line[BY_HAND] and "what-if 1" in line[BY_HAND], (
        table
    )
    # what the label means
    assert "what-if: a sweep run with operators on the host" in " ".join(table.split())


def test_an_old_what_if_stand_in_in_results_is_no_verdict_of_the_support_card_nor_a_flip(tmp_path):
    """Review: a what-if sweep's timed-out stand-in left in ``results`` (until recompaction) was
    the support card's latest verdict of the stack (FAIL(other), 1 of 3 sweeps agreeing) and a
    flip in the report's streaks (org/b: 4 sweeps, 2 flips, streak 1). Both read the stack's rows
    only (``store.of_the_stack``)."""
    import polars as pl

    from model_support.analysis.history import model_streaks, sweep_index
    from model_support.analysis.support import support
    from model_support.record import store

    data = tmp_path / "data"
    make(data, A, 1)
    make(data, B, 2)
    make(data, BY_HAND, 3, "aten::silu")
    stand_in_in_results(data, BY_HAND)
    make(data, LATER, 5)
    # the stand-in is there
    assert store.scan(data, "results").filter(pl.col("sweep_id") == BY_HAND).collect().height
    cards = support("org/b", data)
    assert {c["sweep_id"] for c in cards} == {LATER} and cards[0]["sweeps"] == 3, cards
    streaks = model_streaks(store.scan(data, "results"), sweep_index(data)).filter(
        pl.col("model_id") == "org/b"
    )
    assert streaks.select("sweeps", "flips", "streak").row(0) == (3, 0, 3), streaks
