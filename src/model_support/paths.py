"""Where the package's own files are, and where the checkout is when there is one.

The notebooks and templates ship inside the package (package data, read through
``importlib.resources``), so a non-editable install, such as a Ray worker on another host, runs
exactly what a checkout runs. ``notebooks/`` at the top of the repository is a link to the
package's folder: one source of truth, opened by people and executed by papermill alike.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

#: Notebook names the package ships.
NOTEBOOKS = ("probe", "checks", "aggregate", "report", "debug")
#: Environment variable naming the default data folder (sweeps, dataset, reports).
DATA_DIR_VAR = "MODEL_SUPPORT_DATA_DIR"
#: Environment variable naming the offline fixture models' folder (``make fixtures`` builds it).
MODELS_DIR_VAR = "MODEL_SUPPORT_MODELS_DIR"


def package_file(*parts: str) -> Path:
    """A file shipped in the package, as a real path (the package is installed unzipped)."""
    return Path(str(resources.files("model_support").joinpath(*parts)))


def notebook(name: str) -> Path:
    """The shipped notebook ``name`` (probe, aggregate, report or debug)."""
    if name not in NOTEBOOKS:
        raise ValueError(f"no notebook {name!r}; the package ships {', '.join(NOTEBOOKS)}")
    return package_file("notebooks", f"{name}.ipynb")


def template(name: str) -> Path:
    return package_file("render", "templates", name)


def probe_image() -> Path:
    """The image-text-to-text probe's image as a PNG file, for people and the docs: the probe and
    every repro script draw the same pixels in code (``probe_core.probe_image``; a test checks
    that the two agree)."""
    return package_file("probe", "probe_image.png")


def checkout_root() -> Path | None:
    """The git checkout this package was imported from (an editable install), else None."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / ".git").exists() and (root / "src" / "model_support").is_dir() else None


def default_models_dir() -> Path:
    """``$MODEL_SUPPORT_MODELS_DIR``, else ``<checkout>/data/models`` (``data/models`` outside a
    checkout): where the offline fixtures are built, and where the fluency judge finds its
    offline copy."""
    root = checkout_root()
    return Path(
        os.environ.get(MODELS_DIR_VAR)
        or (root / "data" / "models" if root else Path("data/models"))
    )
