"""Shared fixtures, named for what they hold: the offline model fixtures, a real smoke sweep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FAKE_TOKEN = "hf_" + "FakeTokenForLeakTests" + "x" * 16  # placed in HF_TOKEN during the smoke sweep
# torch_tpu, installed for the tpu adapter's tests, is autoloaded by every `import torch` unless this
# is off; probes that use no TPU turn it off themselves, the test process does it here.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# datasets caches what it loaded by path; pytest reuses tmp paths across runs, so a session cache of its own.
os.environ.setdefault("HF_DATASETS_CACHE", tempfile.mkdtemp(prefix="hf-datasets-"))


#: Fixtures that run real sweeps, notebooks or renders: a test using one is slow (not in `make test-fast`).
HEAVY_FIXTURES = {"smoke_sweep", "real_report", "rendered", "fixture_sweep", "browser", "porting_loop"}


def pytest_collection_modifyitems(config, items):
    """Mark every test that uses a heavy fixture as slow, so `pytest -m "not slow"` (make test-fast)
    keeps the unit tests and the few real probes that are quick."""
    for item in items:
        if HEAVY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def fixture_models() -> dict:
    """The offline fixture models (built once into data/models, cached): name -> manifest entry."""
    from model_support.testing.fixtures import ensure_fixtures

    return ensure_fixtures()["fixtures"]


@pytest.fixture(scope="session")
def smoke_sweep(tmp_path_factory, fixture_models) -> dict:
    """A real sweep of params/smoke.yaml (every fixture, 2 workers) into a fresh data folder."""
    from model_support.sweep import definition as params
    from model_support.sweep import runner as sweep

    data_dir = tmp_path_factory.mktemp("smoke-data")
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        definition = params.load(REPO / "params" / "smoke.yaml")
    finally:
        os.chdir(cwd)
    previous = os.environ.get("HF_TOKEN")
    os.environ["HF_TOKEN"] = FAKE_TOKEN  # must land in no notebook, record, log or Parquet file
    try:
        summary = sweep.run(definition, data_dir, workers=2)
    finally:
        if previous is None:
            os.environ.pop("HF_TOKEN", None)
        else:
            os.environ["HF_TOKEN"] = previous
    from model_support.probe.model_ids import display_name
    from model_support.record import store

    summary["records"] = store.read_records(data_dir, summary["sweep_id"])
    summary["by_name"] = {display_name(r["model_id"]): r for r in summary["records"]}
    return summary


def run_notebook(notebook: str, out: Path, **parameters) -> Path:
    """Execute one of the project's notebooks for real with papermill; returns the output path."""
    import papermill

    papermill.execute_notebook(
        str(REPO / "notebooks" / notebook), str(out), parameters=parameters, progress_bar=False, kernel_name="python3"
    )
    return out


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def probe_record(tmp_path: Path, model: str, **parameters) -> dict:
    """One real papermill probe of ``model`` on the CPU (no CPU reference unless asked); its record."""
    name = Path(model).name
    record_path = tmp_path / f"{name}.json"
    parameters = {"device": "cpu", "reference": "none", **parameters}
    run_notebook("probe.ipynb", tmp_path / f"{name}.ipynb", model_id=model, record_path=str(record_path), **parameters)
    return read_json(record_path)


def cli_debug(data: Path, path: str, probe: dict, matrix: dict, variant: str) -> subprocess.CompletedProcess:
    """``model-support debug s <folder name> --variant VARIANT`` for real, on a one-model sweep ``s``
    written under ``data`` with ``probe`` settings and ``matrix`` (nothing probed). The debug notebook,
    when it runs, is ``sweep_dir(data, "s")/debug/local_<folder>@<variant>.ipynb``."""
    from model_support.record import store
    from model_support.record.sweep_meta import ModelEntry, SweepMeta

    name = Path(path).name
    meta = SweepMeta(
        sweep_id="s",
        name="s",
        created_at="2026-12-01T00:00:00+00:00",
        probe=probe,
        models=[ModelEntry(f"local:{name}", path)],
        matrix=matrix,
    )
    meta.write(store.sweep_dir(data, "s"))
    command = [sys.executable, "-m", "model_support.cli", "debug", "s", name, "--variant", variant]
    return subprocess.run([*command, "--data-dir", str(data)], capture_output=True, text=True, timeout=900)


def cli_sweep(tmp_path: Path, definition: dict, *flags: str) -> tuple[Path, str]:
    """``model-support sweep`` on ``definition`` (written as YAML), for real, in a fresh data folder;
    (data folder, sweep id). Fails the test, with the command's stderr, when the sweep fails."""
    import yaml

    from model_support.record import store

    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(definition))
    data = tmp_path / "data"
    run = subprocess.run(
        [sys.executable, "-m", "model_support.cli", "sweep", str(path), "--data-dir", str(data), *flags],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    (sweep_id,) = store.list_sweeps(data)
    return data, sweep_id


CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="session")
def browser():
    """Debian's headless Chromium driven by Playwright (`make browser` installs it; never downloaded)."""
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is absent: run `make browser` (apt-get install chromium); tests never download one"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield chromium
        chromium.close()


def offline_page(browser):
    """A page that refuses every non-file request and records it (and any page error)."""
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    attempted, errors = [], []

    def route(r):
        if r.request.url.startswith("file:"):
            r.continue_()
        else:
            attempted.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return page, attempted, errors


def assert_charts_drawn(page, min_charts: int, timeout_ms: int = 20000) -> None:
    """At least ``min_charts`` report charts, each with a rendered SVG of real size."""
    page.wait_for_function(f"document.querySelectorAll('.ms-chart svg').length >= {min_charts}", timeout=timeout_ms)
    charts = page.locator(".ms-chart")
    assert charts.count() >= min_charts
    for i in range(charts.count()):
        box = charts.nth(i).locator("svg").first.bounding_box()
        assert box and box["width"] > 50 and box["height"] > 50, f"chart {i} did not render"
