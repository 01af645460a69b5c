"""Sweeping the real Hub, as the report and the explorer show it: models the environment kept from
being probed (pending), models listed but not tested yet, models excluded while the sweep ran, and
the explorer's views (selected, trending, downloads) with its task filter.

The data folder is built by hand: records with Hub metadata written as Parquet, ``sweep.json`` files
whose model lists mix models listed explicitly with models from Hub rankings (``hub.listed_by``),
and a ``pending.json``. The report is rendered for real (papermill + nbconvert); the explorer is
opened in Debian's Chromium with the network refused.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from helpers import offline_page
from model_support import analysis
from model_support.analysis import unprobed_models
from model_support.probe import hub
from model_support.record import schema, store
from model_support.record.sweep_meta import ModelEntry, SweepMeta
from model_support.render import explorer, report

PASS, LOAD, GEN, OTHER = schema.VERDICTS
A = "hubsel-20261201T000000Z-aaaa"
B = "hubsel-20261202T000000Z-bbbb"
GEN_SIG = "IndexError: index out of range in self"
DELTA_REASON = "the Hub could not be reached for model org/delta (ConnectTimeout)."
ZETA_REASON = "the disk is full: no space left to download 2.1 GB for org/zeta."
GATED_REASON = "org/gated is gated: this token has no access (403)."
TEXT, VISION = "text-generation", "image-text-to-text"
#: Hub metadata of each model, as the latest records and sweep.json of sweep B know it.
HUB = {
    "org/alpha": {
        "pipeline_tag": TEXT,
        "downloads": 5000,
        "likes": 12,
        "trending_score": 3,
        "license": "apache-2.0",
    },
    "org/beta": {"pipeline_tag": TEXT, "downloads": 100, "likes": 1, "trending_score": 40},
    "org/gamma": {"pipeline_tag": TEXT, "downloads": 50, "likes": 5, "trending_score": 90},
    "org/delta": {
        "pipeline_tag": VISION,
        "downloads": 900_000,
        "likes": 700,
        "trending_score": 7,
        "gated": "false",
    },
    "org/epsilon": {"pipeline_tag": TEXT, "downloads": 10, "likes": 0, "trending_score": 60},
    "org/gated": {
        "pipeline_tag": TEXT,
        "downloads": 300,
        "likes": 2,
        "trending_score": None,
        "gated": "manual",
    },
}
TRENDING = ["org/gamma", "org/epsilon", "org/beta", "org/delta", "org/alpha"]
DOWNLOADS = ["org/delta", "org/alpha", "org/gated", "org/beta", "org/gamma", "org/epsilon"]
SELECTED = ["org/alpha", "org/beta", "org/zeta"]


def _record(sweep, model, status, sig=None, **extra):
    return schema.empty_record(
        sweep_id=sweep,
        model_id=model,
        status=status,
        failure_signature=sig,
        failure_stage="generate" if sig else None,
        error_type=sig.split(":")[0] if sig else None,
        error_message=f"{model}: {sig}" if sig else None,
        device_type="cpu",
        model_type="llama",
        started_at=f"2026-12-0{1 if sweep == A else 2}T01:00:00+00:00",
        versions={"torch": "2.13.0", "transformers": "4.57.0"},
        **extra,
    )


def _meta(sweep, models, excluded=None):
    return SweepMeta(
        sweep_id=sweep,
        name="hubsel",
        created_at=f"2026-12-0{1 if sweep == A else 2}T00:00:00+00:00",
        probe={"device": "cpu"},
        models=models,
        excluded=excluded or {},
        params_file="params/hubsel.yaml",
        host="h1",
    )


def write_hub_history(data: Path) -> Path:
    """Sweep A (three models listed explicitly, all PASS) and sweep B (the one the tests read):
    alpha PASS, beta FAIL(gen), gamma PASS (trending), delta pending (network; downloads ranking),
    epsilon not tested (trending), gated excluded while running (downloads), zeta pending (disk;
    PASS in A, so it must not read as newly failing or removed), encoder excluded before running."""
    older = {"org/alpha": {**HUB["org/alpha"], "downloads": 4000, "trending_score": 1}}
    a = [
        _record(A, "org/alpha", PASS, **older["org/alpha"]),
        _record(A, "org/beta", PASS, **HUB["org/beta"]),
        _record(A, "org/zeta", PASS),
    ]
    store.write_parquet(a, store.parquet_file(data, "results", A))
    _meta(A, [ModelEntry(m) for m in SELECTED]).write(store.sweep_dir(data, A))

    b = [
        _record(B, "org/alpha", PASS, **HUB["org/alpha"]),
        _record(B, "org/beta", GEN, GEN_SIG, **HUB["org/beta"]),
        _record(B, "org/gamma", PASS, **HUB["org/gamma"]),
    ]
    store.write_parquet(b, store.parquet_file(data, "results", B))
    excluded = [
        # found while running
        schema.empty_record(sweep_id=B, model_id="org/gated", exclusion_reason=GATED_REASON),
        schema.empty_record(
            sweep_id=B, model_id="org/encoder", exclusion_reason="not a text-generation model"
        ),
    ]
    store.write_parquet(excluded, store.parquet_file(data, "excluded", B))

    def ranked(model, by):
        return ModelEntry(model, hub={"model_id": model, **HUB[model], "listed_by": by})

    models = [
        ModelEntry("org/alpha"),
        ModelEntry("org/beta"),
        ModelEntry("org/zeta"),
        ranked("org/gamma", "trending"),
        ranked("org/delta", "downloads"),
        ranked("org/epsilon", "trending"),
        ranked("org/gated", "downloads"),
    ]
    _meta(B, models, {"org/encoder": "not a text-generation model"}).write(store.sweep_dir(data, B))
    store.write_pending(
        data,
        B,
        {
            "org/delta": {
                "reason": DELTA_REASON,
                "problem": "network",
                "at": "2026-12-02T01:10:00+00:00",
            },
            "org/zeta": {
                "reason": ZETA_REASON,
                "problem": "disk",
                "at": "2026-12-02T01:20:00+00:00",
            },
        },
    )
    return data


@pytest.fixture(scope="module")
def hub_data(tmp_path_factory) -> Path:
    return write_hub_history(tmp_path_factory.mktemp("hub-history"))


# --------------------------------------------------------------------------------------------
# the data, without a browser


def test_hub_metadata_fills_exactly_the_records_hub_fields():
    """What ``hub.metadata`` reads off the Hub is what the record declares in its hub group, no
    more, no less."""
    from types import SimpleNamespace

    assert tuple(hub.metadata(SimpleNamespace())) == schema.HUB_FIELDS


def test_report_tables_keep_unprobed_models_apart(hub_data):
    tables = analysis.report_tables(hub_data, B, A)
    pending = tables["pending"]
    assert pending.select("model_id", "problem", "last_error", "baseline_status").rows() == [
        ("org/delta", "network", DELTA_REASON, None),
        ("org/zeta", "disk", ZETA_REASON, PASS),
    ]
    assert pending["at"].to_list() == ["2026-12-02T01:10:00+00:00", "2026-12-02T01:20:00+00:00"]
    assert tables["not_tested"].rows() == [("org/epsilon", "eager+dynamic", "trending", None)]
    # Never in the pass rate: three models probed, two passed; the excluded ones counted apart.
    assert tables["summary"].row(0) == (B, 3, 2, 1, 2 / 3, 2, 0, 2 / 3)
    assert dict(tables["verdicts"].select("status", "count").rows()) == {
        PASS: 2,
        LOAD: 0,
        GEN: 1,
        OTHER: 0,
    }
    # Never in the diff: zeta (PASS in A, pending in B) is neither newly failing nor removed.
    assert [(m, str(c)) for m, c in tables["changes"].select("model_id", "change").rows()] == [
        ("org/beta", "newly failing"),
        ("org/gamma", "added"),
    ]
    excluded = dict(tables["excluded"].select("exclusion_reason", "example_models").rows())
    assert excluded == {GATED_REASON: ["org/gated"], "not a text-generation model": ["org/encoder"]}


def test_a_model_with_a_row_is_not_pending(hub_data, tmp_path):
    """pending.json may lag behind (a model probed by a later resume): its row wins."""
    data = tmp_path / "data"
    shutil.copytree(hub_data, data)
    pending = store.read_pending(data, B)
    store.write_pending(
        data, B, {**pending, "org/alpha": {"reason": "stale", "problem": "network", "at": "x"}}
    )
    pend, not_tested = unprobed_models.unprobed(data, B)
    assert pend["model_id"].to_list() == ["org/delta", "org/zeta"]
    assert not_tested["model_id"].to_list() == ["org/epsilon"]


def _decode(data: dict) -> dict:
    """model_id -> {sweep_id: (status, signature)} from the page's run-length encoded history
    (one variant)."""
    out = {}
    for model in data["models"]:
        h = model[2]
        for k in range(0, len(h), 3):
            for s in range(h[k], h[k] + h[k + 1]):
                out.setdefault(model[0], {})[data["sweeps"][s][0]] = tuple(
                    data["outcomes"][h[k + 2]][:2]
                )
    return out


def test_explorer_data_lists_every_model_of_every_sweep(hub_data):
    data = explorer.explorer_data(hub_data)
    ids = [m[0] for m in data["models"]]
    decoded = _decode(data)
    assert decoded["org/delta"] == {B: ("not probed", DELTA_REASON)}
    assert decoded["org/epsilon"] == {B: ("not tested", None)}
    assert decoded["org/zeta"] == {A: (PASS, None), B: ("not probed", ZETA_REASON)}
    assert decoded["org/gated"] == {B: ("excluded", GATED_REASON)}
    assert decoded["org/encoder"] == {B: ("excluded", "not a text-generation model")}
    assert decoded["org/beta"] == {A: (PASS, None), B: (GEN, GEN_SIG)}
    assert set(ids) == {
        "org/alpha",
        "org/beta",
        "org/gamma",
        "org/delta",
        "org/epsilon",
        "org/gated",
        "org/zeta",
        "org/encoder",
    }
    # A pseudo-row stores no environment of its own.
    assert all(
        m[3] == [] for m in data["models"] if m[0] in ("org/delta", "org/epsilon", "org/zeta")
    )
    assert {v: [ids[i] for i in data["views"][v]] for v in data["views"]} == {
        "selected": SELECTED,
        "trending": TRENDING,
        "downloads": DOWNLOADS,
    }
    assert data["tasks"] == [VISION, TEXT]
    facts = {m[0]: m[explorer.HUB_SLOT] for m in data["models"] if len(m) > explorer.HUB_SLOT}
    names = explorer.HUB_FACTS
    delta = dict(zip(names, facts["org/delta"]))
    assert data["tasks"][delta["pipeline_tag"]] == VISION
    assert (delta["downloads"], delta["likes"], delta["trending_score"]) == (900_000, 700, 7)
    assert (
        data["texts"][delta["listed_by"]] == "downloads"
        and data["texts"][delta["gated"]] == "false"
    )
    alpha = dict(zip(names, facts["org/alpha"]))  # the latest record's metadata, not sweep A's
    assert (alpha["downloads"], alpha["trending_score"]) == (5000, 3)
    assert data["texts"][alpha["license"]] == "apache-2.0" and alpha["listed_by"] == -1
    assert "org/encoder" not in facts and "org/zeta" not in facts  # nothing known: nothing stored
    sweep_pos = {s[0]: k for k, s in enumerate(data["sweeps"])}
    assert sorted(data["pending"]) == sorted(
        [
            [ids.index("org/delta"), sweep_pos[B], "network", "2026-12-02T01:10:00+00:00"],
            [ids.index("org/zeta"), sweep_pos[B], "disk", "2026-12-02T01:20:00+00:00"],
        ]
    )
    assert data["verdicts"][-3:] == ["excluded", "not probed", "not tested"]


def test_explorer_data_of_older_sweeps_without_listings(tmp_path):
    """sweep.json files of the older shape (plain ids, no Hub facts) and no pending.json: every
    listed model is selected, nothing is trending."""
    data = tmp_path / "data"
    store.write_parquet([_record(A, "org/alpha", PASS)], store.parquet_file(data, "results", A))
    raw = {
        "sweep_id": A,
        "name": "hubsel",
        "settings": {"device": "cpu"},
        "models": ["org/alpha", "org/new"],
    }
    store.sweep_dir(data, A).mkdir(parents=True)
    (store.sweep_dir(data, A) / "sweep.json").write_text(json.dumps(raw))
    page = explorer.explorer_data(data)
    assert _decode(page) == {"org/alpha": {A: (PASS, None)}, "org/new": {A: ("not tested", None)}}
    assert page["views"] == {"selected": [0, 1], "trending": [], "downloads": []}
    # rows before the task column ran it
    assert page["pending"] == [] and page["tasks"] == ["text-generation"]


def test_listing_cache_follows_sweep_json(hub_data, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(hub_data, data)
    cache = tmp_path / "cache"
    fresh = unprobed_models.listings(data)
    for _ in range(2):  # written, then read back
        cached = unprobed_models.listings(data, cache_dir=cache)
        assert all(a.equals(b) for a, b in zip(cached, fresh))
    assert len(list(cache.glob(f"{B}.*.parquet"))) == 1
    _meta(B, [ModelEntry("org/alpha"), ModelEntry("org/omega")]).write(store.sweep_dir(data, B))
    listed, hub_rows = unprobed_models.listings(data, [B], cache_dir=cache)
    assert listed["model_id"].to_list() == ["org/alpha", "org/omega"] and hub_rows.height == 0
    assert len(list(cache.glob(f"{B}.*.parquet"))) == 1  # the stale one is gone


# --------------------------------------------------------------------------------------------
# the report, rendered for real


@pytest.fixture(scope="module")
def hub_report(hub_data) -> dict:
    html = report.render_report(hub_data, B)
    return {"data": hub_data, "html": html, "text": html.read_text()}


def test_report_lists_pending_models_apart(hub_report):
    text = hub_report["text"]
    assert "Not probed (pending)" in text
    section = text[text.index("Not probed (pending)") :]
    section = section[: section.index("Pass rate by task, model type and size")]
    for expected in (
        DELTA_REASON,
        ZETA_REASON,
        "org/delta",
        "org/zeta",
        "network",
        "disk",
        "org/epsilon",
    ):
        assert expected in section, expected
    assert f"model-support sweep --resume {B}" in text
    assert re.search(r"<dt>not probed \(pending\)</dt><dd>2</dd>", text)
    assert re.search(r"<dt>not tested \(no record yet\)</dt><dd>1</dd>", text)
    assert re.search(r"<dt>models probed</dt><dd>3</dd>", text)
    assert GATED_REASON in text  # excluded while the sweep ran: in the excluded table
    changes = text[text.index("Changes since the baseline") :]
    changes = changes[: changes.index("<h2")] if "<h2" in changes else changes
    assert "org/beta" in changes and "org/zeta" not in changes.split("left out of the diff")[0]
    assert "1 newly failing" in changes and "0 removed" in changes


def test_report_of_a_sweep_that_probed_nothing(hub_data, tmp_path):
    """The Hub unreachable for the whole sweep: every model pending, no row at all; the report
    says so."""
    data = tmp_path / "data"
    shutil.copytree(hub_data, data)
    c = "hubsel-20261203T000000Z-cccc"
    _meta(c, [ModelEntry("org/alpha"), ModelEntry("org/beta")]).write(store.sweep_dir(data, c))
    reason = "the Hub could not be reached (ConnectError)."
    store.write_pending(
        data,
        c,
        {m: {"reason": reason, "problem": "network", "at": "x"} for m in ("org/alpha", "org/beta")},
    )
    text = report.render_report(data, c, "").read_text()
    assert re.search(r"<dt>not probed \(pending\)</dt><dd>2</dd>", text) and reason in text
    assert re.search(r"<dt>models probed</dt><dd>0</dd>", text)


# --------------------------------------------------------------------------------------------
# the explorer in a real browser, offline


def _rows(page) -> list[str]:
    return page.locator("#results tbody tr td:first-child").all_inner_texts()


def _wait_count(page, n: int) -> None:
    page.wait_for_function(f"document.querySelector('#match-count').textContent.startsWith('{n} ')")


@pytest.mark.browser
def test_explorer_views_and_task_filter(browser, hub_report):
    page, attempted, errors = offline_page(browser)
    page.goto((hub_report["data"] / "reports" / "index.html").as_uri())
    _wait_count(page, 8)
    assert sorted(_rows(page)) == _rows(page)  # "all": by name

    page.locator("#view").select_option("trending")
    _wait_count(page, len(TRENDING))
    assert _rows(page) == TRENDING
    assert page.locator("#metric-head").inner_text() == "trending"
    scores = [
        int(t.replace(",", "")) for t in page.locator("#results tbody td.metric").all_inner_texts()
    ]
    assert scores == sorted(scores, reverse=True) == [90, 60, 40, 7, 3]

    page.locator("#view").select_option("downloads")
    _wait_count(page, len(DOWNLOADS))
    assert _rows(page) == DOWNLOADS
    page.locator("#task-filter").select_option(label=f"{VISION} (1)")
    _wait_count(page, 1)
    assert _rows(page) == ["org/delta"]
    # counted over every model: zeta too
    page.locator("#task-filter").select_option(label=f"{TEXT} (6)")
    _wait_count(page, 5)
    assert _rows(page) == [m for m in DOWNLOADS if m != "org/delta"]

    page.locator("#task-filter").select_option("")
    page.locator("#view").select_option("selected")
    _wait_count(page, len(SELECTED))
    assert _rows(page) == SELECTED
    verdicts = page.locator("#results tbody td.st").all_inner_texts()
    assert verdicts == [PASS, GEN, PASS]  # zeta: its latest run (A), not its pending entry in B

    page.locator("#view").select_option("")
    page.locator("#verdict-filter").select_option("not probed")
    _wait_count(page, 1)  # delta; zeta's latest run is a PASS
    page.locator("#sweep-filter").select_option(label=B)
    _wait_count(page, 2)
    assert _rows(page) == ["org/delta", "org/zeta"]
    assert attempted == [] and errors == []
    page.close()


@pytest.mark.browser
def test_explorer_detail_of_unprobed_models(browser, hub_report):
    page, attempted, errors = offline_page(browser)
    page.goto((hub_report["data"] / "reports" / "index.html").as_uri())
    detail = page.locator("#detail")

    def open_model(model: str) -> None:
        page.locator("#search").fill(model)
        page.wait_for_function(
            "(m) => { const r = document.querySelectorAll('#results tbody tr');"
            " return r.length === 1 && r[0].cells[0].textContent === m; }",
            arg=model,
        )
        page.locator("#results tbody tr").first.click()
        assert model in detail.locator("h2").inner_text()

    open_model("org/delta")
    row = page.locator("#results tbody tr").first
    assert row.locator("td.st").inner_text() == "not probed"
    assert DELTA_REASON in row.locator("td.sig").inner_text()
    text = detail.inner_text()
    assert "not probed" in text and DELTA_REASON in detail.locator(".reason").inner_text()
    assert "network" in text and f"model-support sweep --resume {B}" in text
    assert "900,000" in text and VISION in text  # the Hub's facts from sweep.json

    open_model("org/epsilon")
    assert page.locator("#results tbody tr td.st").first.inner_text() == "not tested"
    assert "not tested" in detail.inner_text() and "trending" in detail.inner_text()

    open_model("org/zeta")  # a PASS in A, pending in B: both in the panel
    text = detail.inner_text()
    assert PASS in detail.locator("table.history").inner_text()
    assert ZETA_REASON in text and "disk" in text

    open_model("org/gated")
    assert page.locator("#results tbody tr td.st").first.inner_text() == "excluded"
    assert GATED_REASON in detail.inner_text()
    colour = page.locator("#results tbody tr td.st").first.evaluate(
        "e => getComputedStyle(e).color"
    )
    assert colour == "rgb(117, 117, 117)"  # schema.VERDICT_COLORS["excluded"]
    assert attempted == [] and errors == []
    page.close()
