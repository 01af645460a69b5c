"""The perf phase keeps a profiler trace where the adapter offers a profiler (``perf_trace``), for
real.

A sweep of tiny-gpt2 on the CPU, whose adapter offers torch.profiler's CPU activity (the pretend
device offers none: its adapter declares no ``profiler_activities``), with the perf phase on and
``perf_trace``: the probe profiles one generation after the timed ones, keeps its Chrome trace
beside its record, and the sweep's driver keeps it in the sweep's folder, where the record's
``perf_trace_path`` names it. On the pretend device no trace is kept and the note says why, the
timed figures unchanged.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap

import pytest

from helpers import REPO

PROBE = {
    "device": "cpu",
    "reference": "none",
    "judge": False,
    "perf": True,
    "perf_tokens": 4,
    "perf_repeats": 1,
    "perf_trace": True,
}
TIMED = ("ttft_s", "tpot_s", "perf_tokens_per_s", "perf_first_call_s")


@pytest.mark.slow
def test_a_sweep_keeps_the_perf_phases_profiler_trace_in_its_folder(tmp_path, fixture_models):
    import yaml

    from model_support.record import store

    data, definition = tmp_path / "data", tmp_path / "trace.yaml"
    model = str(REPO / "data" / "models" / "tiny-gpt2")
    definition.write_text(
        yaml.safe_dump({"name": "trace", "probe": PROBE, "models": [model], "workers": 1})
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "model_support.cli",
        "sweep",
        str(definition),
        "--no-report",
        "--data-dir",
    ]
    done = subprocess.run([*command, str(data)], capture_output=True, text=True, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    (sweep_id,) = store.list_sweeps(data)
    (record,) = store.read_records(data, sweep_id)
    assert record["status"] == "PASS" and all(record[k] > 0 for k in TIMED), record["perf_note"]
    relpath = record["perf_trace_path"]
    assert relpath.startswith(f"sweeps/{sweep_id}/traces/") and relpath.endswith(".json.gz"), (
        relpath
    )
    assert (
        f"one more generation profiled (cpu) after the timed ones: {relpath}" in record["perf_note"]
    )
    kept = (data / relpath).read_bytes()
    assert len(kept) < 200_000  # gzipped: a tiny model's trace stays small
    events = json.loads(gzip.decompress(kept))["traceEvents"]
    operators = {e["name"] for e in events if e.get("name", "").startswith("aten::")}
    # GPT-2: Conv1D, LayerNorm, sorted(operators)[:40]
    assert {"aten::addmm", "aten::layer_norm"} <= operators
    # only the sweep's copy is left
    assert not list((data / "sweeps" / sweep_id).glob(".work/*/traces"))


#: tiny-gpt2 on the pretend device, whose adapter offers no profiler: timed, no trace, and why.
PRETEND = """
    import json, sys
    from model_support.probe.run import run_probe
    record = run_probe("data/models/tiny-gpt2", record_path=sys.argv[1], **{**json.loads(sys.argv[2]), "device": "pretend"})
    print(json.dumps({k: record[k] for k in ("status", "perf_trace_path", "perf_note", *json.loads(sys.argv[3]))}))
"""


@pytest.mark.slow
def test_an_adapter_without_a_profiler_keeps_no_trace_and_says_why(tmp_path, fixture_models):
    env = {**os.environ, "MODEL_SUPPORT_PRETEND": '{"bandwidth_gbs": 10}'}
    args = [str(tmp_path / "record.json"), json.dumps(PROBE), json.dumps(TIMED)]
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PRETEND), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert record["status"] == "PASS" and all(record[k] > 0 for k in TIMED), record["perf_note"]
    assert record["perf_trace_path"] is None
    assert record["perf_note"].endswith(
        "; no profiler trace: the pretend adapter offers no profiler"
    )
    # no traces folder beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


def test_a_record_never_names_a_trace_that_was_not_kept(tmp_path):
    """A split sweep's device phase whose trace write failed: the record the runner stores names
    no file."""
    from model_support.record import store

    kept = tmp_path / "sweeps" / "s" / store.TRACES / ("0" * 64 + ".json.gz")
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"x")
    here = {"perf_trace_path": f"sweeps/s/{store.TRACES}/{kept.name}", "perf_note": "3 repeats"}
    assert store.trace_kept(tmp_path, here) == here
    gone = {**here, "perf_trace_path": f"sweeps/s/{store.TRACES}/{'1' * 64}.json.gz"}
    assert store.trace_kept(tmp_path, gone) == {
        "perf_trace_path": None,
        "perf_note": "3 repeats; the profiler trace was not kept",
    }
    assert store.trace_kept(tmp_path, {"perf_trace_path": None}) == {"perf_trace_path": None}
