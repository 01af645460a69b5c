"""The report's charts (Altair, data pre-aggregated by ``analysis``, so specs stay small) and the
inlined Vega JavaScript that draws them with no network."""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

import polars as pl

from .. import analysis
from ..analysis.tables import SIZE_GROUPS
from ..fileio import atomic_write_text
from ..record import schema
from ..record.schema import VERDICT_COLORS

# --------------------------------------------------------------------------------------------
# display helpers for the notebook: tables and charts as self-contained HTML


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "model-support"


@functools.cache
def vega_script() -> str:
    """A <script> defining ``vegaEmbed`` (Vega, Vega-Lite and vega-embed, inlined): display once
    per page, before any chart.

    The bundle (~0.9 MB) comes from ``vl-convert-python``, which takes seconds to build it, so it
    is kept in ``~/.cache/model-support/`` (``$XDG_CACHE_HOME``) per vl-convert and Vega-Lite
    version; a cache that cannot be written is only slower.
    """
    from importlib import metadata

    try:  # the Vega-Lite version matching this Altair's specs (a private helper: may move)
        from altair.utils._importers import vl_version_for_vl_convert

        version = vl_version_for_vl_convert()
    except (ImportError, AttributeError):
        version = None
    key = re.sub(
        r"[^A-Za-z0-9._-]",
        "_",
        f"vega-embed-vlc{metadata.version('vl-convert-python')}-vl{version}",
    )
    cached = _cache_dir() / f"{key}.js"
    try:
        bundle = cached.read_text(encoding="utf-8")
    except OSError:
        bundle = ""
    if "vegaEmbed" not in bundle:
        import vl_convert

        bundle = vl_convert.javascript_bundle(vl_version=version)  # type: ignore[call-arg]  # its stub omits snippet's default
        try:
            atomic_write_text(cached, bundle)
        except OSError:
            pass  # a read-only home: the next report builds the bundle again
    bundle = bundle.replace("</script", "<\\/script")
    return f'<script type="text/javascript">\n{bundle}\n</script>'


def chart_html(chart, name: str) -> str:
    """An Altair chart as a <div> plus the script that draws it (SVG) with the inlined vegaEmbed."""
    spec = json.dumps(chart.to_dict(), default=str).replace("</", "<\\/")
    div = f"ms-chart-{re.sub(r'[^A-Za-z0-9_-]', '-', name)}"
    return (
        f'<div class="ms-chart" id="{div}"></div>\n<script '
        f'type="text/javascript">\nvegaEmbed("#{div}", {spec}, {{"renderer": "svg", "actions": '
        f'false}}).catch(function (e) {{ var el = document.getElementById("{div}"); '
        'el.classList.add("ms-chart-error"); el.textContent = "This chart failed to draw: " + '
        "e; });\n</script>"
    )


#: Long text columns shown folded (click to open) in tables.
# --------------------------------------------------------------------------------------------
# charts (Altair; data pre-aggregated by analysis, so specs stay small)


def _values(df: pl.DataFrame) -> list[dict]:
    out = df.with_columns(
        [
            pl.col(c).cast(pl.String)
            for c, t in df.schema.items()
            if isinstance(t, (pl.Enum, pl.Categorical))
        ]
        + [
            pl.col(c).dt.strftime("%Y-%m-%dT%H:%M:%SZ")
            for c, t in df.schema.items()
            if isinstance(t, pl.Datetime)
        ]
    )
    return out.to_dicts()


def _alt():
    import altair as alt

    return alt


def _verdict_color(alt):
    return alt.Color(
        "status:N",
        scale=alt.Scale(domain=list(VERDICT_COLORS), range=list(VERDICT_COLORS.values())),
        legend=None,
    )


def verdict_chart(verdicts: pl.DataFrame, unit: str = "models"):
    """Verdict counts; ``unit`` names what is counted ("runs" for a sweep with several variants)."""
    alt = _alt()
    return (
        alt.Chart(alt.Data(values=_values(verdicts)))
        .mark_bar()
        .encode(
            y=alt.Y("status:N", sort=list(schema.VERDICTS), title=None),
            x=alt.X("count:Q", title=unit),
            color=_verdict_color(alt),
            tooltip=["status:N", "count:Q", alt.Tooltip("share:Q", format=".1%")],
        )
        .properties(width=480, title="Verdicts")
    )


def rate_chart(df: pl.DataFrame, category: str, *, top: int = 30, title: str = ""):
    """Pass rate per ``category`` (model_type or size_bucket), bars sorted as the table is."""
    alt = _alt()
    df = df.head(top)
    order = [str(v) for v in df[category].to_list()]
    return (
        alt.Chart(alt.Data(values=_values(df)))
        .mark_bar(color="#2e7d32")
        .encode(
            y=alt.Y(f"{category}:N", sort=order, title=None),
            x=alt.X(
                "pass_rate:Q",
                axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1]),
                title="pass rate",
            ),
            tooltip=[
                f"{category}:N",
                "models:Q",
                "passed:Q",
                alt.Tooltip("pass_rate:Q", format=".1%"),
            ],
        )
        .properties(width=480, title=title or f"Pass rate by {category}")
    )


def variant_speed_chart(stats: pl.DataFrame):
    """Median first-token time and decode tokens/s per variant (``analysis.variant_stats``), side
    by side."""
    alt = _alt()
    order = stats["variant"].to_list()
    data = alt.Data(
        values=_values(
            stats.select("variant", "first_token_s_median", "decode_tokens_per_s_median")
        )
    )
    charts = []
    for field, title in (
        ("first_token_s_median", "first token (s, median, with compilation)"),
        ("decode_tokens_per_s_median", "decode tokens/s (median)"),
    ):
        charts.append(
            alt.Chart(data)
            .mark_bar(color="#1565c0")
            .encode(
                y=alt.Y("variant:N", sort=order, title=None),
                x=alt.X(f"{field}:Q", title=title),
                tooltip=["variant:N", alt.Tooltip(f"{field}:Q", format=".3g")],
            )
            .properties(width=300, height=24 * len(order))
        )
    return alt.hconcat(*charts).properties(title="Speed per variant")


def timing_chart(histogram: pl.DataFrame):
    alt = _alt()
    return (
        alt.Chart(alt.Data(values=_values(histogram)))
        .mark_bar()
        .encode(
            x=alt.X("bin_start:Q", title=None, bin="binned"),
            x2="bin_end:Q",
            y=alt.Y("count:Q", title="models"),
            tooltip=[
                "metric:N",
                alt.Tooltip("bin_start:Q", format=".3g"),
                alt.Tooltip("bin_end:Q", format=".3g"),
                "count:Q",
            ],
        )
        .properties(width=260, height=160)
        .facet(column=alt.Column("metric:N", sort=list(analysis.TIMING_METRICS), title=None))
        .resolve_scale(x="independent", y="independent")
        .properties(title="Timing distributions")
    )


def memory_chart(memory_by_size: pl.DataFrame):
    """Median peak memory by model size, one panel per metric (host, device) on its own scale: a
    device's few MiB would be an invisible sliver beside a host's hundreds on a shared axis."""
    alt = _alt()
    return (
        alt.Chart(alt.Data(values=_values(memory_by_size)))
        .mark_bar()
        .encode(
            x=alt.X("size_bucket:N", sort=list(SIZE_GROUPS), title="model size"),
            y=alt.Y("median:Q", title="median peak memory (MiB)"),
            color=alt.Color("metric:N", title=None, legend=None),
            tooltip=[
                "size_bucket:N",
                "metric:N",
                "count:Q",
                alt.Tooltip("median:Q", format=",.1f"),
                alt.Tooltip("p90:Q", format=",.1f"),
                alt.Tooltip("max:Q", format=",.1f"),
            ],
        )
        .properties(width=300, height=200)
        .facet(column=alt.Column("metric:N", title=None, sort=list(analysis.MEMORY_METRICS)))
        .resolve_scale(y="independent")
        .properties(title="Peak memory by model size")
    )


def speed_chart(perf: pl.DataFrame):
    """Tokens per second (the perf phase's median) against the model's size, one point per PASS
    run (model and variant), on log scales: decode is bound by the bytes read per token, so speed
    falls with size and a model far below its neighbours is the one to look at."""
    alt = _alt()
    points = perf.select(
        "model_id", "variant", "num_params", "perf_tokens_per_s", "tpot_s"
    ).drop_nulls(["num_params", "perf_tokens_per_s"])
    return (
        alt.Chart(alt.Data(values=_values(points)))
        .mark_circle(size=60)
        .encode(
            x=alt.X("num_params:Q", scale=alt.Scale(type="log"), title="parameters"),
            y=alt.Y(
                "perf_tokens_per_s:Q",
                scale=alt.Scale(type="log"),
                title="tokens/s (median of repeats)",
            ),
            tooltip=[
                "model_id:N",
                "variant:N",
                alt.Tooltip("num_params:Q", format=","),
                alt.Tooltip("perf_tokens_per_s:Q", format=",.1f"),
                alt.Tooltip("tpot_s:Q", format=".4f"),
            ],
        )
        .properties(width=420, height=240, title="Tokens per second against model size")
    )


def reference_chart(reference: pl.DataFrame):
    alt = _alt()
    return (
        alt.Chart(alt.Data(values=_values(reference)))
        .mark_bar()
        .encode(
            y=alt.Y("outcome:N", sort=list(analysis.REFERENCE_OUTCOMES), title=None),
            x=alt.X("count:Q", title="models"),
            color=alt.Color(
                "outcome:N",
                scale=alt.Scale(
                    domain=list(analysis.REFERENCE_OUTCOMES),
                    range=["#2e7d32", "#c62828", "#9e9e9e"],
                ),
                legend=None,
            ),
            tooltip=["outcome:N", "count:Q", alt.Tooltip("share:Q", format=".1%")],
        )
        .properties(width=480, title="CPU reference agreement")
    )


def varying_components(history: pl.DataFrame) -> list[str]:
    """The stack components whose version differs between the charted sweeps: only these get a
    panel of their own (a panel per constant component would draw the same line again, in one
    colour)."""
    return [c for c in analysis.VERSION_COMPONENTS if history[c].fill_null("none").n_unique() > 1]


def history_chart(history: pl.DataFrame):
    """Pass rate per sweep in creation order on a y-axis from 0 to 100% (a drop from 90% to 85%
    reads as the small step it is), once per stack component whose version changed, points
    coloured by its version (and shaped by device, one line per device): a regression shows as a
    step where the colour changes. With one stack throughout, one panel. Sweeps are labelled by
    name and UTC time (``analysis.history.sweep_label``), one tick each: a time axis would label
    sweeps seconds apart as ":42"."""
    alt = _alt()
    history = history.filter(pl.col("models") > 0).with_columns(
        pl.col("device_type").fill_null("unknown"),
        *[pl.col(c).fill_null("none") for c in analysis.VERSION_COMPONENTS],
    )
    order = history["label"].to_list()
    data = alt.Data(values=_values(history))
    tooltip = [
        "sweep_id:N",
        "device_type:N",
        "models:Q",
        alt.Tooltip("pass_rate:Q", format=".1%"),
        *[f"{c}:N" for c in analysis.VERSION_COMPONENTS],
    ]
    charts = []
    panels: list[str | None] = [*varying_components(history)] or [None]
    for component in panels:
        base = alt.Chart(data).encode(
            x=alt.X(
                "label:N", sort=order, title=None, axis=alt.Axis(labelAngle=-30, labelLimit=220)
            ),
            y=alt.Y(
                "pass_rate:Q",
                axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1]),
                title="pass rate",
            ),
        )
        line = base.mark_line(color="#bbb").encode(detail="device_type:N")  # one line per device
        color = (
            alt.Color(f"{component}:N", title=component, sort=None)
            if component
            else alt.value("#1565c0")
        )
        points = base.mark_point(size=45, filled=True).encode(
            color=color, shape=alt.Shape("device_type:N", title="device"), tooltip=tooltip
        )
        title = (
            f"Pass rate over sweeps, by {component}"
            if component
            else "Pass rate over sweeps (one stack throughout)"
        )
        charts.append((line + points).properties(width=700, height=150, title=title))
    return alt.vconcat(*charts).resolve_scale(color="independent")


def version_chart(by_version: pl.DataFrame):
    """Pass rate per version of each stack component that had more than one (one bar per
    component would only repeat the overall pass rate); None when every component kept one
    version."""
    alt = _alt()
    charts = []
    for component in analysis.VERSION_COMPONENTS:
        part = by_version.filter(pl.col("component") == component)
        if part.height < 2:
            continue
        charts.append(
            alt.Chart(alt.Data(values=_values(part)))
            .mark_bar(color="#1565c0")
            .encode(
                x=alt.X("version:N", sort=part["version"].to_list(), title=component),
                y=alt.Y(
                    "pass_rate:Q",
                    axis=alt.Axis(format="%"),
                    scale=alt.Scale(domain=[0, 1]),
                    title="pass rate",
                ),
                tooltip=[
                    "version:N",
                    "sweeps:Q",
                    "models:Q",
                    alt.Tooltip("pass_rate:Q", format=".1%"),
                    "first_sweep:N",
                ],
            )
            .properties(width=220, height=160)
        )
    return alt.hconcat(*charts).properties(title="Pass rate by stack version") if charts else None
