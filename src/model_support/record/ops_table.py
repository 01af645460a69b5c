"""The dataset's third config, ``ops``: one row per operator per sweep, from the rows' census.

Each row says which operator (``aten::add.Tensor``), on which stack (the sweep's device and versions), with
what status there (``implemented``, ``CPU fallback``, ``missing``, or ``unknown`` where the device adapter
cannot judge), the models whose probes called it and how often a probe calls it. A stack's coverage over
time is then a query over ``ops`` (docs/ops.md). Written by ``store.compact`` beside ``results`` and
``excluded``.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

from .schema import Versions, arrow_type

#: The row statuses, from the adapter's (``devices.OP_STATUSES``) as a reader says them.
IMPLEMENTED, CPU_FALLBACK, MISSING, UNKNOWN = "implemented", "CPU fallback", "missing", "unknown"

SCHEMA = pa.schema(
    [
        pa.field("sweep_id", pa.string()),
        pa.field("op", pa.string()),
        pa.field("status", pa.string()),
        pa.field("device_type", pa.string()),
        pa.field("versions", arrow_type(Versions)),
        pa.field("models", pa.list_(pa.string())),
        pa.field("probes", pa.int64()),
        pa.field("calls", pa.int64()),
        pa.field("calls_per_probe", pa.float64()),
    ]
)
#: What each column holds (the dataset card).
DOCS = {
    "sweep_id": "the sweep",
    "op": "the operator, as the dispatcher names it (aten::add.Tensor; aten::rsqrt for the default overload)",
    "status": "on the sweep's stack: implemented, CPU fallback, missing, or unknown (the adapter cannot judge)",
    "device_type": "the sweep's device",
    "versions": "the sweep's stack (python, torch, torch_tpu, libtpu, transformers, ...)",
    "models": "the models whose probes called it",
    "probes": "how many probes called it",
    "calls": "its calls over those probes",
    "calls_per_probe": "calls / probes",
}


def op_rows(records: Iterable[dict]) -> list[dict]:
    """The ``ops`` rows of one sweep's records (those with a census), the most-called operator first."""
    found: dict[str, dict] = {}
    stack: dict = {}
    for record in records:
        if record.get("exclusion_reason") or record.get("ops") is None:
            continue
        stack = stack or {"device_type": record.get("device_type"), "versions": record.get("versions")}
        missing, fallback = set(record.get("ops_missing") or ()), set(record.get("ops_fallback") or ())
        unknown = set(record.get("ops_unknown") or ())
        for op, calls in zip(record["ops"], record.get("ops_calls") or [0] * len(record["ops"])):
            row = found.setdefault(
                op, {"sweep_id": record["sweep_id"], "op": op, "statuses": set(), "models": [], "calls": 0}
            )
            row["statuses"].add(
                MISSING
                if op in missing
                else CPU_FALLBACK
                if op in fallback
                else UNKNOWN
                if op in unknown
                else IMPLEMENTED
            )
            if record["model_id"] not in row["models"]:
                row["models"].append(record["model_id"])
            row["calls"] += calls
            row["probes"] = row.get("probes", 0) + 1
    rows = []
    for row in found.values():
        statuses = row.pop("statuses")
        status = next(s for s in (MISSING, CPU_FALLBACK, UNKNOWN, IMPLEMENTED) if s in statuses)
        rows.append(
            {
                **row,
                **stack,
                "status": status,
                "models": sorted(row["models"]),
                "calls_per_probe": row["calls"] / row["probes"],
            }
        )
    rows.sort(key=lambda r: (-r["calls"], r["op"]))
    return rows
