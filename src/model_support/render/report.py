"""The per-sweep HTML report: execute the report notebook, turn it into one self-contained page.

``render_report`` executes ``notebooks/report.ipynb`` with papermill (the executed notebook is
kept as ``data/reports/<sweep_id>.ipynb``), turns it into ``data/reports/<sweep_id>.html`` with
nbconvert (code hidden, through ``templates/offline.html.j2``), then rebuilds the explorer page
``data/reports/index.html``. Every page is self-contained: the Vega JavaScript is inlined once per
page (``charts.vega_script``) and nbconvert's CDN scripts (require.js, MathJax, Mermaid) are left
out, so a report opens from disk with no network.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from .. import analysis, fileio, paths
from ..errors import UserError
from ..fileio import atomic_write_text

REPORTS = "reports"

# --------------------------------------------------------------------------------------------
# sweeps


def _sweeps(data_dir) -> pl.DataFrame:
    return analysis.sweep_index(Path(data_dir), cache_dir=Path(data_dir) / analysis.SWEEP_CACHE)


def previous_sweep(data_dir: Path | str, sweep_id: str) -> str | None:
    """The latest sweep of the same name and device created before ``sweep_id`` (with results
    rows): the default baseline (``analysis.previous_sweep_id``); none for a what-if sweep, whose
    runs are no verdict of the stack to compare (the gate refuses one: its report failed to
    render against a stack sweep of its name)."""
    from ..record import store

    if store.what_if_setting(Path(data_dir), sweep_id):
        return None
    return analysis.previous_sweep_id(_sweeps(data_dir), sweep_id)


def latest_sweep(data_dir: Path | str) -> str:
    """The most recently created sweep of the stack (``latest``: never a what-if sweep); one
    sentence when there is none."""
    from ..record import store

    if _sweeps(data_dir).height == 0:
        raise UserError(f"There are no sweeps under {data_dir}: run a sweep first.")
    return store.resolve_sweep_id(Path(data_dir), store.LATEST)


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
    from ..engine.notebooks import run_notebook
    from .explorer import build_explorer

    data_dir = Path(data_dir).resolve()
    sweeps = _sweeps(data_dir)
    analysis.require_sweep(sweeps, sweep_id)
    if baseline_sweep_id is None:  # the default: none for a what-if sweep (``previous_sweep``)
        baseline_sweep_id = previous_sweep(data_dir, sweep_id) or ""
    elif baseline_sweep_id:
        analysis.require_sweep(sweeps, baseline_sweep_id)
    out_dir = data_dir / REPORTS
    out_dir.mkdir(parents=True, exist_ok=True)
    executed = out_dir / f"{sweep_id}.ipynb"
    partial = out_dir / f".{sweep_id}.partial.ipynb"  # papermill writes here; renamed once whole
    try:
        run_notebook(
            notebook or paths.notebook("report"),
            partial,
            {
                "sweep_id": sweep_id,
                "baseline_sweep_id": baseline_sweep_id,
                "data_dir": str(data_dir),
            },
            timeout=execution_timeout,
            kernel_name=kernel_name or "python3",
        )
    except OSError:  # a full disk: nothing half-written is left
        fileio.remove(partial)
        raise
    except BaseException:  # a cell error: keep the executed notebook, which shows it
        if partial.exists():
            fileio.replace_file(partial, executed)
        raise
    fileio.replace_file(partial, executed)
    out_html = Path(out_html) if out_html else out_dir / f"{sweep_id}.html"
    title = f"Sweep report: {sweep_id}" + (
        f" (against {baseline_sweep_id})" if baseline_sweep_id else ""
    )
    atomic_write_text(out_html, notebook_to_html(executed, title=title))
    build_explorer(data_dir)
    return out_html


def notebook_to_html(notebook_path: Path | str, title: str | None = None) -> str:
    """An executed notebook -> one self-contained HTML page with the code cells hidden."""
    import nbformat
    from jinja2 import FileSystemLoader
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(notebook_path), as_version=4)
    if title:
        nb.metadata["title"] = title

    exporter = HTMLExporter(
        template_name="lab",
        extra_loaders=[FileSystemLoader(str(paths.template("offline.html.j2").parent))],
        template_file="offline.html.j2",
        exclude_input=True,
        exclude_input_prompt=True,
        exclude_output_prompt=True,
    )
    body, _ = exporter.from_notebook_node(nb)
    return body
