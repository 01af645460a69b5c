"""Where records live on disk, and how they become the Parquet dataset: the dataset's one public
face.

Layout (docs/design.md): ``<data>/sweeps/<sweep_id>/`` holds ``sweep.json``, one JSON record per
model under ``records/`` and the executed notebooks; compaction writes
``<data>/results/sweep=<id>/part-0.parquet`` and ``<data>/excluded/sweep=<id>/part-0.parquet``.
Hive-style folders mean adding a sweep never rewrites another, and ``scan`` reads them all lazily.

The work is split by job, each its own module of ``record``: ``dataset_files`` (the configs, scans,
writing a Parquet file), ``sweep_folders`` (a sweep's folder, lock, file names, sweep.json, sweep
ids), ``sweep_files`` (records, logs, repro bodies, traces, pending models, an exclusion),
``journal`` (changes committed as a whole: compaction, exclude and include) and ``dataset_card``.
Callers import this module and use its names (``store.compact``), so where a name lives can change
without them.
"""

from __future__ import annotations

from .dataset_card import (  # noqa: F401 re-exported: the dataset's names, used as store.NAME
    DATASET_CARD,
    card_configs,
    field_table,
    write_dataset_card,
)
from .dataset_files import (  # noqa: F401 re-exported: the dataset's names, used as store.NAME
    CONFIGS,
    DATASET_CONFIGS,
    KEY_TEXTS,
    OPS_CONFIG,
    PARQUET_OPTIONS,
    WHAT_IF_CONFIG,
    parquet_file,
    polars_schema,
    scan,
    scan_ops,
    statistics_columns,
    write_parquet,
)
from .journal import (  # noqa: F401 re-exported: the dataset's names, used as store.NAME
    CHANGE,
    SIDECARS,
    change,
    compact,
    config_of,
    finish_interrupted,
    interrupted,
    require_whole,
    set_exclusion,
    set_published_logs,
)
from .sweep_files import (  # noqa: F401 re-exported: the dataset's names, used as store.NAME
    LOCALISED,
    PUBLISHED,
    REPRO,
    REPRO_BODY_MARK,
    REPRO_NAME,
    RUNNER_FILES,
    RUNNER_FOLDERS,
    TRACE_NAME,
    TRACES,
    copy_repro_bodies,
    exclusion,
    iter_records,
    keep_traces,
    pending_file,
    pending_key,
    published_logs,
    read_pending,
    read_records,
    remove_torn_runner_writes,
    repro_body,
    repro_dir,
    split_repro,
    store_exclusion,
    store_log,
    store_result,
    trace_kept,
    trace_name,
    trace_relpath,
    traces_in,
    write_pending,
)
from .sweep_folders import (  # noqa: F401 re-exported: the dataset's names, used as store.NAME
    LATEST,
    SweepLock,
    data_folder_lock,
    find_record,
    host_ops_by_rows,
    is_what_if,
    legacy_stem,
    list_sweeps,
    migrate_names,
    model_ids_of_rows,
    notebook_relpath,
    of_the_stack,
    read_sweep,
    record_file,
    resolve_sweep_id,
    stem,
    sweep_dir,
    what_if_setting,
    writing,
    writing_all,
)
