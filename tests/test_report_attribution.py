"""Whose failure it is, and execution modes as variants, as the report, the diff and the explorer
show them.

Two small histories built by hand, every number below counted by hand:
- attribution: sweeps A and B differ by one failure the stack newly broke (the CPU reference passes)
  and one the model newly has everywhere (the reference fails the same way); other failures are the
  stack's, the model's, both or unknown, unchanged between the two;
- modes: one model that fails only compiled, one that passes everywhere, in 4 variants (eager /
compile x dynamic / static cache), over an older file without the variant column and two matrix
sweeps. The reports are rendered for real (papermill + nbconvert) and opened, with the explorer, in
Debian's Chromium with the network refused.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from helpers import assert_charts_drawn, offline_page
from model_support import analysis
from model_support.record import schema, store
from model_support.record.schema import VERDICT_COLORS
from model_support.render import explorer, report, terminal

PASS, LOAD, GEN, OTHER = schema.VERDICTS

# --------------------------------------------------------------------------------------------
# attribution: two sweeps that differ by one stack failure and one model failure

A = "attr-20261201T000000Z-aaaa"
B = "attr-20261202T000000Z-bbbb"
SIG_STACK = (
    "NotImplementedError: The operator <name> is not currently implemented for the tpu device."
)
SIG_MODEL = "OSError: <repo> does not appear to have a file named model.safetensors."
SIG_OOM = "OutOfMemoryError: TPU out of memory. Tried to allocate <size>."
SIG_BOTH = "RuntimeError: linalg.inv: the input is singular."
REF_SIG = "RuntimeError: shape <shape> is invalid for input of size <n>"
REF_NOTE = (
    "the reference fails at generate: RuntimeError: shape '[1, 9]' is invalid for input of size 8"
)
#: model -> (model_type, outcome in A, outcome in B); an outcome is (status, signature, stage,
#: attribution).
OK = (PASS, None, None, None)
STACK_GEN = (GEN, SIG_STACK, "generate", "stack")
ATTR_MODELS = {
    "org/m01": ("llama", OK, OK),
    "org/m02": ("llama", OK, STACK_GEN),  # newly broken by the stack
    "org/m03": ("llama", OK, (LOAD, SIG_MODEL, "load", "model")),  # newly failing everywhere
    "org/m04": ("llama", STACK_GEN, STACK_GEN),
    "org/m05": (
        "gpt2",
        (GEN, SIG_STACK, "generate", "model"),
        (GEN, SIG_STACK, "generate", "model"),
    ),
    # unknown
    "org/m06": ("gpt2", (OTHER, SIG_OOM, "runner", None), (OTHER, SIG_OOM, "runner", None)),
    "org/m07": ("qwen2", (GEN, SIG_BOTH, "generate", "both"), (GEN, SIG_BOTH, "generate", "both")),
    "org/m08": ("qwen2", OK, OK),
    "org/m09": ("phi3", OK, OK),
    "org/m10": ("opt", OK, OK),
}


def _record(sweep: str, model: str, outcome: tuple, **extra) -> dict:
    status, sig, stage, attribution = outcome
    both = attribution == "both"
    return schema.empty_record(
        sweep_id=sweep,
        model_id=model,
        status=status,
        failure_signature=sig,
        failure_stage=stage,
        error_type=sig.split(":")[0] if sig else None,
        error_message=f"{model}: {sig}" if sig else None,
        attribution=attribution,
        reference_signature=REF_SIG if both else None,
        reference_note=REF_NOTE if both else None,
        device_type="tpu",
        started_at=f"2026-12-0{sweep[10]}T01:00:00+00:00",
        versions={"torch": "2.13.0", "torch_tpu": "0.2.0", "transformers": "4.57.0"},
        **extra,
    )


@pytest.fixture(scope="module")
def attr_data(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("attribution")
    for k, sweep in enumerate((A, B)):
        rows = [
            _record(
                sweep,
                m,
                spec[1 + k],
                model_type=spec[0],
                num_params=5_000_000 * (i + 1),
                load_s=1.0 + i,
                first_token_s=2.0 + i,
                decode_tokens_per_s=10.0 + i,
                peak_host_mem_mb=100.0 * (i + 1),
            )
            for i, (m, spec) in enumerate(ATTR_MODELS.items())
        ]
        store.write_parquet(rows, store.parquet_file(data, "results", sweep))
    return data


def test_headline_split_and_pass_rate_on_the_stack_by_hand(attr_data):
    results = store.scan(attr_data, "results")
    # B: 10 models, 4 PASS, 6 failures: stack m02 m04, model m03 m05, both m07, unknown m06.
    assert analysis.attribution_counts(results, B).select("attribution", "count").rows() == [
        ("stack", 2),
        ("model", 2),
        ("both", 1),
        ("unknown", 1),
    ]
    summary = analysis.sweep_summary(results, B).row(0, named=True)
    assert (summary["models"], summary["passed"], summary["pass_rate"]) == (10, 4, 0.4)
    # passed / (models probed - failures attributed to the model) = 4 / (10 - 2)
    assert summary["model_failures"] == 2 and summary["stack_pass_rate"] == 0.5


def test_failure_signatures_carry_their_attribution(attr_data):
    results = store.scan(attr_data, "results")
    sigs = analysis.failure_signatures(results, B, A)
    assert sigs.select("failure_signature", "models", "attribution", "new").rows() == [
        (SIG_STACK, 3, "stack 2, model 1", False),  # the most models first; mixed: with counts
        (SIG_MODEL, 1, "model", True),  # new since A
        (SIG_OOM, 1, "unknown", False),
        (SIG_BOTH, 1, "both", False),
    ]
    # no baseline: not known
    assert analysis.failure_signatures(results, B)["new"].to_list() == [None] * 4


def test_diff_separates_stack_from_everywhere(attr_data):
    diff = terminal.diff_table(attr_data, A, B)
    assert diff.select("model_id", "change", "attribution").rows() == [
        ("org/m02", "newly broken by the stack", "stack"),
        ("org/m03", "newly failing everywhere", "model"),
    ]
    counts = analysis.change_counts(diff)
    assert list(counts) == list(analysis.CHANGES) and list(counts)[0] == "newly broken by the stack"
    assert (
        counts["newly broken by the stack"],
        counts["newly failing everywhere"],
        counts["newly failing"],
    ) == (
        1,
        1,
        0,
    )
    text = terminal.format_diff(attr_data, A, B)  # as `model-support diff A B` prints it
    stack_line = next(i for i, line in enumerate(text.splitlines()) if "org/m02" in line)
    model_line = next(i for i, line in enumerate(text.splitlines()) if "org/m03" in line)
    assert stack_line < model_line  # what the porting team acts on comes first
    assert (
        "newly broken by the" in text.splitlines()[stack_line]
        and "newly failing" in text.splitlines()[model_line]
    )
    assert "variant" not in text
    assert (
        f"{A} -> {B}: 1 newly broken by the stack, 0 newly suspect, 0 newly failing, 1 newly "
        "failing everywhere, 0 newly passing, 0 no longer suspect, 0 status changed, 0 "
        "signature changed, 0 added, 0 removed." in text
    )


def test_unknown_attribution_stays_newly_failing_and_both_fails_everywhere():
    frame = pl.DataFrame(
        {
            "sweep_id": ["x"] * 3 + ["y"] * 3,
            "model_id": ["a", "b", "c"] * 2,
            "status": [PASS] * 3 + [GEN, GEN, GEN],
            "attribution": [None] * 3 + [None, "both", "stack"],
        }
    )
    changes = analysis.model_changes(frame, "y", "x")
    assert [(m, str(c)) for m, c in changes.select("model_id", "change").rows()] == [
        ("c", "newly broken by the stack"),
        ("a", "newly failing"),
        ("b", "newly failing everywhere"),
    ]


@pytest.fixture(scope="module")
def attr_report(attr_data) -> dict:
    path = report.render_report(attr_data, B)  # the baseline defaults to A
    return {"data": attr_data, "html": path, "text": path.read_text()}


def test_report_leads_with_whose_failures(attr_report):
    text = attr_report["text"]
    head = re.search(r"<dt>failures \(whose\)</dt><dd>(.*?)</dd>", text).group(1)
    assert re.sub(r"<[^>]+>", "", head) == "6 failures: stack 2, model 2, both 1, unknown 1"
    assert re.search(r"<dt>pass rate on the stack</dt><dd>50\.0% \(4 of 8", text)
    assert re.search(r"<dt>passed \(pass rate\)</dt><dd>4 \(40\.0%\)</dd>", text)
    # What a porting team acts on first: the verdicts, the diff, the split, the failure modes; the
    # breakdowns after, and how the page is made last (render.layout.SECTIONS).
    order = [
        "Verdicts",
        "Changes since the baseline",
        "Whose failures",
        "Failure signatures",
        "Pass rate by task, model type and size",
        "Timings",
        "CPU reference agreement",
        "History across sweeps",
        "Legend",
        "About this report",
    ]
    positions = [text.index(f">{h}<") for h in order]
    assert positions == sorted(positions)
    sigs = text[positions[3] : positions[4]]
    assert "stack 2, model 1" in sigs and "<td>new</td>" in sigs
    changes = text[positions[1] : positions[2]]
    assert changes.index("newly broken by the stack (1)") < changes.index(
        "newly failing everywhere (1)"
    )
    assert changes.index("org/m02") < changes.index("org/m03")
    legend = text[positions[-2] : positions[-1]]
    for term, help_text in schema.ATTRIBUTION_HELP.items():
        assert f"<code>{term}</code>" in legend and help_text in legend
    assert "<code>pass rate on the stack</code>" in legend and "<code>pass rate</code>" in legend
    # Only types with more than one model are charted (llama 4, gpt2 2, qwen2 2; phi3 and opt
    # alone).
    assert (
        "the 3 model types with more than one model; 2 types with a single model are only in "
        "the table" in text
    )


@pytest.mark.browser
def test_report_headline_split_in_chromium(browser, attr_report):
    page, attempted, errors = offline_page(browser)
    page.goto(attr_report["html"].as_uri())
    split = page.locator(".ms-head .ms-split")
    assert split.inner_text() == "6 failures: stack 2, model 2, both 1, unknown 1"
    assert page.locator(".ms-head .ms-attr-stack").inner_text() == "stack 2"
    assert page.locator(".ms-head .ms-attr-model").inner_text() == "model 2"
    assert_charts_drawn(page, 8)
    assert page.locator(".ms-chart-error").count() == 0
    assert attempted == [] and errors == []
    page.close()


def _wait_count(page, n: int) -> None:
    page.wait_for_function(f"document.querySelector('#match-count').textContent.startsWith('{n} ')")


def _models(page) -> list[str]:
    return page.locator("#results tbody tr td:first-child").all_inner_texts()


@pytest.mark.browser
def test_explorer_attribution_filter(browser, attr_report):
    page, attempted, errors = offline_page(browser)
    page.goto((attr_report["data"] / "reports" / "index.html").as_uri())
    _wait_count(page, 10)
    assert page.locator("#variant-filter").is_hidden()  # one variant: no variant filter, no column
    assert page.locator("#results thead th.col-variant").is_hidden()
    for whose, models in (
        ("stack", ["org/m02", "org/m04"]),
        ("model", ["org/m03", "org/m05"]),
        ("both", ["org/m07"]),
        ("unknown", ["org/m06"]),
    ):
        page.locator("#attribution-filter").select_option(whose)
        _wait_count(page, len(models))
        assert _models(page) == models
        assert page.locator("#results tbody td.whose").all_inner_texts() == [whose] * len(models)
    # both: the reference's own signature and note in the detail panel
    page.locator("#attribution-filter").select_option("both")
    _wait_count(page, 1)
    page.locator("#results tbody tr").first.click()
    detail = page.locator("#detail")
    assert "both" in detail.locator(".attribution").inner_text()
    assert detail.locator(".reference-signature").inner_text() == REF_SIG
    assert detail.locator(".reference-note").inner_text() == REF_NOTE
    # in an earlier sweep: m02 passed in A, so it is no stack failure there
    page.locator("#attribution-filter").select_option("stack")
    page.locator("#sweep-filter").select_option(label=A)
    _wait_count(page, 1)
    assert _models(page) == ["org/m04"]
    assert attempted == [] and errors == []
    page.close()


# --------------------------------------------------------------------------------------------
# execution modes: 2 models x 4 variants, one failing only compiled

# an older file: no variant column (eager+dynamic, one row per model)
V0 = "modes-20261201T000000Z-0000"
V1 = "modes-20261202T000000Z-1111"  # the matrix, every run passing
V2 = "modes-20261203T000000Z-2222"  # the matrix, mm/compiled failing compiled
VARIANTS = ("eager+dynamic", "eager+static", "compile+dynamic", "compile+static")
SIG_DYNAMO = "torch._dynamo.exc.Unsupported: call_function <name> in skip_files"
LATER = ("variant", "mode", "cache", "compile_backend", "compile_s", "graphs", "graph_breaks")


def _run(sweep: str, model: str, variant: str | None, fails: bool = False) -> dict:
    mode, cache = variant.split("+") if variant else ("eager", "dynamic")
    compiled = mode == "compile"
    n = VARIANTS.index(variant) if variant else 0
    return schema.empty_record(
        sweep_id=sweep,
        model_id=model,
        variant=variant,
        mode=mode if variant else None,
        cache=cache if variant else None,
        model_type="llama",
        status=GEN if fails else PASS,
        failure_stage="compile" if fails else None,
        failure_signature=SIG_DYNAMO if fails else None,
        error_type="torch._dynamo.exc.Unsupported" if fails else None,
        error_message=f"{model}: {SIG_DYNAMO}" if fails else None,
        attribution="stack" if fails else None,
        compile_backend="inductor" if compiled else None,
        # compile+dynamic 12 / 12, compile+static 13 / 13
        compile_s=(10.0 + n) if compiled else None,
        graphs=2 if compiled else None,
        graph_breaks=(1 if model == "mm/ok" else 0) if compiled and not fails else None,
        graph_break_reasons=["data-dependent branch"]
        if compiled and not fails and model == "mm/ok"
        else None,
        recompilations=1 if compiled and not fails else None,
        matches_eager=True if compiled and not fails else None,
        first_token_s=None if fails else (20.0 if compiled else 1.0),
        decode_tokens_per_s=None if fails else (50.0 if compiled else 10.0),
        device_type="cuda",
        started_at=f"2026-12-0{int(sweep[11]) + 1}T01:00:00+00:00",
        versions={"torch": "2.13.0", "transformers": "4.57.0"},
    )


@pytest.fixture(scope="module")
def modes_data(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("modes")
    models = ("mm/compiled", "mm/ok")
    old = schema.to_table([_run(V0, m, None) for m in models])
    path = store.parquet_file(data, "results", V0)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(old.drop_columns(list(LATER)), path)  # written as an older file really is
    store.write_parquet(
        [_run(V1, m, v) for m in models for v in VARIANTS], store.parquet_file(data, "results", V1)
    )
    store.write_parquet(
        [
            _run(V2, m, v, fails=m == "mm/compiled" and v.startswith("compile"))
            for m in models
            for v in VARIANTS
        ],
        store.parquet_file(data, "results", V2),
    )
    return data


def test_an_older_file_without_variants_reads_as_eager_dynamic(modes_data):
    assert "variant" not in pq.read_schema(store.parquet_file(modes_data, "results", V0)).names
    results = store.scan(modes_data, "results")
    assert analysis.sweep_variants(results, V0) == ["eager+dynamic"]
    tables = analysis.report_tables(modes_data, V0)
    assert tables["variant_stats"].select("variant", "runs", "passed").rows() == [
        ("eager+dynamic", 2, 2)
    ]
    # Against the matrix sweep: the eager+dynamic runs are the same runs (unchanged); the rest are
    # added.
    diff = analysis.model_changes(results, V1, V0)
    assert set(diff["change"].cast(pl.String)) == {"added"} and diff.height == 6
    assert "eager+dynamic" not in set(diff["variant"])


def test_diff_is_keyed_per_variant(modes_data):
    diff = terminal.diff_table(modes_data, V1, V2)
    assert diff.select("model_id", "variant", "change", "status_before", "status_after").rows() == [
        ("mm/compiled", "compile+dynamic", "newly broken by the stack", PASS, GEN),
        ("mm/compiled", "compile+static", "newly broken by the stack", PASS, GEN),
    ]
    text = terminal.format_diff(diff, V1, V2)
    assert "variant" in text and "compile+dynamic" in text and "compile+static" in text
    assert "2 newly broken by the stack" in text


def test_mode_tables_by_hand(modes_data):
    results = store.scan(modes_data, "results")
    assert analysis.sweep_variants(results, V2) == list(VARIANTS)
    grid = analysis.verdict_grid(results, V2)
    assert grid.columns == ["model_id", *VARIANTS]
    assert grid.rows() == [("mm/compiled", PASS, PASS, GEN, GEN), ("mm/ok", PASS, PASS, PASS, PASS)]
    broken = analysis.eager_pass_compile_fail(results, V2)
    assert broken.select("model_id", "variant", "failure_signature", "attribution").rows() == [
        ("mm/compiled", "compile+dynamic", SIG_DYNAMO, "stack"),
        ("mm/compiled", "compile+static", SIG_DYNAMO, "stack"),
    ]
    assert broken["eager_passes"].to_list()[0] == ["eager+dynamic", "eager+static"]
    stats = {r["variant"]: r for r in analysis.variant_stats(results, V2).iter_rows(named=True)}
    assert list(stats) == list(VARIANTS)
    cs = stats["compile+static"]
    assert (
        cs["runs"],
        cs["passed"],
        cs["compiled"],
        cs["compile_s_median"],
        cs["compile_s_max"],
    ) == (2, 1, 2, 13, 13)
    assert (cs["graph_breaks"], cs["runs_with_breaks"], cs["recompilations"]) == (1, 1, 1)
    assert (cs["matches_eager_yes"], cs["matches_eager_no"], cs["matches_eager_unknown"]) == (
        1,
        0,
        1,
    )
    assert (cs["first_token_s_median"], cs["decode_tokens_per_s_median"]) == (20.0, 50.0)
    ed = stats["eager+dynamic"]
    assert (
        ed["compiled"],
        ed["compile_s_median"],
        ed["graph_breaks"],
        ed["matches_eager_unknown"],
    ) == (
        0,
        None,
        None,
        2,
    )
    reasons = analysis.graph_break_reasons(results, V2)
    assert reasons.select("reason", "runs").rows() == [("data-dependent branch", 2)]
    # Verdict counts and signatures count runs (model-variant pairs).
    assert dict(analysis.verdict_counts(results, V2).select("status", "count").rows())[GEN] == 2
    sig = analysis.failure_signatures(results, V2).row(0, named=True)
    assert (sig["models"], sig["count"]) == (1, 2)


@pytest.fixture(scope="module")
def modes_report(modes_data) -> dict:
    path = report.render_report(modes_data, V2)  # against V1
    return {"data": modes_data, "html": path, "text": path.read_text()}


def test_modes_section_in_the_report(modes_report):
    text = modes_report["text"]
    assert re.search(
        r"<dt>runs probed \(model x variant\)</dt><dd>8 \(2 models, 4 variants\)</dd>", text
    )
    start = text.index('id="execution-modes"')
    section = text[start : text.index("<h2", start)]
    assert "Pass eager, fail compiled (1 model)" in section and html.escape(SIG_DYNAMO) in section
    assert "count runs (model-variant pairs)" in section
    assert (
        "compile_s median" in section and "recompilations" in section and "matches eager" in section
    )
    assert "data-dependent branch" in section
    # the older sweep, one variant: no modes section
    old = analysis.report_tables(modes_report["data"], V0)
    from model_support.render import modes_section

    assert modes_section.modes_html(old) == ""


@pytest.mark.browser
def test_modes_grid_in_chromium(browser, modes_report):
    page, attempted, errors = offline_page(browser)
    page.goto(modes_report["html"].as_uri())
    grid = page.locator("table.ms-grid")
    assert grid.count() == 1
    assert grid.locator("thead th.ms-variant").all_inner_texts() == list(VARIANTS)
    rows = grid.locator("tbody tr")
    assert rows.count() == 2
    expected = {
        "mm/compiled": ["st-PASS", "st-PASS", "st-FAIL-gen-", "st-FAIL-gen-"],
        "mm/ok": ["st-PASS"] * 4,
    }
    for k in range(2):
        row = rows.nth(k)
        model = row.locator("td").first.inner_text()
        cells = row.locator("td.ms-verdict")
        assert cells.count() == 4
        classes = [
            cells.nth(j).evaluate("e => [...e.classList].find(c => c.startsWith('st-'))")
            for j in range(4)
        ]
        assert classes == expected[model], model
    # a model whose variants differ first
    assert rows.first.locator("td").first.inner_text() == "mm/compiled"
    fail_cell = rows.first.locator("td.ms-verdict").nth(2)
    assert fail_cell.inner_text() == GEN
    red = VERDICT_COLORS[GEN].lstrip("#")
    rgb = f"rgb({int(red[0:2], 16)}, {int(red[2:4], 16)}, {int(red[4:6], 16)})"
    assert fail_cell.evaluate("e => getComputedStyle(e).backgroundColor") == rgb
    assert_charts_drawn(page, 8)
    assert attempted == [] and errors == []
    page.close()


@pytest.mark.browser
def test_explorer_variant_filter_and_side_by_side(browser, modes_report):
    page, attempted, errors = offline_page(browser)
    page.goto((modes_report["data"] / "reports" / "index.html").as_uri())
    _wait_count(page, 8)  # all variants: one row per (model, variant)
    assert "runs match" in page.locator("#match-count").inner_text()
    assert page.locator("#results tbody td.variant").first.is_visible()
    page.locator("#variant-filter").select_option(label="compile+static")
    _wait_count(page, 2)  # a chosen variant: one row per model
    assert _models(page) == ["mm/compiled", "mm/ok"]
    assert page.locator("#results tbody td.st").all_inner_texts() == [GEN, PASS]
    assert page.locator("#results tbody td.whose").all_inner_texts() == ["stack", ""]
    page.locator("#variant-filter").select_option(label="eager+dynamic")
    _wait_count(page, 2)
    assert page.locator("#results tbody td.st").all_inner_texts() == [PASS, PASS]
    page.locator("#results tbody tr").first.click()
    detail = page.locator("#detail")
    side = detail.locator("table.variants tbody tr")
    assert side.count() == 4
    assert side.locator("td:first-child").all_inner_texts() == list(VARIANTS)
    assert side.locator("td.st").all_inner_texts() == [PASS, PASS, GEN, GEN]
    assert detail.locator("table.variants td.sig").all_inner_texts()[2] == SIG_DYNAMO
    # its support card: per variant the latest verdict and how many of the sweeps that ran it agree
    # (V0 ran eager only, as an older file; the compile variants passed in V1 and fail in V2)
    card = detail.locator("table.support tbody tr")
    assert card.locator("td:first-child").all_inner_texts() == list(VARIANTS)
    assert card.locator("td.st").all_inner_texts() == [PASS, PASS, GEN, GEN]
    assert card.locator("td.agree").all_inner_texts() == ["3 of 3", "2 of 2", "1 of 2", "1 of 2"]
    # last verified in V2 (the sweep's date; its id on hover)
    verified = card.locator("td.verified")
    assert {verified.nth(k).get_attribute("title") for k in range(4)} == {V2}
    assert {t[:10] for t in verified.all_inner_texts()} == {"2026-12-03"}
    # in the chosen sweep: V1, where every variant passed
    page.locator("#sweep-filter").select_option(label=V1)
    page.locator("#results tbody tr").first.click()
    assert detail.locator("table.variants tbody tr td.st").all_inner_texts() == [PASS] * 4
    # the older sweep's rows are the eager+dynamic entries' history
    page.locator("#sweep-filter").select_option(label=V0)
    _wait_count(page, 2)
    page.locator("#variant-filter").select_option(label="compile+static")
    _wait_count(page, 0)
    assert attempted == [] and errors == []
    page.close()


def test_explorer_data_has_one_entry_per_model_and_variant(modes_data):
    data = explorer.explorer_data(modes_data)
    entries = [(m[0], data["variants"][m[11]]) for m in data["models"]]
    assert entries == [(m, v) for m in ("mm/compiled", "mm/ok") for v in VARIANTS]
    assert data["variants"] == list(VARIANTS)


def test_pending_and_not_tested_per_variant(modes_data, tmp_path):
    """A matrix sweep lists each model once per variant: a pending run (``org/x [variant]`` in
    pending.json) and a run without a record are that variant's, never the model's other runs."""
    import json
    import shutil

    from model_support.analysis import unprobed_models

    data = tmp_path / "data"
    shutil.copytree(modes_data, data)
    raw = {
        "sweep_id": V2,
        "name": "modes",
        "probe": {"device": "cuda"},
        "models": ["mm/compiled", "mm/ok", "mm/new"],
        "matrix": {"mode": ["eager", "compile"], "cache": ["dynamic", "static"]},
    }
    store.sweep_dir(data, V2).mkdir(parents=True, exist_ok=True)
    (store.sweep_dir(data, V2) / "sweep.json").write_text(json.dumps(raw))
    store.write_pending(
        data,
        V2,
        {
            "mm/new [compile+static]": {
                "reason": "the Hub could not be reached",
                "problem": "network",
            }
        },
    )
    pending, not_tested = unprobed_models.unprobed(data, V2)
    assert pending.select("model_id", "variant", "problem").rows() == [
        ("mm/new", "compile+static", "network")
    ]
    assert not_tested.select("model_id", "variant").rows() == [
        ("mm/new", v) for v in ("compile+dynamic", "eager+dynamic", "eager+static")
    ]
    tables = analysis.report_tables(data, V2, V1)
    assert tables["pending"].height == 1 and tables["not_tested"].height == 3
    page = explorer.explorer_data(data)
    entries = {(m[0], page["variants"][m[11]]): m for m in page["models"]}
    assert len(entries) == 12  # 3 models x 4 variants
    new = entries[("mm/new", "compile+static")]
    assert page["outcomes"][new[2][2]][0] == "not probed"
    assert page["outcomes"][entries[("mm/new", "eager+dynamic")][2][2]][0] == "not tested"
