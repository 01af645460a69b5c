"""The explorer: one self-contained HTML page to search every model ever probed.

``build_explorer(data_dir)`` writes ``data/reports/index.html``: the page's JavaScript (vanilla,
no framework, no CDN) and its data (compact JSON) are inline, so it opens from disk with no
network. One row per model and variant (its latest run, or its run in the chosen sweep; a sweep
without a matrix has one variant, eager+dynamic, so one row per model), a search box that filters by
model-name fragment as you type, filters by verdict, whose failure it is (attribution: stack, model,
both, unknown), the devices a run needed ("needs N devices", from ``devices_used``; null reads as 1),
variant (a chosen variant lists one row per model), failure signature, device, sweep and stack
versions, and a detail panel: whose failure it is (with the reference's signature and note), the
devices and parallelism of the run, the model's variants side by side in the chosen sweep, its
history across sweeps, the latest error, traceback and repro script (with a Copy button), and links
to its executed notebook and to the sweep's report. The list has a devices column ("2 tp") only when
some run used more than one device or a parallelism; the detail panel always says both.

Size: 100 sweeps x 10,000 models must stay well under 10 MB, so the data is stored compactly:
- an entry's (model and variant) history is run-length encoded: ``[first_sweep, n_sweeps, outcome]``
  per run of consecutive sweeps with the same outcome (verdict + signature + attribution + devices
  used + parallelism, an index into a lookup table); the environment (device and torch / torch_tpu /
  transformers versions) is stored once per sweep, plus ``[sweep, env]`` for the rare row whose
  environment differs from its sweep's;
- error texts, tracebacks, repro scripts, notebook paths and the reference's signature and note are
  kept for the latest run only, and de-duplicated through one string table after the model id and
  sweep id in them are replaced by placeholders (the page puts them back).
Excluded models are listed too, with the pseudo-verdict ``excluded`` and the reason as signature;
so is every model a sweep listed without a row (``analysis.coverage``): ``not probed`` (pending: the
network or the disk kept it from being probed; its last error as signature) and ``not tested`` (no
record yet: the sweep is running or was stopped). A model's "latest run" is its latest sweep with a
verdict or an exclusion; a later not probed / not tested entry shows in its detail panel.

Views, like the Trainium compatibility Space: ``selected`` (models listed explicitly in a sweep
definition), ``trending`` and ``downloads`` (models by their latest known Hub ``trending_score`` /
``downloads``, highest first), each filterable by task (what the latest run probed, ``task``; else the Hub's
``pipeline_tag``), beside "all". Hub
metadata is each field's latest known value, from the records, else from ``sweep.json``. Each
sweep's model list is kept as Parquet in ``data/reports/.cache/listings/`` (keyed by its sweep.json's
size and mtime): parsing a hundred sweep.json files of 10,000 models takes seconds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl

from .. import analysis, paths
from ..analysis import coverage
from ..fileio import atomic_write_text
from ..record import schema
from ..record.display import VERDICT_COLORS
from .explorer_rows import (
    EXCLUDED,
    HUB_FACTS,
    MODEL_MARK,
    NOT_PROBED,
    NOT_TESTED,
    OUTCOME_COLUMNS,
    PSEUDO_VERDICTS,
    SWEEP_MARK,
    VERSION_KEYS,
    Strings,
    encoded_rows,
    hub_facts,
    latest_details,
    relative_href,
    template,
)

__all__ = ["EXCLUDED", "HUB_FACTS", "MODEL_MARK", "SWEEP_MARK", "build_explorer", "explorer_data"]
VIEWS = ("all", "selected", "trending", "downloads")
#: The fields of an entry (one model and variant) in the page data, by position; the page reads them so.
ENTRY_FIELDS = (
    "model_id",
    "model_type",
    "history",
    "env_exceptions",
    "error_type",
    "error_message",
    "traceback",
    "repro_script",
    "notebook",
    "versions",
    "started_at",
    "variant",
    "reference_signature",
    "reference_note",
    "task",
    "hub",
)
HUB_SLOT = ENTRY_FIELDS.index("hub")


def explorer_data(data_dir: Path | str) -> dict:
    """The page's data (see the module docstring for the encoding)."""
    data_dir = Path(data_dir).resolve()
    reports = data_dir / "reports"
    sweeps = analysis.sweep_index(data_dir, cache_dir=data_dir / analysis.SWEEP_CACHE)
    listed, listed_hub = coverage.listings(data_dir, cache_dir=reports / ".cache" / "listings")
    pending = coverage.pending_rows(data_dir, sweeps["sweep_id"].to_list())
    unprobed = coverage.unprobed_rows(data_dir, listed, pending)
    rows, entry_names, outcomes, envs = encoded_rows(data_dir, sweeps, unprobed)
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
    # The sweep whose texts the panel shows: the entry's latest run (a verdict or an exclusion),
    # else its latest pseudo-row (which has no texts).
    latest = rows.group_by("m").agg(
        pl.coalesce(pl.col("s").filter(real).max(), pl.col("s").max()).cast(pl.Int64).alias("s")
    )
    hist = (
        runs.group_by("m", maintain_order=True)
        .agg(pl.concat_list("s", "n", "o").list.explode(**explode).alias("h"))
        .join(entry_names, on="m", how="left")
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
    )
    variants = analysis.sort_variants(hist["variant"].to_list())
    variant_index = {v: k for k, v in enumerate(variants)}
    hist = hist.with_columns(
        pl.col("variant").replace_strict(variant_index, default=len(variants), return_dtype=pl.Int64).alias("vi")
    ).sort("model_id", "vi")
    details = latest_details(data_dir, hist.select("model_id", "variant", "sweep_id"))
    hub = coverage.latest_hub(data_dir, sweeps, listed_hub)
    hub_by_model = {r["model_id"]: r for r in hub.iter_rows(named=True)}
    ranked_by = coverage.rankings(listed)

    texts = Strings()
    types = Strings()
    versions = Strings()
    entry_task = {key: entry_task_of(d, hub_by_model.get(key[0])) for key, d in details.items()}
    tasks = sorted(set(hub["pipeline_tag"].drop_nulls().to_list()) | {t for t in entry_task.values() if t})
    task_index = {t: k for k, t in enumerate(tasks)}
    models = []
    for model_id, variant, vi, h, x, sweep_id in hist.select(
        "model_id", "variant", "vi", "h", "x", "sweep_id"
    ).iter_rows():
        d = details.get((model_id, variant), {})
        full_versions = json.dumps(
            {k: v for k, v in (d.get("versions") or {}).items() if v is not None}, sort_keys=True
        )
        row = [
            model_id,
            types.add(d.get("model_type")),
            h,
            x or [],
            texts.add(d.get("error_type")),
            texts.add(template(d.get("error_message"), model_id, sweep_id)),
            texts.add(template(d.get("traceback"), model_id, sweep_id)),
            texts.add(template(d.get("repro_script"), model_id, sweep_id)),
            texts.add(template(relative_href(d.get("notebook_path"), data_dir, reports), model_id, sweep_id)),
            versions.add(full_versions),
            d.get("started_at"),
            vi,
            texts.add(d.get("reference_signature")),
            texts.add(template(d.get("reference_note"), model_id, sweep_id)),
            task_index.get(
                entry_task.get((model_id, variant)) or (hub_by_model.get(model_id) or {}).get("pipeline_tag"), -1
            ),
        ]
        facts = hub_by_model.get(model_id)
        if facts or model_id in ranked_by:  # the Hub's facts: only for models that have any (stays compact)
            row.append(hub_facts(facts or {}, ranked_by.get(model_id), task_index, texts))
        models.append(row)
    # Every entry of a model (one per variant), and each (model, variant)'s entry.
    entries_of: dict[str, list[int]] = {}
    position = {}
    for k, m in enumerate(models):
        entries_of.setdefault(m[0], []).append(k)
        position[(m[0], variants[m[11]])] = k
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
        "outcomes": outcomes.select(OUTCOME_COLUMNS).rows(),
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
        "variants": variants,
        "default_variant": analysis.DEFAULT_VARIANT,
        "attributions": list(analysis.ATTRIBUTION_KINDS),
        "attribution_help": analysis.ATTRIBUTION_KIND_HELP,
        "tasks": tasks,
        "views": {
            name: [k for m in ids for k in entries_of.get(m, [])] for name, ids in coverage.views(listed, hub).items()
        },
        # [entry, sweep, problem, when] of every pending run (the panel shows them with the resume command)
        "pending": [
            [position[(m, v)], sweep_position[s], problem, at]
            for s, m, v, problem, at in unprobed.filter(pl.col("status") == NOT_PROBED)
            .join(pending, on=["sweep_id", "model_id", "variant"], how="left")
            .select("sweep_id", "model_id", "variant", "problem", "at")
            .iter_rows()
            if (m, v) in position and s in sweep_position
        ],
        "models": models,
    }


def entry_task_of(latest: dict, hub: dict | None) -> str | None:
    """An entry's task, for the task filter: what its latest run probed (a results row older than the
    column ran text-generation), else the Hub's ``pipeline_tag``."""
    if latest.get("task"):
        return latest["task"]
    if latest.get("_config") == 0:  # a results row from before the task column
        return schema.TEXT_GENERATION
    return (hub or {}).get("pipeline_tag")


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
