"""Analysis: small Polars queries over the dataset (one sweep's tables, the diff against a
baseline, the history across sweeps), each returning a small DataFrame; the report renders them."""

from .diff import change_counts, diff_summary, model_changes, signature_changes
from .frames import (
    CHANGES,
    MEMORY_METRICS,
    NO_SIGNATURE,
    REFERENCE_OUTCOMES,
    SIGNATURE_CHANGES,
    SIZE_BUCKETS,
    TIMING_METRICS,
    TOKEN_METRICS,
    VERSION_COMPONENTS,
    size_bucket,
)
from .history import pass_rate_by_version, pass_rate_history, previous_sweep_id, require_sweep, sweep_index, sweep_stats
from .report_tables import report_tables
from .tables import (
    excluded_reasons,
    failure_signatures,
    memory_by_size,
    memory_stats,
    pass_rate_by_model_type,
    pass_rate_by_size,
    reference_agreement,
    sweep_summary,
    timing_histogram,
    timing_stats,
    token_stats,
    verdict_counts,
)

__all__ = [name for name in dir() if not name.startswith("_")]
