"""The report: its tables give the right numbers, the notebook really renders, the pages work
offline.

Numbers are checked twice: on a small history counted by hand, and on a synthetic history against
an independent plain-Python count. The report notebook is executed for real with papermill, and the
HTML pages are opened in Debian's Chromium with every network request refused.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from fixtures import synthetic
from helpers import assert_charts_drawn, offline_page
from model_support import analysis, paths
from model_support.fileio import atomic_write_json
from model_support.record import schema, store
from model_support.render import explorer, report, terminal

REPO_ROOT = Path(__file__).resolve().parents[1]

PASS, LOAD, GEN, OTHER = schema.VERDICTS


# --------------------------------------------------------------------------------------------
# a history small enough to count by hand

A, B = "hand-20261201T000000Z", "hand-20261202T000000Z"
SIG_X = "OSError: <repo> does not appear to have a file named model.safetensors."
SIG_Y = "IndexError: index out of range in self"
SIG_Z = "OutOfMemoryError: TPU out of memory. Tried to allocate <size>."


def _rec(sweep, model, status, sig=None, stage=None, **extra):
    torch = "2.8.0" if sweep == A else "2.9.0"
    return schema.empty_record(
        sweep_id=sweep,
        model_id=model,
        status=status,
        failure_signature=sig,
        failure_stage=stage,
        error_type=sig.split(":")[0] if sig else None,
        error_message=f"{model} failed" if sig else None,
        traceback=f"Traceback (most recent call last):\n{sig}" if sig else None,
        device_type="tpu",
        started_at=f"{sweep[5:9]}-{sweep[9:11]}-{sweep[11:13]}T01:00:00Z",
        versions={"torch": torch, "torch_tpu": "0.2.0", "transformers": "4.57.0"},
        **extra,
    )


@pytest.fixture(scope="module")
def hand_counted(tmp_path_factory) -> Path:
    """Two sweeps of six models and three excluded rows, every number below counted by hand."""
    data = tmp_path_factory.mktemp("hand")
    a = [
        _rec(
            A,
            "org/m1",
            PASS,
            model_type="llama",
            num_params=5_000_000,
            load_s=1.0,
            reference_match=True,
        ),
        _rec(
            A,
            "org/m2",
            PASS,
            model_type="llama",
            num_params=500_000_000,
            load_s=2.0,
            reference_match=True,
        ),
        _rec(A, "org/m3", LOAD, SIG_X, "load", model_type="gpt2", num_params=None),
        _rec(
            A,
            "org/m4",
            GEN,
            SIG_Y,
            "generate",
            model_type="gpt2",
            num_params=2_000_000_000,
            load_s=3.0,
        ),
        _rec(
            A,
            "org/m5",
            PASS,
            model_type="qwen2",
            num_params=20_000_000_000,
            load_s=4.0,
            reference_match=False,
        ),
    ]
    b = [
        _rec(
            B,
            "org/m1",
            PASS,
            model_type="llama",
            num_params=5_000_000,
            load_s=1.0,
            first_token_s=10.0,
            tokens_in=6,
            tokens_out=8,
            peak_host_mem_mb=100.0,
            reference_match=True,
        ),
        _rec(
            B,
            "org/m2",
            GEN,
            SIG_Y,
            "generate",
            model_type="llama",
            num_params=500_000_000,
            load_s=2.0,
            tokens_in=6,
            peak_host_mem_mb=300.0,
        ),
        _rec(
            B,
            "org/m3",
            PASS,
            model_type="gpt2",
            num_params=None,
            load_s=3.0,
            first_token_s=30.0,
            tokens_in=20,
            tokens_out=4,
            peak_host_mem_mb=200.0,
            reference_match=False,
        ),
        _rec(
            B,
            "org/m4",
            OTHER,
            SIG_Z,
            "generate",
            model_type="gpt2",
            num_params=2_000_000_000,
            load_s=4.0,
        ),
        _rec(B, "org/m6", GEN, SIG_Y, "generate", model_type="qwen2", num_params=20_000_000_000),
    ]
    store.write_parquet(a, data / "results" / f"sweep={A}" / "part-0.parquet")
    store.write_parquet(b, data / "results" / f"sweep={B}" / "part-0.parquet")
    excluded = [
        schema.empty_record(
            sweep_id=A, model_id="org/enc1", exclusion_reason="not a text-generation model"
        ),
        schema.empty_record(
            sweep_id=B, model_id="org/enc1", exclusion_reason="not a text-generation model"
        ),
        schema.empty_record(
            sweep_id=B, model_id="org/huge", exclusion_reason="too large for the device"
        ),
    ]
    store.write_parquet(excluded[:1], data / "excluded" / f"sweep={A}" / "part-0.parquet")
    store.write_parquet(excluded[1:], data / "excluded" / f"sweep={B}" / "part-0.parquet")
    for sweep, created in ((A, "2026-12-01T00:00:00Z"), (B, "2026-12-02T00:00:00+00:00")):
        atomic_write_json(
            data / "sweeps" / sweep / "sweep.json",
            {  # the older (v1, "settings") shape
                "sweep_id": sweep,
                "name": "hand",
                "created_at": created,
                "params_file": "params/hand.yaml",
                "settings": {"device": "tpu"},
                "models": [],
                "versions": {},
                "host": "h1",
            },
        )
    return data


def test_verdicts_and_summary_by_hand(hand_counted):
    results, excluded = store.scan(hand_counted, "results"), store.scan(hand_counted, "excluded")
    verdicts = analysis.verdict_counts(results, B)
    assert verdicts.rows() == [(PASS, 2, 0.4), (LOAD, 0, 0.0), (GEN, 2, 0.4), (OTHER, 1, 0.2)]
    # Excluded rows are counted apart and never as a failure. No failure is attributed (a sweep that
    # predates attribution): the pass rate on the stack is the pass rate.
    assert analysis.sweep_summary(results, B, excluded).row(0) == (B, 5, 2, 3, 0.4, 2, 0, 0.4)
    assert analysis.attribution_counts(results, B).select("attribution", "count").rows() == [
        ("stack", 0),
        ("model", 0),
        ("both", 0),
        ("unknown", 3),
    ]
    assert analysis.excluded_reasons(excluded, B).rows() == [
        ("not a text-generation model", 1, ["org/enc1"]),
        ("too large for the device", 1, ["org/huge"]),
    ]


def test_pass_rate_breakdowns_by_hand(hand_counted):
    results = store.scan(hand_counted, "results")
    by_type = analysis.pass_rate_by_model_type(results, B)
    assert by_type.select("model_type", "models", "passed").rows() == [
        ("gpt2", 2, 1),
        ("llama", 2, 1),
        ("qwen2", 1, 0),
    ]
    by_size = analysis.pass_rate_by_size(results, B)
    assert [
        (str(b), m, p) for b, m, p in by_size.select("size_bucket", "models", "passed").rows()
    ] == [
        ("<10M", 1, 1),
        ("10M-1B", 1, 0),
        ("1-10B", 1, 0),
        (">10B", 1, 0),
        ("unknown", 1, 1),
    ]


def test_models_that_failed_before_loading_are_not_of_unknown_size(hand_counted):
    """Sweep A's org/m3 failed at load before its parameters were counted: its own group, not
    "unknown" (which would read as a 0% pass rate for models of unknown size); sweep B's org/m3
    passed unmeasured: unknown."""
    results = store.scan(hand_counted, "results")
    by_size = analysis.pass_rate_by_size(results, A)
    assert [
        (str(b), m, p) for b, m, p in by_size.select("size_bucket", "models", "passed").rows()
    ] == [
        ("<10M", 1, 1),
        ("10M-1B", 1, 1),
        ("1-10B", 1, 0),
        (">10B", 1, 1),
        ("failed before loading", 1, 0),
    ]
    assert (
        "unknown" in analysis.pass_rate_by_size(results, B)["size_bucket"].cast(pl.String).to_list()
    )


def test_every_table_is_the_one_autoescaped_macro():
    """The report's tables, the execution modes' grid, the probe's and the debug notebook's
    key/value tables, the debug comparison and the graph breaks: each is the one Jinja2 table
    macro, which escapes every cell."""
    from model_support import debug, display
    from model_support.debug.compare import COLUMNS
    from model_support.render import html, modes_section

    calls = []
    macro = display._table_macro()
    bad = "<script>alert(1)</script>"

    def spy(*args):
        calls.append(args)
        return macro(*args)

    def cells(row: dict) -> pl.DataFrame:
        return pl.DataFrame([{c: row.get(c) for c in COLUMNS}])

    offender = cells(
        {"index": 0, "module": bad, "class": "Linear", "exceeds": True, "first_offender": True}
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(display, "_table_macro", lambda: spy)
        shown = [
            html.table_html(pl.DataFrame({"status": [bad], "count": [2], "share": [0.4]})),
            modes_section.grid_html(pl.DataFrame({"model_id": [bad], "eager+dynamic": [PASS]})),
            display.kv_table([("model", bad)]),
            debug.table_html(offender),
            debug.graph_breaks_html(
                {"graphs": 2, "graph_breaks": 1, "breaks": [{"reason": bad, "where": None}]}
            ),
        ]
    assert len(calls) == 5
    for text in shown:
        assert bad not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert shown[0].startswith(
        '<table class="ms-table"><thead><tr><th>status</th><th>count</th><th>share</th>'
    )
    assert '<td class="num">2</td><td class="num">40.0%</td></tr></tbody></table>' in shown[0]
    assert (
        '<td class="ms-verdict st-PASS" '
        f'style="background:{schema.VERDICT_COLORS[PASS]};color:#fff">PASS</td>' in (shown[1])
    )


def test_failure_signatures_by_hand(hand_counted):
    sigs = analysis.failure_signatures(store.scan(hand_counted, "results"), B)
    assert sigs.select("failure_signature", "count", "failure_stage", "status").rows() == [
        (SIG_Y, 2, "generate", GEN),
        (SIG_Z, 1, "generate", OTHER),
    ]
    first = sigs.row(0, named=True)
    assert first["example_models"] == ["org/m2", "org/m6"]
    assert first["error_message"] == "org/m2 failed" and first["traceback"].endswith(SIG_Y)


def test_numeric_stats_by_hand(hand_counted):
    results = store.scan(hand_counted, "results")
    timings = {r["metric"]: r for r in analysis.timing_stats(results, B).iter_rows(named=True)}
    assert (
        timings["load_s"]["count"] == 4
        and timings["load_s"]["median"] == 2.5
        and timings["load_s"]["max"] == 4.0
    )
    assert timings["load_s"]["p90"] == pytest.approx(3.7)  # linear between 3.0 and 4.0
    assert (
        timings["first_token_s"]["median"] == 20.0 and timings["decode_tokens_per_s"]["count"] == 0
    )
    tokens = {r["metric"]: r for r in analysis.token_stats(results, B).iter_rows(named=True)}
    assert (
        tokens["tokens_in"]["count"],
        tokens["tokens_in"]["total"],
        tokens["tokens_in"]["max"],
    ) == (3, 32.0, 20.0)
    assert (tokens["tokens_out"]["count"], tokens["tokens_out"]["mean"]) == (2, 6.0)
    memory = {r["metric"]: r for r in analysis.memory_stats(results, B).iter_rows(named=True)}
    assert (memory["peak_host_mem_mb"]["median"], memory["peak_host_mem_mb"]["max"]) == (
        200.0,
        300.0,
    )
    assert (
        memory["peak_device_mem_mb"]["count"] == 0
        and memory["peak_device_mem_mb"]["median"] is None
    )
    assert analysis.reference_agreement(results, B).select("outcome", "count").rows() == [
        ("match", 1),
        ("mismatch", 1),
        ("not run", 3),
    ]
    histogram = analysis.timing_histogram(results, B, bins=3).filter(pl.col("metric") == "load_s")
    assert histogram["count"].to_list() == [1, 1, 2] and histogram["bin_start"][0] == 1.0


def test_diff_and_history_by_hand(hand_counted):
    results = store.scan(hand_counted, "results")
    changes = analysis.model_changes(results, B, A)
    # Keyed per (model, variant): the older files have no variant, read as eager+dynamic. No
    # attribution recorded: a newly failing model stays "newly failing".
    assert set(changes["variant"]) == {analysis.DEFAULT_VARIANT}
    assert [
        (m, str(c), sb, sa)
        for m, c, sb, sa in changes.select(
            "model_id", "change", "status_before", "status_after"
        ).rows()
    ] == [
        ("org/m2", "newly failing", PASS, GEN),
        ("org/m3", "newly passing", LOAD, PASS),
        ("org/m4", "status changed", GEN, OTHER),
        ("org/m6", "added", None, GEN),
        ("org/m5", "removed", PASS, None),
    ]
    sig_changes = analysis.signature_changes(results, B, A)
    assert [(s, str(c), n0, n1) for s, c, n0, n1 in sig_changes.rows()] == [
        (SIG_Z, "appeared", 0, 1),
        (SIG_X, "vanished", 1, 0),
    ]
    assert (
        report.previous_sweep(hand_counted, B) == A
        and report.previous_sweep(hand_counted, A) is None
    )
    sweeps = analysis.sweep_index(hand_counted)
    history = analysis.pass_rate_history(results, sweeps, store.scan(hand_counted, "excluded"))
    assert history.select(
        "sweep_id", "models", "passed", "pass_rate", "excluded", "torch"
    ).rows() == [
        (A, 5, 3, 0.6, 1, "2.8.0"),
        (B, 5, 2, 0.4, 2, "2.9.0"),
    ]
    by_torch = analysis.pass_rate_by_version(results, "torch", sweeps)
    assert by_torch.select("version", "sweeps", "models", "passed", "first_sweep").rows() == [
        ("2.8.0", 1, 5, 3, A),
        ("2.9.0", 1, 5, 2, B),
    ]
    text = terminal.format_diff(hand_counted, A, B)  # as `model-support diff A B` calls it
    assert "org/m2" in text and "newly failing" in text
    assert "variant" not in text  # every run is eager+dynamic: no variant column
    assert (
        f"{A} -> {B}: 0 newly broken by the stack, 0 newly suspect, 1 newly failing, 0 newly "
        "failing everywhere, 1 newly passing, 0 no longer suspect, 1 status changed, 0 "
        "signature changed, 1 added, 0 removed, 1 dropped." in text
    )  # m5 passed in A and B's definition left it out: the gate's word, "dropped", not "removed"


def test_empty_data_gives_empty_tables(tmp_path):
    empty = store.scan(tmp_path, "results")
    assert analysis.verdict_counts(empty, "x")["count"].to_list() == [0, 0, 0, 0]
    assert analysis.sweep_summary(empty, "x", store.scan(tmp_path, "excluded")).row(0) == (
        "x",
        0,
        0,
        0,
        None,
        0,
        0,
        None,
    )
    for table in (
        analysis.failure_signatures(empty, "x"),
        analysis.pass_rate_by_model_type(empty, "x"),
        analysis.pass_rate_by_task(empty, "x"),
        analysis.model_changes(empty, "x", "y"),
        analysis.timing_histogram(empty, "x"),
        analysis.pass_rate_history(empty),
        analysis.pass_rate_by_version(empty, "torch"),
    ):
        assert table.height == 0
    # tokens_in, tokens_out, image_tokens
    assert analysis.token_stats(empty, "x")["count"].to_list() == [0, 0, 0]
    assert analysis.sweep_index(tmp_path).height == 0
    # A frame that lacks columns altogether (an old file read directly) reads them as null.
    old = pl.DataFrame({"sweep_id": ["s", "s"], "model_id": ["a", "b"], "status": [PASS, GEN]})
    assert analysis.token_stats(old, "s")["count"].to_list() == [0, 0, 0]
    assert analysis.timing_stats(old, "s")["median"].to_list() == [None, None, None]
    assert analysis.verdict_counts(old, "s")["count"].to_list() == [1, 0, 1, 0]


def test_a_wholly_excluded_sweep_is_no_failure(hand_counted, tmp_path):
    """A sweep excluded after the fact has no results rows: zero failures, and no default
    baseline."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(hand_counted, data)
    c = "hand-20261203T000000Z"
    store.write_parquet(
        [
            schema.empty_record(sweep_id=c, model_id=m, exclusion_reason="broken stack")
            for m in ("org/m1", "org/m2")
        ],
        data / "excluded" / f"sweep={c}" / "part-0.parquet",
    )
    tables = analysis.report_tables(data, c, B)
    assert tables["summary"].row(0) == (c, 0, 0, 0, None, 2, 0, None)
    assert tables["history"]["sweep_id"].to_list() == [A, B, c]
    assert report.previous_sweep(data, c) == B
    d = "hand-20261204T000000Z"
    store.write_parquet(
        [_rec(d, "org/m1", PASS)], data / "results" / f"sweep={d}" / "part-0.parquet"
    )
    assert report.previous_sweep(data, d) == B  # the excluded sweep is skipped as a baseline


def test_unknown_sweep_id_is_one_sentence(hand_counted):
    expected = f"Unknown sweep id 'nope'; the known sweep ids are: {A}, {B}."
    for call in (
        lambda: terminal.diff_table(hand_counted, A, "nope"),
        lambda: report.render_report(hand_counted, "nope"),
        lambda: analysis.report_tables(hand_counted, "nope"),
    ):
        with pytest.raises(ValueError) as info:
            call()
        assert str(info.value) == expected


# --------------------------------------------------------------------------------------------
# a synthetic history, rendered for real

PLANTED_FAILURE = "planted failure: the operator 'aten::planted' is not implemented"


def _rewrite(path: Path, change) -> None:
    """Apply ``change`` to the records of one Parquet file, keeping the columns it had."""
    table = pq.read_table(path)
    records = [change(dict.fromkeys(schema.FIELDS) | r) for r in table.to_pylist()]
    out = schema.to_table(records).select(table.column_names)
    pq.write_table(out, path)


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> dict:
    """3 synthetic sweeps x 40 models, the first two written before tokens_in/tokens_out existed,
    with one newly failing and one newly passing model planted in the second."""
    data = tmp_path_factory.mktemp("synthetic")
    ids = synthetic.write_synthetic_history(data, 3, 40, seed=3, legacy_sweeps=2)
    rows = {
        s: {r["model_id"]: r for r in pq.read_table(data / "results" / f"sweep={s}").to_pylist()}
        for s in ids[:2]
    }
    both = sorted(set(rows[ids[0]]) & set(rows[ids[1]]))
    fail_now = next(
        m for m in both if rows[ids[0]][m]["status"] == PASS and rows[ids[1]][m]["status"] == PASS
    )
    pass_now = next(
        m for m in both if rows[ids[0]][m]["status"] != PASS and rows[ids[1]][m]["status"] != PASS
    )

    def plant(r):
        if r["model_id"] == fail_now:
            r.update(
                status=GEN,
                failure_stage="generate",
                error_type="NotImplementedError",
                error_message=PLANTED_FAILURE,
                traceback="Traceback\n" + PLANTED_FAILURE,
                failure_signature="NotImplementedError: planted failure",
            )
        elif r["model_id"] == pass_now:
            r.update(
                status=PASS,
                failure_stage=None,
                error_type=None,
                error_message=None,
                traceback=None,
                failure_signature=None,
            )
        return r

    _rewrite(next((data / "results" / f"sweep={ids[1]}").glob("*.parquet")), plant)
    return {"data": data, "ids": ids, "newly_failing": fail_now, "newly_passing": pass_now}


def _python_diff(data: Path, a: str, b: str) -> dict[str, set]:
    """An independent count of newly failing / newly passing models, in plain Python."""
    status = {
        s: {
            r["model_id"]: r["status"]
            for r in pq.read_table(data / "results" / f"sweep={s}").to_pylist()
        }
        for s in (a, b)
    }
    common = set(status[a]) & set(status[b])
    return {
        "newly failing": {m for m in common if status[a][m] == PASS and status[b][m] != PASS},
        "newly passing": {m for m in common if status[a][m] != PASS and status[b][m] == PASS},
    }


def test_diff_finds_the_planted_models(history):
    data, (s0, s1, _) = history["data"], history["ids"]
    diff = terminal.diff_table(data, s0, s1)
    found = {
        c: set(diff.filter(pl.col("change") == c)["model_id"])
        for c in ("newly failing", "newly passing")
    }
    assert found == _python_diff(data, s0, s1)
    assert history["newly_failing"] in found["newly failing"]
    assert history["newly_passing"] in found["newly passing"]
    assert history["newly_failing"] in terminal.format_diff(diff, s0, s1)


def test_synthetic_history_matches_a_plain_count(history):
    data, ids = history["data"], history["ids"]
    results = store.scan(data, "results")
    for sweep in ids:
        rows = pq.read_table(data / "results" / f"sweep={sweep}").to_pylist()
        counts = analysis.verdict_counts(results, sweep)
        assert dict(counts.select("status", "count").rows()) == {
            v: sum(r["status"] == v for r in rows) for v in schema.VERDICTS
        }
    legacy = pq.read_schema(next((data / "results" / f"sweep={ids[0]}").glob("*.parquet")))
    assert "tokens_in" not in legacy.names  # written as an older file really is
    assert analysis.token_stats(results, ids[0])["count"].to_list() == [0, 0, 0]
    assert analysis.token_stats(results, ids[2])["count"].to_list()[1] > 0


def test_explorer_history_decodes_to_the_data(history):
    """The page's run-length encoded history gives back every (model, sweep) verdict."""
    data = explorer.explorer_data(history["data"])
    truth = {}
    for config in store.CONFIGS:
        for r in (
            store.scan(history["data"], config)
            .select("model_id", "sweep_id", "status")
            .collect()
            .iter_rows()
        ):
            truth.setdefault((r[0], r[1]), r[2] or explorer.EXCLUDED)
    decoded = {}
    for model in data["models"]:
        h = model[2]
        for k in range(0, len(h), 3):
            for s in range(h[k], h[k] + h[k + 1]):
                decoded[(model[0], data["sweeps"][s][0])] = data["outcomes"][h[k + 2]][0]
    assert decoded == truth


def test_report_notebook_parameters():
    import papermill

    params = papermill.inspect_notebook(str(paths.notebook("report")))
    assert set(params) == {"sweep_id", "baseline_sweep_id", "data_dir"}
    assert all(p["inferred_type_name"] == "str" for p in params.values())


@pytest.fixture(scope="module")
def rendered(history) -> dict:
    """The report of the second (legacy, planted) sweep, rendered for real: papermill +
    nbconvert."""
    data, ids = history["data"], history["ids"]
    html_path = report.render_report(data, ids[1])
    return {**history, "html": html_path, "sweep": ids[1], "baseline": ids[0]}


def test_render_report_writes_self_contained_html(rendered):
    data, sweep = rendered["data"], rendered["sweep"]
    assert rendered["html"] == data / "reports" / f"{sweep}.html"
    executed = json.loads((data / "reports" / f"{sweep}.ipynb").read_text())
    assert (
        executed["metadata"]["papermill"]["parameters"]["baseline_sweep_id"] == rendered["baseline"]
    )
    text = rendered["html"].read_text()
    assert not re.search(r"<script[^>]*\ssrc=", text), "a script is loaded from elsewhere"
    assert not re.search(r"<(?:link|img|iframe)[^>]*\s(?:src|href)=[\"']?(?:https?:)?//", text)
    assert "vegaEmbed(" in text and text.count('class="ms-chart"') >= 8
    for term in (*schema.VERDICTS, *schema.STAGES):  # the legend explains every verdict and stage
        assert f"<code>{term}</code>" in text
    assert rendered["newly_failing"] in text and rendered["newly_passing"] in text
    # the legacy sweep's token table still renders: its tokens_in row counts 0 values (a table cell,
    # not the notebook's markdown that also names the column)
    assert re.search(r'<td>tokens_in</td><td class="num">0</td>', text)
    assert (data / "reports" / "index.html").is_file()


# --------------------------------------------------------------------------------------------
# the pages in a real browser, offline


@pytest.mark.browser
def test_report_charts_render_offline(browser, rendered):
    page, attempted, errors = offline_page(browser)
    page.goto(rendered["html"].as_uri())
    assert_charts_drawn(page, 8, timeout_ms=15000)
    assert page.locator(".ms-chart-error").count() == 0
    assert attempted == [] and errors == []
    page.close()


@pytest.mark.browser
def test_explorer_search_and_detail(browser, rendered):
    data = rendered["data"]
    all_ids = {
        m
        for c in store.CONFIGS
        for m in store.scan(data, c).select("model_id").collect()["model_id"]
    }
    fragment = rendered["newly_failing"].split("/")[1][:6]
    expected = sum(fragment in m for m in all_ids)
    assert 0 < expected < len(all_ids)

    page, attempted, errors = offline_page(browser)
    page.goto((data / "reports" / "index.html").as_uri())
    assert page.locator("#match-count").inner_text() == f"{len(all_ids)} models match"
    assert page.locator("#results tbody tr").count() == len(all_ids)
    page.locator("#search").press_sequentially(fragment, delay=10)
    page.wait_for_function(
        f"document.querySelector('#match-count').textContent.startsWith('{expected} ')"
    )
    assert page.locator("#results tbody tr").count() == expected

    # The planted model's latest run is the third sweep; pick its row and open the detail panel.
    page.locator("#search").fill(rendered["newly_failing"])
    page.wait_for_function("document.querySelector('#match-count').textContent.startsWith('1 ')")
    page.locator("#sweep-filter").select_option(label=rendered["sweep"])
    page.locator("#results tbody tr").first.click()
    detail = page.locator("#detail")
    detail.wait_for(state="visible", timeout=10000)  # the click's handler fills and shows the panel
    assert detail.is_visible()
    assert rendered["newly_failing"] in detail.locator("h2").inner_text()
    assert "import torch" in detail.locator(".repro").inner_text()
    assert rendered["newly_failing"] in detail.locator(".repro").inner_text()
    history = detail.locator("table.history")
    assert "FAIL(gen)" in history.inner_text()  # each sweep by name and date, its id on hover
    assert rendered["sweep"] in history.locator("td.sweep").evaluate_all(
        "tds => tds.map((td) => td.title)"
    )

    # Each model's latest verdict, counted in Python: the FAIL(gen) ones, and one's error in the
    # panel.
    latest = {}
    for sweep in rendered["ids"]:
        for c in store.CONFIGS:
            for m, st in (
                store.scan(data, c)
                .filter(pl.col("sweep_id") == sweep)
                .select("model_id", "status")
                .collect()
                .rows()
            ):
                latest[m] = st
    failing = sum(st == GEN for st in latest.values())
    assert failing > 0
    page.locator("#search").fill("")
    page.locator("#sweep-filter").select_option("")
    page.locator("#verdict-filter").select_option(GEN)
    page.wait_for_function(
        f"document.querySelector('#match-count').textContent.startsWith('{failing} ')"
    )
    assert page.locator("#results tbody tr").count() == failing
    page.locator("#results tbody tr").first.click()
    assert detail.locator(".error").inner_text().strip()
    assert attempted == [] and errors == []
    page.close()


def test_the_default_baseline_is_the_previous_sweep_of_the_same_name_and_device(tmp_path):
    """A CPU sweep's report compared against a pretend sweep of another list: every model a
    change."""

    def sweep(sweep_id: str, device: str) -> None:
        rows = [{**_rec(sweep_id, "org/m1", PASS), "device_type": device}]
        store.write_parquet(rows, tmp_path / "results" / f"sweep={sweep_id}" / "part-0.parquet")

    sweep("hand-20261201T000000Z", "cpu")
    sweep("hand-20261202T000000Z", "pretend")
    sweep("other-20261203T000000Z", "cpu")
    sweep("hand-20261204T000000Z", "cpu")
    assert report.previous_sweep(tmp_path, "hand-20261204T000000Z") == "hand-20261201T000000Z"
    assert report.previous_sweep(tmp_path, "other-20261203T000000Z") is None
    assert report.previous_sweep(tmp_path, "hand-20261202T000000Z") is None


def test_suspect_passes_are_counted_in_one_vocabulary():
    words = analysis.suspect_words(
        {analysis.DIVERGES: 2, analysis.NOT_FLUENT: 1, analysis.AGREES: 7}
    )
    assert words == "3 (2 diverge from the reference, 1 not fluent with no reference)"
