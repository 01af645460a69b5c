"""The dataset's third config, ``ops``: one row per operator and dtype signature per sweep, from the
rows' census; and the words for what a stack does with an operator, declared here once.

Each row says which operator (``aten::add.Tensor``) with which dtype signature (``bf16,bf16``: the
census' ``ops_sig_dtypes``, ``probe.census.dtype_signature``) and range of ranks, on which stack
(the sweep's device and versions), with what status there (``implemented``, ``CPU fallback``,
``missing``, or ``unknown`` where the device adapter cannot judge: the operator's, which the row's
probes recorded), the models whose probes called it and how often a probe calls it. A record from
before signatures (record version 17) gives one row per operator, its ``dtypes`` null. A stack's
coverage over time is then a query over ``ops`` (docs/ops.md). Written by ``store.compact`` beside
``results`` and ``excluded``.

The status words live here, the lowest room that says them (the device adapters in
``probe.devices``, the census and ``ops`` import them), so this module imports nothing heavy until
its Arrow schema is asked for: the adapters are imported by processes that must stay light (the
sweep's runner, a gated probe waiting for its devices).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

#: What a stack does with an operator (a device adapter's ``op_coverage``): its own kernel (or a
#: composite of others it has), a boxed fallback that runs it on the CPU, no kernel at all, or that
#: the adapter cannot tell.
IMPLEMENTED, FALLBACK, MISSING, UNKNOWN = "implemented", "fallback", "missing", "unknown"
#: Two more an adapter that knows its stack's faults can say (a dispatcher's registrations cannot
#: tell them): the device's runtime aborts in the operator (the process dies), or it runs and gives
#: wrong results. A row records neither: ``ops`` predicts from them.
CRASHES, WRONG = "crashes", "wrong"
OP_STATUSES = (IMPLEMENTED, FALLBACK, MISSING, UNKNOWN, CRASHES, WRONG)
#: The ``ops`` config's status of the four a row records, as a reader says them (a fallback runs on
#: the CPU).
ROW_STATUS = {
    IMPLEMENTED: "implemented",
    FALLBACK: "CPU fallback",
    MISSING: "missing",
    UNKNOWN: "unknown",
}
CPU_FALLBACK = ROW_STATUS[FALLBACK]

#: What each column holds (the dataset card).
DOCS = {
    "sweep_id": "the sweep",
    "op": "the operator, as the dispatcher names it (aten::add.Tensor; aten::rsqrt for the default "
    "overload)",
    "dtypes": "its dtype signature: the tensor arguments' dtypes in order, ->dtype when named (null: an "
    "older census)",
    "min_rank": "the lowest rank the probes called it with in that signature",
    "max_rank": "the highest rank the probes called it with in that signature",
    "status": "on the sweep's stack: implemented, CPU fallback, missing, or unknown (the adapter cannot "
    "judge)",
    "device_type": "the sweep's device",
    "versions": "the sweep's stack (python, torch, torch_tpu, libtpu, transformers, ...)",
    "models": "the models whose probes called it",
    "probes": "how many probes called it",
    "calls": "its calls over those probes",
    "calls_per_probe": "calls / probes",
}


@functools.cache
def _schema() -> Any:
    """The config's Arrow schema, built on first use (pyarrow is imported then, not with the
    status words)."""
    import pyarrow as pa

    from .schema import Versions, arrow_type

    return pa.schema(
        [
            pa.field("sweep_id", pa.string()),
            pa.field("op", pa.string()),
            pa.field("dtypes", pa.string()),
            pa.field("min_rank", pa.int64()),
            pa.field("max_rank", pa.int64()),
            pa.field("status", pa.string()),
            pa.field("device_type", pa.string()),
            pa.field("versions", arrow_type(Versions)),
            pa.field("models", pa.list_(pa.string())),
            pa.field("probes", pa.int64()),
            pa.field("calls", pa.int64()),
            pa.field("calls_per_probe", pa.float64()),
        ]
    )


def __getattr__(name: str) -> Any:
    """``ops_table.SCHEMA``, the Arrow schema, made when first read (PEP 562): see the module
    docstring."""
    if name == "SCHEMA":
        return _schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _row_status(op: str, missing: set, fallback: set, unknown: set) -> str:
    """One record's status of ``op``, from its ``ops_missing``, ``ops_fallback`` and
    ``ops_unknown``."""
    status = (
        MISSING
        if op in missing
        else FALLBACK
        if op in fallback
        else UNKNOWN
        if op in unknown
        else IMPLEMENTED
    )
    return ROW_STATUS[status]


#: A status seen by any probe of the sweep wins over those after it (a model that stopped at an
#: operator says more about the stack than one that never reached it).
_WORST_FIRST = (ROW_STATUS[MISSING], CPU_FALLBACK, ROW_STATUS[UNKNOWN], ROW_STATUS[IMPLEMENTED])


def _signatures(record: dict) -> Iterable[tuple]:
    """(op, dtypes, calls, min rank, max rank) of each of a record's census entries: per
    signature, or per operator (dtypes and ranks null) for a census from before signatures."""
    if record.get("ops_sig_ops") is not None:
        return zip(*(record.get(f) or [None] * len(record["ops_sig_ops"]) for f in SIG_COLUMNS))
    ops = record["ops"]
    return zip(
        ops,
        [None] * len(ops),
        record.get("ops_calls") or [0] * len(ops),
        [None] * len(ops),
        [None] * len(ops),
    )


#: The record's per-signature census fields (``probe.census.SIG_FIELDS``), in the order
#: ``_signatures`` reads them.
SIG_COLUMNS = (
    "ops_sig_ops",
    "ops_sig_dtypes",
    "ops_sig_calls",
    "ops_sig_min_rank",
    "ops_sig_max_rank",
)


def _widen(low: int | None, high: int | None, row: dict) -> None:
    """The row's range of ranks widened to ``low``..``high`` (None: unknown)."""
    if low is not None:
        row["min_rank"] = low if row["min_rank"] is None else min(row["min_rank"], low)
    if high is not None:
        row["max_rank"] = high if row["max_rank"] is None else max(row["max_rank"], high)


def op_rows(records: Iterable[dict]) -> list[dict]:
    """The ``ops`` rows of one sweep's records (those with a census), one per operator and dtype
    signature, the most-called first. Linear in the records: each row's models are a set (a sweep
    of 10,000 models searched a list per row before)."""
    found: dict[tuple, dict] = {}
    stack: dict = {}
    for record in records:
        if record.get("exclusion_reason") or record.get("ops") is None:
            continue
        stack = stack or {
            "device_type": record.get("device_type"),
            "versions": record.get("versions"),
        }
        missing, fallback = (
            set(record.get("ops_missing") or ()),
            set(record.get("ops_fallback") or ()),
        )
        unknown = set(record.get("ops_unknown") or ())
        for op, dtypes, calls, low, high in _signatures(record):
            row = found.get((op, dtypes))
            if row is None:
                row = found[(op, dtypes)] = {
                    "sweep_id": record["sweep_id"],
                    "op": op,
                    "dtypes": dtypes,
                }
                row.update(
                    statuses=set(), models=set(), calls=0, probes=0, min_rank=None, max_rank=None
                )
            row["statuses"].add(_row_status(op, missing, fallback, unknown))
            row["models"].add(record["model_id"])
            row["calls"] += calls or 0
            row["probes"] += 1
            _widen(low, high, row)
    rows = []
    for row in found.values():
        statuses = row.pop("statuses")
        status = next(s for s in _WORST_FIRST if s in statuses)
        rows.append(
            {
                **row,
                **stack,
                "status": status,
                "models": sorted(row["models"]),
                "calls_per_probe": row["calls"] / row["probes"],
            }
        )
    rows.sort(key=lambda r: (-r["calls"], r["op"], r["dtypes"] or ""))
    return rows
