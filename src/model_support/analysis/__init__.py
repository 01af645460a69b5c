"""Analysis: small Polars queries over the dataset (one sweep's tables, the diff against a
baseline, the history across sweeps), each returning a small DataFrame; the report renders them."""

from .diff import change_counts, diff_summary, model_changes, signature_changes
from .frames import (
    AGREES,
    ATTRIBUTION_KIND_HELP,
    ATTRIBUTION_KINDS,
    CHANGES,
    DEFAULT_VARIANT,
    DIVERGES,
    FLUENT,
    MEMORY_METRICS,
    NEWLY_BROKEN_BY_STACK,
    NEWLY_FAILING,
    NEWLY_FAILING_EVERYWHERE,
    NEWLY_SUSPECT,
    NO_LONGER_SUSPECT,
    NO_SIGNATURE,
    NOT_FLUENT,
    PASS_CHECK_HELP,
    PASS_CHECKS,
    REFERENCE_OUTCOMES,
    SIGNATURE_CHANGES,
    SIZE_BUCKETS,
    SUSPECT_CHECKS,
    TASKS,
    TIES,
    TIMING_METRICS,
    TOKEN_METRICS,
    UNCHECKED,
    UNKNOWN_ATTRIBUTION,
    VERSION_COMPONENTS,
    check_measure_col,
    pass_check_col,
    size_bucket,
    sort_variants,
    task_col,
    variant_key,
)
from .history import (
    SWEEP_CACHE,
    pass_rate_by_version,
    pass_rate_history,
    previous_sweep_id,
    require_sweep,
    sweep_index,
    sweep_stats,
)
from .modes import (
    eager_pass_compile_fail,
    graph_break_reasons,
    sweep_variants,
    variant_stats,
    verdict_grid,
)
from .parallel import (
    PARALLELISM_HELP,
    PARALLELISMS,
    multi_device_runs,
    pass_rate_by_parallelism,
    uses_devices,
)
from .passes_checked import pass_checks, suspect_passes, suspect_words
from .report_tables import report_tables
from .tables import (
    attribution_counts,
    excluded_reasons,
    failure_signatures,
    memory_by_size,
    memory_stats,
    pass_rate_by_model_type,
    pass_rate_by_size,
    pass_rate_by_task,
    reference_agreement,
    sweep_summary,
    timing_histogram,
    timing_stats,
    token_stats,
    verdict_counts,
)

__all__ = [name for name in dir() if not name.startswith("_")]
