"""The explorer's data, the heavy lifting: every (model, variant, sweep) row of both configs and the
pseudo-rows of runs listed without a row, as integers ready for run-length encoding; the latest
run's texts; the string table; the Hub facts. ``explorer.explorer_data`` assembles the page data
from these.

An entry of the page is one (model, variant): a null variant (older files, sweeps without a matrix)
reads as ``eager+dynamic``, so a sweep without a matrix has one entry per model, as before.
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl

from .. import analysis
from ..analysis import unprobed_models
from ..analysis.frames import check_note_col, check_step_col, pass_check_col, variant_col, version
from ..analysis.parallel import devices_col, parallelism_col
from ..probe import repro
from ..record import store

EXCLUDED = "excluded"
NOT_PROBED, NOT_TESTED = unprobed_models.NOT_PROBED, unprobed_models.NOT_TESTED
PSEUDO_VERDICTS = (EXCLUDED, NOT_PROBED, NOT_TESTED)
#: Placeholders for the model id and the sweep id inside de-duplicated texts.
MODEL_MARK = "\x01"
SWEEP_MARK = "\x02"
VERSION_KEYS = analysis.VERSION_COMPONENTS
#: What an outcome is, in the page's lookup table: the verdict, the signature, whose failure it is,
#: how many devices it ran on with which parallelism (a result row's nulls, from older files, read
#: as 1 and "none"; an excluded row keeps what it recorded; a pseudo-row has neither), and for a
#: PASS what its check says (``analysis.PASS_CHECKS``) with the step where it diverges from the
#: reference, and the operators its stack lacks of its census (``ops_missing``, joined, or every one
#: its what-if runs found: ``found_missing``; null without a census or when it lacks none:
#: docs/ops.md).
OUTCOME_COLUMNS = (
    "status",
    "failure_signature",
    "attribution",
    "devices_used",
    "parallelism",
    "check",
    "check_step",
    "lacks",
)
#: The order of a model's Hub facts in the page data (the page reads them by position).
HUB_FACTS = (
    "pipeline_tag",
    "downloads",
    "likes",
    "trending_score",
    "library_name",
    "license",
    "gated",
    "hub_num_params",
    "created_at",
    "base_model",
    "listed_by",
)


#: The columns of a row the explorer encodes (its outcome and its environment).
LIGHT_COLUMNS = (
    "model_id",
    "variant",
    "sweep_id",
    "status",
    "failure_signature",
    "attribution",
    "devices_used",
    "parallelism",
    "device_type",
    "exclusion_reason",
    "versions",
    "backend_versions",
)


def found_missing(data_dir: Path) -> pl.DataFrame:
    """(sweep_id, model_id, variant, found) of each result row that what-if runs (``ops
    --complete``, ``--prove``: the sweeps its folder's ``proof.json`` names) ran: every operator
    its stack was found to lack, as `model-support ops` says them (``ops.sweep_models`` and
    ``ops.predict``: the complete census of a ``host_ops: missing`` run, and an operator a run
    then stopped at), joined; its own row's census names only the one that stopped it."""
    from .. import ops

    found = []
    for proof in sorted(Path(data_dir).glob("sweeps/*/proof.json")):
        for m in ops.predict(ops.sweep_models(data_dir, proof.parent.name)):
            if m.runs and m.ops_missing:
                variant = m.variant or analysis.DEFAULT_VARIANT
                found.append((m.sweep_id, m.model_id, variant, ", ".join(m.ops_missing)))
    return pl.DataFrame(
        found,
        schema=dict.fromkeys(("sweep_id", "model_id", "variant", "found"), pl.String),
        orient="row",
    )


def _all_rows(data_dir: Path, unprobed: pl.DataFrame) -> pl.LazyFrame:
    """The rows of both configs and the ``unprobed`` pseudo-rows, ``LIGHT_COLUMNS`` and ``c`` (0
    results, 1 excluded, 2 not probed / not tested), lazily (nothing is read until the caller
    collects)."""
    light = list(LIGHT_COLUMNS)
    no_check = [
        pl.lit(None, dtype=pl.String).alias("check"),
        pl.lit(None, dtype=pl.Int64).alias("check_step"),
        pl.lit(None, dtype=pl.String).alias("lacks"),
    ]
    lacks = (
        pl.when(pl.col("ops_missing").list.len() > 0)
        .then(pl.col("ops_missing").list.join(", "))
        .alias("lacks")
    )
    results = (
        store.scan(data_dir, "results")
        .select(*light, "numerics", "numerics_step", "fluent", "ops_missing")
        .with_columns(
            variant_col(),
            devices_col(),
            parallelism_col(),
            pass_check_col().alias("check"),
            # a diverging check's step only (a too flat reference's is no divergence)
            check_step_col(),
            lacks,
            pl.lit(0, dtype=pl.Int8).alias("c"),
        )
        .select(*light, "check", "check_step", "lacks", "c")
    )
    found = found_missing(data_dir)
    if found.height:  # what what-if runs found it lacks, over what its own census said
        results = (
            results.join(found.lazy(), on=["sweep_id", "model_id", "variant"], how="left")
            .with_columns(pl.coalesce("found", "lacks").alias("lacks"))
            .select(*light, "check", "check_step", "lacks", "c")
        )
    excluded = (
        store.scan(data_dir, "excluded")
        .select(light)
        .with_columns(
            variant_col(),
            pl.lit(EXCLUDED).alias("status"),
            pl.col("exclusion_reason").fill_null("(no reason given)").alias("failure_signature"),
            pl.lit(None, dtype=pl.String).alias("attribution"),
            *no_check,
            pl.lit(1, dtype=pl.Int8).alias("c"),
        )
        .select(*light, "check", "check_step", "lacks", "c")
    )
    types = results.collect_schema()
    pseudo = (
        unprobed.lazy()
        .select(
            "model_id",
            variant_col(),
            "sweep_id",
            "status",
            "failure_signature",
            *[
                pl.lit(None, dtype=types[c]).alias(c)
                for c in (
                    "attribution",
                    "devices_used",
                    "parallelism",
                    "device_type",
                    "exclusion_reason",
                )
                + ("versions", "backend_versions")
            ],
            *no_check,
            pl.lit(2, dtype=pl.Int8).alias("c"),
        )
        .select(*light, "check", "check_step", "lacks", "c")
    )
    return pl.concat([results, excluded, pseudo])


def encoded_rows(data_dir: Path, sweeps: pl.DataFrame, unprobed: pl.DataFrame):
    """Every (model, variant, sweep) row of both configs, and the ``unprobed`` pseudo-rows, as
    integers, ready for run-length encoding.

    Returns (rows, entries, outcomes, envs): rows has m (entry key: model and variant), s (sweep
    position), o (outcome index), e (environment index) and c (0 results, 1 excluded, 2 not probed /
    not tested), sorted by entry then sweep, one row per entry and sweep (results win over excluded,
    both over a pseudo-row); entries maps m to model_id and variant; outcomes and envs are the
    lookup tables. Strings are hashed to integer keys first: sorting a million rows that carry
    strings costs seconds, sorting integers a few milliseconds.
    """
    every = _all_rows(data_dir, unprobed)
    order = sweeps.lazy().with_row_index("s").select("sweep_id", pl.col("s").cast(pl.Int32))
    outcome_cols = list(OUTCOME_COLUMNS)
    env_cols = ["device_type", *VERSION_KEYS]
    wide = (
        every.with_columns([version(k).alias(k) for k in VERSION_KEYS])
        .join(order, on="sweep_id", how="inner")
        .with_columns(
            pl.struct("model_id", "variant").hash(seed=0).alias("m"),
            pl.struct(outcome_cols).hash(seed=0).alias("ok"),
            pl.struct(env_cols).hash(seed=0).alias("ek"),
        )
    ).collect()
    entries = wide.select("m", "model_id", "variant").unique("m")
    outcomes = (
        wide.select("ok", *outcome_cols)
        .unique("ok")
        .sort(outcome_cols, nulls_last=False)
        .with_row_index("o")
        .with_columns(pl.col("o").cast(pl.Int32))
    )
    envs = (
        wide.select("ek", *env_cols)
        .unique("ek")
        .sort(env_cols, nulls_last=True)
        .with_row_index("e")
        .with_columns(pl.col("e").cast(pl.Int32))
    )
    rows = (
        wide.lazy()
        .select("m", "s", "c", "ok", "ek")
        .join(outcomes.lazy().select("ok", "o"), on="ok", how="left")
        .join(envs.lazy().select("ek", "e"), on="ek", how="left")
        .sort("m", "s", "c")
        .filter(
            (
                (pl.col("m") != pl.col("m").shift(1)) | (pl.col("s") != pl.col("s").shift(1))
            ).fill_null(True)
        )
        .select("m", "s", "o", "e", "c")
        .collect()
    )
    return rows, entries, outcomes.drop("ok"), envs.drop("ek")


def relative_href(path: str | None, data_dir: Path, reports: Path) -> str | None:
    """A link from ``data/reports`` to ``path`` when it lies under ``data_dir``; else None."""
    if not path:
        return None
    root = str(data_dir)
    # the common case, fast
    if path.startswith(root + "/") and "/." not in path and "//" not in path:
        return "../" + path[len(root) + 1 :]
    candidates = (
        [path] if os.path.isabs(path) else [os.path.join(data_dir, path), os.path.abspath(path)]
    )
    for candidate in candidates:
        full = os.path.normpath(candidate)
        if full == root or full.startswith(root + os.sep):
            return Path(os.path.relpath(full, reports)).as_posix()
    return None


class Strings:
    """A string table: each distinct text is stored once and referred to by index."""

    def __init__(self):
        self.items: list[str] = []
        self.index: dict[str, int] = {}

    def add(self, text: str | None) -> int:
        if text is None:
            return -1
        found = self.index.get(text)
        if found is None:
            found = self.index[text] = len(self.items)
            self.items.append(text)
        return found


def template(text: str | None, model_id: str, sweep_id: str) -> str | None:
    if text is None:
        return None
    return text.replace(model_id, MODEL_MARK).replace(sweep_id, SWEEP_MARK)


def hub_facts(facts: dict, listed_by: str | None, task_index: dict, texts: Strings) -> list:
    """[task index, downloads, likes, trending_score, then text indices / numbers]: see
    ``HUB_FACTS``."""
    out = []
    for name in HUB_FACTS:
        value = listed_by if name == "listed_by" else facts.get(name)
        if name == "pipeline_tag":
            out.append(task_index.get(value, -1))
        elif name in ("downloads", "likes", "trending_score", "hub_num_params", "created_at"):
            out.append(value)
        else:
            out.append(texts.add(value))
    return out


#: The texts of an entry's latest run that the detail panel shows as they are (read by
#: ``latest_details``, carried in the entry under the same names).
PANEL_TEXTS = ("reference_signature", "reference_note", "notebook_url", "log_url", "check_note")


def latest_details(data_dir: Path, keys: pl.DataFrame) -> dict[tuple[str, str], dict]:
    """The heavy texts of each entry's row in ``keys`` (model_id, variant, sweep_id), keyed by
    (model_id, variant), reading only the sweeps that hold one; an entry whose key has no row (a
    pseudo-row) is absent."""
    heavy_cols = [
        "model_id",
        "variant",
        "sweep_id",
        "model_type",
        "error_type",
        "error_message",
        "traceback",
        "repro_script",
        "repro_settings",
        "repro_sha256",
        "notebook_path",
        "versions",
        "started_at",
        *PANEL_TEXTS,
        "task",
    ]
    wanted = keys["sweep_id"].unique().to_list()
    on = ["model_id", "variant", "sweep_id"]
    heavy = pl.concat(
        [
            store.scan(data_dir, config)
            .with_columns(check_note_col())
            .select(*heavy_cols, pl.lit(c).alias("_config"))
            .filter(pl.col("sweep_id").is_in(wanted))
            .with_columns(variant_col())
            .join(keys.lazy(), on=on, how="semi")
            for c, config in enumerate(store.CONFIGS)
        ]
    )
    latest = (
        heavy.sort("model_id", "variant", "_config")
        .unique(["model_id", "variant"], keep="first", maintain_order=True)
        .collect()
    )
    rows = {(r["model_id"], r["variant"]): r for r in latest.iter_rows(named=True)}
    # the whole script, its body from the data folder's repro/ (older rows have it)
    for row in rows.values():
        row["repro_script"] = repro.script_of_or_none(row, store.repro_dir(data_dir))
    return rows
