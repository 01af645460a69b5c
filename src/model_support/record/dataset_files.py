"""The Parquet dataset's files: the configs, their schema as Polars sees it, lazy scans over
every sweep, and writing one file (``write_parquet``: a temporary copy moved in whole)."""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .. import fileio
from ..errors import UserError
from . import ops_table, schema
from .names import check_name

if TYPE_CHECKING:  # polars is imported where it is used: the probe kernel writes records without it
    import polars as pl


CONFIGS = ("results", "excluded")


#: The third config: one row per operator per sweep, from the census (``ops_table``); every config
#: of the dataset.
OPS_CONFIG = "ops"


#: What-if runs (``what_if``: operators on the host, ``probe.host_ops``), the stack's records'
#: shape, apart: nothing that reads ``results`` (the gate, the exports, the support card, the
#: published default config) sees them.
WHAT_IF_CONFIG = "what_if"


DATASET_CONFIGS = (*CONFIGS, OPS_CONFIG, WHAT_IF_CONFIG)


def polars_schema() -> pl.Schema:
    """The record schema as Polars sees it (built from ``schema.SCHEMA``, never written twice)."""
    import polars as pl

    frame = pl.from_arrow(schema.SCHEMA.empty_table())
    assert isinstance(frame, pl.DataFrame)  # a table, not one column
    return frame.schema


def scan(data_dir: Path, config: str = "results") -> pl.LazyFrame:
    """All sweeps of one config, lazily. Files written before a column existed read it as null."""
    import polars as pl

    if config not in (*CONFIGS, WHAT_IF_CONFIG):
        raise UserError(f"config {config!r} is not one of {', '.join((*CONFIGS, WHAT_IF_CONFIG))}")
    root = Path(data_dir) / config
    files = sorted(root.glob("sweep=*/*.parquet"))
    if not files:
        return pl.LazyFrame(schema=polars_schema())
    return pl.scan_parquet(
        files,
        hive_partitioning=False,
        schema=polars_schema(),
        missing_columns="insert",
        extra_columns="ignore",
    )


def scan_ops(data_dir: Path) -> pl.LazyFrame:
    """The ``ops`` config of every sweep, lazily (``ops_table``)."""
    import polars as pl

    files = sorted((Path(data_dir) / OPS_CONFIG).glob("sweep=*/*.parquet"))
    frame = pl.from_arrow(ops_table.SCHEMA.empty_table())
    assert isinstance(frame, pl.DataFrame)
    if not files:
        return frame.lazy()
    return pl.scan_parquet(
        files, hive_partitioning=False, schema=frame.schema, missing_columns="insert"
    )


#: The text columns a reader filters or groups rows by: they keep Parquet statistics (min and max
#: per row group, for pruning), as every column of another type does. The other texts (tracebacks,
#: messages, notes, settings) do not: a statistic holds the longest texts whole, twice, and cost
#: more than the rows themselves.
KEY_TEXTS = (
    "sweep_id",
    "model_id",
    "variant",
    "status",
    "failure_stage",
    "task",
    "model_type",
    "error_type",
    "failure_signature",
    "mode",
    "cache",
    "dtype",
    "device_type",
    "parallelism",
    "numerics",
    "attribution",
    "pipeline_tag",
    "repro_sha256",
)


def statistics_columns() -> list[str]:
    """The columns written with statistics: ``KEY_TEXTS`` and every column that is not a text."""
    import pyarrow as pa

    return [
        f.name
        for f in schema.SCHEMA
        if f.name in KEY_TEXTS
        or not (pa.types.is_string(f.type) or pa.types.is_large_string(f.type))
    ]


#: How every Parquet file of the dataset is written (docs/dataset.md; bench/bench_row_bytes.py
#: measured each choice on the smoke sweep): zstd (level 12: nearly all of level 19's gain in a
#: twentieth of its time) over plain encoding, since a dictionary page per column costs more than it
#: saves once zstd shares the repeats (the per-repeat and per-signature lists, the notes, the
#: settings); no copy of the Arrow schema in the footer (~14 kB a file: every column's type is a
#: plain Parquet type that pyarrow, Polars and ``datasets`` read back as declared).
PARQUET_OPTIONS = {
    "compression": "zstd",
    "compression_level": 12,
    "use_dictionary": False,
    "store_schema": False,
}


def write_parquet(records, path: Path, batch_rows: int = 512, arrow_schema=None) -> int:
    """Records (any iterable) -> one Parquet file with exactly the declared schema (or
    ``arrow_schema``), atomically, written in row groups of ``batch_rows`` so memory does not
    grow with the sweep, with ``PARQUET_OPTIONS``. Writes no file (and removes an old one) when
    there are no rows: ``datasets`` refuses a file with no row group. Returns the number of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    fileio.make_folders(path.parent)
    # a name of its own (two compactions of one sweep at once must not write into one temporary
    # file)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    rows, writer = 0, None
    iterator = iter(records)
    try:
        try:
            while batch := list(itertools.islice(iterator, batch_rows)):
                if writer is None:
                    if arrow_schema is None:
                        writer = pq.ParquetWriter(
                            tmp,
                            schema.SCHEMA,
                            write_statistics=statistics_columns(),
                            **PARQUET_OPTIONS,
                        )
                    else:
                        writer = pq.ParquetWriter(tmp, arrow_schema, **PARQUET_OPTIONS)
                table = (
                    pa.Table.from_pylist(batch, schema=arrow_schema)
                    if arrow_schema
                    else schema.to_table(batch)
                )
                writer.write_table(table)
                rows += len(batch)
        finally:
            if writer is not None:
                writer.close()
        if rows:
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide shared sweep data
            fileio.replace_file(tmp, path)  # synced, then renamed: a crash never leaves a torn file
        else:
            tmp.unlink()
            fileio.remove(path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a failed write (a full disk) leaves no temp file behind
        raise
    return rows


def parquet_file(data_dir: Path, config: str, sweep_id: str) -> Path:
    check_name(sweep_id, "sweep id", f"{Path(data_dir) / config}")
    return Path(data_dir) / config / f"sweep={sweep_id}" / "part-0.parquet"
