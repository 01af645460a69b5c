"""Parquet bytes per row (issue 47): the dataset's writer options, every field read back as
written by pyarrow, Polars and ``datasets`` (files written before the options changed among
them), and the smoke sweep's rows under the goal (bench/bench_row_bytes.py measures where the
bytes go)."""

from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from model_support.record import ops_table, schema, store
from model_support.record.sweep_meta import ModelEntry, SweepMeta

#: The goal: a row of the smoke sweep's record configs, in bytes of Parquet.
GOAL = 4096


def _record(sweep_id: str, i: int, status: str) -> schema.Record:
    """A record with a field of every kind the schema has: texts, numbers, lists of each, the
    versions struct."""
    return schema.empty_record(
        sweep_id=sweep_id,
        model_id=f"org/model-{i}",
        status=status,
        failure_stage=None if status == "PASS" else "generate",
        traceback=None
        if status == "PASS"
        else f"Traceback (most recent call last):\n  line {i}\nRuntimeError: x",
        num_params=1000 + i,
        load_s=0.25 + i / 7,
        chat_template_used=bool(i % 2),
        output_token_ids=[i, i + 1, 2],
        ttft_s_repeats=[0.011 + i / 1e4, 0.0123, 0.0119],
        ops=["aten::mm", "aten::add.Tensor"],
        ops_calls=[3 + i, 5],
        ops_device_s=[1.5e-4 * (i + 1), 3.1e-5],
        ops_sig_ops=["aten::mm", "aten::add.Tensor"],
        ops_sig_dtypes=["bf16,bf16", "bf16,bf16"],
        ops_sig_calls=[3 + i, 5],
        versions={
            **dict.fromkeys(schema.Versions.__annotations__),
            "torch": "2.13.0",
            "python": "3.11.7",
        },
        repro_settings='{"model_id": "org/model"}',
        device_type="cpu",
    )


def _sweep(data_dir: Path, sweep_id: str, n: int = 5) -> list[schema.Record]:
    records = [_record(sweep_id, i, "PASS" if i % 2 else "FAIL(gen)") for i in range(n)]
    SweepMeta(
        sweep_id=sweep_id,
        name="t",
        created_at="2026-12-01T00:00:00+00:00",
        probe={},
        models=[ModelEntry(r["model_id"]) for r in records],
        excluded={"org/gone": "gated"},
    ).write(store.sweep_dir(data_dir, sweep_id))
    for record in records:
        store.store_result(data_dir, sweep_id, record, None, "log\n")
    store.compact(data_dir, sweep_id)
    return records


def _sorted(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: r["model_id"])


def test_the_dataset_is_written_with_zstd_plain_encoding_and_no_arrow_schema_copy(tmp_path):
    _sweep(tmp_path, "s1")
    files = sorted(tmp_path.glob("*/sweep=s1/*.parquet"))
    assert {f.parent.parent.name for f in files} == {"results", "excluded", "ops"}
    for path in files:
        meta = pq.read_metadata(path)
        assert b"ARROW:schema" not in (meta.metadata or {}), path
        chunks = [
            meta.row_group(g).column(j)
            for g in range(meta.num_row_groups)
            for j in range(meta.num_columns)
        ]
        assert {c.compression for c in chunks} == {"ZSTD"}, path
        assert not any(c.has_dictionary_page for c in chunks), path
    results = pq.read_metadata(store.parquet_file(tmp_path, "results", "s1")).row_group(0)
    stats = {
        results.column(j).path_in_schema: results.column(j).is_stats_set
        for j in range(results.num_columns)
    }
    # statistics as before
    assert stats["sweep_id"] and stats["num_params"] and not stats["traceback"]


def test_every_field_reads_back_as_written_with_pyarrow_polars_and_datasets(tmp_path):
    records = _sweep(tmp_path, "s1")
    results = store.parquet_file(tmp_path, "results", "s1")
    table = pq.read_table(results)
    assert table.schema.equals(schema.SCHEMA)  # the declared types from the Parquet schema alone
    assert _sorted(table.to_pylist()) == _sorted(records)
    frame = store.scan(tmp_path).collect()
    assert frame.schema == store.polars_schema()
    assert _sorted(frame.to_dicts()) == _sorted(records)
    ops = pq.read_table(store.parquet_file(tmp_path, "ops", "s1"))
    assert ops.schema.equals(ops_table.SCHEMA) and ops.num_rows == 2
    datasets = pytest.importorskip("datasets")
    loaded = datasets.load_dataset(str(tmp_path), "results", split="train")
    assert set(schema.FIELDS) <= set(loaded.column_names)
    assert _sorted([{k: row[k] for k in schema.FIELDS} for row in loaded]) == _sorted(records)
    assert datasets.load_dataset(str(tmp_path), "excluded", split="train")["exclusion_reason"] == [
        "gated"
    ]
    assert datasets.load_dataset(str(tmp_path), "ops", split="train").num_rows == 2


def test_a_config_of_older_files_and_newer_ones_reads_as_one(tmp_path):
    """A dataset published before the options changed (snappy, dictionaries, the Arrow schema
    stored) gains sweeps written with them: Polars and ``datasets`` read the config whole."""
    older = _sweep(tmp_path, "s1")
    path = store.parquet_file(tmp_path, "results", "s1")
    # pyarrow's defaults
    pq.write_table(pq.read_table(path), path, write_statistics=store.statistics_columns())
    assert b"ARROW:schema" in pq.read_metadata(path).metadata
    newer = _sweep(tmp_path, "s2")
    frame = store.scan(tmp_path).collect()
    assert _sorted(frame.to_dicts()) == _sorted(older + newer)
    datasets = pytest.importorskip("datasets")
    loaded = datasets.load_dataset(str(tmp_path), "results", split="train")
    assert _sorted([{k: row[k] for k in schema.FIELDS} for row in loaded]) == _sorted(older + newer)


def test_the_smoke_sweeps_rows_are_at_most_4_kb_each(smoke_sweep):
    """One row per model: ``results`` alone (4,830 bytes before, bench/README.md) and with
    ``excluded``'s rows, whose small file is nearly all fixed cost. The ``ops`` config's many
    small rows are not counted."""
    data = Path(smoke_sweep["data_dir"])
    sizes = {}
    for config in store.CONFIGS:
        (path,) = data.glob(f"{config}/sweep=*/*.parquet")
        sizes[config] = (pq.read_metadata(path).num_rows, path.stat().st_size)
    rows, size = sizes["results"]
    assert rows >= 30 and size / rows <= GOAL
    assert sum(s for _, s in sizes.values()) / sum(r for r, _ in sizes.values()) <= GOAL
    frame = store.scan(data).collect()
    assert (
        frame.height == rows
        and frame.select(pl.struct("model_id", "variant").n_unique()).item() == rows
    )


def test_a_float_column_keeps_every_bit(tmp_path):
    """Plain encoding and zstd are lossless: a timing list reads back bit for bit."""
    values = [[0.1 + 1e-17 * i, 1 / 3, 2.5e-308, float("inf")] for i in range(3)]
    rows = [{**_record("s", i, "PASS"), "tpot_s_repeats": v} for i, v in enumerate(values)]
    path = tmp_path / "t.parquet"
    store.write_parquet(rows, path)
    column = pq.read_table(path).column("tpot_s_repeats")
    assert column.to_pylist() == values and column.type == pa.list_(pa.float64())
