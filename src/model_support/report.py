"""The per-sweep HTML report, the sweep diff, and the display helpers the report notebook calls.

``render_report`` executes ``notebooks/report.ipynb`` with papermill (the executed notebook is
kept as ``data/reports/<sweep_id>.ipynb``), turns it into ``data/reports/<sweep_id>.html`` with
nbconvert (code hidden), then rebuilds the explorer page ``data/reports/index.html``. Every page
is self-contained: the Vega, Vega-Lite and vega-embed JavaScript is inlined once per page from
the ``vl-convert-python`` package, and nbconvert's CDN scripts (require.js, MathJax, Mermaid) are
left out, so a report opens from disk with no network.

``diff_table`` and ``format_diff`` serve ``model-support diff A B``.
"""

from __future__ import annotations

import functools
import html
import io
import json
import os
import re
from datetime import date, datetime
from pathlib import Path

import polars as pl

from . import report_data, schema, store

#: The report notebook, in the checkout this package is imported from.
NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "report.ipynb"
REPORTS = "reports"

#: One colour per verdict, used by every chart.
VERDICT_COLORS = {schema.PASS: "#2e7d32", schema.FAIL_LOAD: "#ef6c00", schema.FAIL_GEN: "#c62828", schema.FAIL_OTHER: "#6a1b9a"}

#: What the report's other terms mean (the verdicts and stages come from ``schema``).
TERM_HELP = {
    "excluded": "left out on purpose (not a text-generation model, too large, listed in params, or the whole sweep "
                "after the fact); never counted as a failure",
    "failure signature": "the error type plus the message with volatile parts (numbers, paths, ids, names) replaced "
                         "by placeholders: same cause, same signature",
    "pass rate": "PASS / models probed in the sweep (excluded models are not in the denominator)",
    "CPU agreement": "the device's greedy tokens compared with the same generation on CPU: match, mismatch, or not "
                     "run (switched off, above the size limit, or no generation)",
    "newly failing / newly passing": "PASS in the baseline and a FAIL now / a FAIL in the baseline and PASS now",
    "status changed / signature changed": "failing in both sweeps, with a different verdict / the same verdict "
                                          "but a different failure signature",
    "added / removed": "probed in only one of the two sweeps",
    "first_token_s": "time to the first generated token, including compilation",
}

_OFFLINE_TEMPLATE = """{%- extends 'index.html.j2' -%}
{#- nbconvert's lab page without the scripts it fetches from a CDN: the report works offline. -#}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block extra_css -%}
<style type="text/css">
  body.jp-Notebook { max-width: 1200px; margin: 0 auto; }
  table.ms-table { border-collapse: collapse; font-size: 12px; margin: 6px 0 14px; }
  .jp-RenderedHTMLCommon table.ms-table { table-layout: auto; }
  .jp-RenderedHTMLCommon table.ms-table th, .jp-RenderedHTMLCommon table.ms-table td {
    border: 1px solid #ddd; padding: 3px 6px; text-align: left; vertical-align: top; max-width: 520px; }
  .jp-RenderedHTMLCommon table.ms-table th { background: #f4f4f4; }
  .jp-RenderedHTMLCommon table.ms-table td.num { text-align: right; font-variant-numeric: tabular-nums; }
  .jp-RenderedHTMLCommon table.ms-table pre { margin: 0; white-space: pre-wrap; max-width: 700px; font-size: 11px; }
  .jp-RenderedHTMLCommon table.ms-table summary { cursor: pointer; color: #1565c0; }
  .ms-note { color: #555; font-size: 12px; }
  .ms-head dt { font-weight: bold; float: left; clear: left; width: 170px; }
  .ms-head dd { margin-left: 180px; }
</style>
{%- endblock extra_css -%}
"""


# --------------------------------------------------------------------------------------------
# sweeps


def _sweeps(data_dir) -> pl.DataFrame:
    return report_data.sweep_index(Path(data_dir))


def previous_sweep(data_dir: Path | str, sweep_id: str) -> str | None:
    """The latest sweep created before ``sweep_id`` (with results rows): the default baseline."""
    return report_data.previous_sweep_id(_sweeps(data_dir), sweep_id)


def latest_sweep(data_dir: Path | str) -> str:
    """The most recently created sweep; a one-sentence ValueError when there is none."""
    sweeps = _sweeps(data_dir)
    if sweeps.height == 0:
        raise ValueError(f"There are no sweeps under {data_dir}: run a sweep first.")
    return sweeps["sweep_id"][-1]


# --------------------------------------------------------------------------------------------
# rendering


def render_report(
    data_dir: Path | str,
    sweep_id: str,
    baseline_sweep_id: str | None = None,
    out_html: Path | str | None = None,
    *,
    notebook: Path | str | None = None,
    kernel_name: str | None = None,
    execution_timeout: int = 600,
) -> Path:
    """Execute the report notebook for ``sweep_id`` and write its HTML; returns the HTML path.

    ``baseline_sweep_id`` None means the previous sweep (``previous_sweep``); "" means no diff.
    The executed notebook stays in ``data/reports/<sweep_id>.ipynb`` (a failed execution leaves it
    there showing the error, and raises); the HTML goes to ``out_html`` or
    ``data/reports/<sweep_id>.html``. The explorer page is rebuilt afterwards.
    """
    import papermill

    from .explorer import build_explorer
    from .kernels import ipc_kernel

    data_dir = Path(data_dir).resolve()
    sweeps = _sweeps(data_dir)
    report_data.require_sweep(sweeps, sweep_id)
    if baseline_sweep_id is None:
        baseline_sweep_id = report_data.previous_sweep_id(sweeps, sweep_id) or ""
    elif baseline_sweep_id:
        report_data.require_sweep(sweeps, baseline_sweep_id)
    out_dir = data_dir / REPORTS
    out_dir.mkdir(parents=True, exist_ok=True)
    executed = out_dir / f"{sweep_id}.ipynb"
    with ipc_kernel(kernel_name or "python3") as km:  # as every notebook run of ours
        papermill.execute_notebook(
            str(notebook or NOTEBOOK),
            str(executed),
            parameters={"sweep_id": sweep_id, "baseline_sweep_id": baseline_sweep_id, "data_dir": str(data_dir)},
            kernel_name=kernel_name or "python3",
            progress_bar=False,
            execution_timeout=execution_timeout,
            km=km,
        )
    out_html = Path(out_html) if out_html else out_dir / f"{sweep_id}.html"
    title = f"Sweep report: {sweep_id}" + (f" (against {baseline_sweep_id})" if baseline_sweep_id else "")
    write_page(out_html, notebook_to_html(executed, title=title))
    build_explorer(data_dir)
    return out_html


def notebook_to_html(notebook_path: Path | str, title: str | None = None) -> str:
    """An executed notebook -> one self-contained HTML page with the code cells hidden."""
    import nbformat
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(notebook_path), as_version=4)
    if title:
        nb.metadata["title"] = title

    exporter = HTMLExporter(
        template_name="lab",
        extra_loaders=[DictLoader({"offline.html.j2": _OFFLINE_TEMPLATE})],
        template_file="offline.html.j2",
        exclude_input=True,
        exclude_input_prompt=True,
        exclude_output_prompt=True,
    )
    body, _ = exporter.from_notebook_node(nb)
    return body


def write_page(path: Path, text: str) -> None:
    """Write an HTML page atomically, readable by all (a report is meant to be served and shared)."""
    store.atomic_write_bytes(path, text.encode("utf-8"))
    os.chmod(path, 0o644)


# --------------------------------------------------------------------------------------------
# the diff of two sweeps (model-support diff A B)


def diff_table(data_dir: Path | str, a: str, b: str) -> pl.DataFrame:
    """Models whose outcome changed from sweep ``a`` (the baseline) to sweep ``b``: see
    ``report_data.model_changes``. Unknown ids raise a one-sentence ValueError."""
    sweeps = _sweeps(data_dir)
    report_data.require_sweep(sweeps, a)
    report_data.require_sweep(sweeps, b)
    return report_data.model_changes(store.scan(Path(data_dir), "results"), b, a)


def diff_summary(diff: pl.DataFrame, a: str, b: str) -> str:
    """One line: how many models changed, by kind."""
    counts = report_data.change_counts(diff)
    parts = ", ".join(f"{n} {change}" for change, n in counts.items())
    return f"{a} -> {b}: {parts}."


def format_diff(
    diff: pl.DataFrame | Path | str, a: str, b: str, *, max_per_change: int = 15, width: int = 140
) -> str:
    """``diff_table``'s output as a terminal table (rich when installed, else plain text): newly
    failing first, then newly passing, status and signature changes, added and removed, at most
    ``max_per_change`` models of each, then a one-line summary.

    ``diff`` is a ``diff_table`` result, or a data folder to compute it from (``model-support diff``
    passes the folder)."""
    if not isinstance(diff, pl.DataFrame):
        diff = diff_table(diff, a, b)
    headers = ["model", "change", "before", "after", "signature now (was)"]
    rows, left_out = [], []
    for change in report_data.CHANGES:
        part = diff.filter(pl.col("change") == change)
        for r in part.head(max_per_change).iter_rows(named=True):
            now, was = r["signature_after"], r["signature_before"]
            sig = now or ""
            if was and was != now:
                sig = f"{sig} (was: {was})" if sig else f"(was: {was})"
            rows.append([r["model_id"], change, r["status_before"] or "-", r["status_after"] or "-", sig])
        if part.height > max_per_change:
            left_out.append(f"{part.height - max_per_change} more {change}")
    more = f"... and {', '.join(left_out)} (see diff_table for all)" if left_out else ""
    summary = diff_summary(diff, a, b)
    title = f"{b} against {a}"
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        body = _plain_table(headers, rows) if rows else "No model changed."
        return "\n".join(x for x in (title, body, more, summary) if x) + "\n"
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, force_terminal=False, highlight=False)
    if rows:
        table = Table(*headers, title=title)
        for row in rows:
            table.add_row(*[_rich_escape(c) for c in row])
        console.print(table)
    else:
        console.print(f"{title}: no model changed.")
    if more:
        console.print(more, soft_wrap=True)
    console.print(summary, soft_wrap=True)
    return buffer.getvalue()


def _rich_escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _plain_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


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
    key = re.sub(r"[^A-Za-z0-9._-]", "_", f"vega-embed-vlc{metadata.version('vl-convert-python')}-vl{version}")
    cached = _cache_dir() / f"{key}.js"
    try:
        bundle = cached.read_text(encoding="utf-8")
    except OSError:
        bundle = ""
    if "vegaEmbed" not in bundle:
        import vl_convert

        bundle = vl_convert.javascript_bundle(vl_version=version)
        try:
            store.atomic_write_bytes(cached, bundle.encode("utf-8"))
        except OSError:
            pass  # a read-only home: the next report builds the bundle again
    bundle = bundle.replace("</script", "<\\/script")
    return f'<script type="text/javascript">\n{bundle}\n</script>'


def chart_html(chart, name: str) -> str:
    """An Altair chart as a <div> plus the script that draws it (SVG) with the inlined vegaEmbed."""
    spec = json.dumps(chart.to_dict(), default=str).replace("</", "<\\/")
    div = f"ms-chart-{re.sub(r'[^A-Za-z0-9_-]', '-', name)}"
    return (
        f'<div class="ms-chart" id="{div}"></div>\n<script type="text/javascript">\n'
        f'vegaEmbed("#{div}", {spec}, {{"renderer": "svg", "actions": false}})'
        f'.catch(function (e) {{ var el = document.getElementById("{div}"); el.classList.add("ms-chart-error"); '
        f'el.textContent = "This chart failed to draw: " + e; }});\n</script>'
    )


#: Long text columns shown folded (click to open) in tables.
FOLDED = ("error_message", "traceback", "repro_script")


def _cell(value, column: str) -> tuple[str, bool]:
    """(escaped HTML, is_number) for one table cell."""
    if value is None:
        return "", False
    if isinstance(value, bool):
        return str(value).lower(), False
    if isinstance(value, float):
        if column in ("pass_rate", "share"):
            return f"{100 * value:.1f}%", True
        return (f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"), True
    if isinstance(value, int):
        return f"{value:,}", True
    if isinstance(value, (list, tuple)):
        return "<br>".join(html.escape(str(v)) for v in value), False
    if isinstance(value, datetime):
        return html.escape(value.strftime("%Y-%m-%d %H:%M UTC")), False
    if isinstance(value, date):
        return html.escape(value.isoformat()), False
    text = str(value)
    if column in FOLDED or "\n" in text or len(text) > 160:
        lines = text.strip().splitlines() or [""]
        if column == "traceback":
            first = f"traceback ({len(lines)} lines)"
        else:
            first = html.escape(lines[0][:80]) + ("&hellip;" if len(lines) > 1 or len(lines[0]) > 80 else "")
        return f"<details><summary>{first}</summary><pre>{html.escape(text)}</pre></details>", False
    return html.escape(text), False


def table_html(df: pl.DataFrame, *, max_rows: int = 100, empty: str = "none") -> str:
    """A small DataFrame as a plain HTML table: rates as percentages, long text folded."""
    if df.height == 0:
        return f'<p class="ms-note">{html.escape(empty)}</p>'
    head = "".join(f"<th>{html.escape(c)}</th>" for c in df.columns)
    body = []
    for row in df.head(max_rows).iter_rows(named=True):
        cells = []
        for column, value in row.items():
            text, number = _cell(value, column)
            cells.append(f'<td class="num">{text}</td>' if number else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = f'<p class="ms-note">{df.height - max_rows} more rows not shown.</p>' if df.height > max_rows else ""
    return f'<table class="ms-table"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>{more}'


def header_html(tables: dict[str, pl.DataFrame], sweep_id: str, baseline_sweep_id: str | None) -> str:
    """The report's opening facts: the sweep, when, where, with what stack, and its headline numbers."""
    sweeps = tables["sweeps"].filter(pl.col("sweep_id") == sweep_id).row(0, named=True)
    history = tables["history"].filter(pl.col("sweep_id") == sweep_id)
    versions = history.row(0, named=True) if history.height else {}
    summary = tables["summary"].row(0, named=True)
    rate = summary["pass_rate"]
    facts = {
        "sweep": sweep_id,
        "created": sweeps["created_at"].strftime("%Y-%m-%d %H:%M UTC") if sweeps["created_at"] else "unknown",
        "device": sweeps["device_type"] or "unknown",
        "host": sweeps["host"] or "unknown",
        "stack": ", ".join(f"{c} {versions.get(c) or '-'}" for c in report_data.VERSION_COMPONENTS),
        "models probed": f"{summary['models']:,}",
        "passed": f"{summary['passed']:,} ({100 * rate:.1f}%)" if rate is not None else "0",
        "excluded (not failures)": f"{summary['excluded']:,}",
        "baseline": baseline_sweep_id or "none",
    }
    items = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(str(v))}</dd>" for k, v in facts.items())
    return f'<dl class="ms-head">{items}</dl>'


def changes_html(tables: dict[str, pl.DataFrame], sweep_id: str, baseline_sweep_id: str | None) -> str:
    if not baseline_sweep_id:
        return '<p class="ms-note">No baseline sweep: nothing to compare with.</p>'
    line = diff_summary(tables["changes"], baseline_sweep_id, sweep_id)
    return f"<p><b>{html.escape(line)}</b></p>"


def legend_html() -> str:
    """Every verdict and failure stage with its meaning, then the report's other terms."""
    def dl(title: str, entries: dict[str, str]) -> str:
        items = "".join(f"<dt><code>{html.escape(k)}</code></dt><dd>{html.escape(v)}</dd>" for k, v in entries.items())
        return f'<h4>{html.escape(title)}</h4><dl class="ms-head ms-legend">{items}</dl>'

    return (
        dl("Verdicts", schema.VERDICT_HELP)
        + dl("Failure stages", schema.STAGE_HELP)
        + dl("Other terms", TERM_HELP)
        + dl("Size buckets (num_params)", {b: b if b != "unknown" else "num_params not recorded" for b in report_data.SIZE_BUCKETS})
    )


def show_table(df: pl.DataFrame, **kwargs) -> None:
    from IPython.display import HTML, display

    display(HTML(table_html(df, **kwargs)))


def show_html(text: str) -> None:
    from IPython.display import HTML, display

    display(HTML(text))


def show_chart(chart, name: str) -> None:
    from IPython.display import HTML, display

    display(HTML(chart_html(chart, name)))


# --------------------------------------------------------------------------------------------
# charts (Altair; data pre-aggregated by report_data, so specs stay small)


def _values(df: pl.DataFrame) -> list[dict]:
    out = df.with_columns(
        [pl.col(c).cast(pl.String) for c, t in df.schema.items() if isinstance(t, (pl.Enum, pl.Categorical))]
        + [pl.col(c).dt.strftime("%Y-%m-%dT%H:%M:%SZ") for c, t in df.schema.items() if isinstance(t, pl.Datetime)]
    )
    return out.to_dicts()


def _alt():
    import altair as alt

    return alt


def _verdict_color(alt):
    return alt.Color("status:N", scale=alt.Scale(domain=list(VERDICT_COLORS), range=list(VERDICT_COLORS.values())),
                     legend=None)


def verdict_chart(verdicts: pl.DataFrame):
    alt = _alt()
    return (
        alt.Chart(alt.Data(values=_values(verdicts)))
        .mark_bar()
        .encode(
            y=alt.Y("status:N", sort=list(schema.VERDICTS), title=None),
            x=alt.X("count:Q", title="models"),
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
            x=alt.X("pass_rate:Q", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1]), title="pass rate"),
            tooltip=[f"{category}:N", "models:Q", "passed:Q", alt.Tooltip("pass_rate:Q", format=".1%")],
        )
        .properties(width=480, title=title or f"Pass rate by {category}")
    )


def timing_chart(histogram: pl.DataFrame):
    alt = _alt()
    return (
        alt.Chart(alt.Data(values=_values(histogram)))
        .mark_bar()
        .encode(
            x=alt.X("bin_start:Q", title=None, bin="binned"),
            x2="bin_end:Q",
            y=alt.Y("count:Q", title="models"),
            tooltip=["metric:N", alt.Tooltip("bin_start:Q", format=".3g"), alt.Tooltip("bin_end:Q", format=".3g"), "count:Q"],
        )
        .properties(width=260, height=160)
        .facet(column=alt.Column("metric:N", sort=list(report_data.TIMING_METRICS), title=None))
        .resolve_scale(x="independent", y="independent")
        .properties(title="Timing distributions")
    )


def memory_chart(memory_by_size: pl.DataFrame):
    alt = _alt()
    return (
        alt.Chart(alt.Data(values=_values(memory_by_size)))
        .mark_bar()
        .encode(
            x=alt.X("size_bucket:N", sort=list(report_data.SIZE_BUCKETS), title="model size"),
            xOffset=alt.XOffset("metric:N"),
            y=alt.Y("median:Q", title="median peak memory (MB)"),
            color=alt.Color("metric:N", title=None),
            tooltip=["size_bucket:N", "metric:N", "count:Q", alt.Tooltip("median:Q", format=",.0f"),
                     alt.Tooltip("p90:Q", format=",.0f"), alt.Tooltip("max:Q", format=",.0f")],
        )
        .properties(width=480, title="Peak memory by model size")
    )


def reference_chart(reference: pl.DataFrame):
    alt = _alt()
    return (
        alt.Chart(alt.Data(values=_values(reference)))
        .mark_bar()
        .encode(
            y=alt.Y("outcome:N", sort=list(report_data.REFERENCE_OUTCOMES), title=None),
            x=alt.X("count:Q", title="models"),
            color=alt.Color("outcome:N", scale=alt.Scale(domain=list(report_data.REFERENCE_OUTCOMES),
                                                          range=["#2e7d32", "#c62828", "#9e9e9e"]), legend=None),
            tooltip=["outcome:N", "count:Q", alt.Tooltip("share:Q", format=".1%")],
        )
        .properties(width=480, title="CPU reference agreement")
    )


def history_chart(history: pl.DataFrame):
    """Pass rate per sweep over time, once per stack component, points coloured by its version
    (and shaped by device, one line per device): a regression shows as a step where the colour
    changes."""
    alt = _alt()
    history = history.filter(pl.col("models") > 0).with_columns(
        pl.col("device_type").fill_null("unknown"), *[pl.col(c).fill_null("none") for c in report_data.VERSION_COMPONENTS]
    )
    data = alt.Data(values=_values(history))
    charts = []
    for component in report_data.VERSION_COMPONENTS:
        base = alt.Chart(data).encode(
            x=alt.X("created_at:T", title=None),
            y=alt.Y("pass_rate:Q", axis=alt.Axis(format="%"), scale=alt.Scale(zero=False), title="pass rate"),
        )
        line = base.mark_line(color="#bbb").encode(detail="device_type:N")  # one line per device
        points = base.mark_point(size=45, filled=True).encode(
            color=alt.Color(f"{component}:N", title=component, sort=None),
            shape=alt.Shape("device_type:N", title="device"),
            tooltip=["sweep_id:N", "device_type:N", "models:Q", alt.Tooltip("pass_rate:Q", format=".1%"),
                     *[f"{c}:N" for c in report_data.VERSION_COMPONENTS]],
        )
        charts.append((line + points).properties(width=700, height=150, title=f"Pass rate over sweeps, by {component}"))
    return alt.vconcat(*charts).resolve_scale(color="independent")


def version_chart(by_version: pl.DataFrame):
    alt = _alt()
    charts = []
    for component in report_data.VERSION_COMPONENTS:
        part = by_version.filter(pl.col("component") == component)
        charts.append(
            alt.Chart(alt.Data(values=_values(part)))
            .mark_bar(color="#1565c0")
            .encode(
                x=alt.X("version:N", sort=part["version"].to_list(), title=component),
                y=alt.Y("pass_rate:Q", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1]), title="pass rate"),
                tooltip=["version:N", "sweeps:Q", "models:Q", alt.Tooltip("pass_rate:Q", format=".1%"), "first_sweep:N"],
            )
            .properties(width=220, height=160)
        )
    return alt.hconcat(*charts).properties(title="Pass rate by stack version")
