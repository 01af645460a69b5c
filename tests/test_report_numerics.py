"""Is a PASS right? The PASS split as the report, the diff and the explorer show it.

A small history built by hand, every number counted by hand: sweep A, then sweep B in which one
model's logits newly diverge from the reference (newly suspect), one that could only be judged is
newly not fluent (newly suspect), one that diverged agrees again (no longer suspect), and one that
failed passes but diverges (newly suspect, not merely newly passing), and one whose reference was
too flat to judge is left to the judge, who finds it not fluent (newly suspect, with no step: a too
flat step is no divergence). Each check names the measure that judged it: the logit error, the KL
and flip margin alone on a row from before it, the judge. An older file without the check's columns
reads as unchecked. The report is rendered for real and the explorer opened in Chromium with the
network refused.
"""

from __future__ import annotations

import re

import polars as pl
import pyarrow.parquet as pq
import pytest

from helpers import offline_page, wait_count
from model_support import analysis
from model_support.analysis import tables
from model_support.record import schema, store
from model_support.render import report, terminal

PASS, LOAD, GEN, OTHER = schema.VERDICTS
OLD = "chk-20261130T000000Z-0000"
A = "chk-20261201T000000Z-aaaa"
B = "chk-20261202T000000Z-bbbb"
SIG = "NotImplementedError: The operator <name> is not currently implemented for the tpu device."
MATCH = {
    "numerics": "match",
    "numerics_note": "all 8 steps agree; largest KL 0.001 nats",
    "numerics_measure": "logit error",
    "fluent": False,
}
#: A row from before ``numerics_measure``: its check was judged by the KL and the flip margin alone.
TIES = {
    "numerics": "ties",
    "numerics_step": 5,
    "numerics_note": "1 of 8 steps flip at a near-tie",
    "fluent": True,
}
DIVERGES = {
    "numerics": "diverges",
    "numerics_step": 3,
    "numerics_note": "step 3 of 8: KL 2.1 nats",
    "numerics_measure": "KL",
    "fluent": True,
}
TOO_FLAT = {
    "numerics": "too flat",
    "numerics_step": 0,
    "numerics_note": "8 of 8 steps too flat to judge",
    "numerics_measure": "KL",
    "fluent": False,
    "fluency_score": -9.0,
    "fluency_note": "junk",
}
FLUENT = {
    "fluent": True,
    "fluency_score": -2.5,
    "numerics_note": "no reference: skipped",
    "fluency_note": "fluent",
}
NOT_FLUENT = {
    "fluent": False,
    "fluency_score": -9.0,
    "numerics_note": "no reference: skipped",
    "fluency_note": "junk",
}
#: model -> (check in A, check in B); a check is a dict of record fields, or "fail".
MODELS = {
    "org/c1": (MATCH, MATCH),
    "org/c2": (MATCH, DIVERGES),  # newly suspect: the stack now computes wrong numbers
    "org/c3": (FLUENT, NOT_FLUENT),  # newly suspect: no reference, the text went bad
    "org/c4": (DIVERGES, TIES),  # no longer suspect
    "org/c5": ("fail", DIVERGES),  # failed before, passes now, but diverges: newly suspect
    "org/c6": (TIES, TIES),
    "org/c7": ({}, {}),  # neither the reference nor the judge said anything: unchecked
    # newly suspect: the reference could not judge, the judge finds it not fluent
    "org/c8": (MATCH, TOO_FLAT),
}


def _record(sweep: str, model: str, check, **extra) -> dict:
    failing = check == "fail"
    return schema.empty_record(
        sweep_id=sweep,
        model_id=model,
        status=GEN if failing else PASS,
        failure_stage="generate" if failing else None,
        failure_signature=SIG if failing else None,
        attribution="stack" if failing else None,
        generated_text=None if failing else f"text of {model}",
        device_type="tpu",
        started_at=f"2026-12-0{sweep[10]}T01:00:00+00:00",
        versions={"torch": "2.13.0", "torch_tpu": "0.2.0", "transformers": "5.24.0"},
        **({} if failing else check),
        **extra,
    )


@pytest.fixture(scope="module")
def checks_data(tmp_path_factory):
    data = tmp_path_factory.mktemp("checks")
    for k, sweep in enumerate((A, B)):
        rows = [_record(sweep, m, spec[k]) for m, spec in MODELS.items()]
        store.write_parquet(rows, store.parquet_file(data, "results", sweep))
    # an older sweep, written before the checks existed: its file lacks their columns
    old = schema.to_table([_record(OLD, "org/c1", {})]).drop_columns(list(schema.NUMERICS_FIELDS))
    path = store.parquet_file(data, "results", OLD)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(old, path)
    return data


def test_the_passes_split_by_their_check_suspect_first(checks_data):
    results = store.scan(checks_data, "results")
    assert analysis.pass_checks(results, B).select("check", "suspect", "count").rows() == [
        ("diverges", True, 2),
        ("no reference, not fluent", True, 2),
        ("agrees within ties", False, 2),
        ("agrees", False, 1),
        ("no reference, fluent", False, 0),
        ("unchecked", False, 1),
    ]
    suspect = analysis.suspect_passes(results, B)
    assert suspect.select("model_id", "check", "measure", "step").rows() == [
        ("org/c2", "diverges", "KL", 3),
        ("org/c5", "diverges", "KL", 3),
        ("org/c3", "no reference, not fluent", "fluency judge", None),
        ("org/c8", "no reference, not fluent", "fluency judge (reference too flat)", None),
    ]
    assert suspect["note"].to_list() == [
        "step 3 of 8: KL 2.1 nats",
        "step 3 of 8: KL 2.1 nats",
        "junk",
        # why the reference could not judge, then the judge's word
        "8 of 8 steps too flat to judge; junk",
    ]
    measures = dict(tables.model_rows(results, B).select("model_id", "check_measure").rows())
    assert measures == {
        "org/c1": "logit error",
        "org/c2": "KL",
        "org/c3": "fluency judge",
        "org/c4": "KL + flip margin",  # a row from before the logit error
        "org/c5": "KL",
        "org/c6": "KL + flip margin",
        "org/c7": None,
        "org/c8": "fluency judge (reference too flat)",
    }
    # the older file reads as unchecked, never as an error
    assert analysis.pass_checks(results, OLD).filter(pl.col("count") > 0).rows() == [
        ("unchecked", False, 1, 1.0)
    ]


def test_the_diff_says_newly_suspect_right_after_what_the_stack_broke(checks_data):
    diff = terminal.diff_table(checks_data, A, B)
    rows = diff.select("model_id", "change", "check_after", "suspect_step").rows()
    assert [(m, str(c), k, s) for m, c, k, s in rows] == [
        ("org/c2", "newly suspect", "diverges", 3),
        ("org/c3", "newly suspect", "no reference, not fluent", None),
        ("org/c5", "newly suspect", "diverges", 3),
        ("org/c8", "newly suspect", "no reference, not fluent", None),
        ("org/c4", "no longer suspect", "agrees within ties", None),
    ]
    assert list(analysis.CHANGES)[:2] == ["newly broken by the stack", "newly suspect"]
    text = terminal.format_diff(checks_data, A, B)
    line = next(x for x in text.splitlines() if "org/c2" in x)
    assert "newly suspect" in line and "diverges: step 3 of 8" in line
    assert "4 newly suspect" in text and "1 no longer suspect" in text


@pytest.fixture(scope="module")
def checks_report(checks_data):
    path = report.render_report(checks_data, B, A)
    return {"data": checks_data, "html": path, "text": path.read_text()}


def test_the_report_lists_suspect_passes_first_with_their_step(checks_report):
    text = checks_report["text"]
    assert re.search(
        r"<dt>suspect passes</dt><dd>4 \(2 diverge from the reference, 2 not fluent", text
    )
    order = [
        "Changes since the baseline",
        "Whose failures",
        "Is a PASS right?",
        "Failure signatures",
    ]
    positions = [text.index(f">{h}<") for h in order]
    assert positions == sorted(positions)
    section = text[positions[2] : positions[3]]
    lead = re.sub(r"<[^>]+>", "", re.search(r'<p class="ms-lead">(.*?)</p>', section).group(1))
    assert lead.startswith(
        "8 passes: 4 suspect (2 diverge from the reference, 2 with no reference are not fluent)"
    )
    listed = section[section.index("Suspect passes") : section.index("All passes")]
    assert (
        listed.index("org/c2")
        < listed.index("org/c5")
        < listed.index("org/c3")
        < listed.index("org/c8")
    )
    assert "diverges at step" in listed and "step 3 of 8: KL 2.1 nats" in listed
    assert "judged by" in listed and "fluency judge (reference too flat)" in listed
    # the per-run table: each check with the measure that judged it
    assert "agrees (logit error)" in text and "agrees within ties (KL + flip margin)" in text
    assert "diverges at step 3 (KL)" in text
    changes = text[positions[0] : positions[1]]
    assert changes.index("newly suspect (4)") < changes.index("no longer suspect (1)")
    assert "Is a PASS right? (what its check says)" in text  # the legend explains every kind


@pytest.mark.browser
def test_explorer_filters_suspect_passes(browser, checks_report):
    page, attempted, errors = offline_page(browser)
    page.goto((checks_report["data"] / "reports" / "index.html").as_uri())
    wait_count(page, 8)
    page.locator("#check-filter").select_option("suspect")
    wait_count(page, 4)
    rows = page.locator("#results tbody tr")
    listed = dict(
        zip(
            rows.locator("td:first-child").all_inner_texts(),
            rows.locator("td.check").all_inner_texts(),
        )
    )
    assert listed == {
        "org/c2": "diverges at step 3",
        "org/c3": "no reference, not fluent",
        "org/c5": "diverges at step 3",
        "org/c8": "no reference, not fluent",  # a too flat reference's step is no divergence
    }
    page.locator("#check-filter").select_option("agrees within ties")
    wait_count(page, 2)
    page.locator("#check-filter").select_option("suspect")
    page.locator("#sweep-filter").select_option(label=A)  # in A only c4 was suspect
    wait_count(page, 1)
    page.locator("#sweep-filter").select_option("")
    page.locator("#check-filter").select_option("diverges")
    wait_count(page, 2)
    page.locator("#results tbody tr").first.click()
    check = page.locator("#detail dd.check")
    assert (
        "diverges at step 3" in check.inner_text()
        and "step 3 of 8: KL 2.1 nats" in check.inner_text()
    )
    assert attempted == [] and errors == []
    page.close()
