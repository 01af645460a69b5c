"""The store: atomic records, Parquet with one schema, old files, datasets configs, exclusions."""

import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from model_support.errors import UserError
from model_support.fileio import atomic_write_json
from model_support.record import schema, store
from model_support.record.sweep_meta import ModelEntry, SweepMeta, safe_name


def make_sweep(
    data_dir: Path, sweep_id: str, statuses: dict[str, str], excluded: dict | None = None
):
    SweepMeta(
        sweep_id=sweep_id,
        name="t",
        created_at="2026-12-01T00:00:00+00:00",
        probe={},
        models=[ModelEntry(m) for m in statuses],
        excluded=excluded or {},
    ).write(store.sweep_dir(data_dir, sweep_id))
    for i, (model_id, status) in enumerate(statuses.items()):
        record = schema.empty_record(
            sweep_id=sweep_id,
            model_id=model_id,
            status=status,
            tokens_in=5 + i,
            tokens_out=8,
            versions={"torch": "2.13.0"},
        )
        store.store_result(data_dir, sweep_id, record, None, "log\n")


def test_records_compact_to_parquet_with_the_declared_schema(tmp_path):
    make_sweep(
        tmp_path,
        "s1",
        {"org/a": "PASS", "org/b": "FAIL(gen)"},
        excluded={"org/c": "not a text model"},
    )
    assert store.compact(tmp_path, "s1") == (2, 1)
    table = pq.read_table(store.parquet_file(tmp_path, "results", "s1"))
    assert table.schema.equals(schema.SCHEMA)
    rows = store.scan(tmp_path).collect().sort("model_id")
    assert rows["status"].to_list() == ["PASS", "FAIL(gen)"]
    assert rows["tokens_in"].to_list() == [5, 6]
    excluded = store.scan(tmp_path, "excluded").collect()
    assert excluded["model_id"].to_list() == ["org/c"] and excluded[
        "exclusion_reason"
    ].to_list() == ["not a text model"]


def test_old_files_without_token_columns_read_as_null(tmp_path):
    make_sweep(tmp_path, "new", {"org/a": "PASS"})
    store.compact(tmp_path, "new")
    old = schema.to_table([schema.empty_record(sweep_id="old", model_id="org/a", status="PASS")])
    old = old.drop_columns(list(schema.LATER_FIELDS))
    path = store.parquet_file(tmp_path, "results", "old")
    path.parent.mkdir(parents=True)
    pq.write_table(old, path)
    assert "tokens_in" not in pq.read_schema(path).names
    rows = store.scan(tmp_path).collect().sort("sweep_id")
    assert rows["sweep_id"].to_list() == ["new", "old"]
    assert rows["tokens_in"].to_list() == [5, None] and rows["tokens_out"].to_list() == [8, None]


def test_datasets_loads_both_configs_from_the_card(tmp_path):
    datasets = pytest.importorskip("datasets")
    make_sweep(
        tmp_path, "s1", {"org/a": "PASS", "org/b": "FAIL(load)"}, excluded={"org/c": "too large"}
    )
    store.compact(tmp_path, "s1")
    results = datasets.load_dataset(str(tmp_path), "results", split="train")
    excluded = datasets.load_dataset(str(tmp_path), "excluded", split="train")
    assert sorted(results["status"]) == ["FAIL(load)", "PASS"]
    assert excluded["exclusion_reason"] == ["too large"]
    assert set(schema.FIELDS) <= set(results.column_names)


def test_exclude_and_include_a_whole_sweep_lose_no_row(tmp_path):
    make_sweep(
        tmp_path, "s1", {"org/a": "PASS", "org/b": "FAIL(gen)"}, excluded={"org/c": "too large"}
    )
    store.compact(tmp_path, "s1")
    before = store.scan(tmp_path).collect().sort("model_id")
    assert store.set_exclusion(tmp_path, "s1", "broken libtpu build") == (0, 3)
    excluded = store.scan(tmp_path, "excluded").collect()
    assert sorted(excluded["model_id"].to_list()) == ["org/a", "org/b", "org/c"]
    assert excluded.filter(pl.col("status").is_not_null())[
        "exclusion_reason"
    ].unique().to_list() == ["broken libtpu build"]
    assert store.scan(tmp_path).collect().height == 0
    assert store.set_exclusion(tmp_path, "s1", None) == (2, 1)
    after = store.scan(tmp_path).collect().sort("model_id")
    assert after.equals(before)


def test_unknown_sweep_is_one_sentence(tmp_path):
    make_sweep(tmp_path, "s1", {"org/a": "PASS"})
    with pytest.raises(ValueError, match=r"^Sweep 'nope' does not exist .* known sweeps: s1\.$"):
        store.set_exclusion(tmp_path, "nope", "x")


def test_atomic_write_leaves_no_temporary_files(tmp_path):
    atomic_write_json(tmp_path / "r.json", {"a": 1})
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_schema_refuses_unknown_fields_and_verdicts():
    with pytest.raises(KeyError):
        schema.empty_record(statuss="PASS")
    with pytest.raises(ValueError, match="not one of"):
        schema.check_record(schema.empty_record(status="OK"))


def test_safe_names_are_file_names():
    assert safe_name("meta-llama/Llama-3.2-1B") == "meta-llama__Llama-3.2-1B"
    assert "/" not in safe_name("/abs/path/to/model") and len(safe_name("x/" * 200)) <= 120


def test_the_card_lists_every_declared_field_and_what_older_files_read(tmp_path):
    """The dataset card's field table comes from the declaration: one row per column, in the
    file's order."""
    make_sweep(tmp_path, "s1", {"org/a": "PASS"})
    store.compact(tmp_path, "s1")
    card = (tmp_path / "README.md").read_text()
    rows = [line for line in card.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == pq.read_schema(
        store.parquet_file(tmp_path, "results", "s1")
    ).names
    (variant,) = [row for row in rows if row.startswith("| `variant`")]
    assert "| identity | 5 |" in variant and "(older files: `eager+dynamic`)" in variant


def test_the_declaration_gives_arrow_types_groups_and_versions():
    assert schema.arrow_type(list[float] | None) == pa.list_(pa.float64())
    assert schema.arrow_type(bool | None) == pa.bool_()
    assert schema.FIELDS["versions"].field("torch").type == pa.string()
    assert schema.names_in("download") == ("revision_sha", "download_s", "download_bytes")
    assert max(f.since for f in schema.DECLARATION) == schema.VERSION
    assert not set(schema.LATER_FIELDS) & {"sweep_id", "model_id", "status", "failure_signature"}
    with pytest.raises(KeyError, match="no field group 'hubb'"):
        schema.names_in("hubb")


@pytest.mark.slow
def test_the_runners_record_carries_what_the_probes_own_would(fixture_models, monkeypatch):
    """A probe that wrote no record (here: its notebook timed out) gets a stand-in from the
    runner that says who, with which settings and Hub facts, as the probe's own record of the
    same task does (both made by a real run of the probe notebook). The device is a slow one (the
    pretend device, each embedding lookup 0.5 s), so the generation cell outlasts a 1 s timeout
    however fast the host: once the kernel's start stopped counting against the model's clock, a
    tiny model on the CPU could finish inside it."""
    from model_support.probe import probe_params
    from model_support.probe.records import new_record
    from model_support.sweep.worker.process import run_task

    monkeypatch.setenv("MODEL_SUPPORT_PRETEND", json.dumps({"slow_ops": {"aten::embedding": 0.5}}))
    params = {
        "device": "pretend",
        "mode": "eager",
        "cache": "static",
        "max_new_tokens": 4,
        "reference": "none",
    }
    # its repeats of 0.5 s lookups would take minutes: this test is about the timeout
    params["perf"] = "off"
    task = {
        "sweep_id": "s",
        "model_id": "local:tiny-llama",
        "source": fixture_models["tiny-llama"]["path"],
        "params": params,
        "variant": probe_params.variant(params),
        "timeout_s": 300,
        "notebook_path": "sweeps/s/notebooks/tiny-llama@eager+static+4t.ipynb",
        "hub": {"pipeline_tag": "text-generation", "license": "apache-2.0"},
    }
    probe = run_task(task).record
    # its first slow cell times out: the runner's record
    record = run_task({**task, "timeout_s": 1}).record
    assert probe["status"] == schema.PASS, probe["error_message"]
    assert (record["status"], record["failure_stage"], record["error_type"]) == (
        "FAIL(other)",
        "runner",
        "ProbeTimeout",
    )
    same = (
        *(
            "sweep_id",
            "model_id",
            "revision",
            "variant",
            "mode",
            "cache",
            "max_new_tokens",
            "dtype",
            "prompt",
        ),
        *(
            "seed",
            "trust_remote_code",
            "device_type",
            "notebook_path",
            "versions",
            "pipeline_tag",
            "license",
        ),
    )
    assert {k: record[k] for k in same} == {k: probe[k] for k in same}
    assert record["variant"] == "eager+static+4t" and record["license"] == "apache-2.0"
    assert record["failure_signature"].startswith("ProbeTimeout: timed out after <n> s")
    with pytest.raises(KeyError, match="not Hub facts of a record: status"):
        new_record("org/m", params, facts={"status": "PASS"})


def test_two_compactions_at_once_do_not_share_a_temporary_file(tmp_path):
    """A second write of the same Parquet file starting while the first is under way (two
    compactions of a sweep at once): each writes its own temporary file, both finish, the last
    one's rows are the file's."""
    path = tmp_path / "results" / "sweep=s" / "part-0.parquet"
    inner = [schema.empty_record(sweep_id="s", model_id="org/inner", status="PASS")]

    def outer():
        yield schema.empty_record(sweep_id="s", model_id="org/outer-1", status="PASS")
        # the other compaction, finished in the middle of this one
        assert store.write_parquet(inner, path) == 1
        yield schema.empty_record(sweep_id="s", model_id="org/outer-2", status="PASS")

    assert store.write_parquet(outer(), path, batch_rows=1) == 2
    assert pq.read_table(path).column("model_id").to_pylist() == ["org/outer-1", "org/outer-2"]
    # no temporary file left
    assert sorted(p.name for p in path.parent.iterdir()) == ["part-0.parquet"]


@pytest.fixture
def sweep_held_elsewhere(tmp_path):
    """Sweep s1 with its lock held by another process (as a running sweep's runner holds it)."""
    import subprocess
    import sys

    make_sweep(tmp_path, "s1", {"org/a": "PASS"})
    code = (
        "import sys; from pathlib import Path; from model_support.record import store\n"
        f"with store.SweepLock(store.sweep_dir(Path({str(tmp_path)!r}), 's1')):\n"
        "    print('held', flush=True); sys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        yield tmp_path
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


def test_a_running_sweeps_files_are_rewritten_by_no_other_command(sweep_held_elsewhere):
    """aggregate, exclude, include and push --logs (compact, set_exclusion, set_published_logs)
    and push (writing_all) refuse, in one sentence, while another process writes the sweep;
    nothing changed."""
    data_dir = sweep_held_elsewhere
    refusal = (
        r"^Sweep folder .*s1 is being written by another running sweep; wait for it to finish\.$"
    )
    for attempt in (
        lambda: store.compact(data_dir, "s1"),
        lambda: store.set_exclusion(data_dir, "s1", "broken stack"),
        lambda: store.set_exclusion(data_dir, "s1", None),
        lambda: store.set_published_logs(
            data_dir, "s1", {"repo": "o/d", "bucket": None, "url": "https://x/"}
        ),
    ):
        with pytest.raises(UserError, match=refusal):
            attempt()
    with pytest.raises(UserError, match=refusal), store.writing_all(data_dir):
        pass
    assert not store.parquet_file(data_dir, "results", "s1").exists()
    assert store.exclusion(data_dir, "s1") is None and store.published_logs(data_dir, "s1") is None


def test_the_holder_of_a_sweeps_lock_compacts_it_and_a_second_holder_is_refused(tmp_path):
    make_sweep(tmp_path, "s1", {"org/a": "PASS"})
    with store.SweepLock(store.sweep_dir(tmp_path, "s1")):
        assert store.compact(tmp_path, "s1") == (1, 0)  # the runner, at the end of its run
        with pytest.raises(UserError, match="being written by another running sweep"):
            store.SweepLock(store.sweep_dir(tmp_path, "s1")).__enter__()
    assert store.compact(tmp_path, "s1") == (1, 0)  # released: anyone may
