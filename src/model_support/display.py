"""What notebooks show, the small pieces: HTML, a key/value table, and results stored in (and read
back from) an executed notebook's outputs. Plumbing for the probe, debug and render notebooks alike.

A notebook's result (the probe's record, the debug notebook's findings) is displayed as a bundle
whose output metadata carries ``{"model_support": {<flag>: true}}``; ``read_tagged`` finds it again
in the executed notebook.
"""

from __future__ import annotations

import functools
import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

NOTEBOOK_KEY = "model_support"
#: The table macro's template (``render/templates/table.html.j2``), found by path: this module is in
#: the package's lowest room and imports nothing of ``render``, which it serves as much as the probe
#: and the debug notebook.
TABLE_TEMPLATE = Path(__file__).parent / "render" / "templates" / "table.html.j2"


def size_text(nbytes: float) -> str:
    """A size on disk or on the wire in decimal units, as the Hub and ``cache.max_gb`` count them
    (1 KB = 1e3, 1 MB = 1e6, 1 GB = 1e9 bytes): ``16.1 GB``. Memory (host RAM, device HBM) is
    counted in binary units and labelled so (MiB, GiB): the records' ``*_mem_mb`` fields hold
    MiB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{int(nbytes)} bytes"


@dataclass(frozen=True)
class Cell:
    """One cell of ``html_table``: its ``text`` (escaped by the macro, so any value is safe to
    show), shown as it is, folded (``fold``: the summary shown; the text whole in a <pre> once
    opened), as ``lines`` (one a line), as ``links`` ((text, href) pairs) or as ``code``; a
    header cell (``header``) or a data cell; and the attributes a table needs to look and behave
    as it did when built by hand (class, style, title, and ``sort``: the value a sortable table
    orders the column by, as ``data-sort``)."""

    text: object = ""
    header: bool = False
    cls: str | None = None
    style: str | None = None
    title: str | None = None
    sort: object = None
    fold: str | None = None
    lines: Sequence[object] | None = None
    links: Sequence[tuple[str, str]] = ()
    code: bool = False

    @property
    def tag(self) -> str:
        return "th" if self.header else "td"


@dataclass(frozen=True)
class Row:
    """One row of ``html_table``: its cells, and a class or style of its own (a highlighted
    offender)."""

    cells: Sequence[Cell]
    cls: str | None = None
    style: str | None = None

    @property
    def attrs(self) -> dict[str, object]:
        return {"class": self.cls, "style": self.style}


@functools.cache
def _table_macro():
    """The ``table`` macro of the one table template, autoescaped; loaded once per process."""
    from jinja2 import Environment, FileSystemLoader

    env = Environment(loader=FileSystemLoader(str(TABLE_TEMPLATE.parent)), autoescape=True)
    return env.get_template(TABLE_TEMPLATE.name).module.table


def html_table(
    head: Iterable[Cell | str],
    rows: Iterable[Row | Sequence[Cell]],
    *,
    cls: str | None = None,
    style: str | None = None,
    id: str | None = None,
) -> str:
    """A <table> through the one Jinja2 macro (autoescaped): ``head`` (its header cells; a plain
    string is a plain header; none: no <thead>), ``rows`` (a ``Row`` or its cells) and the
    table's class, style and id. Every table of the project is built here, so escaping and markup
    are decided once."""
    head_cells = [c if isinstance(c, Cell) else Cell(c, header=True) for c in head]
    body = [r if isinstance(r, Row) else Row(r) for r in rows]
    return str(_table_macro()(head_cells, body, {"class": cls, "style": style, "id": id}))


def kv_table(rows, title: str | None = None, color: str | None = None) -> str:
    """A two-column (name, value) HTML table; rows whose value is None are left out."""
    body = html_table(
        [],
        (
            [
                Cell(k, header=True, style="text-align:left;vertical-align:top"),
                Cell(v, style="text-align:left"),
            ]
            for k, v in rows
            if v is not None
        ),
    )
    head = (
        f"<h3 style='color:{color}'>{html.escape(title)}</h3>"
        if title and color
        else (f"<h3>{html.escape(title)}</h3>" if title else "")
    )
    return f"{head}{body}"


def show_html(markup: str) -> None:
    """Display ``markup`` in the notebook (the one way every notebook of the project shows HTML)."""
    from IPython.display import HTML, display

    display(HTML(markup))


#: The one verdict that needs no reason beside it (``record.schema.PASS``: this room imports nothing
#: of ``record``).
PASS = "PASS"


def outcome_text(record: Mapping[str, object]) -> str:
    """A probe's outcome in one line, what its reader needs first: the verdict and, for any but a
    PASS, where it failed and the sentence that says why (the record's error), or why there is no
    verdict (its exclusion reason)."""
    status, model, device = record.get("status"), record.get("model_id"), record.get("device_type")
    if status is None:
        return (
            f"no verdict for {model} on {device}: {record.get('exclusion_reason') or 'nothing ran'}"
        )
    if status == PASS:
        return f"{PASS}: {model} on {device}"
    why = ": ".join(str(x) for x in (record.get("error_type"), record.get("error_message")) if x)
    return f"{status} at {record.get('failure_stage') or '?'}: {why or 'no error recorded'}"


def show_outcome(record: Mapping[str, object]) -> None:
    """Display ``outcome_text`` as the notebook's headline: large, and for any but a PASS boxed,
    so the sentence that says why is read before the record's table (its text/plain is the line
    itself: ``papermill --log-output`` and text viewers show it too)."""
    from IPython.display import display

    text = outcome_text(record)
    box = (
        ""
        if record.get("status") == PASS
        else "border-left:6px solid #c62828;background:#fff4f4;padding:8px 12px;"
    )
    markup = (
        "<div "
        f"style='{box}font-size:1.15em;white-space:pre-wrap'><strong>{html.escape(text)}</strong></div>"
    )
    display({"text/html": markup, "text/plain": text}, raw=True)


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
    metadata first, where the probe processes of older sweeps kept it); None when it has none.
    Shown more than once (a probe's record after its device phase, then after its host checks),
    the last."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    stored = nb.metadata.get(NOTEBOOK_KEY, {}).get(flag)
    if isinstance(stored, dict):
        return dict(stored)
    found = None
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("metadata", {}).get(NOTEBOOK_KEY, {}).get(flag):
                found = dict(output["data"]["application/json"])
    return found
