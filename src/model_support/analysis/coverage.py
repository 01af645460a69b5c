"""What a sweep listed but did not probe, and what the Hub says about each model.

A model listed in a sweep's ``sweep.json`` ends in one of four ways: a ``results`` row (its
verdict), an ``excluded`` row (left out on purpose, or found without access while the sweep ran),
an entry of ``pending.json`` (the network or the disk kept it from being probed: ``--resume``
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
from pathlib import Path

import polars as pl

from .. import store
from ..fileio import atomic_write_bytes
from ..sweep_meta import SweepMeta

#: The pseudo-verdicts of models listed in a sweep without a row (never failures).
NOT_PROBED = "not probed"
NOT_TESTED = "not tested"
UNPROBED_HELP = {
    NOT_PROBED: "the network or the disk kept it from being probed (pending, with its last error); resuming the "
    "sweep retries it; never counted as a failure",
    NOT_TESTED: "listed in the sweep but without a record yet: the sweep is still running or was stopped; resuming "
    "the sweep probes it; never counted as a failure",
}
#: The Hub metadata fields of a record (the same names in ``sweep.json``'s ``hub`` dicts).
HUB_FIELDS = (
    "pipeline_tag",
    "library_name",
    "downloads",
    "likes",
    "trending_score",
    "gated",
    "license",
    "created_at",
    "base_model",
    "hub_num_params",
)
PENDING_SCHEMA = {
    "sweep_id": pl.String,
    "model_id": pl.String,
    "problem": pl.String,
    "last_error": pl.String,
    "at": pl.String,
}
LISTED_SCHEMA = {"sweep_id": pl.String, "model_id": pl.String, "listed_by": pl.String}


def _hub_schema() -> dict:
    types = store.polars_schema()
    return {"sweep_id": pl.String, "model_id": pl.String, **{f: types[f] for f in HUB_FIELDS}}


def resume_command(sweep_id: str) -> str:
    return f"model-support sweep --resume {sweep_id}"


def pending_rows(data_dir: Path | str, sweep_ids) -> pl.DataFrame:
    """sweep_id, model_id, problem (network or disk), last_error (one sentence), at (ISO time): every
    model left pending by the given sweeps (``pending.json``), sorted by sweep then model."""
    rows = []
    for sweep_id in sweep_ids:
        for model_id, entry in store.read_pending(Path(data_dir), sweep_id).items():
            entry = entry if isinstance(entry, dict) else {"reason": str(entry)}
            rows.append((sweep_id, model_id, entry.get("problem") or "network", entry.get("reason"), entry.get("at")))
    return pl.DataFrame(rows, schema=PENDING_SCHEMA, orient="row").sort("sweep_id", "model_id")


def _read_meta(path: Path) -> SweepMeta:
    with open(path, encoding="utf-8") as handle:
        raw = json.load(handle)
    raw.setdefault("sweep_id", path.parent.name)
    return SweepMeta.from_dict(raw)


def _sweep_listing(path: Path) -> pl.DataFrame:
    """One ``sweep.json``'s models: sweep_id, model_id, listed_by, then ``HUB_FIELDS``."""
    meta = _read_meta(path)
    models = [e.model_id for e in meta.models]
    hubs = [e.hub or {} for e in meta.models]
    frame = _hub_frame([{**h, "sweep_id": meta.sweep_id, "model_id": m} for m, h in zip(models, hubs)])
    listed_by = pl.Series("listed_by", [h.get("listed_by") for h in hubs], dtype=pl.String)
    return frame.insert_column(2, listed_by)


def _cached_listing(path: Path, cache_dir: Path) -> pl.DataFrame:
    """``_sweep_listing``, kept as Parquet in ``cache_dir`` under the sweep.json's size and mtime
    (a sweep.json is written once, when its sweep is created: parsing 100 of 10,000 models each
    takes seconds, reading them back a fraction of one). A cache that cannot be written is only slower."""
    stat = path.stat()
    cached = cache_dir / f"{path.parent.name}.{stat.st_size}-{stat.st_mtime_ns}.parquet"
    if cached.is_file():
        try:
            return pl.read_parquet(cached)
        except (OSError, pl.exceptions.PolarsError):
            pass
    frame = _sweep_listing(path)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        for old in cache_dir.glob(f"{glob.escape(path.parent.name)}.*.parquet"):
            old.unlink(missing_ok=True)
        buffer = io.BytesIO()
        frame.write_parquet(buffer)
        atomic_write_bytes(cached, buffer.getvalue())
    except OSError:
        pass
    return frame


def listings(data_dir: Path | str, sweep_ids=None, cache_dir: Path | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The models every sweep listed (all sweeps with a ``sweep.json``, or only ``sweep_ids``).

    Returns (listed, hub): listed has sweep_id, model_id, listed_by (null: listed explicitly in the
    sweep definition; else the Hub ranking it came from); hub has sweep_id, model_id and
    ``HUB_FIELDS`` for the entries that carry Hub metadata (others are left out: it stays small).
    ``cache_dir``: keep each sweep's listing there as Parquet (see ``_cached_listing``).
    """
    folder = Path(data_dir) / "sweeps"
    paths = (
        sorted(folder.glob("*/sweep.json"))
        if sweep_ids is None
        else [p for p in (folder / s / "sweep.json" for s in sweep_ids) if p.is_file()]
    )
    frames = [_cached_listing(p, Path(cache_dir)) if cache_dir else _sweep_listing(p) for p in paths]
    both = pl.concat(frames) if frames else _sweep_listing_schema()
    known = pl.any_horizontal([pl.col(f).is_not_null() for f in HUB_FIELDS])
    return both.select(*LISTED_SCHEMA), both.filter(known).drop("listed_by")


def _sweep_listing_schema() -> pl.DataFrame:
    return _hub_frame([]).insert_column(2, pl.Series("listed_by", [], dtype=pl.String))


def _hub_frame(rows: list[dict]) -> pl.DataFrame:
    """Hub dicts -> a typed frame; a value of the wrong type (a hand-edited sweep.json) reads as null."""
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
    """One sweep's models without a row: (pending, not_tested).

    ``probed`` holds the model_id of the sweep's rows in either config (read here when None); a
    model with a row is neither pending nor not tested, whatever ``pending.json`` still says.
    pending: model_id, problem, last_error, at. not_tested: model_id, listed_by.
    """
    if probed is None:
        probed = pl.concat(
            [
                store.scan(Path(data_dir), c).filter(pl.col("sweep_id") == sweep_id).select("model_id")
                for c in store.CONFIGS
            ]
        ).collect()
    probed = probed.select("model_id").unique()
    pending = pending_rows(data_dir, [sweep_id]).join(probed, on="model_id", how="anti").drop("sweep_id")
    listed, _ = listings(data_dir, [sweep_id])
    not_tested = (
        listed.join(probed, on="model_id", how="anti")
        .join(pending.select("model_id"), on="model_id", how="anti")
        .unique("model_id", keep="first", maintain_order=True)
        .sort("model_id")
        .select("model_id", "listed_by")
    )
    return pending.sort("model_id"), not_tested


def _row_keys(data_dir: Path | str) -> pl.LazyFrame:
    """(sweep_id, model_id) of every row of either config."""
    return pl.concat([store.scan(Path(data_dir), c).select("sweep_id", "model_id") for c in store.CONFIGS])


def unprobed_rows(data_dir: Path | str, listed: pl.DataFrame, pending: pl.DataFrame) -> pl.DataFrame:
    """Every sweep's models without a row, as pseudo-rows: sweep_id, model_id, status (``NOT_PROBED``
    for a pending model, ``NOT_TESTED`` for one listed in ``sweep.json`` and neither probed nor
    pending), failure_signature (the pending model's last error; null when not tested).

    ``listed`` and ``pending`` come from ``listings`` and ``pending_rows``."""
    keys = _row_keys(data_dir)
    waiting = pending.lazy().join(keys, on=["sweep_id", "model_id"], how="anti")
    untested = (
        listed.lazy()
        .select("sweep_id", "model_id")
        .join(keys, on=["sweep_id", "model_id"], how="anti")
        .join(pending.lazy(), on=["sweep_id", "model_id"], how="anti")
        .unique(["sweep_id", "model_id"])
    )
    return pl.concat(
        [
            waiting.select(
                "sweep_id",
                "model_id",
                pl.lit(NOT_PROBED).alias("status"),
                pl.col("last_error").alias("failure_signature"),
            ),
            untested.select(
                "sweep_id",
                "model_id",
                pl.lit(NOT_TESTED).alias("status"),
                pl.lit(None, pl.String).alias("failure_signature"),
            ),
        ]
    ).collect()


def latest_hub(data_dir: Path | str, sweeps: pl.DataFrame, hub: pl.DataFrame) -> pl.DataFrame:
    """model_id and each of ``HUB_FIELDS``: its latest known value (the latest sweep that knows it;
    within a sweep a record wins over ``sweep.json``), for every model that has any. ``sweeps`` is a
    ``sweep_index`` (its order), ``hub`` the second frame of ``listings``."""
    order = sweeps.lazy().with_row_index("s").select("sweep_id", pl.col("s").cast(pl.Int64))
    known = pl.any_horizontal([pl.col(f).is_not_null() for f in HUB_FIELDS])
    records = [
        store.scan(Path(data_dir), c).select("sweep_id", "model_id", *HUB_FIELDS).filter(known) for c in store.CONFIGS
    ]
    sources = [r.with_columns(pl.lit(1).alias("p")) for r in records]
    sources.append(hub.lazy().select("sweep_id", "model_id", *HUB_FIELDS).with_columns(pl.lit(0).alias("p")))
    return (
        pl.concat(sources)
        .join(order, on="sweep_id", how="left")
        .sort("model_id", "s", "p", nulls_last=False)
        .group_by("model_id", maintain_order=True)
        .agg([pl.col(f).drop_nulls().last() for f in HUB_FIELDS])
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

    return {"selected": selected, "trending": ranked("trending_score"), "downloads": ranked("downloads")}


def rankings(listed: pl.DataFrame) -> dict[str, str]:
    """model_id -> the Hub rankings that listed it in any sweep (``"downloads, trending"``)."""
    found = listed.drop_nulls("listed_by").group_by("model_id").agg(pl.col("listed_by").unique().sort().str.join(", "))
    return dict(found.iter_rows())
