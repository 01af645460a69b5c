"""What a sweep listed but did not probe, and what the Hub says about each model.

A model listed in a sweep's ``sweep.json`` (once per variant of the sweep's matrix: a record is one
(model, variant); a null variant reads as ``eager+dynamic``) ends in one of four ways: a ``results``
row (its verdict), an ``excluded`` row (left out on purpose, or found without access while the sweep
ran), an entry of ``pending.json`` (the network or the disk kept it from being probed: ``--resume``
retries it), or nothing yet (the sweep is still running, or was stopped): "not tested". The last two
are never failures: they have no verdict, are never in a pass rate and never in a diff.

``sweep.json`` also says how each model came to be listed: explicitly in the sweep definition, or
from a Hub ranking (``hub["listed_by"]``: downloads, trending or likes), with the Hub metadata
known when the sweep was created. ``listings`` reads that for every sweep.
"""

from __future__ import annotations

import glob
import io
import json
import re
from pathlib import Path

import polars as pl

from .. import fileio
from ..fileio import atomic_write_bytes
from ..probe import probe_params
from ..record import schema, store
from ..record.sweep_meta import SweepMeta
from .frames import DEFAULT_VARIANT, variant_col

#: The pseudo-verdicts of models listed in a sweep without a row (never failures).
NOT_PROBED = "not probed"
NOT_TESTED = "not tested"
UNPROBED_HELP = {
    NOT_PROBED: "the network or the disk kept it from being probed (pending, with its last error); "
    "resuming the sweep retries it; never counted as a failure",
    NOT_TESTED: "listed in the sweep but without a record yet: the sweep is still running or was stopped; "
    "resuming the sweep probes it; never counted as a failure",
}
PENDING_SCHEMA = {
    "sweep_id": pl.String,
    "model_id": pl.String,
    "variant": pl.String,
    "problem": pl.String,
    "last_error": pl.String,
    "at": pl.String,
}
LISTED_SCHEMA = {
    "sweep_id": pl.String,
    "model_id": pl.String,
    "variant": pl.String,
    "listed_by": pl.String,
}
KEY = ["model_id", "variant"]
#: A pending key of a variant but the default one: ``org/name [compile+static]``
#: (``store.pending_key``).
_PENDING_KEY = re.compile(r"^(?P<model>.+) \[(?P<variant>[^\[\]]+)\]$")
#: The version of the cached listings' layout (part of the cache file name: an older layout is
#: rebuilt).
_LISTING_LAYOUT = "v2"


def _hub_schema() -> dict:
    types = store.polars_schema()
    return {
        "sweep_id": pl.String,
        "model_id": pl.String,
        **{f: types[f] for f in schema.HUB_FIELDS},
    }


def resume_command(sweep_id: str) -> str:
    return f"model-support sweep --resume {sweep_id}"


def pending_key_parts(key: str, entry: dict | None = None) -> tuple[str, str]:
    """A ``pending.json`` key (and its entry) -> (model_id, variant): ``org/x [compile+static]``
    is that variant of org/x; a plain key is the default variant. An entry's own model_id /
    variant win."""
    entry = entry or {}
    found = _PENDING_KEY.match(key)
    model_id, variant = (found["model"], found["variant"]) if found else (key, DEFAULT_VARIANT)
    return entry.get("model_id") or model_id, entry.get("variant") or variant


def pending_rows(data_dir: Path | str, sweep_ids) -> pl.DataFrame:
    """sweep_id, model_id, variant, problem (network or disk), last_error (one sentence), at (ISO
    time): every (model, variant) left pending by the given sweeps (``pending.json``), sorted by
    sweep then model."""
    rows = []
    for sweep_id in sweep_ids:
        for key, entry in store.read_pending(Path(data_dir), sweep_id).items():
            entry = entry if isinstance(entry, dict) else {"reason": str(entry)}
            model_id, variant = pending_key_parts(key, entry)
            problem = entry.get("problem") or "network"
            rows.append(
                (sweep_id, model_id, variant, problem, entry.get("reason"), entry.get("at"))
            )
    return pl.DataFrame(rows, schema=PENDING_SCHEMA, orient="row").sort(
        "sweep_id", "model_id", "variant"
    )


def _read_meta(path: Path) -> SweepMeta:
    with open(path, encoding="utf-8") as handle:
        raw = json.load(handle)
    raw.setdefault("sweep_id", path.parent.name)
    return SweepMeta.from_dict(raw)


def model_variants(meta: SweepMeta, overrides: dict | None = None) -> list[str]:
    """The variants a sweep probes a model in: its matrix's combinations over the probe settings
    and the model's overrides (``probe_params.variant``); one, the sweep's own, without a matrix."""
    base = {**(meta.probe or {}), **(overrides or {})}
    labels = []
    for combo in probe_params.combinations(
        getattr(meta, "matrix", None), getattr(meta, "stacks", None)
    ):
        try:
            label = probe_params.variant({**base, **combo})
        except (TypeError, ValueError, AttributeError):  # a hand-edited sweep.json
            label = DEFAULT_VARIANT
        if label not in labels:
            labels.append(label)
    return labels


def _sweep_listing(path: Path) -> pl.DataFrame:
    """One ``sweep.json``'s models, once per variant: sweep_id, model_id, variant, listed_by, then
    ``schema.HUB_FIELDS``."""
    meta = _read_meta(path)
    entries = [(e, v) for e in meta.models for v in model_variants(meta, e.overrides)]
    hubs = [e.hub or {} for e, _ in entries]
    frame = _hub_frame(
        [
            {**h, "sweep_id": meta.sweep_id, "model_id": e.model_id}
            for (e, _), h in zip(entries, hubs)
        ]
    )
    variants = pl.Series("variant", [v for _, v in entries], dtype=pl.String)
    listed_by = pl.Series("listed_by", [h.get("listed_by") for h in hubs], dtype=pl.String)
    return frame.insert_column(2, variants).insert_column(3, listed_by)


def _cached_listing(path: Path, cache_dir: Path) -> pl.DataFrame:
    """``_sweep_listing``, kept as Parquet in ``cache_dir`` under the sweep.json's size and mtime
    (a sweep.json is written once, when its sweep is created: parsing 100 of 10,000 models each
    takes seconds, reading them back a fraction of one). A cache that cannot be written is only
    slower."""
    stat = path.stat()
    cached = (
        cache_dir
        / f"{path.parent.name}.{_LISTING_LAYOUT}.{stat.st_size}-{stat.st_mtime_ns}.parquet"
    )
    if cached.is_file():
        try:
            return pl.read_parquet(cached)
        except (OSError, pl.exceptions.PolarsError):
            pass
    frame = _sweep_listing(path)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        for old in cache_dir.glob(f"{glob.escape(path.parent.name)}.*.parquet"):
            fileio.remove(old)
        buffer = io.BytesIO()
        frame.write_parquet(buffer)
        atomic_write_bytes(cached, buffer.getvalue())
    except OSError:
        pass
    return frame


def listings(
    data_dir: Path | str, sweep_ids=None, cache_dir: Path | None = None
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The models every sweep listed (all sweeps with a ``sweep.json``, or only ``sweep_ids``).

    Returns (listed, hub): listed has sweep_id, model_id, variant (one row per variant the sweep
    probes the model in), listed_by (null: listed explicitly in the sweep definition; else the Hub
    ranking it came from); hub has sweep_id, model_id and ``schema.HUB_FIELDS`` for the models that
    carry Hub metadata, once each (others are left out: it stays small). ``cache_dir``: keep each
    sweep's listing there as Parquet (see ``_cached_listing``).
    """
    folder = Path(data_dir) / "sweeps"
    paths = (
        sorted(folder.glob("*/sweep.json"))
        if sweep_ids is None
        else [p for p in (folder / s / "sweep.json" for s in sweep_ids) if p.is_file()]
    )
    frames = [
        _cached_listing(p, Path(cache_dir)) if cache_dir else _sweep_listing(p) for p in paths
    ]
    both = pl.concat(frames) if frames else _sweep_listing_schema()
    known = pl.any_horizontal([pl.col(f).is_not_null() for f in schema.HUB_FIELDS])
    hub = both.filter(known).unique(["sweep_id", "model_id"], keep="first", maintain_order=True)
    return both.select(*LISTED_SCHEMA), hub.drop("variant", "listed_by")


def _sweep_listing_schema() -> pl.DataFrame:
    return (
        _hub_frame([])
        .insert_column(2, pl.Series("variant", [], dtype=pl.String))
        .insert_column(3, pl.Series("listed_by", [], dtype=pl.String))
    )


def _hub_frame(rows: list[dict]) -> pl.DataFrame:
    """Hub dicts -> a typed frame; a value of the wrong type (a hand-edited sweep.json) reads as
    null."""
    columns = {}
    for name, dtype in _hub_schema().items():
        values = [r.get(name) for r in rows]
        if dtype == pl.String:
            values = [None if v is None else str(v) for v in values]
        else:
            values = [v if isinstance(v, int) and not isinstance(v, bool) else None for v in values]
        columns[name] = pl.Series(name, values, dtype=dtype)
    return pl.DataFrame(columns)


def unprobed(
    data_dir: Path | str, sweep_id: str, probed: pl.DataFrame | None = None
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One sweep's (model, variant) runs without a row: (pending, not_tested).

    ``probed`` holds the model_id (and variant; null or absent: the default one) of the sweep's rows
    in either config (read here when None); a run with a row is neither pending nor not tested,
    whatever ``pending.json`` still says. pending: model_id, variant, problem, last_error, at.
    not_tested: model_id, variant, listed_by.
    """
    if probed is None:
        probed = pl.concat(
            [
                store.scan(Path(data_dir), c)
                .filter(pl.col("sweep_id") == sweep_id)
                .select("model_id", "variant")
                for c in store.CONFIGS
            ]
        ).collect()
    if "variant" not in probed.columns:
        probed = probed.with_columns(pl.lit(None, dtype=pl.String).alias("variant"))
    probed = probed.select("model_id", variant_col()).unique()
    pending = pending_rows(data_dir, [sweep_id]).join(probed, on=KEY, how="anti").drop("sweep_id")
    listed, _ = listings(data_dir, [sweep_id])
    not_tested = (
        listed.join(probed, on=KEY, how="anti")
        .join(pending.select(KEY), on=KEY, how="anti")
        .unique(KEY, keep="first", maintain_order=True)
        .sort("model_id", "variant")
        .select("model_id", "variant", "listed_by")
    )
    return pending.sort("model_id", "variant"), not_tested


def _row_keys(data_dir: Path | str) -> pl.LazyFrame:
    """(sweep_id, model_id, variant) of every row of either config (a null variant: the default
    one)."""
    return pl.concat(
        [
            store.scan(Path(data_dir), c).select("sweep_id", "model_id", variant_col())
            for c in store.CONFIGS
        ]
    )


def unprobed_rows(
    data_dir: Path | str, listed: pl.DataFrame, pending: pl.DataFrame
) -> pl.DataFrame:
    """Every sweep's (model, variant) runs without a row, as pseudo-rows: sweep_id, model_id,
    variant, status (``NOT_PROBED`` for a pending run, ``NOT_TESTED`` for one listed in
    ``sweep.json`` and neither probed nor pending), failure_signature (the pending run's last
    error; null when not tested).

    ``listed`` and ``pending`` come from ``listings`` and ``pending_rows``."""
    keys = _row_keys(data_dir)
    on = ["sweep_id", *KEY]
    waiting = pending.lazy().join(keys, on=on, how="anti")
    untested = (
        listed.lazy()
        .select(on)
        .join(keys, on=on, how="anti")
        .join(pending.lazy(), on=on, how="anti")
        .unique(on)
    )
    return pl.concat(
        [
            waiting.select(
                *on,
                pl.lit(NOT_PROBED).alias("status"),
                pl.col("last_error").alias("failure_signature"),
            ),
            untested.select(
                *on,
                pl.lit(NOT_TESTED).alias("status"),
                pl.lit(None, pl.String).alias("failure_signature"),
            ),
        ]
    ).collect()


def latest_hub(data_dir: Path | str, sweeps: pl.DataFrame, hub: pl.DataFrame) -> pl.DataFrame:
    """model_id and each of ``schema.HUB_FIELDS``: its latest known value (the latest sweep that
    knows it; within a sweep a record wins over ``sweep.json``), for every model that has any.
    ``sweeps`` is a ``sweep_index`` (its order), ``hub`` the second frame of ``listings``."""
    order = sweeps.lazy().with_row_index("s").select("sweep_id", pl.col("s").cast(pl.Int64))
    known = pl.any_horizontal([pl.col(f).is_not_null() for f in schema.HUB_FIELDS])
    records = [
        store.scan(Path(data_dir), c)
        .select("sweep_id", "model_id", *schema.HUB_FIELDS)
        .filter(known)
        for c in store.CONFIGS
    ]
    sources = [r.with_columns(pl.lit(1).alias("p")) for r in records]
    sources.append(
        hub.lazy()
        .select("sweep_id", "model_id", *schema.HUB_FIELDS)
        .with_columns(pl.lit(0).alias("p"))
    )
    return (
        pl.concat(sources)
        .join(order, on="sweep_id", how="left")
        .sort("model_id", "s", "p", nulls_last=False)
        .group_by("model_id", maintain_order=True)
        .agg([pl.col(f).drop_nulls().last() for f in schema.HUB_FIELDS])
        .collect()
    )


def views(listed: pl.DataFrame, hub: pl.DataFrame) -> dict[str, list[str]]:
    """The explorer's curated views, as model ids in display order: ``selected`` (listed explicitly
    in a sweep definition, not from a Hub ranking; by id), ``trending`` (by the latest known
    trending_score, highest first) and ``downloads`` (by downloads, highest first); ``hub`` is
    ``latest_hub``. A model without the score is not in that view."""
    selected = listed.filter(pl.col("listed_by").is_null())["model_id"].unique().sort().to_list()

    def ranked(field: str) -> list[str]:
        return (
            hub.filter(pl.col(field).is_not_null())
            .sort([field, "model_id"], descending=[True, False])["model_id"]
            .to_list()
        )

    return {
        "selected": selected,
        "trending": ranked("trending_score"),
        "downloads": ranked("downloads"),
    }


def rankings(listed: pl.DataFrame) -> dict[str, str]:
    """model_id -> the Hub rankings that listed it in any sweep (``"downloads, trending"``)."""
    found = (
        listed.drop_nulls("listed_by")
        .group_by("model_id")
        .agg(pl.col("listed_by").unique().sort().str.join(", "))
    )
    return dict(found.iter_rows())
