"""What notebooks show, the small pieces: verdict colours, a key/value table, and results stored
in (and read back from) an executed notebook's outputs.

One set of verdict colours serves the probe summary, the report's charts and tables, and the
explorer (which reads them from the page data). A notebook's result (the probe's record, the debug
notebook's findings) is displayed as a bundle whose output metadata carries
``{"model_support": {<flag>: true}}``; ``read_tagged`` finds it again in the executed notebook.
"""

from __future__ import annotations

import html
from pathlib import Path

from . import schema

NOTEBOOK_KEY = "model_support"
#: One colour per verdict (and for excluded rows), everywhere.
VERDICT_COLORS = {
    schema.PASS: "#2e7d32",
    schema.FAIL_LOAD: "#ef6c00",
    schema.FAIL_GEN: "#c62828",
    schema.FAIL_OTHER: "#6a1b9a",
    "excluded": "#757575",
    "not probed": "#9e9e9e",
}


def verdict_color(status: str | None) -> str:
    return VERDICT_COLORS.get(status or "", "#555555")


def kv_table(rows, title: str | None = None, color: str | None = None) -> str:
    """A two-column (name, value) HTML table; rows whose value is None are left out."""
    body = "".join(
        f"<tr><th style='text-align:left;vertical-align:top'>{html.escape(str(k))}</th>"
        f"<td style='text-align:left'>{html.escape(str(v))}</td></tr>"
        for k, v in rows
        if v is not None
    )
    head = (
        f"<h3 style='color:{color}'>{html.escape(title)}</h3>"
        if title and color
        else (f"<h3>{html.escape(title)}</h3>" if title else "")
    )
    return f"{head}<table>{body}</table>"


def show_html(markup: str) -> None:
    from IPython.display import HTML, display

    display(HTML(markup))


def show_tagged(flag: str, markup: str, data: dict, text: str) -> None:
    """Display ``markup`` and store ``data`` in the same output, tagged with ``flag``."""
    from IPython.display import display

    display(
        {"text/html": markup, "application/json": data, "text/plain": text},
        raw=True,
        metadata={NOTEBOOK_KEY: {flag: True}},
    )


def read_tagged(path: Path, flag: str) -> dict | None:
    """The data an executed notebook stored with ``show_tagged(flag, ...)`` (the notebook's own
    metadata first, where the probe processes of older sweeps kept it); None when it has none."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    stored = nb.metadata.get(NOTEBOOK_KEY, {}).get(flag)
    if isinstance(stored, dict):
        return dict(stored)
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("metadata", {}).get(NOTEBOOK_KEY, {}).get(flag):
                return dict(output["data"]["application/json"])
    return None
