"""The report and the explorer of a real sweep of the fixtures, opened in headless Chromium
offline."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import assert_charts_drawn, offline_page
from model_support.record import schema

CLI = [sys.executable, "-m", "model_support.cli"]


@pytest.fixture(scope="module")
def real_report(smoke_sweep) -> dict:
    """`model-support report` on the smoke sweep, as `make sweep` ends."""
    data_dir = Path(smoke_sweep["data_dir"])
    run = subprocess.run(
        [*CLI, "report", smoke_sweep["sweep_id"], "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    html = data_dir / "reports" / f"{smoke_sweep['sweep_id']}.html"
    assert f"report:   {html}" in run.stdout
    return {
        "data": data_dir,
        "html": html,
        "index": data_dir / "reports" / "index.html",
        **smoke_sweep,
    }


def test_real_report_names_every_failure_signature(real_report):
    text = real_report["html"].read_text()
    assert not re.search(r"<script[^>]*\ssrc=", text)
    # None: excluded
    failing = [r for r in real_report["records"] if r["status"] not in (schema.PASS, None)]
    assert failing
    for record in failing:
        assert record["error_type"] in text, record["model_id"]


@pytest.mark.browser
def test_real_report_charts_render_offline(browser, real_report):
    page, attempted, errors = offline_page(browser)
    page.goto(real_report["html"].as_uri())
    assert_charts_drawn(page, 6)
    assert attempted == [] and errors == []
    page.close()


@pytest.mark.browser
def test_real_explorer_search_and_detail(browser, real_report):
    page, attempted, errors = offline_page(browser)
    page.goto(real_report["index"].as_uri())
    total = real_report["total"] + 1  # + the model excluded before running
    page.wait_for_function(
        f"document.querySelector('#match-count').textContent.startsWith('{total} ')"
    )
    page.locator("#search").press_sequentially("short-pos", delay=10)
    page.wait_for_function("document.querySelector('#match-count').textContent.startsWith('1 ')")
    assert page.locator("#results tbody tr").count() == 1
    page.locator("#results tbody tr").first.click()
    detail = page.locator("#detail")
    record = real_report["by_name"]["fail-short-positions"]
    assert record["error_type"] in detail.locator(".error").inner_text()
    assert "run_stages" in detail.locator(".repro").inner_text()
    assert attempted == [] and errors == []
    page.close()


@pytest.mark.browser
def test_real_report_and_explorer_go_by_task(browser, real_report, fixture_models):
    """A sweep of both tasks: the report's header gives each task's pass rate and its signature
    table says a signature's task; the explorer's task filter keeps the rows of that task, from
    the records' own task."""
    page, attempted, errors = offline_page(browser)
    page.goto(real_report["html"].as_uri())
    header = page.locator("dl.ms-head").first.inner_text()
    vlm = [
        r
        for r in real_report["records"]
        if r["task"] == "image-text-to-text" and r["status"] is not None
    ]
    passed = sum(r["status"] == schema.PASS for r in vlm)
    assert f"image-text-to-text {100 * passed / len(vlm):.1f}% ({passed} of {len(vlm)})" in header
    assert "text-generation " in header
    signatures = page.locator("table", has=page.locator("th", has_text="failure signature")).first
    assert "task" in signatures.locator("thead").inner_text()
    row = signatures.locator("tr", has_text="Image features and image tokens do not match")
    assert "image-text-to-text" in row.inner_text()
    page.goto(real_report["index"].as_uri())
    page.wait_for_selector("#results tbody tr")
    option = page.locator("#task-filter option", has_text="image-text-to-text")
    page.select_option("#task-filter", option.get_attribute("value"))
    vlm_ids = sorted(
        r["model_id"] for r in real_report["records"] if r["task"] == "image-text-to-text"
    )
    page.wait_for_function(
        f"document.querySelector('#match-count').textContent.startsWith('{len(vlm_ids)} ')"
    )
    shown = sorted(page.locator("#results tbody tr td:first-child").all_inner_texts())
    assert shown == vlm_ids and len(vlm_ids) == sum(
        name in fixture_models for name in (i[6:] for i in vlm_ids)
    )
    page.locator("#results tbody tr", has_text="local:tiny-llava").first.click()
    assert page.locator("#detail dd.task").inner_text() == "image-text-to-text"
    assert attempted == [] and errors == []
    page.close()
