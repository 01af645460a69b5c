"""A model's support card from code: ``model_support.support("org/model", data_dir)`` and ``model-support
support MODEL``.

Read from the dataset alone (the ``results`` config, local or pulled from the Hub): for each stack (its name in a sweep of several,
device type and torch / torch_tpu / transformers versions) and variant, the model's latest verdict, whether that PASS is
right, when it was last verified, how many sweeps of that stack and variant agree with it, and the evidence
(the sweep, the repro body, the published notebook and log).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ..errors import UserError
from ..record import store
from .frames import SUSPECT_CHECKS, pass_check_col, variant_col

#: What names a stack on a card: the sweep's stack name (``stacks:``; null for a sweep of one), the device and versions.
STACK_KEYS = ("stack_name", "device_type", "torch", "torch_tpu", "transformers")


def support(model_id: str, data_dir: Path | str = "data") -> list[dict]:
    """The model's card: one entry per stack and variant, newest verification first; one sentence when the
    dataset has no row of it (with the closest model ids)."""
    rows = (
        store.scan(Path(data_dir), "results")
        .filter(pl.col("model_id") == model_id)
        .select(
            "sweep_id",
            "variant",
            "status",
            "numerics",
            "fluent",
            "failure_signature",
            "stack_name",
            "device_type",
            "versions",
            "started_at",
            "repro_sha256",
            "notebook_url",
            "log_url",
        )
        .with_columns(variant_col(), pass_check_col().alias("check"))
        .collect()
    )
    if rows.height == 0:
        raise UserError(f"No row of {model_id!r} in the dataset in {data_dir}; {_closest(model_id, data_dir)}")
    cards: dict[tuple, list[dict]] = {}
    for r in rows.iter_rows(named=True):
        versions = r["versions"] or {}
        stack = (
            r["stack_name"],
            r["device_type"],
            versions.get("torch"),
            versions.get("torch_tpu"),
            versions.get("transformers"),
        )
        cards.setdefault((*stack, r["variant"]), []).append(r)
    out = []
    for key, runs in cards.items():
        runs.sort(key=lambda r: (r["started_at"] or "", r["sweep_id"]))
        latest = runs[-1]
        verdict = latest["status"]
        out.append(
            {
                "model_id": model_id,
                **dict(zip(STACK_KEYS, key[:-1], strict=True)),
                "variant": key[-1],
                "verdict": verdict,
                "check": latest["check"],
                "suspect": latest["check"] in SUSPECT_CHECKS,
                "failure_signature": latest["failure_signature"],
                "last_verified": latest["started_at"],
                "sweep_id": latest["sweep_id"],
                "sweeps": len(runs),
                "agreeing": sum(r["status"] == verdict for r in runs),
                "repro": f"{store.REPRO}/{latest['repro_sha256']}.py" if latest["repro_sha256"] else None,
                "notebook_url": latest["notebook_url"],
                "log_url": latest["log_url"],
            }
        )
    out.sort(key=lambda c: c["last_verified"] or "", reverse=True)
    return out


def _closest(model_id: str, data_dir: Path | str) -> str:
    import difflib

    known = store.scan(Path(data_dir), "results").select("model_id").unique().collect()["model_id"].to_list()
    close = difflib.get_close_matches(model_id, [k for k in known if k], n=3, cutoff=0.4)
    return f"did you mean {' or '.join(close)}?" if close else f"the dataset knows {len(known)} models."
