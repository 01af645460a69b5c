"""The PASS runs that cost the host: device-to-host syncs or CPU fallbacks per decode token above a
threshold.

Why: a PASS that copies to the host or runs an operator on the CPU at every token is slow in
production, and its verdict does not say so. Each PASS row carries what its stack counted (the
record's ``host`` group, by ``probe.instruments.host_cost``); the report lists those above the
thresholds. The default sync threshold is one per token: transformers' own end-of-sequence check
costs every model one on every stack, so more than one is the model's or the stack's. Any fallback
call per token counts.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ..record import schema, store
from .diff import KEY
from .frames import sweep_rows, variant_col

#: Syncs per decode token above which a PASS is listed (generate's end-of-sequence check is one).
SYNCS_PER_TOKEN = 1.0
#: Fallback calls per decode token above which a PASS is listed.
FALLBACK_CALLS_PER_TOKEN = 0.0
#: The table's columns, in order.
COLUMNS = (
    "model_id",
    "variant",
    "host_syncs_per_token",
    "harness_syncs_per_token",
    "prefill_host_syncs",
    "fallback_calls_per_token",
    "fallbacks",
    "host_cost_note",
)


def host_cost_table(
    data_dir: Path | str,
    sweep_id: str,
    syncs: float = SYNCS_PER_TOKEN,
    fallback_calls: float = FALLBACK_CALLS_PER_TOKEN,
) -> pl.DataFrame:
    """The latest PASS of each (model, variant) of ``sweep_id`` whose syncs or fallback calls per
    decode token are above the thresholds (``COLUMNS``; ``fallbacks``: each operator with its
    calls in the generation), the most syncs first. Sweeps from before the fields (record version
    17) have none."""
    results = store.scan(Path(data_dir), "results")
    wanted = ["model_id", "variant", "status", "started_at", *schema.names_in("host")]
    rows = (
        sweep_rows(results, sweep_id, wanted)
        .with_columns(variant_col())
        .sort("started_at", nulls_last=False)
        .unique(KEY, keep="last", maintain_order=False)
        .filter(pl.col("status") == schema.PASS)
        .filter(
            (pl.col("host_syncs_per_token") > syncs)
            | (pl.col("fallback_calls_per_token") > fallback_calls)
        )
        .collect()
    )
    shown = [
        {
            **{c: r[c] for c in COLUMNS if c != "fallbacks"},
            "fallbacks": ", ".join(
                f"{op} x{n}" for op, n in zip(r["fallback_ops"] or [], r["fallback_op_calls"] or [])
            )
            or None,
        }
        for r in rows.iter_rows(named=True)
    ]
    table = pl.DataFrame(shown, schema={c: rows.schema.get(c, pl.String) for c in COLUMNS})
    return table.select(COLUMNS).sort(
        ["host_syncs_per_token", "model_id"], descending=[True, False], nulls_last=True
    )
