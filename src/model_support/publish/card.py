"""The dataset card a reader lands on: what a row is, the verdicts, the sweeps with their dates and
pass rates, the stack versions covered, how to load each config, the latest report and where the raw
logs are (``templates/dataset_card.md.j2``).

Everything on it derives from the data folder and the push's destination, never from the clock, so
pushing the same data twice gives the same card (and the second push has nothing to upload). Pass
rates are ``analysis.pass_rate_history``'s: PASS over result rows, excluded rows never counted.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from .. import analysis, paths
from ..analysis.history import what_if_sweeps
from ..record import schema, store

UNKNOWN = "–"


def sweep_rows(data_dir: Path) -> pl.DataFrame:
    """Every sweep of the data folder with rows, oldest first: sweep_id, label, created_at,
    device_type, models, passed, pass_rate, excluded and the stack's components
    (``analysis.VERSION_COMPONENTS``: torch, backend, transformers)."""
    sweeps = analysis.sweep_index(data_dir)
    history = analysis.pass_rate_history(
        store.scan(data_dir, "results"), sweeps, store.scan(data_dir, "excluded")
    )
    rows = history.filter((pl.col("models") > 0) | (pl.col("excluded") > 0))
    # a what-if sweep (operators on the host) is no sweep of the stack, even by its excluded rows
    # alone
    what_if = what_if_sweeps(data_dir, rows["sweep_id"].to_list())
    return rows.filter(~pl.col("sweep_id").is_in(sorted(what_if)))


def latest_with_results(rows: pl.DataFrame) -> str | None:
    """The latest sweep with result rows: the one whose report the card links."""
    with_results = rows.filter(pl.col("models") > 0)
    return with_results["sweep_id"][-1] if with_results.height else None


def render_card(
    data_dir: Path,
    repo_id: str,
    rows: pl.DataFrame,
    *,
    report: dict | None,
    logs: dict[str, dict],
    other_sweeps: list[str],
) -> str:
    """The card's markdown. ``report``: {"path", "url", "label"} of the latest sweep's report in
    the repo, or None; ``logs``: {sweep_id: destination (``files.log_destination``)} of the
    sweeps whose logs are published; ``other_sweeps``: sweeps the repo has that this data folder
    does not."""
    from jinja2 import Environment, FileSystemLoader

    def cell(value) -> str:
        return UNKNOWN if value is None or value == "" else str(value)

    sweeps = [
        {
            "sweep_id": r["sweep_id"],
            "date": r["created_at"].strftime("%Y-%m-%d %H:%M") if r["created_at"] else UNKNOWN,
            "device": cell(r["device_type"]),
            "models": r["models"],
            "passed": r["passed"],
            "pass_rate": UNKNOWN if r["pass_rate"] is None else f"{r['pass_rate']:.1%}",
            "excluded": r["excluded"],
            **{c: cell(r[c]) for c in analysis.VERSION_COMPONENTS},
            "logs": _where(logs.get(r["sweep_id"])),
        }
        for r in rows.iter_rows(named=True)
    ]
    versions = [
        (c, list(dict.fromkeys(v for v in rows[c].to_list() if v)))
        for c in analysis.VERSION_COMPONENTS
    ]
    buckets = sorted({d["bucket"] for d in logs.values() if d.get("bucket")})
    where = (
        ["`logs/<sweep_id>/` in this repo"]
        if any(not d.get("bucket") for d in logs.values())
        else []
    )
    where += [f"`hf://buckets/{b}/<sweep_id>/`" for b in buckets]
    folder = paths.template("dataset_card.md.j2").parent
    env = Environment(
        loader=FileSystemLoader(str(folder)), autoescape=False, keep_trailing_newline=True
    )
    return env.get_template("dataset_card.md.j2").render(
        configs=store.card_configs(data_dir),
        repo_id=repo_id,
        verdicts=list(schema.VERDICT_HELP.items()),
        sweeps=sweeps,
        other_sweeps=other_sweeps,
        versions=versions,
        report=report,
        logs=" and ".join(where),
        fields=store.field_table(),
    )


def _where(destination: dict | None) -> str:
    if not destination:
        return UNKNOWN
    if destination.get("bucket"):
        return f"`hf://buckets/{destination['bucket']}/{destination['prefix']}`"
    return f"[{destination['prefix']}]({destination['url'].replace('/blob/main/', '/tree/main/')})"
