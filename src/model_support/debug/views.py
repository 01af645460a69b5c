"""How the debug notebook shows its findings: HTML pieces, the divergence chart, the summary."""

from __future__ import annotations

import html
import math

from .. import display
from ..display import Cell, Row
from ..probe.checks import first_divergence
from .compare import COLUMNS, conclusion, first_offender, offender_reason
from .tracer import ROOT_LABEL

DEBUG_FLAG = "debug"


def divergence_chart(table, tolerance: float | None = None):
    """Max absolute difference per module call in execution order (log scale), the first offender
    highlighted. Zero differences sit on the floor and non-finite ones on the ceiling of the axis;
    the tooltip shows the true values."""
    import altair as alt
    import polars as pl

    data = table.filter(pl.col("max_abs_diff").is_not_null() | pl.col("exceeds"))
    positive = [v for v in data["max_abs_diff"].to_list() if v is not None and 0 < v < math.inf]
    floor = min(positive) / 10 if positive else 1e-12
    ceiling = max(positive) * 10 if positive else 1.0

    def plotted(row):
        value = row["max_abs_diff"]
        if row["new_nonfinite"] or value is None or value == math.inf:
            return ceiling
        return max(value, floor)

    def status(row):
        if row["first_offender"]:
            return "first offender"
        if row["new_nonfinite"]:
            return "new inf/nan on device"
        if row["exceeds"]:
            return "above tolerance"
        return "within tolerance"

    points_data = []
    for row in data.iter_rows(named=True):
        points_data.append(
            {
                "index": row["index"],
                "module": _label(row["module"]),
                "class": row["class"],
                "call": row["call"],
                "max_abs_diff": _finite_or_none(row["max_abs_diff"]),
                "max_rel_diff": _finite_or_none(row["max_rel_diff"]),
                "new_nonfinite": row["new_nonfinite"],
                "plotted_diff": plotted(row),
                "status": status(row),
            }
        )
    domain = ["within tolerance", "above tolerance", "new inf/nan on device", "first offender"]
    colors = ["#4c78a8", "#f58518", "#b279a2", "#d62728"]
    title = "Max |device - reference| per module, in execution order"
    if tolerance is not None:
        title += f" (relative tolerance {tolerance:g})"
    base = alt.Chart(alt.Data(values=points_data)).encode(
        x=alt.X("index:Q", title="module call (order of completion)"),
        y=alt.Y("plotted_diff:Q", scale=alt.Scale(type="log"), title="max abs diff (log)"),
        tooltip=[
            "index:Q",
            "module:N",
            "class:N",
            "call:Q",
            alt.Tooltip("max_abs_diff:Q", format=".3g"),
            alt.Tooltip("max_rel_diff:Q", format=".3g"),
            "new_nonfinite:Q",
            "status:N",
        ],
    )
    line = base.mark_line(color="#bbbbbb", strokeWidth=1)
    points = base.mark_point(filled=True).encode(
        color=alt.Color("status:N", scale=alt.Scale(domain=domain, range=colors), title=None),
        size=alt.condition(alt.datum.status == "first offender", alt.value(160), alt.value(30)),
    )
    layers = [line, points]
    offender = [row for row in points_data if row["status"] == "first offender"]
    if offender:
        label = (
            alt.Chart(alt.Data(values=offender))
            .mark_text(align="left", dx=8, dy=-8, color="#d62728")
            .encode(
                x="index:Q", y=alt.Y("plotted_diff:Q", scale=alt.Scale(type="log")), text="module:N"
            )
        )
        rule = (
            alt.Chart(alt.Data(values=offender))
            .mark_rule(color="#d62728", strokeDash=[4, 3])
            .encode(x="index:Q")
        )
        layers += [rule, label]
    return alt.layer(*layers).properties(width=720, height=280, title=title)


def _finite_or_none(value):
    return value if value is not None and math.isfinite(value) else None


def chart_bundle(chart) -> dict:
    """A display bundle for an Altair chart that needs no network: the Vega-Lite spec (JupyterLab
    draws it, with tooltips) and the same chart as SVG (for viewers without a Vega-Lite
    renderer)."""
    import altair as alt

    spec = chart.to_dict()
    major = alt.SCHEMA_VERSION.lstrip("v").split(".")[0]
    bundle = {f"application/vnd.vegalite.v{major}+json": spec, "text/plain": "<divergence chart>"}
    try:
        import vl_convert
        from altair.utils._importers import vl_version_for_vl_convert

        bundle["image/svg+xml"] = vl_convert.vegalite_to_svg(
            spec, vl_version=vl_version_for_vl_convert()
        )
    except ImportError:  # vl-convert is optional: JupyterLab draws the spec itself
        pass
    return bundle


def show_chart(chart):
    from IPython.display import display

    display(chart_bundle(chart), raw=True)


def _label(name: str | None) -> str:
    return ROOT_LABEL if name == "" else str(name)


def _inputs_text(inputs: list[dict]) -> str:
    return (
        ", ".join(f"{i['arg']}: {i['dtype'].removeprefix('torch.')}{i['shape']}" for i in inputs)
        or "no tensor inputs"
    )


def failure_html(failure: dict | None, what: str) -> str:
    """One failure (``ModuleTracer.failure_from``) as HTML."""
    esc = html.escape
    if failure is None:
        return f"<p><b>{esc(what)}</b>: ran without an exception.</p>"
    where = (
        f"in <code>{esc(_label(failure['module']))}</code> ({esc(failure['class'])})"
        if failure["module"] is not None
        else "outside any module"
    )
    rows = [
        (
            "module",
            f"{_label(failure['module'])} ({failure['class_path']})"
            if failure["module"] is not None
            else "-",
        ),
        ("module settings", failure.get("module_summary") or "-"),
        ("inputs", _inputs_text(failure["inputs"])),
        ("entered, outer to inner", " > ".join(_label(n) for n in failure["stack"]) or "-"),
        ("exception", f"{failure['error_type']}: {failure['error_message']}"),
    ]
    return (
        f"<p style='color:#cf222e'><b>{esc(what)}</b> raised {where}</p>{display.kv_table(rows)}"
        f"<details><summary>traceback</summary><pre>{esc(failure['traceback'])}</pre></details>"
    )


def table_html(table, max_height: int = 420) -> str:
    """The comparison table as self-contained HTML (``display.html_table``), scrollable, the
    first offender highlighted."""

    def fmt(value):
        if value is None:
            return ""
        if isinstance(value, float):
            return f"{value:.3g}"
        return str(value)

    shown = tuple(c for c in COLUMNS if c != "first_offender")  # shown by the row's colour instead
    head = [Cell(c, header=True, style="position:sticky;top:0;background:#fff") for c in shown]
    rows = (
        Row(
            [
                Cell(_label(row[c]) if c == "module" else fmt(row[c]), style="white-space:nowrap")
                for c in shown
            ],
            style=(
                "background:#ffd7d5;font-weight:bold"
                if row["first_offender"]
                else ("background:#fff4e5" if row["exceeds"] else None)
            ),
        )
        for row in table.iter_rows(named=True)
    )
    return (
        "<div "
        f"style='max-height:{max_height}px;overflow:auto'>{display.html_table(head, rows)}</div>"
    )


def divergence_html(table, tolerance: float) -> str:
    esc = html.escape
    row = first_offender(table)
    if row is None:
        headline = (
            f"<p><b>No module diverges</b>: every compared module is within relative tolerance "
            f"{tolerance:g} and has no new inf/nan ({table.height} module calls).</p>"
        )
    else:
        headline = (
            "<p style='color:#cf222e'><b>First divergence</b>: "
            f"<code>{esc(_label(row['module']))}</code> ({esc(row['class'])}, call "
            f"{row['call']}, module call #{row['index']}): "
            f"{esc(offender_reason(row, tolerance))}.</p>"
        )
    return headline + table_html(table)


def generation_html(
    generation: dict, reference: dict | None = None, numerics: dict | None = None
) -> str:
    """The device's generation step by step, the reference's, and the reference's verdict on the
    device's logits (``numerics``: what the probe's record says for the same run)."""
    esc = html.escape
    parts = []
    if generation["ok"]:
        parts.append(
            f"<p><b>Generation</b> ran: {generation['tokens_out']} new token(s) "
            f"{esc(str(generation['output_token_ids']))} after {generation['tokens_in']} "
            "prompt tokens.</p>"
        )
    else:
        parts.append(
            f"<p style='color:#cf222e'><b>Generation fails at step {generation['step']}</b> "
            "(0-based index of the new token whose forward raised), with "
            f"{generation['seq_len']} tokens in the sequence (tokens_in "
            f"{generation['tokens_in']} + {generation['step']} generated; "
            f"{generation['forward_calls']} forward call(s)).</p>"
        )
        parts.append(failure_html(generation["failure"], f"Step {generation['step']}"))
    if reference is not None:
        if reference["ok"]:
            parts.append(
                f"<p>CPU reference: {esc(str(reference['output_token_ids']))}; first "
                "divergence: "
                f"{first_divergence(generation['output_token_ids'] or [], reference['output_token_ids'])}.</p>"
            )
        else:
            parts.append(
                f"<p>CPU reference fails too, at step {reference['step']} (in "
                f"<code>{esc(_label(reference['failure']['module']))}</code>): not specific to "
                "the device.</p>"
            )
    if numerics:
        colour = " style='color:#cf222e'" if numerics["numerics"] == "diverges" else ""
        parts.append(
            f"<p{colour}><b>Numerics</b> (the CPU reference teacher-forced on these tokens, as "
            f"the probe checks): <b>{esc(str(numerics['numerics']))}</b>: "
            f"{esc(numerics['numerics_note'] or '')}.</p>"
        )
    return "".join(parts)


def summary_html(result: dict) -> str:
    gen = result.get("generation") or {}
    offender = result.get("first_offender")
    failure = result.get("forward_failure")
    rows = [
        ("model", result["model_id"]),
        (
            "device / dtype",
            f"{result['device_type']} / {result['dtype']} (reference cpu / "
            f"{result['reference_dtype']})",
        ),
        ("tokens_in", result["tokens_in"]),
        (
            "forward raises in",
            f"{_label(failure['module'])} ({failure['class']}): {failure['error_type']}"
            if failure
            else "-",
        ),
        (
            "first divergence",
            f"{_label(offender['module'])} ({offender['class']}): {offender['reason']}"
            if offender
            else "-",
        ),
        (
            "generation",
            "ran"
            if gen.get("ok")
            else (
                f"fails at step {gen.get('step')}, seq_len {gen.get('seq_len')}, in "
                f"{_label((gen.get('failure') or {}).get('module'))}"
                if gen
                else "-"
            ),
        ),
        (
            "numerics",
            f"{result['numerics']['numerics']}: {result['numerics']['numerics_note']}"
            if result.get("numerics")
            else "-",
        ),
        (
            "generated vs reference",
            f"{gen.get('output_token_ids')} vs {gen.get('reference_token_ids')} "
            f"(first divergence {gen.get('first_divergence')})"
            if gen
            else "-",
        ),
    ]
    return display.kv_table(rows, title="Debug summary")


def conclusion_slot():
    """Display where the conclusion will stand (at the top of the notebook); ``.update`` it at
    the end."""
    from IPython.display import HTML, display

    return display(
        HTML("<p><b>Conclusion</b>: (computed at the end of the notebook)</p>"), display_id=True
    )


def conclusion_html(result: dict) -> str:
    return f"<p style='font-size:1.1em'><b>Conclusion</b>: {html.escape(conclusion(result))}.</p>"


def show_conclusion(slot, result: dict) -> None:
    """Fill the slot ``conclusion_slot`` displayed at the top."""
    from IPython.display import HTML

    slot.update(HTML(conclusion_html(result)))


def show(result: dict):
    """Display the summary and store the result in the output, tagged so readers find it."""
    text = (
        f"debug {result['model_id']}: "
        f"forward_failure={(result['forward_failure'] or {}).get('module')} "
        f"first_offender={(result['first_offender'] or {}).get('module')} "
        f"generation_step={(result['generation'] or {}).get('step')}"
    )
    display.show_tagged(DEBUG_FLAG, summary_html(result), result, text)


def debug_result_from_notebook(path) -> dict:
    """The result an executed debug notebook displayed with ``show``; ValueError when it has
    none."""
    found = display.read_tagged(path, DEBUG_FLAG)
    if found is None:
        raise ValueError(
            f"{path} holds no debug result (the notebook did not reach its show(result) cell)."
        )
    return found
