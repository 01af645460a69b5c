"""A model's support card from code: ``model_support.support("org/model", data_dir)`` and
``model-support support MODEL``.

Read from the dataset alone (the ``results`` config, local or pulled from the Hub): for each stack
(its name in a sweep of several, the device type, torch and transformers versions, the device
backend as its adapter declares it, and the backend's settings) and variant, the model's latest
verdict, whether that PASS is right (and the measure that judged it), when it was last verified, how
many sweeps of that stack and variant agree with it, and the evidence (the sweep, the command that
reproduces that latest run, ``repro.command``, and the published notebook and log).
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from ..errors import UserError
from ..probe import repro
from ..record import store
from .frames import (
    BACKEND,
    SUSPECT_CHECKS,
    backend_col,
    backend_settings_col,
    check_measure_col,
    pass_check_col,
    variant_col,
    version,
)

#: What names a stack on a card: the sweep's stack name (``stacks:``; null for a sweep of one), the
#: device, the torch and transformers versions, the device backend (``frames.backend_col``: the
#: packages and runtime its adapter declares; null for torch alone) and the backend's settings (its
#: adapter's variables, compared as data).
STACK_KEYS = ("stack_name", "device_type", "torch", BACKEND, "transformers", "backend_settings")


def model_ids(data_dir: Path | str = "data") -> list[str]:
    """Every model id the dataset's ``results`` hold, sorted."""
    known = (
        store.scan(Path(data_dir), "results")
        .select("model_id")
        .unique()
        .collect()["model_id"]
        .to_list()
    )
    return sorted(k for k in known if k)


def closest(model_id: str, ids: list[str]) -> list[str]:
    """Up to three of ``ids`` that read most like ``model_id`` (difflib's ratio, at least 0.4),
    closest first."""
    import difflib

    return difflib.get_close_matches(model_id, ids, n=3, cutoff=0.4)


def _settings(text: str | None) -> dict:
    """A row's backend settings (JSON of variable -> value), {} for none."""
    return json.loads(text) if text else {}


def _as_data(value: str):
    """A setting's value as data where it is JSON (spacing and key order aside), else as written."""
    try:
        return json.loads(value)
    except ValueError:
        return value


def _settings_key(settings: dict) -> str:
    """What two rows' settings must share to be one stack: every variable's value, compared as
    data."""
    return json.dumps({name: _as_data(value) for name, value in settings.items()}, sort_keys=True)


def support(model_id: str, data_dir: Path | str = "data") -> list[dict]:
    """The model's card: one entry per stack and variant, newest verification first; one sentence
    when the dataset has no row of it (with the closest model ids)."""
    rows = (
        store.scan(Path(data_dir), "results")
        .filter(pl.col("model_id") == model_id, store.of_the_stack())
        .with_columns(
            variant_col(),
            pass_check_col().alias("check"),
            check_measure_col(),
            version("torch").alias("torch"),
            backend_col(),
            version("transformers").alias("transformers"),
            backend_settings_col(),
        )
        .select(
            "sweep_id",
            "variant",
            "status",
            "check",
            "check_measure",
            "failure_signature",
            *STACK_KEYS,
            "started_at",
            (pl.col("repro_sha256").is_not_null() | pl.col("repro_script").is_not_null()).alias(
                "has_repro"
            ),
            "notebook_url",
            "log_url",
        )
        .collect()
    )
    if rows.height == 0:
        raise UserError(
            f"No row of {model_id!r} in the dataset in {data_dir}; {_closest(model_id, data_dir)}"
        )
    cards: dict[tuple, list[dict]] = {}
    for r in rows.iter_rows(named=True):
        r["backend_settings"] = _settings(r["backend_settings"])
        stack = tuple(r[k] for k in STACK_KEYS[:-1]) + (_settings_key(r["backend_settings"]),)
        cards.setdefault((*stack, r["variant"]), []).append(r)
    out = []
    for key, runs in cards.items():
        runs.sort(key=lambda r: (r["started_at"] or "", r["sweep_id"]))
        latest = runs[-1]
        verdict = latest["status"]
        out.append(
            {
                "model_id": model_id,
                **{k: latest[k] for k in STACK_KEYS},
                "variant": key[-1],
                "verdict": verdict,
                "check": latest["check"],
                # what judged it (frames.check_measure_col)
                "check_measure": latest["check_measure"],
                "suspect": latest["check"] in SUSPECT_CHECKS,
                "failure_signature": latest["failure_signature"],
                "last_verified": latest["started_at"],
                "sweep_id": latest["sweep_id"],
                "sweeps": len(runs),
                "agreeing": sum(r["status"] == verdict for r in runs),
                # the command that reproduces this latest run, not the body every row of its code
                # shares
                "repro": repro.command(latest["sweep_id"], model_id, key[-1], data_dir)
                if latest["has_repro"]
                else None,
                "notebook_url": latest["notebook_url"],
                "log_url": latest["log_url"],
            }
        )
    out.sort(key=lambda c: c["last_verified"] or "", reverse=True)
    return out


def _closest(model_id: str, data_dir: Path | str) -> str:
    known = model_ids(data_dir)
    close = closest(model_id, known)
    return (
        f"did you mean {' or '.join(close)}?"
        if close
        else f"the dataset knows {len(known)} models."
    )
