"""Models bigger than one chip, as the report and the explorer show them.

One small history built by hand, every number below counted by hand: an older sweep whose file
predates ``devices_used`` and ``parallelism`` (two models, read as one device, no parallelism), then
a sweep with a 1-device model, a 2-device tensor-parallel one, a 2-device expert-parallel one and a
2-device model with no plan that fails at load. The report is rendered for real (papermill +
nbconvert); the explorer is opened in Debian's Chromium with the network refused.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from helpers import offline_page
from model_support import analysis
from model_support.record import schema, store
from model_support.render import explorer, report, sections

PASS, LOAD, GEN, OTHER = schema.VERDICTS
OLD = "dev-20261201T000000Z-0000"  # written before the devices columns existed
NEW = "dev-20261202T000000Z-1111"
SIG_NO_PLAN = "RuntimeError: <name> has no tensor or expert parallel plan, and needs <n> devices"
GB = 1_000_000_000
#: model -> (status, devices_used, parallelism, tp_size, ep_size, memory estimate in bytes)
NEW_MODELS = {
    "dv/one": (PASS, 1, "none", None, None, 2 * GB),
    "dv/tp": (PASS, 2, "tp", 2, 1, 30 * GB),
    "dv/ep": (PASS, 2, "ep", 1, 2, 40 * GB),
    "dv/noplan": (LOAD, 2, None, 1, 1, 50 * GB),  # no plan: parallelism null, reads as none
}
RANK_ERROR = "rank 1: FAIL(load) at load: RuntimeError: no plan for the experts"
#: What the ranks said (the rest of the runs say nothing: older records, one device).
RANKS_SAID = {
    "dv/tp": {"ranks_agree": True},
    "dv/ep": {"ranks_agree": False},
    "dv/noplan": {
        "rank_errors": [RANK_ERROR],
        "rank_log_tail": "--- rank 1 stderr ---\nFile 'timer.py', in put",
    },
}


def _record(sweep: str, model: str, status: str, **extra) -> dict:
    fails = status != PASS
    return schema.empty_record(
        sweep_id=sweep,
        model_id=model,
        model_type="llama",
        status=status,
        failure_stage="load" if fails else None,
        failure_signature=SIG_NO_PLAN if fails else None,
        error_type="RuntimeError" if fails else None,
        error_message=f"{model}: {SIG_NO_PLAN}" if fails else None,
        device_type="tpu",
        started_at=f"2026-12-0{int(sweep[11]) + 1}T01:00:00+00:00",
        versions={"torch": "2.13.0", "torch_tpu": "0.2.0", "transformers": "4.57.0"},
        **extra,
    )


def _write_old(data: Path) -> None:
    old = schema.to_table([_record(OLD, "old/a", PASS), _record(OLD, "old/b", GEN)])
    path = store.parquet_file(data, "results", OLD)
    path.parent.mkdir(parents=True, exist_ok=True)
    # written as an older file really is
    pq.write_table(old.drop_columns(list(schema.SHARDED_FIELDS)), path)


@pytest.fixture(scope="module")
def dev_data(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("devices")
    _write_old(data)
    rows = [
        _record(
            NEW,
            model,
            status,
            devices_used=devices,
            parallelism=kind,
            tp_size=tp,
            ep_size=ep,
            memory_estimate_bytes=memory,
            load_s_per_rank=[1.0] * devices,
            generate_s_per_rank=[2.0] * devices if status == PASS else None,
            **RANKS_SAID.get(model, {}),
        )
        for model, (status, devices, kind, tp, ep, memory) in NEW_MODELS.items()
    ]
    store.write_parquet(rows, store.parquet_file(data, "results", NEW))
    return data


def test_pass_rate_by_parallelism_by_hand(dev_data):
    results = store.scan(dev_data, "results")
    # none: dv/one (PASS) and dv/noplan (null parallelism, FAIL): 1 of 2; tp and ep: 1 of 1 each.
    assert analysis.pass_rate_by_parallelism(results, NEW).rows() == [
        ("none", 2, 1, 0.5),
        ("tp", 1, 1, 1.0),
        ("ep", 1, 1, 1.0),
    ]
    # The older file: both models read as one device, no parallelism; tp and ep listed with no
    # models.
    assert analysis.pass_rate_by_parallelism(results, OLD).rows() == [
        ("none", 2, 1, 0.5),
        ("tp", 0, 0, None),
        ("ep", 0, 0, None),
    ]


def test_multi_device_runs_by_hand(dev_data):
    results = store.scan(dev_data, "results")
    multi = analysis.multi_device_runs(results, NEW)
    assert multi.select(
        "model_id",
        "devices_used",
        "parallelism",
        "tp_size",
        "ep_size",
        "memory_estimate_gb",
        "status",
    ).rows() == [
        ("dv/ep", 2, "ep", 1, 2, 40.0, PASS),
        ("dv/noplan", 2, "none", 1, 1, 50.0, LOAD),  # null parallelism reads as none
        ("dv/tp", 2, "tp", 2, 1, 30.0, PASS),
    ]
    assert multi.select("ranks_agree", "rank_errors").rows() == [
        (False, None),
        (None, [RANK_ERROR]),
        (True, None),
    ]
    assert multi["rank_log_tail"].to_list()[1].endswith("in put")
    old = analysis.multi_device_runs(results, OLD)
    assert old.height == 0
    assert not analysis.uses_devices(old, analysis.pass_rate_by_parallelism(results, OLD))


def test_older_file_has_no_devices_section(dev_data):
    assert "devices_used" not in pq.read_schema(store.parquet_file(dev_data, "results", OLD)).names
    tables = analysis.report_tables(dev_data, OLD)
    assert tables["multi_device"].height == 0
    assert sections.devices_html(tables) == ""
    assert "Devices and parallelism" in sections.devices_html(analysis.report_tables(dev_data, NEW))


@pytest.fixture(scope="module")
def dev_report(dev_data) -> dict:
    path = report.render_report(dev_data, NEW)  # against OLD
    old_path = report.render_report(dev_data, OLD, "")
    return {
        "data": dev_data,
        "html": path,
        "text": path.read_text(),
        "old_text": old_path.read_text(),
    }


def test_report_has_the_devices_section(dev_report):
    text = dev_report["text"]
    start = text.index(">Devices and parallelism<")
    section = text[start : text.index("<h2", start + 1)]
    assert "3 models ran on more than one device" in section
    for model in ("dv/ep", "dv/noplan", "dv/tp"):
        assert f"<td>{model}</td>" in section
    assert "<td>dv/one</td>" not in section
    assert "memory estimate (GB)" in section and '<td class="num">40</td>' in section
    assert ">Pass rate by parallelism<" in section
    assert (
        '<td>none</td><td class="num">2</td><td class="num">1</td><td class="num">50.0%</td>'
        in section
    )
    assert (
        '<td>tp</td><td class="num">1</td><td class="num">1</td><td class="num">100.0%</td>'
        in section
    )
    # what the ranks said: agreement, each rank's error, the failed ranks' log folded
    assert "<th>ranks agree</th>" in section and "<td>false</td>" in section
    assert f"<td>{RANK_ERROR}</td>" in section
    assert (
        "<details><summary>--- rank 1 stderr ---" in section and "in put</pre></details>" in section
    )
    # the older sweep's report: no section
    assert "Devices and parallelism" not in dev_report["old_text"]
    assert ">Verdicts<" in dev_report["old_text"]


def _wait_count(page, n: int) -> None:
    page.wait_for_function(f"document.querySelector('#match-count').textContent.startsWith('{n} ')")


def _models(page) -> list[str]:
    return page.locator("#results tbody tr td:first-child").all_inner_texts()


@pytest.mark.browser
def test_explorer_devices_filter(browser, dev_report):
    page, attempted, errors = offline_page(browser)
    page.goto((dev_report["data"] / "reports" / "index.html").as_uri())
    _wait_count(page, 6)
    assert page.locator("#devices-filter").is_visible()
    assert page.locator("#results thead th.col-devices").is_visible()
    options = page.locator("#devices-filter option").all_inner_texts()
    assert options == ["any devices", "needs 1 device", "needs 2 devices"]
    page.locator("#devices-filter").select_option("2")
    _wait_count(page, 3)
    assert _models(page) == ["dv/ep", "dv/noplan", "dv/tp"]
    assert page.locator("#results tbody td.devices").all_inner_texts() == ["2 ep", "2", "2 tp"]
    page.locator("#devices-filter").select_option("1")
    _wait_count(page, 3)
    # the older file's models read as one device
    assert _models(page) == ["dv/one", "old/a", "old/b"]
    # the detail panel says the devices and the parallelism
    page.locator("#devices-filter").select_option("2")
    _wait_count(page, 3)
    page.locator("#results tbody tr").nth(2).click()
    detail = page.locator("#detail")
    assert detail.locator("dd.devices").inner_text() == "2"
    assert detail.locator("dd.parallelism").inner_text() == "tp"
    # in the older sweep nothing ran on two devices
    page.locator("#sweep-filter").select_option(label=OLD)
    _wait_count(page, 0)
    assert attempted == [] and errors == []
    page.close()


@pytest.mark.browser
def test_explorer_of_an_older_file_hides_devices(browser, tmp_path):
    _write_old(tmp_path)
    data = explorer.explorer_data(tmp_path)
    assert [tuple(o[3:5]) for o in data["outcomes"]] == [(1, "none"), (1, "none")]
    page, attempted, errors = offline_page(browser)
    page.goto(explorer.build_explorer(tmp_path).as_uri())
    _wait_count(page, 2)
    # every run on one device: no filter, no column
    assert page.locator("#devices-filter").is_hidden()
    assert page.locator("#results thead th.col-devices").is_hidden()
    page.locator("#results tbody tr").first.click()
    assert page.locator("#detail dd.devices").inner_text() == "1"
    assert page.locator("#detail dd.parallelism").inner_text() == "none"
    assert attempted == [] and errors == []
    page.close()
