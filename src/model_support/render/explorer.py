"""The explorer: one self-contained HTML page to search every model ever probed.

``build_explorer(data_dir)`` writes ``data/reports/index.html``: the page's JavaScript (vanilla, no
framework, no CDN) and its data (compact JSON) are inline, so it opens from disk with no network.
One row per model and variant (its latest run, or its run in the chosen sweep; a sweep without a
matrix has one variant, eager+dynamic, so one row per model), a search box that filters by
model-name fragment as you type, filters by verdict, whose failure it is (attribution: stack, model,
both, unknown), what a PASS's check says ("suspect passes", or one of ``analysis.PASS_CHECKS``), the
devices a run needed ("needs N devices", from ``devices_used``; null reads as 1), variant (a chosen
variant lists one row per model), failure signature, device, sweep and stack versions, and a detail
panel: whose failure it is (with the reference's signature and note), the devices and parallelism of
the run, the model's variants side by side in the chosen sweep, its history across sweeps, the
latest error, traceback and repro script (with a Copy button), and links to its executed notebook,
to the sweep's report and, once ``model-support push --logs`` published them, to its notebook and
log on the Hub (``notebook_url``, ``log_url``); for a PASS, its check and why; for a run a bisect
named the release of (the sweep's ``bisect.json``), "changed by <package> <version>" (in the list's
and the history's signature cells too). The list has a devices column ("2 tp") only when some run
used more than one device or a parallelism; the detail panel always says both. The list fits a 1280
px screen: fixed column widths, a sweep shown by name and date (its id on hover, ``sweep_labels``),
no cell wrapping, a cell too narrow for its text ending in "…" with the whole text as its tooltip,
and the minor columns hidden while the detail panel is open.

Size: 100 sweeps x 10,000 models must stay well under 10 MB, so the data is stored compactly:
- an entry's (model and variant) history is run-length encoded: ``[first_sweep, n_sweeps, outcome]``
  per run of consecutive sweeps with the same outcome (verdict + signature + attribution + devices
  used + parallelism + a PASS's check and its step, an index into a lookup table); the environment
  (device and torch / torch_tpu / transformers versions) is stored once per sweep, plus ``[sweep,
  env]`` for the rare row whose environment differs from its sweep's;
- a timed PASS's speed (tokens/s with its repeats' spread, and TPOT) differs on every sweep, so it
  is kept apart from the outcome: two characters a number, per entry from its first timed sweep to
  its last (``explorer_speed``; the detail panel's history shows it in a column, and a sparkline
  across sweeps);
- error texts, tracebacks, repro scripts, notebook paths and the reference's signature and note are
kept for the latest run only, and de-duplicated through one string table after the model id and
sweep id in them are replaced by placeholders (the page puts them back). Excluded models are listed
too, with the pseudo-verdict ``excluded`` and the reason as signature; so is every model a sweep
listed without a row (``analysis.unprobed_models``): ``not probed`` (pending: the network or the
disk kept it from being probed; its last error as signature) and ``not tested`` (no record yet: the
sweep is running or was stopped). A model's "latest run" is its latest sweep with a verdict or an
exclusion; a later not probed / not tested entry shows in its detail panel.

Views, like the Trainium compatibility Space: ``selected`` (models listed explicitly in a sweep
definition), ``trending`` and ``downloads`` (models by their latest known Hub ``trending_score`` /
``downloads``, highest first), each filterable by task (what the latest run probed, ``task``; else
the Hub's ``pipeline_tag``), beside "all". Hub metadata is each field's latest known value, from the
records, else from ``sweep.json``. Each sweep's model list is kept as Parquet in
``data/reports/.cache/listings/`` (keyed by its sweep.json's size and mtime): parsing a hundred
sweep.json files of 10,000 models takes seconds.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from .. import analysis, paths
from ..analysis import unprobed_models
from ..analysis.history import sweep_labels as history_labels
from ..analysis.history import what_if_sweeps
from ..bisect import results as bisect_results
from ..fileio import atomic_write_text
from ..probe.signatures import portable_paths
from ..record import schema
from ..record.schema import VERDICT_COLORS
from . import explorer_speed
from .explorer_rows import (
    EXCLUDED,
    HUB_FACTS,
    MODEL_MARK,
    NOT_PROBED,
    NOT_TESTED,
    OUTCOME_COLUMNS,
    PANEL_TEXTS,
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
#: The fields of an entry (one model and variant) in the page data, by position; the page reads them
#: so.
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
    *PANEL_TEXTS,
    "task",
    "hub",
)
HUB_SLOT = ENTRY_FIELDS.index("hub")


def explorer_data(data_dir: Path | str) -> dict:
    """The page's data (see the module docstring for the encoding)."""
    data_dir = Path(data_dir).resolve()
    reports = data_dir / "reports"
    facts = data_dir / analysis.SWEEP_CACHE  # what sweep_index keeps of each sweep.json
    sweeps = analysis.sweep_index(data_dir, cache_dir=facts)
    # the stack's history: a what-if sweep (operators on the host) is no verdict of it, neither its
    # runs nor the models its definition lists ("not tested" by it, their Hub facts and rankings);
    # its own report tells it
    what_if = sorted(what_if_sweeps(data_dir, sweeps["sweep_id"].to_list(), cache_dir=facts))
    sweeps = sweeps.filter(~pl.col("sweep_id").is_in(what_if))
    listed, listed_hub = unprobed_models.listings(
        data_dir, cache_dir=reports / ".cache" / "listings"
    )
    listed, listed_hub = (
        frame.filter(~pl.col("sweep_id").is_in(what_if)) for frame in (listed, listed_hub)
    )
    pending = unprobed_models.pending_rows(data_dir, sweeps["sweep_id"].to_list())
    unprobed = unprobed_models.unprobed_rows(data_dir, listed, pending)
    rows, entry_names, outcomes, envs = encoded_rows(data_dir, sweeps, unprobed)
    rows, sweep_env = _with_sweep_envs(rows)
    hist = _histories(rows, entry_names, sweeps)
    variants = analysis.sort_variants(hist["variant"].to_list())
    hist = _in_variant_order(hist, variants)
    hub = unprobed_models.latest_hub(data_dir, sweeps, listed_hub)
    details = latest_details(data_dir, hist.select("model_id", "variant", "sweep_id"))
    hub_by_model = {r["model_id"]: r for r in hub.iter_rows(named=True)}
    entry_task = {key: entry_task_of(d, hub_by_model.get(key[0])) for key, d in details.items()}
    tasks = sorted(
        set(hub["pipeline_tag"].drop_nulls().to_list()) | {t for t in entry_task.values() if t}
    )
    tables = _Tables(
        texts=Strings(),
        types=Strings(),
        versions=Strings(),
        tasks={t: k for k, t in enumerate(tasks)},
    )
    entries = _entries(
        data_dir, hist, details, hub_by_model, entry_task, unprobed_models.rankings(listed), tables
    )
    entries_of, position = _positions(entries)
    sweep_rows = _sweep_rows(sweeps, reports, dict(sweep_env.iter_rows()))
    sweep_position = {r[0]: s for s, r in enumerate(sweep_rows)}
    return {
        "sweeps": sweep_rows,
        "outcomes": outcomes.select(OUTCOME_COLUMNS).rows(),
        "envs": envs.select("device_type", *VERSION_KEYS).rows(),
        "types": tables.types.items,
        "texts": tables.texts.items,
        "versions": tables.versions.items,
        **_vocabulary(variants),
        "tasks": tasks,
        "views": {
            name: [k for m in ids for k in entries_of.get(m, [])]
            for name, ids in unprobed_models.views(listed, hub).items()
        },
        # [entry, sweep, problem, when] of every pending run (the panel shows them with the resume
        # command)
        "pending": [
            [position[(m, v)], sweep_position[s], problem, at]
            for s, m, v, problem, at in unprobed.filter(pl.col("status") == NOT_PROBED)
            .join(pending, on=["sweep_id", "model_id", "variant"], how="left")
            .select("sweep_id", "model_id", "variant", "problem", "at")
            .iter_rows()
            if (m, v) in position and s in sweep_position
        ],
        "models": [[entry[field] for field in ENTRY_FIELDS if field in entry] for entry in entries],
        # each timed entry's tokens/s, spread and TPOT per sweep, as codes (explorer_speed)
        "speed": explorer_speed.page_data(data_dir, sweeps, position),
        # [entry, sweep, "transformers 5.25.0"] of every run a bisect named the release of
        # (bisect.json)
        "changed_by": [
            [position[key], sweep_position[s], said]
            for s in sweep_position
            for key, said in bisect_results.changed_by(data_dir, s).items()
            if key in position
        ],
    }


def _in_variant_order(hist: pl.DataFrame, variants: list[str]) -> pl.DataFrame:
    """The histories by model, each model's variants in ``variants``' order (column ``vi``)."""
    variant_index = {v: k for k, v in enumerate(variants)}
    return hist.with_columns(
        pl.col("variant")
        .replace_strict(variant_index, default=len(variants), return_dtype=pl.Int64)
        .alias("vi")
    ).sort("model_id", "vi")


def _positions(entries: list[dict]) -> tuple[dict[str, list[int]], dict[tuple, int]]:
    """Every entry of a model (one per variant), and each (model, variant)'s entry."""
    entries_of: dict[str, list[int]] = {}
    position = {}
    for k, entry in enumerate(entries):
        entries_of.setdefault(entry["model_id"], []).append(k)
        position[(entry["model_id"], entry["variant_label"])] = k
    return entries_of, position


def _vocabulary(variants: list[str]) -> dict:
    """The page's fixed words: the verdicts (and the pseudo ones), their help, the variants,
    attributions and PASS checks (in the order the page's data always had them)."""
    return {
        "verdicts": [*schema.VERDICTS, *PSEUDO_VERDICTS],
        "pseudo": list(PSEUDO_VERDICTS),
        "unprobed": [NOT_PROBED, NOT_TESTED],
        "verdict_help": {
            **schema.VERDICT_HELP,
            EXCLUDED: "left out on purpose; never counted as a failure",
            **unprobed_models.UNPROBED_HELP,
        },
        "variants": variants,
        "default_variant": analysis.DEFAULT_VARIANT,
        "attributions": list(analysis.ATTRIBUTION_KINDS),
        "attribution_help": analysis.ATTRIBUTION_KIND_HELP,
        "checks": list(analysis.PASS_CHECKS),
        "suspect_checks": list(analysis.SUSPECT_CHECKS),
        "check_help": analysis.PASS_CHECK_HELP,
    }


def sweep_labels(sweep_ids: list[str]) -> list[str]:
    """What the list shows for each sweep (its full id is the tooltip): its name and UTC date,
    with the time where two sweeps of one name share a date, the seconds where they share the
    minute, and the id's suffix where they share the second (``analysis.history.sweep_labels``)."""
    return history_labels(sweep_ids, coarsest=0)


def _with_sweep_envs(rows: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Each sweep's usual environment (``e_sweep``, from its real rows); a real row keeps its own
    (stored as an exception when it differs), a pseudo-row (not probed, not tested) takes its
    sweep's."""
    real = pl.col("c") < 2
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
    return rows, sweep_env


def _histories(rows: pl.DataFrame, entry_names: pl.DataFrame, sweeps: pl.DataFrame) -> pl.DataFrame:
    """One row per entry (model and variant): its history ``h`` (runs of consecutive sweeps with
    the same outcome: [sweep, count, outcome] flattened), its environment exceptions ``x``
    ([sweep, env] flattened), and the sweep whose texts the panel shows (``sweep_id``: its latest
    real run, else its latest pseudo-row, which has no texts)."""
    real = pl.col("c") < 2
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
    latest = rows.group_by("m").agg(
        pl.coalesce(pl.col("s").filter(real).max(), pl.col("s").max()).cast(pl.Int64).alias("s")
    )
    odd = (
        rows.filter(pl.col("e") != pl.col("e_sweep"))
        .group_by("m", maintain_order=True)
        .agg(
            pl.concat_list(pl.col("s").cast(pl.Int64), pl.col("e").cast(pl.Int64))
            .list.explode(**explode)
            .alias("x")
        )
    )
    return (
        runs.group_by("m", maintain_order=True)
        .agg(pl.concat_list("s", "n", "o").list.explode(**explode).alias("h"))
        .join(entry_names, on="m", how="left")
        .join(odd, on="m", how="left", maintain_order="left")
        .join(latest, on="m", how="left", maintain_order="left")
        .join(
            sweeps.with_row_index("s").select(pl.col("s").cast(pl.Int64), "sweep_id"),
            on="s",
            how="left",
        )
    )


@dataclass
class _Tables:
    """The page's shared string tables (an entry holds indices into them) and the Hub tasks'
    indices."""

    texts: Strings
    types: Strings
    versions: Strings
    tasks: dict[str, int]


def _entries(
    data_dir: Path,
    hist: pl.DataFrame,
    details: dict,
    hub_by_model: dict,
    entry_task: dict,
    ranked_by: dict,
    tables: _Tables,
) -> list[dict]:
    """One entry per model and variant (``hist``'s order), by name: the ``ENTRY_FIELDS`` the page
    reads (``hub`` only for models with any Hub facts: the page data stays compact), plus
    ``variant_label``. ``details``: each entry's latest run (``latest_details``); ``entry_task``:
    its task (``entry_task_of``)."""
    reports = data_dir / "reports"
    texts = tables.texts
    entries = []
    for model_id, variant, vi, h, x, sweep_id in hist.select(
        "model_id", "variant", "vi", "h", "x", "sweep_id"
    ).iter_rows():
        d = details.get((model_id, variant), {})
        versions = {k: v for k, v in (d.get("versions") or {}).items() if v is not None}
        entry = {
            "model_id": model_id,
            "model_type": tables.types.add(d.get("model_type")),
            "history": h,
            "env_exceptions": x or [],
            "error_type": texts.add(d.get("error_type")),
            "error_message": texts.add(template(d.get("error_message"), model_id, sweep_id)),
            "traceback": texts.add(
                template(portable_paths(d.get("traceback")), model_id, sweep_id)
            ),
            "repro_script": texts.add(template(d.get("repro_script"), model_id, sweep_id)),
            "notebook": texts.add(
                template(
                    relative_href(d.get("notebook_path"), data_dir, reports), model_id, sweep_id
                )
            ),
            "versions": tables.versions.add(json.dumps(versions, sort_keys=True)),
            "started_at": d.get("started_at"),
            "variant": vi,
            "reference_signature": texts.add(d.get("reference_signature")),
            "reference_note": texts.add(template(d.get("reference_note"), model_id, sweep_id)),
            "notebook_url": texts.add(template(d.get("notebook_url"), model_id, sweep_id)),
            "log_url": texts.add(template(d.get("log_url"), model_id, sweep_id)),
            "check_note": texts.add(template(d.get("check_note"), model_id, sweep_id)),
            "task": tables.tasks.get(
                entry_task.get((model_id, variant))
                or (hub_by_model.get(model_id) or {}).get("pipeline_tag")
                or "",
                -1,
            ),
            "variant_label": variant,
        }
        facts = hub_by_model.get(model_id)
        if facts or model_id in ranked_by:
            entry["hub"] = hub_facts(facts or {}, ranked_by.get(model_id), tables.tasks, texts)
        entries.append(entry)
    return entries


def _sweep_rows(sweeps: pl.DataFrame, reports: Path, default_env: dict) -> list[list]:
    """[sweep_id, created (UTC, minutes), device type, its report's file name or null, its usual
    env, its label]."""
    rows = []
    labels = sweep_labels(sweeps["sweep_id"].to_list())
    for s, r in enumerate(sweeps.iter_rows(named=True)):
        report = reports / f"{r['sweep_id']}.html"
        rows.append(
            [
                r["sweep_id"],
                r["created_at"].strftime("%Y-%m-%d %H:%M") if r["created_at"] else "",
                r["device_type"] or "",
                report.name if report.exists() else None,
                default_env.get(s, -1),
                labels[s],
            ]
        )
    return rows


def entry_task_of(latest: dict, hub: dict | None) -> str | None:
    """An entry's task, for the task filter: what its latest run probed (a results row older than
    the column ran text-generation), else the Hub's ``pipeline_tag``."""
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
    colors = {
        **VERDICT_COLORS,
        NOT_TESTED: VERDICT_COLORS.get(NOT_TESTED, VERDICT_COLORS[NOT_PROBED]),
    }
    classes = [(re.sub(r"[^A-Za-z0-9]+", "-", status), color) for status, color in colors.items()]
    page = env.get_template("explorer.html.j2").render(
        data=payload,
        script=(folder / "explorer.js").read_text(),
        verdict_colors=classes,
        views=VIEWS,
    )
    out = data_dir / "reports" / "index.html"
    atomic_write_text(out, page)
    return out
