"""What notebooks show, the small pieces: HTML, a key/value table, and results stored in (and read
back from) an executed notebook's outputs. Plumbing for the probe, debug and render notebooks alike.

A notebook's result (the probe's record, the debug notebook's findings) is displayed as a bundle
whose output metadata carries ``{"model_support": {<flag>: true}}``; ``read_tagged`` finds it again
in the executed notebook.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path

NOTEBOOK_KEY = "model_support"


def size_text(nbytes: float) -> str:
    """A size on disk or on the wire in decimal units, as the Hub and ``cache.max_gb`` count them
    (1 KB = 1e3, 1 MB = 1e6, 1 GB = 1e9 bytes): ``16.1 GB``. Memory (host RAM, device HBM) is counted in
    binary units and labelled so (MiB, GiB): the records' ``*_mem_mb`` fields hold MiB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{int(nbytes)} bytes"


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
    """Display ``markup`` in the notebook (the one way every notebook of the project shows HTML)."""
    from IPython.display import HTML, display

    display(HTML(markup))


def show_tagged(flag: str, markup: str, data: Mapping[str, object], text: str) -> None:
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
