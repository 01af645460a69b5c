"""How fast, and did it get slower: the perf phase, the perf gate and the report's performance
section, for real.

Four sweeps of three tiny models on the pretend device, one model at a time, into one data folder:
three fault-free (noise is not a regression: three comparisons, each passes the gate at its default
threshold) and one whose ``aten::rsqrt`` is slowed by about twice the noise two fault-free sweeps
can show. The pretend device times on its own clock (``model_support_pretend.clock``: a device's
timeline, each process's pace up to 2 ``clock_jitter`` spreads off, so two sweeps differ by up to
~4%), as the repro script that ``bisect --metric`` times does. RMSNorm models (tiny-llama,
tiny-qwen2) call rsqrt in every layer, LayerNorm models (tiny-gpt2) do not: the gate must fail on
exactly the former, naming the operator.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from helpers import REPO

CLI = [sys.executable, "-m", "model_support.cli"]
RMS_NORM, LAYER_NORM = ("tiny-llama", "tiny-qwen2"), ("tiny-gpt2",)
#: The pretend device's clock noise (its default ``clock_jitter``) and how far apart, at most, two
#: fault-free sweeps time the same work: 4 spreads (``clock.NOISE_BOUND``), 4%.
JITTER = 0.01
NOISE = 4 * JITTER
#: Seconds added to each rsqrt call on the device's clock: tiny-llama calls it 5 times a step (twice
#: per layer and once at the end), on a step of ~0.95 ms: +0.1 ms, about +10.5%, twice the noise;
#: tiny-gpt2 is untouched.
SLOW_RSQRT_S = 0.00002
CLEAN = {"bandwidth_gbs": 10, "clock_jitter": JITTER}
#: Three timed repeats of 8 tokens each, whatever their spread and cost (perf_spread and perf_budget
#: 0), beside the verdict's decode steps (the device's clock stamps its tokens too).
PROBE = {
    "device": "pretend",
    "reference": "none",
    "judge": False,
    "perf_tokens": 8,
    "perf_repeats": 3,
    "perf_spread": 0,
    "perf_budget": 0,
}
FAULT_FREE = ("a", "b", "c")


def cli(
    args: list, data, config: dict | None = None, check: bool = True
) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "MODEL_SUPPORT_PRETEND": json.dumps(config or CLEAN),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [*CLI, *args, "--data-dir", str(data)], capture_output=True, text=True, cwd=REPO, env=env
    )
    assert not check or done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def perf_sweeps(tmp_path_factory, fixture_models) -> dict:
    """Sweeps a, b and c (fault-free) and slow (rsqrt slowed), one after the other, one model at
    a time each, into one data folder."""
    import yaml

    from model_support.record import store

    tmp = tmp_path_factory.mktemp("perf")
    data = tmp / "data"
    models = [str(REPO / "data" / "models" / m) for m in (*RMS_NORM, *LAYER_NORM)]
    configs = {
        **dict.fromkeys(FAULT_FREE, CLEAN),
        "slow": {**CLEAN, "slow_ops": {"aten::rsqrt": SLOW_RSQRT_S}},
    }
    for name, config in configs.items():
        definition = tmp / f"{name}.yaml"
        definition.write_text(
            yaml.safe_dump({"name": name, "probe": PROBE, "models": models, "workers": 1})
        )
        cli(["sweep", str(definition), "--no-report"], data, config)
    ids = {
        name: next(s for s in store.list_sweeps(data) if s.startswith(f"{name}-"))
        for name in configs
    }
    return {
        "data": data,
        "ids": ids,
        "records": {k: store.read_records(data, v) for k, v in ids.items()},
    }


def test_every_pass_is_timed_on_its_device_with_repeats_spread_and_bandwidth(perf_sweeps):
    for record in perf_sweeps["records"]["a"]:
        name = record["model_id"]
        assert record["status"] == "PASS", name
        # TPOT's samples: each generation's median step, the verdict's (its first step left out) and
        # the three repeats'
        assert len(record["ttft_s_repeats"]) == 3 and len(record["tpot_s_repeats"]) == 4, name
        assert record["perf_repeats_run"] == 3 and record["perf_stop"] == "cap", name
        assert record["perf_note"].startswith(
            "3 repeats of 8 tokens; TPOT from the verdict's decode steps"
        ), name
        assert min(record["tpot_s_repeats"]) <= record["tpot_s"] <= max(record["tpot_s_repeats"])
        assert record["tpot_spread"] >= 0 and record["perf_tokens_out"] == 8
        assert (
            record["perf_first_call_s"] > record["ttft_s"] > 0 and record["perf_tokens_per_s"] > 0
        )
        assert record["perf_peak_device_mem_mb"] > 0 and record["decode_bytes_per_token"] > 0
        # against the 10 GB/s the pretend device declares
        assert 0 < record["bandwidth_utilisation"] < 1, name
        assert "against 10 GB/s (bandwidth_gbs in MODEL_SUPPORT_PRETEND)" in record["perf_note"]
        # the census timed each operator of the verdict's generation: one figure per operator
        assert len(record["ops_device_s"]) == len(record["ops"]) and sum(record["ops_device_s"]) > 0
        assert record["ops_time_source"].startswith("the device's own clock")
        assert "on the device's own clock" in record["perf_note"]
        # the existing timings keep their meaning: the verdict's own generation
        assert record["first_token_s"] > 0 and record["tokens_out"] == 8
    slow = {
        r["model_id"].rsplit("/", 1)[-1].removeprefix("local:"): r
        for r in perf_sweeps["records"]["slow"]
    }
    rsqrt = {n: dict(zip(r["ops"], r["ops_device_s"])).get("aten::rsqrt") for n, r in slow.items()}
    # 8 steps x 5
    assert all(rsqrt[n] > 8 * 5 * SLOW_RSQRT_S for n in RMS_NORM) and rsqrt["tiny-gpt2"] is None


def short(model_id: str) -> str:
    return model_id.rsplit("/", 1)[-1].removeprefix("local:")


def tpot(records: list) -> dict:
    return {short(r["model_id"]): r["tpot_s"] for r in records}


def test_the_perf_gate_names_the_rmsnorm_models_and_rsqrt_and_not_the_layernorm_ones(perf_sweeps):
    data, ids = perf_sweeps["data"], perf_sweeps["ids"]
    # the default 5%
    done = cli(["diff", ids["a"], ids["slow"], "--fail-on", "perf"], data, check=False)
    slower = [line for line in done.stdout.splitlines() if line.startswith("slower: ")]
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    named = {
        line.split(": ")[1].split(" [")[0].rsplit("/", 1)[-1].removeprefix("local:")
        for line in slower
    }
    assert named == set(RMS_NORM), slower
    tpot = [line for line in slower if ": tpot_s " in line]
    assert len(tpot) == 2 and all("grew most: aten::rsqrt +" in line for line in tpot), slower
    assert "gate (perf): FAILED" in done.stdout


def test_the_slowdown_is_about_twice_the_noise_and_fault_free_sweeps_pass_three_times(perf_sweeps):
    """Noise is not a regression: the fault-free sweeps compared in turn (a-b, b-c, c-a) pass the
    gate at its default threshold three times in a row; the slowdown the gate catches is about
    twice what they differ by at most."""
    data, ids, records = perf_sweeps["data"], perf_sweeps["ids"], perf_sweeps["records"]
    apart = [
        abs(tpot(records[y])[m] / tpot(records[x])[m] - 1)
        for x, y in zip(FAULT_FREE, FAULT_FREE[1:] + ("a",))
        for m in tpot(records[x])
    ]
    assert max(apart) < NOISE * 1.1, apart  # the clock's bound, and the per-kernel noise on top
    slowed = {m: tpot(records["slow"])[m] / tpot(records["a"])[m] - 1 for m in RMS_NORM}
    assert all(1.25 * NOISE < change < 4 * NOISE for change in slowed.values()), (
        slowed,
        max(apart),
    )
    for x, y in zip(FAULT_FREE, FAULT_FREE[1:] + ("a",)):
        done = cli(["diff", ids[x], ids[y], "--fail-on", "perf"], data, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        assert (
            "perf: 3 run(s) timed alike in both sweeps" in done.stdout
            and "gate (perf): passed" in done.stdout
        )


def test_the_threshold_is_one_sentence_when_wrong_and_loosens_the_gate(perf_sweeps):
    data, ids = perf_sweeps["data"], perf_sweeps["ids"]
    bad = cli(
        ["diff", ids["a"], ids["b"], "--fail-on", "perf", "--perf-threshold", "fast"],
        data,
        check=False,
    )
    assert bad.returncode == 2 and "--perf-threshold 'fast' is not a threshold" in bad.stderr
    alone = cli(["diff", ids["a"], ids["b"], "--perf-threshold", "5%"], data, check=False)
    assert alone.returncode == 2 and "--perf-threshold applies to --fail-on perf" in alone.stderr
    loose = cli(
        ["diff", ids["a"], ids["slow"], "--fail-on", "perf", "--perf-threshold", "50%"],
        data,
        check=False,
    )
    assert loose.returncode == 0, loose.stdout[-2000:]


def test_the_reports_performance_section_lists_every_pass_and_the_slower_ones(perf_sweeps, browser):
    from helpers import offline_page
    from model_support.analysis.report_tables import report_tables
    from model_support.render.layout import SECTIONS, Context, section_html

    data, ids = perf_sweeps["data"], perf_sweeps["ids"]
    # the report's own section, as it renders it
    (section,) = [s for s in SECTIONS if s.anchor == "performance"]
    page_html = section_html(
        section, Context(report_tables(data, ids["slow"], ids["a"]), ids["slow"], ids["a"])
    )
    from helpers import assert_charts_drawn
    from model_support.render.charts import vega_script

    page, attempted, errors = offline_page(browser)
    # the report's charts
    page.set_content(f"<html><head>{vega_script()}</head><body>{page_html}</body></html>")
    heading = page.locator("h2#performance")
    assert heading.count() == 1
    section = page.evaluate(
        """() => { const out = []; let el = document.querySelector('h2#performance').nextElementSibling;
        while (el && el.tagName !== 'H2') { out.push(el.innerText); el = el.nextElementSibling; } return out.join('\\n'); }"""
    )
    for record in perf_sweeps["records"]["slow"]:
        assert record["model_id"] in section
    slower = section.split("Slower than the baseline, beyond noise")[1].split(
        "Faster than the baseline"
    )[0]
    # the report compares at the gate's default 5%: the RMSNorm models, and not the LayerNorm one
    assert all(m in slower for m in RMS_NORM) and not any(m in slower for m in LAYER_NORM), slower
    assert "aten::rsqrt" in section and "ms ±" in section
    # the change as the terminal says it, never a raw ratio
    assert re.search(r"\+\d+\.\d%", slower), slower
    assert_charts_drawn(page, 1)  # tokens/s against model size, drawn
    assert not attempted and not errors


def test_the_report_lists_the_passes_that_sync_more_than_once_per_token(perf_sweeps):
    """Counted by the pretend backend on every PASS: tiny-gpt2's forward asks whether its pad
    token is among its ids (a sync per token beyond generate's own end-of-sequence check), the
    RMSNorm models' do not; only it is listed."""
    from model_support.analysis.host_cost_rows import host_cost_table

    data, ids = perf_sweeps["data"], perf_sweeps["ids"]
    syncs = {
        r["model_id"].rsplit("/", 1)[-1].removeprefix("local:"): r["host_syncs_per_token"]
        for r in perf_sweeps["records"]["a"]
    }
    assert syncs == {"tiny-llama": 1.0, "tiny-qwen2": 1.0, "tiny-gpt2": 2.0}
    assert {r["harness_syncs_per_token"] for r in perf_sweeps["records"]["a"]} == {2.0}
    table = host_cost_table(data, ids["a"])
    assert table["model_id"].str.ends_with("tiny-gpt2").to_list() == [True]
    assert (
        table.row(0, named=True)["host_syncs_per_token"] == 2.0
        and table.row(0, named=True)["fallbacks"] is None
    )


def test_bisect_metric_names_the_backend_setting_that_slowed_a_model(perf_sweeps):
    """``bisect A SLOW --metric tpot``: the sweeps run the same packages and differ only in
    MODEL_SUPPORT_PRETEND (rsqrt slowed); end A's repro timing is the baseline, end B's is slower
    beyond the threshold with the repeats apart, and B's packages with A's setting are as A
    again: the setting is named, with the two medians."""
    from model_support.analysis import perf
    from model_support.bisect import results

    data, ids = perf_sweeps["data"], perf_sweeps["ids"]
    # the rows it bisects unasked: the perf gate's slower ones for that metric (the RMSNorm models)
    slower = perf.slower(data, ids["a"], ids["slow"], "tpot_s", perf.DEFAULT_THRESHOLD)
    assert {r["model_id"].removeprefix("local:") for r in slower} == set(RMS_NORM)
    bad = cli(["bisect", ids["a"], ids["slow"], "--perf-threshold", "5%"], data, check=False)
    assert bad.returncode == 2 and "--perf-threshold applies to --metric" in bad.stderr
    # the default 5%
    args = ["bisect", ids["a"], ids["slow"], "--metric", "tpot", "--model", "tiny-llama"]
    done = cli(args, data)
    (line,) = done.stdout.splitlines()
    assert ": tpot_s " in line and "changed by a backend setting: MODEL_SUPPORT_PRETEND" in line, (
        line
    )
    (answer,) = results.read_answers(data, ids["slow"])
    assert answer["status"] == "a backend setting" and answer["metric"] == "tpot_s", answer
    assert (
        "slow_ops" in answer["setting"][0]["after"]
        and "slow_ops" not in answer["setting"][0]["before"]
    )
    steps = [(s["step"], s["ran"], s["verdict"], len(s["repeats"])) for s in answer["steps"]]
    assert steps == [
        ("end A", "PASS", "as A", 3),  # the sweep's perf_repeats (at least 3)
        ("end B", "PASS", "slower", 3),
        ("A's settings", "PASS", "as A", 3),
    ], answer["steps"]
    assert answer["after"] > 1.05 * answer["before"] and max(answer["steps"][0]["repeats"]) < min(
        answer["steps"][1]["repeats"]
    )
    assert results.changed_by(data, ids["slow"]) == {}  # a slowdown is not what changed a verdict


def test_the_explorer_shows_a_models_tokens_per_s_across_sweeps(perf_sweeps, browser, tmp_path):
    """Issue 37: the explorer's detail panel shows a model's tokens/s in each sweep's history
    row, as its record says to 3 significant figures, with TPOT and a sparkline; a run not timed
    shows none (never 0), and an entry never timed has no speed figures in the page data at all."""
    from helpers import offline_page
    from model_support.record import schema, store
    from model_support.record.sweep_meta import ModelEntry, SweepMeta
    from model_support.render import explorer, explorer_speed

    def speeds(page, search: str) -> dict:
        """{sweep id: (tokens/s, TPOT) as the open panel's history shows them}."""
        # the list follows after a short pause: wait for its one row
        page.locator("#search").fill(search)
        rows = "document.querySelectorAll('#results tbody td.model')"
        page.wait_for_function(f"{rows}.length === 1 && {rows}[0].textContent.includes({search!r})")
        page.locator("#results tbody tr").first.click()
        assert search in page.locator("#detail h2").inner_text()
        rows = page.locator("#detail table.history tbody tr:not(.h-signature)").evaluate_all(
            """trs => trs.map((tr) => [tr.querySelector('td.sweep').title,
                (tr.querySelector('td.speed') || {}).innerText ?? null,
                (tr.querySelector('td.speed .tps') || {}).textContent ?? null,
                (tr.querySelector('td.speed .tpot') || {}).textContent ?? null])"""
        )
        return {sweep: (cell, tps, tpot) for sweep, cell, tps, tpot in rows}

    three = lambda x: float(f"{x:.3g}")  # noqa: E731
    page, attempted, errors = offline_page(browser)
    page.goto(explorer.build_explorer(perf_sweeps["data"]).as_uri())
    shown = speeds(page, "tiny-llama")
    assert set(shown) == set(perf_sweeps["ids"].values())
    for name, sweep_id in perf_sweeps["ids"].items():
        (llama,) = [r for r in perf_sweeps["records"][name] if r["model_id"].endswith("tiny-llama")]
        _, tps, tpot = shown[sweep_id]
        assert float(tps) == three(llama["perf_tokens_per_s"]) > 0, (
            name,
            tps,
            llama["perf_tokens_per_s"],
        )
        assert float(tpot.removesuffix(" ms")) == three(llama["tpot_s"] * 1000), (
            name,
            tpot,
            llama["tpot_s"],
        )
    assert page.locator("#detail svg.spark circle").count() == len(perf_sweeps["ids"])
    assert (
        f"across {len(perf_sweeps['ids'])} timed sweeps on pretend"
        in page.locator("#detail p.speed-line").inner_text()
    )

    # A model timed, then a PASS not timed, then timed again; another that always fails (never
    # timed).
    hand = tmp_path / "data"
    for day, timed in ((1, True), (2, False), (3, True)):
        sweep_id = f"hand-2026120{day}T000000Z"
        models = [ModelEntry("org/timed"), ModelEntry("org/broken")]
        at = f"2026-12-0{day}T00:00:00+00:00"
        meta = SweepMeta(
            sweep_id=sweep_id,
            name="hand",
            created_at=at,
            probe={"device": "pretend"},
            models=models,
        )
        meta.write(store.sweep_dir(hand, sweep_id))
        perf = {
            "perf_tokens_per_s": 10.0 * day,
            "perf_tokens_per_s_repeats": [9.0 * day, 10.0 * day, 11.0 * day],
        }
        perf = {**perf, "tpot_s": 0.05 / day} if timed else {}
        records = [
            schema.empty_record(
                sweep_id=sweep_id, model_id="org/timed", status=schema.PASS, **perf
            ),
            schema.empty_record(
                sweep_id=sweep_id,
                model_id="org/broken",
                status=schema.FAIL_OTHER,
                failure_stage="generate",
            ),
        ]
        for record in records:
            store.store_result(hand, sweep_id, record, None, "log\n")
        store.compact(hand, sweep_id)
    data = explorer.explorer_data(hand)
    names = [m[0] for m in data["models"]]
    speed = {
        names[i]: (first, explorer_speed.decode(codes))
        for i, first, codes in data["speed"]["entries"]
    }
    assert set(speed) == {"org/timed"}  # org/broken: no speed figures at all
    # tokens/s, spread (max - min) / median in %, TPOT in ms per sweep; the untimed sweep between:
    # none, not 0
    assert speed["org/timed"] == (0, [(10.0, 20.0, 50.0), None, (30.0, 20.0, 16.7)])
    page.goto(explorer.build_explorer(hand).as_uri())
    shown = speeds(page, "org/timed")
    assert [shown[f"hand-2026120{day}T000000Z"][1:] for day in (1, 2, 3)] == [
        ("10", "50 ms"),
        (None, None),
        ("30", "16.7 ms"),
    ]
    assert shown["hand-20261202T000000Z"][0] == "not timed"
    shown = speeds(page, "org/broken")
    assert page.locator("#detail th.h-speed").count() == 0 and all(
        v == (None, None, None) for v in shown.values()
    )
    assert attempted == [] and errors == []
    page.close()
