"""Shared fixtures, named for what they hold: the offline model fixtures, a real smoke sweep."""

from __future__ import annotations

import os
import tempfile

import pytest

from helpers import CHROMIUM, FAKE_TOKEN, REPO

# torch_tpu, installed for the tpu adapter's tests, is autoloaded by every `import torch` unless this
# is off; probes that use no TPU turn it off themselves, the test process does it here.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# datasets caches what it loaded by path; pytest reuses tmp paths across runs, so a session cache of its own.
os.environ.setdefault("HF_DATASETS_CACHE", tempfile.mkdtemp(prefix="hf-datasets-"))


#: Fixtures that run real sweeps, notebooks or renders: a test using one is slow (not in `make test-fast`).
HEAVY_FIXTURES = {"smoke_sweep", "real_report", "rendered", "fixture_sweep", "browser", "porting_loop", "two_sweeps"}


def pytest_collection_modifyitems(config, items):
    """Mark every test that uses a heavy fixture as slow, so `pytest -m "not slow"` (make test-fast)
    keeps the unit tests and the few real probes that are quick."""
    for item in items:
        if HEAVY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def fixture_models() -> dict:
    """The offline fixture models (built once into data/models, cached): name -> manifest entry."""
    from fixtures.build import ensure_fixtures

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
