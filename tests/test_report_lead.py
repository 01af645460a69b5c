"""The report and the explorer lead with what a porting engineer came for (checked in Chromium at
1280 x 800): the report's first screen holds the verdicts and what changed since the baseline,
its sections come in the one declared order (``render.layout.SECTIONS``) with how the page is
made last; two sweeps started in the same minute read apart in the explorer and the history
chart; the open detail panel follows the sweep filter; the device-memory bars keep their own
scale beside the host's; the history's pass rate is drawn from 0, once for a stack that never
changed; every model is in one table that sorts and filters, with its record and repro; an opened
traceback reads across its table; the terminal never prints ``None``.

The data: two sweeps of one name started 30 seconds apart, on a pretend device, where one model
fails in the first (the stack's failure: a missing operator) and passes in the second."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from urllib.parse import unquote, urlparse

import polars as pl
import pytest

from helpers import offline_page
from model_support.record import schema, store
from model_support.record.sweep_meta import ModelEntry, SweepMeta
from model_support.render import explorer, layout, report, terminal

SCREEN = {"width": 1280, "height": 800}
FIRST, SECOND = "loop-20261201T020010Z-aaaa", "loop-20261201T020040Z-bbbb"
MODELS = [f"org/model-{i}" for i in range(6)]
FIXED = "org/model-1"  # FAIL(gen) in FIRST, PASS in SECOND
MISSING = (
    "NotImplementedError: Could not run 'aten::rsqrt' with arguments from the 'pretend' backend."
)
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/opt/venv/lib/python3.13/site-packages/transformers/models/llama/modeling_llama.py", line 72, in forward\n'
    "    variance = hidden_states.pow(2).mean(-1, keepdim=True); hidden_states * torch.rsqrt(variance + eps)\n"
    f"{MISSING}"
)
#: Every probe's repro script: its settings, then the body kept once in the data folder's repro/ (by
#: its hash).
REPRO_BODY = store.REPRO_BODY_MARK + "\nprint('the probe, again')\n"


def write_loop(data) -> None:
    for sweep_id, second in ((FIRST, 10), (SECOND, 40)):
        SweepMeta(
            sweep_id=sweep_id,
            name="loop",
            created_at=f"2026-12-01T02:00:{second}+00:00",
            probe={"device": "pretend", "perf": False},
            models=[ModelEntry(m) for m in MODELS],
        ).write(store.sweep_dir(data, sweep_id))
        for i, model_id in enumerate(MODELS):
            failed = model_id == FIXED and sweep_id == FIRST or i == 4
            record = schema.empty_record(
                sweep_id=sweep_id,
                model_id=model_id,
                status=schema.FAIL_GEN if failed else schema.PASS,
                failure_stage="generate" if failed else None,
                failure_signature=MISSING if failed else None,
                error_type="NotImplementedError" if failed else None,
                error_message=MISSING if failed else None,
                attribution="stack" if failed else None,
                device_type="pretend",
                num_params=1_000_000,
                peak_host_mem_mb=420.0 + i,
                peak_device_mem_mb=0.4 + 0.01 * i,
                tokens_in=5,
                tokens_out=None if failed else 8,
                traceback=TRACEBACK if failed else None,
                versions={"torch": "2.13.0+cpu", "transformers": "5.25.0"},
                started_at=f"2026-12-01T02:00:{second + i:02d}+00:00",
                repro_script="SETTINGS = {}\n" + REPRO_BODY,
                repro_settings="{}",
                repro_sha256=hashlib.sha256(REPRO_BODY.encode()).hexdigest(),
            )
            store.store_result(data, sweep_id, record, None, "log\n")
        store.compact(data, sweep_id)


@pytest.fixture(scope="module")
def loop(tmp_path_factory) -> dict:
    data = tmp_path_factory.mktemp("lead")
    write_loop(data)
    html = report.render_report(data, SECOND)  # the baseline defaults to FIRST
    return {"data": data, "html": html}


#: Each h2 of the page with its top edge (px from the top of the page) and text.
HEADINGS = (
    "() => [...document.querySelectorAll('h2')].map((h) => "
    "[Math.round(h.getBoundingClientRect().top), h.textContent.replace(/¶$/, '').trim()])"
)


@pytest.mark.browser
def test_the_first_screen_holds_the_verdicts_and_the_changes(browser, loop):
    page, attempted, errors = offline_page(browser)
    page.set_viewport_size(SCREEN)
    page.goto(loop["html"].as_uri())
    page.wait_for_selector("#ms-chart-verdicts svg")
    headings = page.evaluate(HEADINGS)
    titles = [title for _, title in headings]
    declared = [s.title for s in layout.SECTIONS if s.title]
    # the declared order
    assert [t for t in titles if t in declared] == [t for t in declared if t in titles]
    assert titles[:3] == ["Verdicts", "Changes since the baseline", "Whose failures"]
    assert titles[-1] == "About this report"
    top = dict((title, y) for y, title in headings)
    # its summary line shows too
    assert top["Changes since the baseline"] < SCREEN["height"] - 150, headings
    summary = page.locator(".ms-diff-summary")
    assert (
        summary.bounding_box()["y"] < SCREEN["height"] and "1 newly passing" in summary.inner_text()
    )
    rendering = page.get_by_text("model_support.render.report.render_report").first
    # the note for developers is at the end
    assert rendering.bounding_box()["y"] > 3 * SCREEN["height"]
    assert attempted == [] and errors == []
    page.close()


#: The rendered bars (Vega draws each as a path in a g.mark-rect) of one chart, as [x, y, width,
#: height].
BARS = (
    "(sel) => [...document.querySelectorAll(sel + ' g.mark-rect.role-mark path')].map((p) => "
    "{ const r = p.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; })"
)
POINTS = (
    "(sel) => [...document.querySelectorAll(sel + ' g.mark-symbol.role-mark path')].map((p) => "
    "Math.round(p.getBoundingClientRect().x))"
)


@pytest.mark.browser
def test_device_memory_has_its_own_scale_and_sweeps_a_minute_apart_draw_apart(browser, loop):
    page, attempted, errors = offline_page(browser)
    page.set_viewport_size(SCREEN)
    page.goto(loop["html"].as_uri())
    page.wait_for_selector("#ms-chart-memory svg")
    page.wait_for_selector("#ms-chart-history svg")
    bars = page.evaluate(BARS, "#ms-chart-memory")
    # host ~420 MB, device ~0.4 MB: both tall
    assert len(bars) == 2 and min(h for *_, h in bars) > 100, bars
    points = page.evaluate(POINTS, "#ms-chart-history")
    # two sweeps, one panel: the stack never changed
    assert len(points) == 2 and len(set(points)) == 2, points
    labels = page.locator("#ms-chart-history").inner_text()
    assert "loop 2026-12-01 02:00:10" in labels and "loop 2026-12-01 02:00:40" in labels
    assert attempted == [] and errors == []
    page.close()


#: The texts of one chart's y-axis labels, and of its panels' titles.
Y_LABELS = (
    "(sel) => [...document.querySelectorAll(sel + ' g.role-axis')].filter((g) => "
    "g.querySelector('.role-axis-title')?.textContent === 'pass rate').flatMap((g) => "
    "[...g.querySelectorAll('.role-axis-label text')].map((t) => t.textContent))"
)
TITLES = (
    "(sel) => [...document.querySelectorAll(sel + ' g.role-title-text text')].map((t) => "
    "t.textContent)"
)


@pytest.mark.browser
def test_the_history_starts_at_zero_and_draws_a_constant_stack_once(browser, loop):
    """Pass rates of 67% and 83% on an axis from 0 (not from 66%, where a small step looks like a
    cliff); a stack whose every component kept its version gets one history panel, not one per
    component, and no version chart."""
    page, attempted, errors = offline_page(browser)
    page.goto(loop["html"].as_uri())
    page.wait_for_selector("#ms-chart-history svg")
    assert page.locator("#ms-chart-history g.mark-line.role-mark").count() == 1
    labels = page.evaluate(Y_LABELS, "#ms-chart-history")
    assert labels[0] == "0%" and labels[-1] == "100%", labels
    assert page.evaluate(TITLES, "#ms-chart-history") == [
        "Pass rate over sweeps (one stack throughout)"
    ]
    assert page.locator("#ms-chart-by-version").count() == 0
    assert (
        "no chart by version"
        in page.locator("#history-across-sweeps ~ p.ms-note").first.inner_text()
    )
    assert attempted == [] and errors == []
    page.close()


#: Each row of the per-model table that shows: [model, verdict, host MiB, tokens out].
MODEL_ROWS = """() => { const heads = [...document.querySelectorAll('#ms-models thead th')].map((th) => th.textContent);
  const at = (name) => heads.indexOf(name);
  return [...document.querySelectorAll('#ms-models tbody tr')].filter((tr) => !tr.hidden)
    .map((tr) => [at('model'), at('verdict'), at('host MiB'), at('tokens out')].map((k) => tr.cells[k].textContent)); }"""


def _local(url: str) -> Path:
    """A link's file on disk (the page's links are relative: the browser resolves them against
    the report)."""
    return Path(unquote(urlparse(url).path))


@pytest.mark.browser
def test_every_model_sorts_and_filters_with_its_record_and_repro(browser, loop):
    """The report lists every model of the sweep, PASS included, with its numbers, a link to its
    record and its repro body that open, and its repro command; a heading sorts (again: the other
    way, empty cells last), words filter. An opened traceback reads across its whole table,
    nothing cut."""
    page, attempted, errors = offline_page(browser)
    page.set_viewport_size(SCREEN)
    page.goto(loop["html"].as_uri())
    page.wait_for_selector("#ms-models tbody tr")
    rows = page.evaluate(MODEL_ROWS)
    assert [r[0] for r in rows] == MODELS and [r[1] for r in rows].count(schema.PASS) == 5
    assert page.locator("#ms-models-count").inner_text() == "6 of 6 models shown"
    for model_id in MODELS:  # each run's record and repro body, linked from the report's folder
        row = page.locator("#ms-models tbody tr", has_text=model_id)
        record = _local(row.locator("a", has_text="record").evaluate("(a) => a.href"))
        assert (
            json.loads(record.read_text())["model_id"] == model_id
            and record.parent.name == "records"
        )
        body = _local(row.locator("a", has_text="repro").evaluate("(a) => a.href"))
        assert body.parent == loop["data"] / "repro" and body.read_text() == REPRO_BODY
        assert (
            f"model-support repro {SECOND} {model_id}" in row.locator("details pre").text_content()
        )

    page.locator("#ms-models th", has_text="host MiB").click()
    page.locator("#ms-models th", has_text="host MiB").click()  # again: largest first
    assert [r[0] for r in page.evaluate(MODEL_ROWS)] == MODELS[::-1]
    # the failed run has none: last, either way
    page.locator("#ms-models th", has_text="tokens out").click()
    assert page.evaluate(MODEL_ROWS)[-1][:2] == ["org/model-4", schema.FAIL_GEN]
    page.locator("#ms-models th", has_text="tokens out").click()
    assert page.evaluate(MODEL_ROWS)[-1][:2] == ["org/model-4", schema.FAIL_GEN]

    page.locator("#ms-models-filter").fill("model-4")
    page.wait_for_function(
        "document.querySelector('#ms-models-count').textContent.startsWith('1 of 6')"
    )
    assert [r[0] for r in page.evaluate(MODEL_ROWS)] == ["org/model-4"]
    page.locator("#ms-models-filter").fill("pass model")
    page.wait_for_function(
        "document.querySelector('#ms-models-count').textContent.startsWith('5 of 6')"
    )
    assert "org/model-4" not in [r[0] for r in page.evaluate(MODEL_ROWS)]

    signatures = page.locator(
        "table.ms-table", has=page.locator("th", has_text="failure signature")
    )
    signatures.locator("summary", has_text="traceback").click()
    shown = page.locator("tr.ms-unfolded pre")
    shown.wait_for(state="visible")
    from model_support.probe.signatures import portable_paths

    # a page names files, not the machine that ran them
    assert shown.text_content() == portable_paths(TRACEBACK)
    box, table = shown.bounding_box(), signatures.bounding_box()
    assert box["width"] > table["width"] - 40 and box["x"] + box["width"] <= SCREEN["width"], (
        box,
        table,
    )
    # the long lines wrap, nothing cut
    assert shown.evaluate("(pre) => pre.scrollWidth <= pre.clientWidth")
    assert attempted == [] and errors == []
    page.close()


@pytest.mark.browser
def test_explorer_sweeps_read_apart_and_the_panel_follows_the_sweep_filter(browser, loop):
    page, attempted, errors = offline_page(browser)
    page.set_viewport_size(SCREEN)
    page.goto((loop["data"] / "reports" / "index.html").as_uri())
    page.wait_for_selector("#results tbody tr")
    page.locator("#search").fill(FIXED)
    page.wait_for_function("document.querySelector('#match-count').textContent.startsWith('1 ')")
    row = page.locator("#results tbody tr").first
    assert (
        row.locator("td.st").inner_text() == "PASS"
        and row.locator("td.sweep").inner_text() == "loop 2026-12-01 02:00:40"
    )
    row.click()
    detail = page.locator("#detail")
    detail.wait_for(state="visible")
    history = detail.locator("table.history td.sweep").all_inner_texts()
    assert history == ["loop 2026-12-01 02:00:40", "loop 2026-12-01 02:00:10"]
    cut = "(tds) => tds.filter((td) => td.scrollWidth > td.clientWidth).map((td) => td.textContent)"
    # the seconds show, in the list and the panel
    assert page.locator("td.sweep").evaluate_all(cut) == []
    assert detail.locator("dd.run .st").inner_text() == "PASS"

    page.locator("#sweep-filter").select_option(label=FIRST)  # the open panel follows the list
    page.wait_for_function(
        "document.querySelector('#results tbody td.st').textContent === 'FAIL(gen)'"
    )
    assert detail.is_visible()
    assert detail.locator("dd.run").inner_text() == f"{FIRST} FAIL(gen)"
    assert detail.locator("dd.latest").inner_text() == f"{SECOND} PASS"
    assert page.locator("#results tbody tr.selected").count() == 1

    # the row leaves the list: the panel closes
    page.locator("#verdict-filter").select_option("PASS")
    page.wait_for_function("document.querySelector('#match-count').textContent.startsWith('0 ')")
    assert detail.is_hidden()
    assert attempted == [] and errors == []
    page.close()


def test_two_sweeps_in_one_minute_have_labels_apart():
    ids = [
        "smoke-20261201T020000Z-aaaa",
        "smoke-20261202T020000Z-bbbb",
        "smoke-20261202T090010Z-cccc",
        "smoke-20261202T090040Z-dddd",
        "nightly-20261202T090000Z-dddd",
        "nightly-20261202T090000Z-eeee",
        "no-time-in-this-id",
    ]
    assert explorer.sweep_labels(ids) == [
        "smoke 2026-12-01",
        "smoke 2026-12-02 02:00",
        "smoke 2026-12-02 09:00:10",
        "smoke 2026-12-02 09:00:40",
        "nightly 2026-12-02 09:00:00 dddd",
        "nightly 2026-12-02 09:00:00 eeee",
        "no-time-in-this-id",
    ]
    from model_support.analysis.history import sweep_labels

    assert sweep_labels(ids[:4]) == [
        "smoke 2026-12-01 02:00",
        "smoke 2026-12-02 02:00",
        "smoke 2026-12-02 09:00:10",
        "smoke 2026-12-02 09:00:40",
    ]


def test_the_terminal_never_prints_none(loop):
    data = loop["data"]
    diff = terminal.diff_table(data, FIRST, SECOND)
    assert "None" not in terminal.format_diff(data, FIRST, SECOND)
    suspect = diff.head(1).with_columns(  # a row that says why without saying what its check is now
        pl.lit("no longer suspect").cast(diff["change"].dtype).alias("change"),
        pl.lit(None, dtype=pl.String).alias("check_after"),
        pl.lit("agrees with the reference").alias("check_note"),
        pl.lit(None, dtype=pl.String).alias("status_before"),
    )
    assert "None" not in terminal.format_diff(suspect, FIRST, SECOND)
    from rich.console import Console

    console = Console(record=True, width=200)
    terminal.verdict_table(store.read_records(data, FIRST), console)
    printed = console.export_text()
    assert "None" not in printed and "5/-" in printed
    assert "with arguments from the…" in printed  # a signature cut for the table says so
