"""Across sweeps: the index of every sweep, and pass rate over time and by stack version.

A sweep is known by its ``sweeps/<id>/sweep.json`` (read through ``sweep_meta.SweepMeta``, whatever
version wrote it) or by rows in either config. ``label`` (name and UTC time, from
``sweep_meta.parse_sweep_id``, finer where two sweeps would read the same: ``sweep_labels``) is what
charts and tables show for a sweep.
"""

from __future__ import annotations

import glob
import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from .. import fileio
from ..errors import UserError
from ..fileio import atomic_write_text
from ..record import schema, store
from ..record.sweep_meta import SweepMeta, parse_sweep_id
from .frames import (
    VERSION_COLUMNS,
    VERSION_COMPONENTS,
    Frame,
    as_lazy,
    restricted_to,
    version,
    with_rate,
)

# --------------------------------------------------------------------------------------------
# sweeps


def _parse_time(value) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        parsed = value
    else:
        text = str(value).strip()
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            try:
                parsed = datetime.strptime(text, "%Y%m%dT%H%M%SZ")
            except ValueError:
                return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def sweep_label(sweep_id: str, created: datetime | None = None) -> str:
    """``smoke 2026-12-02 17:30``: a sweep's name and UTC time, from its id (else ``created``)."""
    parsed = parse_sweep_id(sweep_id)
    when = parsed.time or created
    return f"{parsed.name} {when:%Y-%m-%d %H:%M}" if when else parsed.name


#: How finely a sweep's UTC time is shown, coarsest first (``sweep_labels``).
_TIME_FORMATS = ("%Y-%m-%d", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S")


def sweep_labels(
    sweep_ids: list[str], created: list[datetime | None] | None = None, coarsest: int = 1
) -> list[str]:
    """Labels that tell the sweeps apart: name and UTC time (from the id, else ``created``),
    shown to the minute (``coarsest=1``; ``0``: the date) and finer only where two would read the
    same: the seconds of two sweeps started in the same minute, then the id's suffix of two
    started in the same second; an id that still reads like another's is shown whole. A chart
    axis with one category per label never draws two sweeps as one."""
    parsed = [parse_sweep_id(i) for i in sweep_ids]
    times = [p.time or (created[k] if created else None) for k, p in enumerate(parsed)]

    def label(k: int, level: int) -> str:
        p, when = parsed[k], times[k]
        if when is None:
            return p.name
        text = f"{p.name} {when:{_TIME_FORMATS[min(level, len(_TIME_FORMATS) - 1)]}}"
        return f"{text} {p.suffix}" if level >= len(_TIME_FORMATS) and p.suffix else text

    levels = [coarsest] * len(sweep_ids)
    labels = [label(k, coarsest) for k in range(len(sweep_ids))]
    for _ in range(len(_TIME_FORMATS) + 1 - coarsest):
        seen = Counter(labels)
        for k, text in enumerate(labels):
            if seen[text] > 1:
                levels[k] += 1
                labels[k] = label(k, levels[k])
    seen = Counter(labels)
    return [text if seen[text] == 1 else sweep_ids[k] for k, text in enumerate(labels)]


def sweep_stats(results: Frame) -> pl.LazyFrame:
    """The one pass over every row that the across-sweep tables need: row counts by sweep_id,
    status, device_type, host and the stack's components (``VERSION_COMPONENTS``: torch, the
    backend, transformers; columns ``n`` and ``first_started_at``). A few hundred rows for a
    million records."""
    lf = restricted_to(
        results, list(dict.fromkeys(["sweep_id", "status", "host", "started_at", *VERSION_COLUMNS]))
    )
    return lf.group_by(
        "sweep_id",
        "status",
        "device_type",
        "host",
        *[version(c).alias(c) for c in VERSION_COMPONENTS],
    ).agg(pl.len().cast(pl.Int64).alias("n"), pl.col("started_at").min().alias("first_started_at"))


def _most_common(stats: pl.DataFrame | pl.LazyFrame, column: str) -> pl.LazyFrame:
    """sweep_id -> the non-null value of ``column`` covering the most rows (ties: smallest
    value)."""
    return (
        as_lazy(stats)
        .drop_nulls(column)
        .group_by("sweep_id", column)
        .agg(pl.col("n").sum())
        .sort(["sweep_id", "n", column], descending=[False, True, False])
        .group_by("sweep_id", maintain_order=True)
        .agg(pl.col(column).first())
    )


#: Where the report and the explorer keep what they read of each sweep.json (under the data folder).
SWEEP_CACHE = Path("reports") / ".cache" / "sweeps"
#: What ``sweep_index`` needs of a sweep.json (a few fields of a file that lists every model with
#: its Hub facts).
_META_FACTS = ("sweep_id", "name", "created_at", "params_file", "host", "device", "host_ops")


def _meta_facts(path: Path) -> dict:
    with open(path, encoding="utf-8") as handle:
        raw = json.load(handle)
    raw.setdefault("sweep_id", path.parent.name)
    meta = SweepMeta.from_dict(raw)
    return {
        "sweep_id": meta.sweep_id,
        "name": meta.name,
        "created_at": meta.created_at,
        "params_file": meta.params_file,
        "host": meta.host,
        "device": (meta.probe or {}).get("device"),
        # a what-if sweep's (store.what_if_setting)
        "host_ops": (meta.probe or {}).get("host_ops") or None,
    }


def _cached_meta_facts(path: Path, cache_dir: Path | None) -> dict:
    """``_meta_facts``, kept as a small JSON file in ``cache_dir`` under the sweep.json's size
    and mtime (a sweep.json of 10,000 models with their Hub facts is megabytes: a hundred of them
    take seconds to parse). A cache that cannot be read or written is only slower."""
    if cache_dir is None:
        return _meta_facts(path)
    stat = path.stat()
    cached = Path(cache_dir) / f"{path.parent.name}.{stat.st_size}-{stat.st_mtime_ns}.json"
    try:
        facts = json.loads(cached.read_text(encoding="utf-8"))
        if isinstance(facts, dict) and set(facts) == set(_META_FACTS):
            return facts
    except (OSError, ValueError):
        pass
    facts = _meta_facts(path)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        for old in cached.parent.glob(f"{glob.escape(path.parent.name)}.*.json"):
            fileio.remove(old)
        atomic_write_text(cached, json.dumps(facts))
    except OSError:
        pass
    return facts


def what_if_sweeps(
    data_dir: Path | str, sweep_ids: list[str], cache_dir: Path | None = None
) -> set[str]:
    """Which of ``sweep_ids`` are what-if sweeps (``store.what_if_setting``): by their
    definition's facts as ``sweep_index`` keeps them (``cache_dir``: a megabytes-long sweep.json
    is not parsed again), a sweep pulled without its definition by its rows
    (``store.host_ops_by_rows``: asked of all at once)."""
    data_dir = Path(data_dir)
    found, pulled = set(), []
    for sweep_id in sweep_ids:
        path = data_dir / "sweeps" / sweep_id / "sweep.json"
        if path.is_file():
            if _cached_meta_facts(path, cache_dir)["host_ops"]:
                found.add(sweep_id)
        else:
            pulled.append(sweep_id)
    return found | set(store.host_ops_by_rows(data_dir, pulled))


#: The sweep index's columns (``sweep_index``).
SWEEP_INDEX_SCHEMA = pl.Schema(
    {
        "sweep_id": pl.String(),
        "name": pl.String(),
        "label": pl.String(),
        "created_at": pl.Datetime("us", "UTC"),
        "models": pl.Int64(),
        "excluded": pl.Int64(),
        "device_type": pl.String(),
        "host": pl.String(),
        "params_file": pl.String(),
        "what_if": pl.Boolean(),
    }
)


def _counted_by_sweep(data_dir: Path, stats: pl.DataFrame | None) -> tuple[dict, dict]:
    """Per sweep id: its results rows (count, first start, most common device type and host) and
    its excluded rows (count, first start), in one ``pl.collect_all``."""
    if stats is None:
        stats = sweep_stats(store.scan(data_dir, "results")).collect()
    rows = (
        stats.lazy()
        .group_by("sweep_id")
        .agg(pl.col("n").sum().alias("models"), pl.col("first_started_at").min())
        .join(_most_common(stats, "device_type"), on="sweep_id", how="left")
        .join(_most_common(stats, "host"), on="sweep_id", how="left")
    )
    excluded = (
        store.scan(data_dir, "excluded")
        .group_by("sweep_id")
        .agg(
            pl.len().cast(pl.Int64).alias("excluded"),
            pl.col("started_at").min().alias("excluded_started_at"),
        )
    )
    counted, excluded_counted = pl.collect_all([rows, excluded])
    by_rows = {r["sweep_id"]: r for r in counted.iter_rows(named=True)}
    return by_rows, {r["sweep_id"]: r for r in excluded_counted.iter_rows(named=True)}


def sweep_index(
    data_dir: Path | str, stats: pl.DataFrame | None = None, cache_dir: Path | None = None
) -> pl.DataFrame:
    """Every known sweep, oldest first.

    A sweep is known by its ``sweeps/<id>/sweep.json`` or by rows in either config. Columns:
    sweep_id, name, created_at (UTC; from sweep.json, else the sweep's earliest ``started_at``),
    models (results rows), excluded (excluded rows), device_type, host, params_file, what_if (a
    what-if sweep: operators on the host, no verdict of the stack; ``what_if_sweeps``' rule: its
    definition, else its rows). ``stats`` (``sweep_stats`` of the results, collected) saves a pass
    over the rows when already at hand; ``cache_dir`` keeps what it reads of each sweep.json there
    (see ``_cached_meta_facts``).
    """
    data_dir = Path(data_dir)
    meta: dict[str, dict] = {}
    for path in sorted((data_dir / "sweeps").glob("*/sweep.json")):
        facts = _cached_meta_facts(path, cache_dir)
        meta[facts["sweep_id"]] = facts
    by_rows, by_excl = _counted_by_sweep(data_dir, stats)
    # a sweep pulled without its definition is a what-if one by its rows (asked of all at once; none
    # in a data folder of its own sweeps): its runs are in the what_if config, or older stand-ins in
    # results carry host_ops
    pulled = sorted((set(by_rows) | set(by_excl)) - set(meta) - {None})
    what_if = {s for s, facts in meta.items() if facts["host_ops"]} | set(
        store.host_ops_by_rows(data_dir, pulled)
    )

    records = []
    for sweep_id in sorted((set(meta) | set(by_rows) | set(by_excl)) - {None}):
        info = meta.get(sweep_id)
        row = by_rows.get(sweep_id, {})
        excl = by_excl.get(sweep_id, {})
        created = _parse_time(info["created_at"] if info else None)
        if created is None:
            created = _parse_time(row.get("first_started_at") or excl.get("excluded_started_at"))
        records.append(
            {
                "sweep_id": sweep_id,
                "name": info["name"] if info else parse_sweep_id(sweep_id).name,
                "label": sweep_label(sweep_id, created),
                "created_at": created,
                "models": row.get("models") or 0,
                "excluded": excl.get("excluded") or 0,
                "device_type": row.get("device_type") or (info["device"] if info else None),
                "host": (info["host"] if info else None) or row.get("host"),
                "params_file": info["params_file"] if info else None,
                "what_if": sweep_id in what_if,
            }
        )
    records.sort(
        key=lambda r: (
            r["created_at"] is None,
            r["created_at"] or datetime.min.replace(tzinfo=UTC),
            r["sweep_id"],
        )
    )
    ids: list[str] = [str(r["sweep_id"]) for r in records]
    times: list[datetime | None] = [
        r["created_at"] if isinstance(r["created_at"], datetime) else None for r in records
    ]
    for record, text in zip(records, sweep_labels(ids, times)):
        record["label"] = text  # two sweeps started in the same minute read apart
    frame = pl.DataFrame(records, schema=SWEEP_INDEX_SCHEMA, orient="row")
    return frame.sort(["created_at", "sweep_id"], nulls_last=True)


def require_sweep(sweeps: pl.DataFrame, sweep_id: str) -> str:
    """``sweep_id`` if ``sweeps`` (a ``sweep_index``) knows it; else a one-sentence ValueError."""
    known = sweeps["sweep_id"].to_list()
    if sweep_id not in known:
        listing = ", ".join(known) if known else "none"
        raise UserError(f"Unknown sweep id {sweep_id!r}; the known sweep ids are: {listing}.")
    return sweep_id


def previous_sweep_id(
    sweeps: pl.DataFrame, sweep_id: str, device_type: str | None = None
) -> str | None:
    """The latest sweep of the same name on the same device type created before ``sweep_id`` that
    has results rows (a wholly excluded sweep, e.g. a broken stack, is no baseline); None when
    there is none. A sweep of another list or another device is no default baseline: its diff
    would be every model's. ``device_type``: the sweep's own, where its rows do not say it yet (a
    sweep running: ``analysis.flakes``). A what-if sweep (``sweeps``' ``what_if``: operators on
    the host) is never one, nor has one: its runs are no verdict of the stack, even where older
    stand-ins of it sit in results (the report's default baseline, the nightly's, the gate's
    earlier verdicts all ask here)."""
    require_sweep(sweeps, sweep_id)
    rows = sweeps.to_dicts()
    position = [r["sweep_id"] for r in rows].index(sweep_id)
    this = {**rows[position], **({"device_type": device_type} if device_type else {})}
    if this.get("what_if"):
        return None
    for row in reversed(rows[:position]):
        # None: no rows
        same_device = this["device_type"] is None or row["device_type"] == this["device_type"]
        if row["models"] and row["name"] == this["name"] and same_device and not row.get("what_if"):
            return row["sweep_id"]
    return None


# --------------------------------------------------------------------------------------------
# across sweeps


def pass_rate_history(
    results: Frame, sweeps: pl.DataFrame | None = None, excluded: Frame | None = None
) -> pl.DataFrame:
    """One row per sweep, oldest first: sweep_id, name, created_at, models, passed, failed,
    pass_rate, excluded, device_type, and the sweep's (most common) torch, backend
    (``frames.backend_col``) and transformers versions, so that a regression shows up as a step at a
    version change.

    ``sweeps`` (a ``sweep_index``) gives names and creation times; without it the order is each
    sweep's earliest ``started_at``.
    """
    return history_query(sweep_stats(results).collect(), sweeps, excluded).collect()


def history_query(
    stats: pl.DataFrame, sweeps: pl.DataFrame | None, excluded: Frame | None
) -> pl.LazyFrame:
    per_sweep = (
        stats.lazy()
        .group_by("sweep_id")
        .agg(
            pl.col("n").sum().alias("models"),
            pl.col("n").filter(pl.col("status") == schema.PASS).sum().alias("passed"),
            pl.col("first_started_at").min(),
        )
    )
    for column in ("device_type", *VERSION_COMPONENTS):
        per_sweep = per_sweep.join(_most_common(stats, column), on="sweep_id", how="left")
    if excluded is not None:
        n_excluded = (
            restricted_to(excluded, ["sweep_id"])
            .group_by("sweep_id")
            .agg(pl.len().cast(pl.Int64).alias("excluded"))
        )
    else:
        n_excluded = pl.LazyFrame(schema={"sweep_id": pl.String, "excluded": pl.Int64})
    if sweeps is None:
        ids = stats["sweep_id"].unique().to_list()
        order = pl.LazyFrame(
            {
                "sweep_id": ids,
                "name": [parse_sweep_id(i).name for i in ids],
                "label": sweep_labels(ids),
            },
            schema={"sweep_id": pl.String, "name": pl.String, "label": pl.String},
        ).join(
            per_sweep.select(
                "sweep_id",
                pl.col("first_started_at")
                .str.to_datetime(time_zone="UTC", strict=False, time_unit="us")
                .alias("created_at"),
            ),
            on="sweep_id",
            how="left",
        )
    else:
        order = sweeps.lazy().select("sweep_id", "name", "label", "created_at")
    return (
        order.join(per_sweep.drop("first_started_at"), on="sweep_id", how="left")
        .join(n_excluded, on="sweep_id", how="left")
        .with_columns(
            pl.col("models").fill_null(0),
            pl.col("passed").fill_null(0),
            pl.col("excluded").fill_null(0),
        )
        .pipe(with_rate)
        .sort(["created_at", "sweep_id"], nulls_last=True)
        .select(
            "sweep_id",
            "name",
            "label",
            "created_at",
            "models",
            "passed",
            "failed",
            "pass_rate",
            "excluded",
            "device_type",
            *VERSION_COMPONENTS,
        )
    )


def pass_rate_by_version(
    results: Frame, component: str, sweeps: pl.DataFrame | None = None
) -> pl.DataFrame:
    """Pass rate per version of one stack ``component`` (torch, backend or transformers):
    component, version ("none" where not known, e.g. the backend of a row from before its adapter
    said it), sweeps, models, passed, failed, pass_rate, first_sweep; in order of first
    appearance."""
    return by_version_query(sweep_stats(results).collect(), component, sweeps).collect()


def by_version_query(
    stats: pl.DataFrame, component: str, sweeps: pl.DataFrame | None
) -> pl.LazyFrame:
    if component not in VERSION_COMPONENTS:
        raise UserError(
            f"{component!r} is not one of the stack components {', '.join(VERSION_COMPONENTS)}"
        )
    lf = stats.lazy().with_columns(pl.col(component).fill_null("none").alias("version"))
    if sweeps is not None:
        rank = (
            sweeps.lazy()
            .with_row_index("sweep_rank")
            .select("sweep_id", pl.col("sweep_rank").cast(pl.Int64))
        )
        lf = lf.join(rank, on="sweep_id", how="left")
    else:
        lf = lf.with_columns(pl.lit(None, dtype=pl.Int64).alias("sweep_rank"))
    return (
        lf.group_by("version")
        .agg(
            pl.col("sweep_id").n_unique().cast(pl.Int64).alias("sweeps"),
            pl.col("n").sum().alias("models"),
            pl.col("n").filter(pl.col("status") == schema.PASS).sum().alias("passed"),
            pl.col("sweep_id")
            .sort_by(["sweep_rank", "first_started_at"], nulls_last=True)
            .first()
            .alias("first_sweep"),
            pl.col("sweep_rank").min().alias("_rank"),
            pl.col("first_started_at").min().alias("_started"),
        )
        .pipe(with_rate)
        .sort(["_rank", "_started", "version"], nulls_last=True)
        .select(
            pl.lit(component).alias("component"),
            "version",
            "sweeps",
            "models",
            "passed",
            "failed",
            "pass_rate",
            "first_sweep",
        )
    )


# --------------------------------------------------------------------------------------------
# flips and streaks per model


def model_streaks(results: Frame, sweeps: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per model and variant over the sweeps of one name and device type, oldest first: name,
    device_type, model_id, variant, sweeps (how many had it), flips (how often its outcome
    changed from one of those sweeps to the next), outcome (the latest: a verdict, or ``suspect
    PASS``), streak (that many sweeps in a row, ending with the latest), since (the streak's
    first sweep), last_sweep, flaky (the latest run's attempts disagreed). A nightly's model that
    flips every other night is flaky; one "failing since SWEEP, 4 sweeps in a row" is a standing
    failure."""
    from .frames import SUSPECT_CHECKS, pass_check_col, variant_col

    sweeps = sweeps if sweeps is not None else sweep_index_from_rows(results)
    order = sweeps.select(
        "sweep_id", "name", "created_at", pl.col("device_type").alias("sweep_device")
    )
    rows = (
        restricted_to(
            results,
            [
                "sweep_id",
                "model_id",
                "variant",
                "status",
                "numerics",
                "fluent",
                "flaky",
                "started_at",
            ]
            + ["what_if", "host_ops"],
        )
        # a what-if run is no flip of the stack
        .filter(pl.col("status").is_not_null(), store.of_the_stack())
        .with_columns(variant_col(), pass_check_col().alias("check"))
        .sort("started_at", nulls_last=False)
        .unique(["sweep_id", "model_id", "variant"], keep="last")
        .join(order.lazy(), on="sweep_id", how="inner")
        .sort("created_at", "sweep_id")
        .collect()
    )
    found: dict[tuple, dict] = {}
    for r in rows.iter_rows(named=True):
        outcome = (
            "suspect PASS"
            if r["status"] == schema.PASS and r["check"] in SUSPECT_CHECKS
            else r["status"]
        )
        key = (r["name"], r["sweep_device"], r["model_id"], r["variant"])
        seen = found.get(key)
        if seen is None:
            found[key] = {
                "sweeps": 1,
                "flips": 0,
                "outcome": outcome,
                "streak": 1,
                "since": r["sweep_id"],
            }
        elif outcome == seen["outcome"]:
            seen.update(sweeps=seen["sweeps"] + 1, streak=seen["streak"] + 1)
        else:
            seen.update(
                sweeps=seen["sweeps"] + 1,
                flips=seen["flips"] + 1,
                outcome=outcome,
                streak=1,
                since=r["sweep_id"],
            )
        found[key].update(last_sweep=r["sweep_id"], flaky=bool(r["flaky"]))
    return pl.DataFrame(
        [
            {"name": k[0], "device_type": k[1], "model_id": k[2], "variant": k[3], **v}
            for k, v in sorted(found.items(), key=lambda kv: tuple(str(p) for p in kv[0]))
        ],
        schema={
            "name": pl.String,
            "device_type": pl.String,
            "model_id": pl.String,
            "variant": pl.String,
            "sweeps": pl.Int64,
            "flips": pl.Int64,
            "outcome": pl.String,
            "streak": pl.Int64,
            "since": pl.String,
            "last_sweep": pl.String,
            "flaky": pl.Boolean,
        },
        orient="row",
    )


def sweep_index_from_rows(results: Frame) -> pl.DataFrame:
    """The sweeps the rows name, with their name, device type and first start (no data folder at
    hand)."""
    stats = sweep_stats(results).collect()
    order = history_query(stats, None, None).collect()
    return order.select("sweep_id", "name", "created_at", "device_type")


def streak_words(row: dict, labels: dict[str, str] | None = None) -> str:
    """``failing since nightly 2026-12-04 00:00 (FAIL(gen)), 4 sweeps in a row; 3 flips in 9
    sweeps``."""
    labels = labels or {}
    since = labels.get(row["since"], row["since"])
    state = "passing" if row["outcome"] == schema.PASS else f"failing ({row['outcome']})"
    words = (
        f"{state} since {since}, {row['streak']} sweep{'s' if row['streak'] != 1 else ''} in a row"
    )
    if row["flips"]:
        words += (
            f"; {row['flips']} flip{'s' if row['flips'] != 1 else ''} in {row['sweeps']} sweeps"
        )
    return words + ("; flaky in the latest" if row["flaky"] else "")
