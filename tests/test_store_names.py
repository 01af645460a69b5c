"""Identifiers that become paths (plain names, one-to-one file names), stored code read by its
checked hash, and JSON-lines files that survive a torn tail."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from helpers import wait_until_blocked
from model_support import fileio
from model_support.analysis import decision
from model_support.errors import UserError
from model_support.probe import repro
from model_support.record import names, schema, store
from model_support.record.sweep_meta import ModelEntry, SweepMeta
from model_support.sweep import device_time

CLI = [sys.executable, "-m", "model_support.cli"]


def write_sweep(data: Path, sweep_id: str, models: list[str], stored_id: str | None = None) -> None:
    meta = SweepMeta(
        sweep_id=stored_id or sweep_id,
        name="t",
        created_at="2026-12-05T00:00:00+00:00",
        probe={"device": "cpu"},
        models=[ModelEntry(m) for m in models],
    )
    meta.write(store.sweep_dir(data, sweep_id))


def files_outside(root: Path, data: Path) -> list[Path]:
    return [p for p in root.rglob("*") if data not in p.parents and p != data]


def test_a_climbing_sweep_id_in_sweep_json_is_refused_before_anything_is_written(tmp_path):
    data = tmp_path / "deep" / "data"
    write_sweep(data, "s1", ["org/a"], stored_id="../../../somewhere")
    before = files_outside(tmp_path, data)
    run = subprocess.run(
        [*CLI, "sweep", "--resume", "s1", "--data-dir", str(data)], capture_output=True, text=True
    )
    assert run.returncode == 2
    assert (
        "sweep.json: field sweep_id is '../../../somewhere', not its folder's name 's1'"
        in run.stderr
    )
    assert "Traceback" not in run.stderr
    assert files_outside(tmp_path, data) == before
    assert sorted(p.name for p in store.sweep_dir(data, "s1").iterdir()) == ["sweep.json"]


@pytest.mark.parametrize("sweep_id", ["../../x", "/etc", "a/b", "..", "a\0b"])
def test_sweep_ids_from_the_command_line_are_plain_names(tmp_path, sweep_id):
    with pytest.raises(UserError, match="is not a plain name"):
        store.compact(tmp_path, sweep_id)
    with pytest.raises(UserError, match="is not a plain name"):
        store.parquet_file(tmp_path, "results", sweep_id)
    assert not any(tmp_path.iterdir())


def test_a_record_of_another_sweep_is_refused_naming_the_file_and_field(tmp_path):
    write_sweep(tmp_path, "s1", ["org/a"])
    record = schema.empty_record(sweep_id="../elsewhere", model_id="org/a", status="PASS")
    fileio.atomic_write_json(store.record_file(tmp_path, "s1", "org/a"), record)
    with pytest.raises(
        UserError, match=r"org__a.json: field sweep_id is '../elsewhere', not its sweep's 's1'"
    ):
        store.compact(tmp_path, "s1")


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("local:tiny+opt", "local:tiny_opt"),
        ("org/model", "org__model"),
        ("local:x", "local_x"),
        ("a b", "a_b"),
    ],
)
def test_model_ids_map_to_file_names_one_to_one(a, b):
    assert names.model_file_name(a) != names.model_file_name(b)
    for name in (names.model_file_name(a), names.model_file_name(b)):
        assert names.check_name(name, "file", "test") == name


def test_plain_ids_keep_the_names_older_sweeps_have():
    for model_id in ("org/model", "local:tiny-opt", "HuggingFaceTB/SmolLM2-135M-Instruct", "gpt2"):
        assert names.model_file_name(model_id) == names.legacy_name(model_id)


def test_a_definition_whose_models_would_share_a_file_is_refused_naming_both(tmp_path):
    from model_support.sweep import definition

    path = tmp_path / "p.yaml"
    path.write_text("name: t\nprobe: {device: cpu}\nmodels: [Org/Model, org/model]\n")
    with pytest.raises(
        UserError, match="models 'Org/Model' and 'org/model' would share one record file"
    ):
        definition.load(path)


def test_a_sweep_stored_under_the_old_names_resumes_and_keeps_both_models(tmp_path):
    """An older sweep holds local:tiny+opt under the legacy name ``local_tiny_opt`` (which is
    also tiny_opt's name): it is found as done, moved to its own name once, and tiny_opt's record
    never overwrites it."""
    write_sweep(tmp_path, "s1", ["local:tiny+opt", "local:tiny_opt"])
    old = schema.empty_record(sweep_id="s1", model_id="local:tiny+opt", status="PASS")
    fileio.atomic_write_json(
        store.sweep_dir(tmp_path, "s1") / "records" / "local_tiny_opt.json", old
    )
    assert store.find_record(tmp_path, "s1", "local:tiny+opt") is not None
    assert store.find_record(tmp_path, "s1", "local:tiny_opt") is None
    assert store.migrate_names(tmp_path, "s1") == 1
    store.store_result(
        tmp_path,
        "s1",
        schema.empty_record(sweep_id="s1", model_id="local:tiny_opt", status="FAIL(gen)"),
        None,
        "",
    )
    assert sorted((r["model_id"], r["status"]) for r in store.iter_records(tmp_path, "s1")) == [
        ("local:tiny+opt", "PASS"),
        ("local:tiny_opt", "FAIL(gen)"),
    ]


def test_a_record_under_two_names_is_read_once_and_the_next_migration_removes_the_old_one(
    tmp_path, capsys
):
    """A migration stopped between writing a record's own name and removing its old one leaves it
    under both: the reader keeps one (from its own name) and says so; the next migration removes
    the old name."""
    write_sweep(tmp_path, "s1", ["local:tiny+opt", "org/a"])
    store.store_result(
        tmp_path,
        "s1",
        schema.empty_record(sweep_id="s1", model_id="org/a", status="PASS"),
        None,
        "",
    )
    record = schema.empty_record(sweep_id="s1", model_id="local:tiny+opt", status="PASS")
    records = store.sweep_dir(tmp_path, "s1") / "records"
    for name in ("local_tiny_opt", store.stem("local:tiny+opt")):
        fileio.atomic_write_json(records / f"{name}.json", record)
    assert store.compact(tmp_path, "s1") == (2, 0)
    assert sorted(store.scan(tmp_path).collect()["model_id"]) == ["local:tiny+opt", "org/a"]
    said = capsys.readouterr().err
    assert (
        said.count("local_tiny_opt.json: the record of local:tiny+opt is also under its own name")
        == 1
    ), said
    assert "`model-support sweep --resume s1` removes the old name" in said
    assert store.migrate_names(tmp_path, "s1") == 1
    assert sorted(p.name for p in records.iterdir()) == [
        f"{store.stem('local:tiny+opt')}.json",
        "org__a.json",
    ]
    store.compact(tmp_path, "s1")
    assert "also under its own name" not in capsys.readouterr().err


def _record_with_body(data: Path, sha: str) -> None:
    write_sweep(data, "s1", ["org/a"])
    record = schema.empty_record(sweep_id="s1", model_id="org/a", status="PASS")
    record.update(repro_settings=json.dumps({"model_id": "org/a"}), repro_sha256=sha)
    fileio.atomic_write_json(store.record_file(data, "s1", "org/a"), record)


def test_a_repro_body_outside_the_repro_folder_is_refused(tmp_path):
    data = tmp_path / "data"
    outside = tmp_path / "elsewhere" / "x.py"
    outside.parent.mkdir()
    outside.write_text("print('not the probe')\n")
    _record_with_body(data, "../../../../elsewhere/x")
    with pytest.raises(
        UserError, match="names its repro body '../../../../elsewhere/x', which is not a SHA-256"
    ):
        repro.script_for(data, "s1", "org/a")
    run = subprocess.run(
        [*CLI, "repro", "s1", "org/a", "--data-dir", str(data)], capture_output=True, text=True
    )
    assert (
        run.returncode == 2
        and "not the probe" not in run.stdout
        and "which is not a SHA-256" in run.stderr
    )


def test_an_altered_repro_body_is_refused(tmp_path):
    body = store.REPRO_BODY_MARK + "\nprint('the probe')\n"
    sha = hashlib.sha256(body.encode()).hexdigest()
    _record_with_body(tmp_path, sha)
    path = store.repro_dir(tmp_path, "s1") / f"{sha}.py"
    fileio.atomic_write_text(path, body)
    assert "print('the probe')" in repro.script_for(tmp_path, "s1", "org/a")
    fileio.atomic_write_text(path, body + "import os; os.system('rm -rf ~')\n")
    with pytest.raises(UserError, match="does not hash to its name"):
        repro.script_for(tmp_path, "s1", "org/a")
    # an altered body is not copied into the dataset either
    assert store.copy_repro_bodies(tmp_path, "s1") == 0


def test_appends_start_on_a_fresh_line_and_readers_skip_a_torn_one(tmp_path, capsys):
    path = tmp_path / "schedule.jsonl"
    fileio.append_line(
        path, {"model_id": "a", "start": 1.0, "end": 2.0, "devices": [0], "device_s": 0.5}
    )
    with open(path, "a") as handle:  # a full disk mid-append: half a line, no newline
        handle.write('{"model_id": "b", "sta')
    fileio.append_line(
        path, {"model_id": "c", "start": 3.0, "end": 4.0, "devices": [0], "device_s": 0.5}
    )
    assert [r["model_id"] for r in device_time.read_rows(tmp_path)] == ["a", "c"]
    assert "skipped 1 unreadable line(s)" in capsys.readouterr().err


def test_write_parquet_syncs_before_it_replaces(tmp_path, monkeypatch):
    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(
        os,
        "fsync",
        lambda fd: calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))) or real_fsync(fd),
    )
    monkeypatch.setattr(
        os, "replace", lambda a, b: calls.append(("replace", str(a))) or real_replace(a, b)
    )
    store.write_parquet(
        [schema.empty_record(sweep_id="s", model_id="m", status="PASS")], tmp_path / "p.parquet"
    )
    replaced = next(i for i, c in enumerate(calls) if c[0] == "replace")
    assert ("fsync", calls[replaced][1]) in calls[:replaced]


def _entries(folder: Path) -> dict[str, int]:
    """A folder's entries as a crash would find them if they were on the disk: name -> inode."""
    return {entry.name: entry.inode() for entry in os.scandir(folder)}


def _synced_entries(monkeypatch) -> dict[str, dict[str, int]]:
    """Record each fsync of a folder with the folder's entries at that moment (the real fsync
    still runs): a rename, creation or removal after a folder's last sync is not on the disk, and
    SIGKILL cannot show it."""
    synced: dict[str, dict[str, int]] = {}
    real_fsync = os.fsync

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.isdir(path):
            synced[path] = _entries(Path(path))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def _parquet(path: Path, rows: int) -> None:
    store.write_parquet(
        [schema.empty_record(sweep_id="s", model_id="m", status="PASS")] * rows, path
    )


#: Each write helper that changes a folder's entries: (set up, act, the folders whose entries it
#: changes).
FOLDER_CHANGES = {
    "a file in new folders": (
        None,
        lambda d: fileio.atomic_write_bytes(d / "a" / "b" / "r.json", b"{}"),
        ["", "a", "a/b"],
    ),
    "a file replaced": ("r.json", lambda d: fileio.atomic_write_json(d / "r.json", {"a": 1}), [""]),
    "a file removed": ("r.json", lambda d: fileio.remove(d / "r.json"), [""]),
    "a name reserved": (None, lambda d: fileio.create_new(d / "n" / "reserved"), ["", "n"]),
    "a JSON-lines file begun": (
        None,
        lambda d: fileio.append_line(d / "log.jsonl", {"a": 1}),
        [""],
    ),
    "a Parquet file in a new folder": (
        None,
        lambda d: _parquet(d / "results" / "p.parquet", 1),
        ["", "results"],
    ),
    "a Parquet file with no rows removed": (
        "p.parquet",
        lambda d: _parquet(d / "p.parquet", 0),
        [""],
    ),
}


@pytest.mark.parametrize("case", list(FOLDER_CHANGES))
def test_every_folder_is_synced_after_its_entries_change(tmp_path, monkeypatch, case):
    """The last fsync of each folder a write changed saw the folder as it is now: the rename
    (creation, removal) is durable, not only the file's bytes."""
    existing, act, folders = FOLDER_CHANGES[case]
    if existing:
        (tmp_path / existing).write_bytes(b"old")
    synced = _synced_entries(monkeypatch)
    act(tmp_path)
    for folder in (tmp_path / f for f in folders):
        assert synced.get(str(folder.resolve())) == _entries(folder), (
            f"{folder}: changed after its last sync"
        )


def test_the_card_and_shared_repro_wait_for_the_data_folders_lock(tmp_path):
    done = threading.Event()
    with store.data_folder_lock(tmp_path):
        writer = threading.Thread(target=lambda: (store.write_dataset_card(tmp_path), done.set()))
        writer.start()
        # in flock, seen there
        wait_until_blocked(writer, "data_folder_lock", within="write_dataset_card")
        assert not done.is_set() and not (tmp_path / "README.md").exists()
    writer.join(timeout=10)
    assert done.is_set() and (tmp_path / "README.md").exists()


def _three_sweeps(data: Path) -> list[str]:
    ids = [
        "smoke-20261201T000000Z-aaaa",
        "smoke-20261202T000000Z-bbbb",
        "other-20261203T000000Z-cccc",
    ]
    for day, sweep_id in enumerate(ids, 1):
        meta = SweepMeta(
            sweep_id=sweep_id,
            name=sweep_id.split("-")[0],
            created_at=f"2026-12-0{day}T00:00:00+00:00",
            probe={"device": "cpu"},
            models=[ModelEntry("org/a"), ModelEntry("org/b")],
        )
        meta.write(store.sweep_dir(data, sweep_id))
        store.store_result(
            data,
            sweep_id,
            schema.empty_record(sweep_id=sweep_id, model_id="org/a", status="PASS"),
            None,
            "",
        )
    return ids


def test_a_sweep_id_is_easy_to_give(tmp_path):
    a, b, c = _three_sweeps(tmp_path)
    assert store.resolve_sweep_id(tmp_path, a) == a
    assert store.resolve_sweep_id(tmp_path, "latest") == c
    assert store.resolve_sweep_id(tmp_path, "latest:smoke") == b
    assert store.resolve_sweep_id(tmp_path, "other") == c  # a unique prefix
    with pytest.raises(
        UserError, match=r"is the start of 2 sweeps .*; give more of the id; `latest:smoke` names"
    ):
        store.resolve_sweep_id(tmp_path, "smoke")
    with pytest.raises(UserError, match=f"did you mean {b}"):
        store.resolve_sweep_id(tmp_path, "smoke-20261202T000000Z-bbbc")
    with pytest.raises(UserError, match="No sweep named 'nightly'.*the names are other, smoke"):
        store.resolve_sweep_id(tmp_path, "latest:nightly")


def test_list_shows_the_sweeps_newest_first_and_commands_take_latest(tmp_path):
    a, b, c = _three_sweeps(tmp_path)
    run = subprocess.run(
        [*CLI, "list", "--json", "--data-dir", str(tmp_path)], capture_output=True, text=True
    )
    rows = json.loads(run.stdout)
    assert [r["sweep_id"] for r in rows] == [c, b, a]
    assert rows[0] | {"sweep_id": None} == {
        "sweep_id": None,
        "name": "other",
        "device": "cpu",
        "models": 2,
        "PASS": 1,
        "FAIL(load)": 0,
        "FAIL(gen)": 0,
        "FAIL(other)": 0,
        "excluded": 0,
        "state": "1 to run",
    }
    table = subprocess.run(
        [*CLI, "list", "--data-dir", str(tmp_path)], capture_output=True, text=True
    ).stdout
    assert table.index(c) < table.index(b) < table.index(a)
    agg = subprocess.run(
        [*CLI, "aggregate", "latest:smoke", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert agg.returncode == 0 and agg.stdout.startswith(f"{b}: 1 result rows"), agg.stderr


def _rows(data: Path, config: str, sweep_id: str, **fields) -> None:
    record = schema.empty_record(sweep_id=sweep_id, model_id="org/a", status="PASS", **fields)
    if config == "excluded":
        record = {**record, "status": None, "exclusion_reason": "gated"}
    store.write_parquet([record], store.parquet_file(data, config, sweep_id))


def test_latest_in_a_dataset_pulled_without_its_sweeps_is_the_newest_sweep_of_the_stack(tmp_path):
    """A pulled dataset knows its sweeps by their Parquet files only: ``latest`` is the newest by
    the time in the ids (not the last name), a sweep whose rows carry ``host_ops`` is a what-if
    sweep (even one whose rows are all excluded) and no sweep of the stack, and a folder
    compaction left empty names no sweep."""
    older_by_name = "zeta-20261201T000000Z-aaaa"
    newest_stack = "alpha-20261203T000000Z-bbbb"
    # newer still, but its runs ran operators on the host
    what_if = "silu-on-host-20261205T000000Z-cccc"
    # a what-if sweep all of whose models were gated
    all_excluded = "rsqrt-on-host-20261206T000000Z-dddd"
    _rows(tmp_path, "results", older_by_name)
    _rows(tmp_path, "results", newest_stack)
    _rows(tmp_path, store.WHAT_IF_CONFIG, what_if, host_ops="aten::silu", what_if=True)
    _rows(tmp_path, "excluded", all_excluded, host_ops="aten::rsqrt")
    # left empty by a compaction
    (tmp_path / "results" / "sweep=empty-20261209T000000Z-eeee").mkdir()
    assert not (tmp_path / "sweeps").exists()
    assert store.resolve_sweep_id(tmp_path, "latest") == newest_stack
    # named, it is still no sweep of the stack
    with pytest.raises(UserError, match="is a what-if sweep"):
        store.resolve_sweep_id(tmp_path, "latest:silu-on-host")
    assert store.resolve_sweep_id(tmp_path, what_if) == what_if  # its id names it
    assert store.resolve_sweep_id(tmp_path, "latest:zeta") == older_by_name
    assert (
        store.what_if_setting(tmp_path, all_excluded),
        store.what_if_setting(tmp_path, newest_stack),
    ) == (
        "aten::rsqrt",
        None,
    )
    with pytest.raises(UserError, match="is a what-if sweep"):  # the gate refuses a pulled one too
        decision.refuse_what_if(tmp_path, newest_stack, what_if)


def test_latest_orders_local_and_pulled_sweeps_by_time_together(tmp_path):
    """A data folder with sweeps of its own and pulled ones: one order by time (pulled ones
    listed after the local ones made an older pulled sweep ``latest``)."""
    local = _three_sweeps(tmp_path)  # 2026-12-01 .. 2026-12-03
    _rows(tmp_path, "results", "pulled-20261130T000000Z-ffff")  # older than every local one
    assert store.resolve_sweep_id(tmp_path, "latest") == local[-1]
    _rows(tmp_path, "results", "pulled-20261210T000000Z-9999")  # newer than every local one
    assert store.resolve_sweep_id(tmp_path, "latest") == "pulled-20261210T000000Z-9999"


def test_a_what_if_sweeps_stand_in_records_are_what_if_rows_never_the_stacks_verdicts():
    """The runner's stand-in for a crash or a timeout carries the setting only (``host_ops``):
    still a what-if row (review found one stored in ``results`` as the stack's FAIL(other), then
    a stack sweep's baseline)."""
    crashed = schema.empty_record(
        sweep_id="s", model_id="org/a", status="FAIL(other)", host_ops="aten::silu"
    )
    assert store.config_of(crashed) == store.WHAT_IF_CONFIG
    assert store.config_of({**crashed, "exclusion_reason": "gated"}) == "excluded"
    assert (
        store.config_of(schema.empty_record(sweep_id="s", model_id="org/a", status="PASS"))
        == "results"
    )


def test_a_what_if_sweep_takes_no_baseline_and_is_none(tmp_path):
    """A what-if sweep named as the stack's sweeps: its report's default baseline is none (its
    report failed to render against the stack's, the gate refusing the pair), and its runs, a
    stand-in crash's too, stay out of the stack's sweeps' baselines."""
    from model_support.render import report

    a, b, _ = _three_sweeps(tmp_path)
    hosted = "smoke-20261204T000000Z-dddd"
    SweepMeta(
        sweep_id=hosted,
        name="smoke",
        created_at="2026-12-04T00:00:00+00:00",
        probe={"device": "cpu", "host_ops": "aten::silu"},
        models=[ModelEntry("org/a"), ModelEntry("org/b")],
        excluded={"org/b": "gated: no access"},  # excluded before running
    ).write(store.sweep_dir(tmp_path, hosted))
    crashed = schema.empty_record(
        sweep_id=hosted, model_id="org/a", status="FAIL(other)", host_ops="aten::silu"
    )
    store.store_result(tmp_path, hosted, crashed, None, "")
    store.compact(tmp_path, hosted)
    for sweep_id in (a, b):
        store.compact(tmp_path, sweep_id)
    assert report.previous_sweep(tmp_path, b) == a
    assert report.previous_sweep(tmp_path, hosted) is None
    # a what-if row, not the stack's
    assert not any((tmp_path / "results" / f"sweep={hosted}").glob("*.parquet"))
    assert (
        store.resolve_sweep_id(tmp_path, "latest:smoke") == b
        and store.resolve_sweep_id(tmp_path, "latest") != hosted
    )
    assert store.resolve_sweep_id(tmp_path, hosted) == hosted  # its id names it
    # the stand-in's script would run the stack's kernels
    with pytest.raises(UserError, match="as a what-if run"):
        repro.script_for(tmp_path, hosted, "org/a")
    from model_support.render.terminal import sweep_list_rows

    listed = next(r for r in sweep_list_rows(tmp_path) if r["sweep_id"] == hosted)
    assert (
        listed["excluded"] == 1
        and listed["FAIL(other)"] == 0
        and "what-if: 1 run(s)" in listed["state"]
    )
    # the dataset without sweeps/: its excluded row still says what it was
    pulled = tmp_path / "pulled"
    for config in ("results", "excluded", store.WHAT_IF_CONFIG):
        if (tmp_path / config).exists():
            shutil.copytree(tmp_path / config, pulled / config)
    assert (
        store.what_if_setting(pulled, hosted) == "aten::silu"
        and store.resolve_sweep_id(pulled, "latest") != hosted
    )
