"""The explorer: one self-contained HTML page to search every model ever probed.

``build_explorer(data_dir)`` writes ``data/reports/index.html``: the page's JavaScript (vanilla,
no framework, no CDN) and its data (compact JSON) are inline, so it opens from disk with no
network. One row per model (its latest run, or its run in the chosen sweep), a search box that
filters by model-name fragment as you type, filters by verdict, failure signature, device, sweep
and stack versions, and a detail panel per model: its history across sweeps, the latest error,
traceback and repro script (with a Copy button), and links to its executed notebook and to the
sweep's report.

Size: 100 sweeps x 10,000 models must stay well under 10 MB, so the data is stored compactly:
- a model's history is run-length encoded: ``[first_sweep, n_sweeps, outcome]`` per run of
  consecutive sweeps with the same outcome (verdict + signature, an index into a lookup table);
  the environment (device and torch / torch_tpu / transformers versions) is stored once per
  sweep, plus ``[sweep, env]`` for the rare row whose environment differs from its sweep's;
- error texts, tracebacks, repro scripts and notebook paths are kept for the latest run only, and
  de-duplicated through one string table after the model id and sweep id in them are replaced by
  placeholders (the page puts them back).
Excluded models are listed too, with the pseudo-verdict ``excluded`` and the reason as signature;
so is every model a sweep listed without a row (``analysis.coverage``): ``not probed`` (pending: the
network or the disk kept it from being probed; its last error as signature) and ``not tested`` (no
record yet: the sweep is running or was stopped). A model's "latest run" is its latest sweep with a
verdict or an exclusion; a later not probed / not tested entry shows in its detail panel.

Views, like the Trainium compatibility Space: ``selected`` (models listed explicitly in a sweep
definition), ``trending`` and ``downloads`` (models by their latest known Hub ``trending_score`` /
``downloads``, highest first), each filterable by task (``pipeline_tag``), beside "all". Hub
metadata is each field's latest known value, from the records, else from ``sweep.json``. Each
sweep's model list is kept as Parquet in ``data/reports/.cache/listings/`` (keyed by its sweep.json's
size and mtime): parsing a hundred sweep.json files of 10,000 models takes seconds.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import polars as pl

from .. import analysis, paths, schema, store
from ..analysis import coverage
from ..display import VERDICT_COLORS
from ..fileio import atomic_write_text

EXCLUDED = "excluded"
NOT_PROBED, NOT_TESTED = coverage.NOT_PROBED, coverage.NOT_TESTED
PSEUDO_VERDICTS = (EXCLUDED, NOT_PROBED, NOT_TESTED)
VIEWS = ("all", "selected", "trending", "downloads")
#: Placeholders for the model id and the sweep id inside de-duplicated texts.
MODEL_MARK = "\x01"
SWEEP_MARK = "\x02"
VERSION_KEYS = analysis.VERSION_COMPONENTS


def _encoded_rows(data_dir: Path, sweeps: pl.DataFrame, unprobed: pl.DataFrame):
    """Every (model, sweep) row of both configs, and the ``unprobed`` pseudo-rows, as integers,
    ready for run-length encoding.

    Returns (rows, models, outcomes, envs): rows has m (model key), s (sweep position), o
    (outcome index), e (environment index) and c (0 results, 1 excluded, 2 not probed / not
    tested), sorted by model then sweep, one row per model and sweep (results win over excluded,
    both over a pseudo-row); models maps m to model_id; outcomes and envs are the lookup tables. Strings are hashed to integer keys first: sorting a million rows that carry
    strings costs seconds, sorting integers a few milliseconds.
    """
    light = ["model_id", "sweep_id", "status", "failure_signature", "device_type", "exclusion_reason", "versions"]
    results = store.scan(data_dir, "results").select(light).with_columns(pl.lit(0, dtype=pl.Int8).alias("c"))
    excluded = (
        store.scan(data_dir, "excluded")
        .select(light)
        .with_columns(
            pl.lit(EXCLUDED).alias("status"),
            pl.col("exclusion_reason").fill_null("(no reason given)").alias("failure_signature"),
            pl.lit(1, dtype=pl.Int8).alias("c"),
        )
    )
    pseudo = (
        unprobed.lazy()
        .select(
            "model_id",
            "sweep_id",
            "status",
            "failure_signature",
            *[
                pl.lit(None, dtype=results.collect_schema()[c]).alias(c)
                for c in ("device_type", "exclusion_reason", "versions")
            ],
            pl.lit(2, dtype=pl.Int8).alias("c"),
        )
        .select(*light, "c")
    )
    order = sweeps.lazy().with_row_index("s").select("sweep_id", pl.col("s").cast(pl.Int32))
    outcome_cols = ["status", "failure_signature"]
    env_cols = ["device_type", *VERSION_KEYS]
    wide = (
        pl.concat([results, excluded, pseudo])
        .with_columns([pl.col("versions").struct.field(k).alias(k) for k in VERSION_KEYS])
        .join(order, on="sweep_id", how="inner")
        .with_columns(
            pl.col("model_id").hash(seed=0).alias("m"),
            pl.struct(outcome_cols).hash(seed=0).alias("ok"),
            pl.struct(env_cols).hash(seed=0).alias("ek"),
        )
    ).collect()
    models = wide.select("m", "model_id").unique("m")
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
        .filter(((pl.col("m") != pl.col("m").shift(1)) | (pl.col("s") != pl.col("s").shift(1))).fill_null(True))
        .select("m", "s", "o", "e", "c")
        .collect()
    )
    return rows, models, outcomes.drop("ok"), envs.drop("ek")


def _relative_href(path: str | None, data_dir: Path, reports: Path) -> str | None:
    """A link from ``data/reports`` to ``path`` when it lies under ``data_dir``; else None."""
    if not path:
        return None
    root = str(data_dir)
    if path.startswith(root + "/") and "/." not in path and "//" not in path:  # the common case, fast
        return "../" + path[len(root) + 1 :]
    candidates = [path] if os.path.isabs(path) else [os.path.join(data_dir, path), os.path.abspath(path)]
    for candidate in candidates:
        full = os.path.normpath(candidate)
        if full == root or full.startswith(root + os.sep):
            return Path(os.path.relpath(full, reports)).as_posix()
    return None


class _Strings:
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


def _template(text: str | None, model_id: str, sweep_id: str) -> str | None:
    if text is None:
        return None
    return text.replace(model_id, MODEL_MARK).replace(sweep_id, SWEEP_MARK)


def explorer_data(data_dir: Path | str) -> dict:
    """The page's data (see the module docstring for the encoding)."""
    data_dir = Path(data_dir).resolve()
    reports = data_dir / "reports"
    sweeps = analysis.sweep_index(data_dir)
    listed, listed_hub = coverage.listings(data_dir, cache_dir=reports / ".cache" / "listings")
    pending = coverage.pending_rows(data_dir, sweeps["sweep_id"].to_list())
    unprobed = coverage.unprobed_rows(data_dir, listed, pending)
    rows, model_names, outcomes, envs = _encoded_rows(data_dir, sweeps, unprobed)
    real = pl.col("c") < 2
    # Each sweep's usual environment (from its real rows); a real row that differs from it is stored
    # as an exception; a pseudo-row has none of its own.
    sweep_env = (
        rows.group_by("s", "e")
        .agg(pl.len(), real.any().alias("real"))
        .sort(["s", "real", "len", "e"], descending=[False, True, True, False])
        .group_by("s", maintain_order=True)
        .agg(pl.col("e").first().alias("e_sweep"))
    )
    rows = rows.join(sweep_env, on="s", how="left").with_columns(
        pl.when(real).then(pl.col("e")).otherwise(pl.col("e_sweep")).alias("e")
    )
    # Runs of consecutive sweeps with the same outcome.
    new_run = (
        (pl.col("s") != pl.col("s").shift(1) + 1)
        | (pl.col("o") != pl.col("o").shift(1))
        | (pl.col("m") != pl.col("m").shift(1))
    ).fill_null(True)
    runs = (
        rows.with_columns(run=new_run.cum_sum())
        .group_by("run", maintain_order=True)
        .agg(
            pl.col("m").first(),
            *[pl.col(c).first().cast(pl.Int64) for c in ("s", "o")],
            pl.len().cast(pl.Int64).alias("n"),
        )
    )
    explode = dict(keep_nulls=False, empty_as_null=False)
    # The sweep whose texts the panel shows: the model's latest run (a verdict or an exclusion),
    # else its latest pseudo-row (which has no texts).
    latest = rows.group_by("m").agg(
        pl.coalesce(pl.col("s").filter(real).max(), pl.col("s").max()).cast(pl.Int64).alias("s")
    )
    hist = (
        runs.group_by("m", maintain_order=True)
        .agg(pl.concat_list("s", "n", "o").list.explode(**explode).alias("h"))
        .join(model_names, on="m", how="left")
    )
    odd = (
        rows.filter(pl.col("e") != pl.col("e_sweep"))
        .group_by("m", maintain_order=True)
        .agg(pl.concat_list(pl.col("s").cast(pl.Int64), pl.col("e").cast(pl.Int64)).list.explode(**explode).alias("x"))
    )
    hist = (
        hist.join(odd, on="m", how="left", maintain_order="left")
        .join(latest, on="m", how="left", maintain_order="left")
        .join(sweeps.with_row_index("s").select(pl.col("s").cast(pl.Int64), "sweep_id"), on="s", how="left")
        .sort("model_id")
    )
    details = _latest_details(data_dir, hist.select("model_id", "sweep_id"))
    hub = coverage.latest_hub(data_dir, sweeps, listed_hub)
    hub_by_model = {r["model_id"]: r for r in hub.iter_rows(named=True)}
    ranked_by = coverage.rankings(listed)

    texts = _Strings()
    types = _Strings()
    versions = _Strings()
    tasks = sorted(set(hub["pipeline_tag"].drop_nulls().to_list()))
    task_index = {t: k for k, t in enumerate(tasks)}
    models = []
    for model_id, h, x, sweep_id in hist.select("model_id", "h", "x", "sweep_id").iter_rows():
        d = details.get(model_id, {})
        full_versions = json.dumps(
            {k: v for k, v in (d.get("versions") or {}).items() if v is not None}, sort_keys=True
        )
        row = [
            model_id,
            types.add(d.get("model_type")),
            h,
            x or [],
            texts.add(d.get("error_type")),
            texts.add(_template(d.get("error_message"), model_id, sweep_id)),
            texts.add(_template(d.get("traceback"), model_id, sweep_id)),
            texts.add(_template(d.get("repro_script"), model_id, sweep_id)),
            texts.add(_template(_relative_href(d.get("notebook_path"), data_dir, reports), model_id, sweep_id)),
            versions.add(full_versions),
            d.get("started_at"),
        ]
        facts = hub_by_model.get(model_id)
        if facts or model_id in ranked_by:  # the Hub's facts: only for models that have any (stays compact)
            row.append(_hub_facts(facts or {}, ranked_by.get(model_id), task_index, texts))
        models.append(row)
    position = {m[0]: k for k, m in enumerate(models)}
    default_env = dict(sweep_env.iter_rows())
    sweep_rows = []
    for s, r in enumerate(sweeps.iter_rows(named=True)):
        report = reports / f"{r['sweep_id']}.html"
        sweep_rows.append(
            [
                r["sweep_id"],
                r["created_at"].strftime("%Y-%m-%d %H:%M") if r["created_at"] else "",
                r["device_type"] or "",
                report.name if report.exists() else None,
                default_env.get(s, -1),
            ]
        )
    sweep_position = {r[0]: s for s, r in enumerate(sweep_rows)}
    return {
        "sweeps": sweep_rows,
        "outcomes": outcomes.select("status", "failure_signature").rows(),
        "envs": envs.select("device_type", *VERSION_KEYS).rows(),
        "types": types.items,
        "texts": texts.items,
        "versions": versions.items,
        "verdicts": [*schema.VERDICTS, *PSEUDO_VERDICTS],
        "pseudo": list(PSEUDO_VERDICTS),
        "unprobed": [NOT_PROBED, NOT_TESTED],
        "verdict_help": {
            **schema.VERDICT_HELP,
            EXCLUDED: "left out on purpose; never counted as a failure",
            **coverage.UNPROBED_HELP,
        },
        "tasks": tasks,
        "views": {
            name: [position[m] for m in ids if m in position] for name, ids in coverage.views(listed, hub).items()
        },
        # [model, sweep, problem, when] of every pending model (the panel shows them with the resume command)
        "pending": [
            [position[m], sweep_position[s], problem, at]
            for s, m, problem, at in unprobed.filter(pl.col("status") == NOT_PROBED)
            .join(pending, on=["sweep_id", "model_id"], how="left")
            .select("sweep_id", "model_id", "problem", "at")
            .iter_rows()
            if m in position and s in sweep_position
        ],
        "models": models,
    }


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


def _hub_facts(facts: dict, listed_by: str | None, task_index: dict, texts: _Strings) -> list:
    """[task index, downloads, likes, trending_score, then text indices / numbers]: see ``HUB_FACTS``."""
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


def _latest_details(data_dir: Path, keys: pl.DataFrame) -> dict[str, dict]:
    """The heavy texts of each model's row in ``keys`` (model_id, sweep_id), reading only the sweeps
    that hold one; a model whose key has no row (a pseudo-row) is absent."""
    heavy_cols = [
        "model_id",
        "sweep_id",
        "model_type",
        "error_type",
        "error_message",
        "traceback",
        "repro_script",
        "notebook_path",
        "versions",
        "started_at",
    ]
    wanted = keys["sweep_id"].unique().to_list()
    heavy = pl.concat(
        [
            store.scan(data_dir, config)
            .select(*heavy_cols, pl.lit(c).alias("_config"))
            .filter(pl.col("sweep_id").is_in(wanted))
            .join(keys.lazy(), on=["model_id", "sweep_id"], how="semi")
            for c, config in enumerate(store.CONFIGS)
        ]
    )
    heavy = heavy.sort("model_id", "_config").unique("model_id", keep="first", maintain_order=True).collect()
    return {r["model_id"]: r for r in heavy.iter_rows(named=True)}


def build_explorer(data_dir: Path | str) -> Path:
    """Write ``data/reports/index.html`` (atomically) and return its path: the page template
    (``templates/explorer.html.j2``) with its script (``templates/explorer.js``) and data inline."""
    from jinja2 import Environment, FileSystemLoader

    data_dir = Path(data_dir).resolve()
    data = explorer_data(data_dir)
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False).replace("</", "<\\/")
    folder = paths.template("explorer.html.j2").parent
    env = Environment(loader=FileSystemLoader(str(folder)), autoescape=False)
    # One class per verdict, as the page's slug() names it (not tested shares not probed's colour).
    colors = {**VERDICT_COLORS, NOT_TESTED: VERDICT_COLORS.get(NOT_TESTED, VERDICT_COLORS[NOT_PROBED])}
    colors = [(re.sub(r"[^A-Za-z0-9]+", "-", status), color) for status, color in colors.items()]
    page = env.get_template("explorer.html.j2").render(
        data=payload, script=(folder / "explorer.js").read_text(), verdict_colors=colors, views=VIEWS
    )
    out = data_dir / "reports" / "index.html"
    atomic_write_text(out, page)
    return out
