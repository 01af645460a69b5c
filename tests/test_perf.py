"""How fast, and did it get slower: the perf phase, the perf gate and the report's performance section, for real.

Three sweeps of three tiny models on the pretend device, one model at a time, into one data folder: two
fault-free (noise is not a regression, in either direction) and one whose ``aten::rsqrt`` is slowed, by several
times the noise two fault-free sweeps show on this shared host (the suite's other worker makes it large: a
slowdown sized at twice a quiet machine's noise passed and failed by turns under `make test`). RMSNorm models (tiny-llama, tiny-qwen2) call rsqrt in every layer,
LayerNorm models (tiny-gpt2) do not: the gate must fail on exactly the former, naming the operator.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO

CLI = [sys.executable, "-m", "model_support.cli"]
RMS_NORM, LAYER_NORM = ("tiny-llama", "tiny-qwen2"), ("tiny-gpt2",)
#: The gate's threshold here. This host is shared (the suite's other worker, other processes). The perf phase times
#: the pretend device on its own clock (its kernels' CPU time plus its stalls: ``PretendAdapter.perf_clock``), which
#: other processes do not move: two fault-free sweeps under `make test` now differ by up to ~11% (on the wall clock
#: they differed by 2x to 4x, their repeat ranges apart). The repro script that ``bisect --metric`` times still reads
#: the wall clock, so the module keeps a wide margin. The default 5% is for a quiet machine (bench/bench_perf.py).
THRESHOLD = "50%"
#: Seconds added to each rsqrt call: RMSNorm models call it twice per layer and once at the end of each step
#: (tiny-llama: 5 calls a step, so 5 ms a call adds 25 ms to a step of ~7 ms on the pretend device, census on: far
#: beyond the threshold even when the fault-free sweep ran under three times the load; tiny-gpt2 is untouched).
SLOW_RSQRT_S = 0.005
CLEAN = {"bandwidth_gbs": 10}
PROBE = {"device": "pretend", "reference": "none", "judge": False, "perf_tokens": 8, "perf_repeats": 3}


def cli(args: list, data, config: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "MODEL_SUPPORT_PRETEND": json.dumps(config or CLEAN), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*CLI, *args, "--data-dir", str(data)], capture_output=True, text=True, cwd=REPO, env=env)
    assert not check or done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def perf_sweeps(tmp_path_factory, fixture_models) -> dict:
    """Sweeps a and b (fault-free) and slow (rsqrt slowed), one after the other, one model at a time each, into
    one data folder."""
    import yaml

    from model_support.record import store

    tmp = tmp_path_factory.mktemp("perf")
    data = tmp / "data"
    models = [str(REPO / "data" / "models" / m) for m in (*RMS_NORM, *LAYER_NORM)]
    configs = {"a": CLEAN, "b": CLEAN, "slow": {**CLEAN, "slow_ops": {"aten::rsqrt": SLOW_RSQRT_S}}}
    for name, config in configs.items():
        definition = tmp / f"{name}.yaml"
        definition.write_text(yaml.safe_dump({"name": name, "probe": PROBE, "models": models, "workers": 1}))
        cli(["sweep", str(definition), "--no-report"], data, config)
    ids = {name: next(s for s in store.list_sweeps(data) if s.startswith(f"{name}-")) for name in configs}
    return {"data": data, "ids": ids, "records": {k: store.read_records(data, v) for k, v in ids.items()}}


def test_every_pass_is_timed_on_its_device_with_repeats_spread_and_bandwidth(perf_sweeps):
    for record in perf_sweeps["records"]["a"]:
        name = record["model_id"]
        assert record["status"] == "PASS", name
        assert len(record["tpot_s_repeats"]) == len(record["ttft_s_repeats"]) == 3, name
        assert min(record["tpot_s_repeats"]) <= record["tpot_s"] <= max(record["tpot_s_repeats"])
        assert record["tpot_spread"] >= 0 and record["perf_tokens_out"] == 8
        assert record["perf_first_call_s"] > record["ttft_s"] > 0 and record["perf_tokens_per_s"] > 0
        assert record["perf_peak_device_mem_mb"] > 0 and record["decode_bytes_per_token"] > 0
        assert 0 < record["bandwidth_utilisation"] < 1, name  # against the 10 GB/s the pretend device declares
        assert "against 10 GB/s (bandwidth_gbs in MODEL_SUPPORT_PRETEND)" in record["perf_note"]
        # the census timed each operator of the verdict's generation: one figure per operator
        assert len(record["ops_device_s"]) == len(record["ops"]) and sum(record["ops_device_s"]) > 0
        assert record["ops_time_source"].startswith("host clock")
        # the existing timings keep their meaning: the verdict's own generation
        assert record["first_token_s"] > 0 and record["tokens_out"] == 8
    slow = {r["model_id"].rsplit("/", 1)[-1].removeprefix("local:"): r for r in perf_sweeps["records"]["slow"]}
    rsqrt = {n: dict(zip(r["ops"], r["ops_device_s"])).get("aten::rsqrt") for n, r in slow.items()}
    assert all(rsqrt[n] > 8 * SLOW_RSQRT_S for n in RMS_NORM) and rsqrt["tiny-gpt2"] is None


def test_the_perf_gate_names_the_rmsnorm_models_and_rsqrt_and_not_the_layernorm_ones(perf_sweeps):
    data, ids = perf_sweeps["data"], perf_sweeps["ids"]
    done = cli(["diff", ids["a"], ids["slow"], "--fail-on", "perf", "--perf-threshold", THRESHOLD], data, check=False)
    slower = [line for line in done.stdout.splitlines() if line.startswith("slower: ")]
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    named = {line.split(": ")[1].split(" [")[0].rsplit("/", 1)[-1].removeprefix("local:") for line in slower}
    assert named == set(RMS_NORM), slower
    tpot = [line for line in slower if ": tpot_s " in line]
    assert len(tpot) == 2 and all("grew most: aten::rsqrt +" in line for line in tpot), slower
    assert "gate (perf): FAILED" in done.stdout


def test_two_fault_free_sweeps_pass_the_perf_gate_both_ways(perf_sweeps):
    data, ids = perf_sweeps["data"], perf_sweeps["ids"]
    for a, b in ((ids["a"], ids["b"]), (ids["b"], ids["a"])):
        done = cli(["diff", a, b, "--fail-on", "perf", "--perf-threshold", THRESHOLD], data, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        assert "perf: 3 run(s) timed in both sweeps" in done.stdout and "gate (perf): passed" in done.stdout


def test_the_threshold_is_one_sentence_when_wrong_and_loosens_the_gate(perf_sweeps):
    data, ids = perf_sweeps["data"], perf_sweeps["ids"]
    bad = cli(["diff", ids["a"], ids["b"], "--fail-on", "perf", "--perf-threshold", "fast"], data, check=False)
    assert bad.returncode == 2 and "--perf-threshold 'fast' is not a threshold" in bad.stderr
    alone = cli(["diff", ids["a"], ids["b"], "--perf-threshold", "5%"], data, check=False)
    assert alone.returncode == 2 and "--perf-threshold applies to --fail-on perf" in alone.stderr
    loose = cli(["diff", ids["a"], ids["slow"], "--fail-on", "perf", "--perf-threshold", "900%"], data, check=False)
    assert loose.returncode == 0, loose.stdout[-2000:]


def test_the_reports_performance_section_lists_every_pass_and_the_slower_ones(perf_sweeps, browser):
    from helpers import offline_page
    from model_support.analysis.report_tables import report_tables
    from model_support.render.layout import SECTIONS, Context, section_html

    data, ids = perf_sweeps["data"], perf_sweeps["ids"]
    (section,) = [s for s in SECTIONS if s.anchor == "performance"]  # the report's own section, as it renders it
    page_html = section_html(section, Context(report_tables(data, ids["slow"], ids["a"]), ids["slow"], ids["a"]))
    from helpers import assert_charts_drawn
    from model_support.render.charts import vega_script

    page, attempted, errors = offline_page(browser)
    page.set_content(f"<html><head>{vega_script()}</head><body>{page_html}</body></html>")  # the report's charts
    heading = page.locator("h2#performance")
    assert heading.count() == 1
    section = page.evaluate(
        """() => { const out = []; let el = document.querySelector('h2#performance').nextElementSibling;
        while (el && el.tagName !== 'H2') { out.push(el.innerText); el = el.nextElementSibling; } return out.join('\\n'); }"""
    )
    for record in perf_sweeps["records"]["slow"]:
        assert record["model_id"] in section
    slower = section.split("Slower than the baseline, beyond noise")[1].split("Faster than the baseline")[0]
    # the report compares at the default 5%, which a loaded host's noise can pass (a fault-free tiny-gpt2 read
    # +5.7% with its repeats apart in one run): the RMSNorm models must be there; the gate's test holds the rest
    assert all(m in slower for m in RMS_NORM)
    assert "aten::rsqrt" in section and "ms ±" in section
    assert_charts_drawn(page, 1)  # tokens/s against model size, drawn
    assert not attempted and not errors


def test_the_report_lists_the_passes_that_sync_more_than_once_per_token(perf_sweeps):
    """Counted by the pretend backend on every PASS: tiny-gpt2's forward asks whether its pad token is among its ids
    (a sync per token beyond generate's own end-of-sequence check), the RMSNorm models' do not; only it is listed."""
    from model_support.analysis.host_cost import host_cost_table

    data, ids = perf_sweeps["data"], perf_sweeps["ids"]
    syncs = {
        r["model_id"].rsplit("/", 1)[-1].removeprefix("local:"): r["host_syncs_per_token"]
        for r in perf_sweeps["records"]["a"]
    }
    assert syncs == {"tiny-llama": 1.0, "tiny-qwen2": 1.0, "tiny-gpt2": 2.0}
    assert {r["harness_syncs_per_token"] for r in perf_sweeps["records"]["a"]} == {2.0}
    table = host_cost_table(data, ids["a"])
    assert table["model_id"].str.ends_with("tiny-gpt2").to_list() == [True]
    assert table.row(0, named=True)["host_syncs_per_token"] == 2.0 and table.row(0, named=True)["fallbacks"] is None


def test_bisect_metric_names_the_backend_setting_that_slowed_a_model(perf_sweeps):
    """``bisect A SLOW --metric tpot``: the sweeps run the same packages and differ only in MODEL_SUPPORT_PRETEND
    (rsqrt slowed); end A's repro timing is the baseline, end B's is slower beyond the threshold with the repeats
    apart, and B's packages with A's setting are as A again: the setting is named, with the two medians."""
    from model_support.analysis import perf
    from model_support.bisect import results

    data, ids = perf_sweeps["data"], perf_sweeps["ids"]
    # the rows it bisects unasked: the perf gate's slower ones for that metric (the RMSNorm models)
    slower = perf.slower(data, ids["a"], ids["slow"], "tpot_s", perf.parse_threshold(THRESHOLD))
    assert {r["model_id"].removeprefix("local:") for r in slower} == set(RMS_NORM)
    bad = cli(["bisect", ids["a"], ids["slow"], "--perf-threshold", "5%"], data, check=False)
    assert bad.returncode == 2 and "--perf-threshold applies to --metric" in bad.stderr
    args = ["bisect", ids["a"], ids["slow"], "--metric", "tpot", "--perf-threshold", THRESHOLD, "--model", "tiny-llama"]
    done = cli(args, data)
    (line,) = done.stdout.splitlines()
    assert ": tpot_s " in line and "changed by a backend setting: MODEL_SUPPORT_PRETEND" in line, line
    (answer,) = results.read_answers(data, ids["slow"])
    assert answer["status"] == "a backend setting" and answer["metric"] == "tpot_s", answer
    assert "slow_ops" in answer["setting"][0]["after"] and "slow_ops" not in answer["setting"][0]["before"]
    steps = [(s["step"], s["ran"], s["verdict"], len(s["repeats"])) for s in answer["steps"]]
    assert steps == [
        ("end A", "PASS", "as A", 3),  # the sweep's perf_repeats (at least 3)
        ("end B", "PASS", "slower", 3),
        ("A's settings", "PASS", "as A", 3),
    ], answer["steps"]
    assert answer["after"] > 1.5 * answer["before"] and max(answer["steps"][0]["repeats"]) < min(
        answer["steps"][1]["repeats"]
    )
    assert results.changed_by(data, ids["slow"]) == {}  # a slowdown is not what changed a verdict
