"""The store's journal (``store.change``), in one process and in well under a second: what a
change writes before its body, what it leaves when the body raises, what the next command
finishes (its sidecars as the journal says, the Parquet files rebuilt from the records, the
journal removed, one sentence), a torn journal, a sweep another process is writing.
tests/test_store_faults.py stops real processes at every write point; these are the rules it
rests on, fast enough for ``make mutation`` (bench/mutation.py) to run against every mutant of
them."""

from __future__ import annotations

import fcntl
import json

import pyarrow.parquet as pq
import pytest

from model_support.errors import UserError
from model_support.fileio import atomic_write_json
from model_support.record import schema, store
from model_support.record.sweep_meta import ModelEntry, SweepMeta

SWEEP, OTHER = "journal-20261205T000000Z-abcd", "journal-20261206T000000Z-efgh"


def _sweep(data, sweep_id: str = SWEEP, models=("org/a", "org/b")) -> None:
    """A sweep of two stored records, not compacted (its Parquet files are what a change
    rebuilds)."""
    SweepMeta(
        sweep_id=sweep_id,
        name="journal",
        created_at="2026-12-05T00:00:00+00:00",
        probe={},
        models=[ModelEntry(m) for m in models],
    ).write(store.sweep_dir(data, sweep_id))
    for model_id in models:
        store.store_result(
            data,
            sweep_id,
            schema.empty_record(sweep_id=sweep_id, model_id=model_id, status="PASS"),
            None,
            "",
        )


def _journal(data, sweep_id: str = SWEEP):
    return store.sweep_dir(data, sweep_id) / store.CHANGE


def _models(data, config: str, sweep_id: str = SWEEP) -> list[str]:
    path = store.parquet_file(data, config, sweep_id)
    return (
        sorted(pq.read_table(path, columns=["model_id"])["model_id"].to_pylist())
        if path.exists()
        else []
    )


def test_a_change_is_journaled_before_its_body_and_the_journal_removed_after_it(tmp_path):
    _sweep(tmp_path)
    sidecars = {"exclusion.json": {"reason": "a broken stack"}}
    with store.writing(tmp_path, SWEEP), store.change(tmp_path, SWEEP, "exclude", sidecars):
        entry = json.loads(_journal(tmp_path).read_text())
        assert (entry["change"], entry["sidecars"]) == ("exclude", sidecars) and entry[
            "at"
        ].startswith("20")
        assert store.interrupted(tmp_path) == [SWEEP]
    assert not _journal(tmp_path).exists() and store.interrupted(tmp_path) == []
    with store.writing(tmp_path, SWEEP), store.change(tmp_path, SWEEP, "compact"):
        # none given: none to set
        assert json.loads(_journal(tmp_path).read_text())["sidecars"] == {}


def test_a_change_nested_in_an_open_one_of_the_same_sweep_is_covered_by_the_outer_journal(tmp_path):
    _sweep(tmp_path)
    with (
        store.writing(tmp_path, SWEEP),
        store.change(tmp_path, SWEEP, "exclude", {"exclusion.json": None}),
    ):
        with store.change(tmp_path, SWEEP, "compact"):
            # not rewritten
            assert json.loads(_journal(tmp_path).read_text())["change"] == "exclude"
        assert _journal(tmp_path).exists()  # the inner change's end removes nothing
        # this process's own open change is no interrupted one
        assert store.finish_interrupted(tmp_path) == []
    assert not _journal(tmp_path).exists()


def test_a_body_that_raises_leaves_the_change_half_done_for_the_next_command(tmp_path):
    _sweep(tmp_path)
    _sweep(tmp_path, OTHER, ("org/c",))
    with pytest.raises(RuntimeError, match="stopped"):
        with (
            store.writing(tmp_path, SWEEP),
            store.change(tmp_path, SWEEP, "exclude", {"exclusion.json": {"reason": "r"}}),
        ):
            raise RuntimeError("stopped midway")
    assert _journal(tmp_path).exists() and store.interrupted(tmp_path) == [SWEEP]
    with pytest.raises(
        UserError, match=f"has a change half-done in sweep.s. {SWEEP}; refused to publish it"
    ):
        store.require_whole(tmp_path)
    # a change begun again in this process (the journal no longer its own) is a new one, and ends
    # clean
    with store.writing(tmp_path, SWEEP), store.change(tmp_path, SWEEP, "compact"):
        pass
    assert store.interrupted(tmp_path) == [] and store.require_whole(tmp_path) is None


def test_the_next_command_sets_the_sidecars_rebuilds_the_files_and_says_so(tmp_path):
    """A stopped ``exclude``: the journal says exclusion.json's contents and that published.json
    goes; the next command writes the one, removes the other, ignores a name that is no sidecar,
    moves every row to the excluded config (rebuilt from the records), removes the journal and
    says it in one sentence."""
    _sweep(tmp_path)
    _sweep(tmp_path, OTHER, ("org/c",))
    folder = store.sweep_dir(tmp_path, SWEEP)
    atomic_write_json(folder / store.PUBLISHED, {"repo": "r", "bucket": "b", "url": "u"})
    sidecars = {
        "sweep.json": {"x": 1},
        "exclusion.json": {"reason": "a broken stack"},
        store.PUBLISHED: None,
    }
    atomic_write_json(
        _journal(tmp_path),
        {"change": "exclude", "sidecars": sidecars, "at": "2026-12-05T01:02:03+00:00"},
    )
    said = store.finish_interrupted(tmp_path)
    assert said == [
        f"Sweep {SWEEP}: an interrupted exclude (begun 2026-12-05T01:02:03+00:00) was "
        "finished: its dataset files were rebuilt from its records."
    ]
    assert (
        store.exclusion(tmp_path, SWEEP) == "a broken stack"
        and store.published_logs(tmp_path, SWEEP) is None
    )
    assert json.loads((folder / "sweep.json").read_text()) != {"x": 1}  # no sidecar: left alone
    assert (_models(tmp_path, "results"), _models(tmp_path, "excluded")) == ([], ["org/a", "org/b"])
    assert (
        store.interrupted(tmp_path) == []
        and not (store.sweep_dir(tmp_path, OTHER) / store.CHANGE).exists()
    )
    assert _models(tmp_path, "results", OTHER) == []  # a sweep with no journal is left as it was
    assert store.finish_interrupted(tmp_path) == []  # nothing left to finish


def test_an_interrupted_push_is_undone_and_a_torn_journal_is_a_change_that_had_not_begun(tmp_path):
    _sweep(tmp_path)
    atomic_write_json(_journal(tmp_path), {"change": "push", "sidecars": {store.PUBLISHED: None}})
    (said,) = store.finish_interrupted(tmp_path)
    assert said.startswith(f"Sweep {SWEEP}: an interrupted push (begun earlier) was undone: ")
    assert _models(tmp_path, "results") == ["org/a", "org/b"]
    _journal(tmp_path).write_text('{"change": "exc')  # torn as it was written
    (said,) = store.finish_interrupted(tmp_path, [SWEEP])
    assert said.startswith(f"Sweep {SWEEP}: an interrupted unknown (begun earlier) was finished")
    assert not _journal(tmp_path).exists()


def test_a_sweep_another_process_is_writing_is_left_to_it_and_only_the_sweeps_asked_are_finished(
    tmp_path,
):
    _sweep(tmp_path)
    _sweep(tmp_path, OTHER, ("org/c",))
    for sweep_id in (SWEEP, OTHER):
        atomic_write_json(_journal(tmp_path, sweep_id), {"change": "compact", "sidecars": {}})
    # another process's lock on the sweep
    with open(store.sweep_dir(tmp_path, SWEEP) / ".lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        said = store.finish_interrupted(tmp_path)
        fcntl.flock(held, fcntl.LOCK_UN)
    assert [line.split(":")[0] for line in said] == [f"Sweep {OTHER}"]
    assert store.interrupted(tmp_path) == [SWEEP] and _models(tmp_path, "results", OTHER) == [
        "org/c"
    ]
    atomic_write_json(_journal(tmp_path, OTHER), {"change": "compact", "sidecars": {}})
    assert [line.split(":")[0] for line in store.finish_interrupted(tmp_path, [OTHER])] == [
        f"Sweep {OTHER}"
    ]
    assert store.interrupted(tmp_path) == [SWEEP]
    # asked for a sweep with nothing half-done first: nothing to say of it, and the next one is
    # still finished
    atomic_write_json(_journal(tmp_path, OTHER), {"change": "compact", "sidecars": {}})
    store.finish_interrupted(tmp_path, [SWEEP])
    assert store.finish_interrupted(tmp_path, [SWEEP, OTHER]) == [
        f"Sweep {OTHER}: an interrupted compact (begun earlier) was finished: its dataset "
        "files were rebuilt from its records."
    ]


def test_a_journal_in_a_sweep_with_no_definition_removes_the_journal_without_a_rebuild(tmp_path):
    """A pulled sweep (no sweep.json) has no records to rebuild from: its sidecars are set and
    its journal goes."""
    folder = store.sweep_dir(tmp_path, SWEEP)
    folder.mkdir(parents=True)
    atomic_write_json(
        _journal(tmp_path), {"change": "include", "sidecars": {"exclusion.json": None}}
    )
    atomic_write_json(folder / "exclusion.json", {"reason": "old"})
    (said,) = store.finish_interrupted(tmp_path)
    assert "an interrupted include" in said and store.exclusion(tmp_path, SWEEP) is None
    assert (
        not _journal(tmp_path).exists()
        and not store.parquet_file(tmp_path, "results", SWEEP).exists()
    )
