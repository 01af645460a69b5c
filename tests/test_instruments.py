"""What watches a probe while it runs (``probe.instruments``): the flight recorder's file, and
what a PASS costs the host (syncs and CPU fallbacks per decode token, counted by the pretend
backend where they happen).

The silent, late abort named by the flight recorder through a synchronous rerun is a real sweep's
row:
tests/test_pretend.py::test_a_silent_late_abort_names_its_operator_has_its_repro_script_and_is_the_stacks."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from model_support.probe.instruments import flight_recorder, host_cost
from model_support_pretend import CONFIG_VAR, PretendConfigError, parse


def test_the_flight_recorder_keeps_the_last_operators_in_a_file_in_order(tmp_path):
    """A ring of ``SLOTS`` operators, each with its tensor arguments' dtypes and shapes and its
    stage, read back by another reader (the runner) in the order they were dispatched, the last
    last; composites as their parts."""
    import torch

    path = tmp_path / flight_recorder.FLIGHT_FILE
    x = torch.ones(2, 3)
    recorder = flight_recorder.FlightRecorder(path, "cpu", {"blocking_env": {"X_BLOCKING": "1"}})
    with recorder:
        recorder.enter("generate")
        for _ in range(10):
            x = x + 1
            x = x.relu()
        torch.nn.functional.linear(x, torch.ones(4, 3, dtype=torch.float32))
    found = flight_recorder.read(path)
    assert found is not None and found["meta"] == {
        "blocking_env": {"X_BLOCKING": "1"},
        "device": "cpu",
    }
    assert found["recorded"] > flight_recorder.SLOTS and len(found["ops"]) == flight_recorder.SLOTS
    last = found["ops"][-1]
    # linear, decomposed
    assert last["op"] in ("aten::mm", "aten::addmm") and last["stage"] == "generate"
    assert "float32[2, 3]" in last["args"]
    names = [op["op"] for op in found["ops"]]
    relus = [i for i, name in enumerate(names) if name == "aten::relu" and i > 0]
    # in the order they were dispatched
    assert relus and all(names[i - 1] == "aten::add.Tensor" for i in relus)
    # x + 1: a Python number is no tensor argument
    assert found["ops"][relus[0] - 1]["args"] == "float32[2, 3]"
    assert flight_recorder.read(tmp_path / "none.bin") is None


def test_the_runners_crash_fields_say_how_the_operator_was_found(tmp_path):
    """Without a rerun: the last operator; with a synchronous rerun that died: its last operator,
    the first run's named in the note; a rerun that did not die: the last operator, and why it
    may be a later one."""
    import torch

    with flight_recorder.FlightRecorder(tmp_path / flight_recorder.FLIGHT_FILE, "cpu"):
        torch.ones(2).neg()
    assert flight_recorder.crash_fields(tmp_path, died=False) == {}
    assert flight_recorder.crash_fields(tmp_path, died=True)["crash_operator"] == "aten::neg"
    with flight_recorder.FlightRecorder(tmp_path / flight_recorder.RERUN_FILE, "cpu"):
        torch.ones(2).exp()
    outcome = tmp_path / f"{flight_recorder.RERUN_FILE}.json"
    outcome.write_text(json.dumps({"exit": -6, "blocking_env": {"X_BLOCKING": "1"}}))
    found = flight_recorder.crash_fields(tmp_path, died=True)
    assert (found["crash_operator"], found["crash_operator_args"]) == ("aten::exp", "float32[2]")
    assert found["crash_operator_note"].endswith(
        "(X_BLOCKING=1) died in; the first run's last operator was aten::neg"
    )
    outcome.write_text(json.dumps({"exit": 0, "blocking_env": {"X_BLOCKING": "1"}}))
    found = flight_recorder.crash_fields(tmp_path, died=True)
    assert (
        found["crash_operator"] == "aten::neg"
        and "ended with exit status 0 without dying" in found["crash_operator_note"]
    )
    # a compiled run that died had no recorder: it says why, never a guess
    compiled = flight_recorder.crash_fields(tmp_path / "compiled", died=True, mode="compile")
    assert compiled == {"crash_operator_note": flight_recorder.NOT_IN_COMPILE}
    assert flight_recorder.crash_fields(tmp_path / "compiled", died=True, mode="eager") == {}


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"crash_message": "no"}, "'crash_message' must be true or false"),
        ({"crash_after": -1}, "'crash_after' must be a whole number of operators >= 0"),
    ],
)
def test_the_pretend_crash_settings_are_checked(config, words):
    with pytest.raises(PretendConfigError, match=words):
        parse(json.dumps(config))


def test_a_stack_that_counts_nothing_reads_not_measured():
    from model_support.probe.devices import AcceleratorAdapter, Adapter

    assert host_cost.meter_for(Adapter("cpu"), "eager") == (None, "the CPU is the host")
    meter, why = host_cost.meter_for(AcceleratorAdapter("xpu"), "eager")
    assert meter is None and "keeps no counts" in why
    assert host_cost.not_measured(why)["host_cost_note"].startswith("not measured: the xpu adapter")


#: tiny-gpt2 (2 layers, gelu_new: one aten::tanh per layer) probed on the pretend device with
#: aten::tanh a CPU fallback: its record's host-cost fields.
HOST_COST = """
    import json
    from model_support.probe import run
    record = run.run_probe("data/models/tiny-gpt2", device="pretend", reference="none", judge=False, perf=False)
    print(json.dumps({k: record[k] for k in ("status", "tokens_out", *run.host_cost.FIELDS)}))
"""


def test_a_pass_counts_its_syncs_and_fallbacks_per_decode_token_where_they_happen():
    """Counted by the backend (its fallback's kernel, its copies out, its
    ``_local_scalar_dense``), token by token: each decode token of tiny-gpt2 runs aten::tanh on
    the CPU twice (one per layer) and syncs twice (GPT-2's forward asks whether the pad token is
    among its ids; generate's end-of-sequence check asks whether every sequence is done); the
    probe's own two per token (its timer's device sync, the copy of the token its streamer is
    handed) are the harness's. The prompt's prefill is apart: 8 forwards, 16 tanh calls in all."""
    config = {"fallback_ops": ["aten::tanh"]}
    env = {**__import__("os").environ, CONFIG_VAR: json.dumps(config)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(HOST_COST)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert (record["status"], record["tokens_out"]) == ("PASS", 8)
    assert record["fallback_ops"] == ["aten::tanh"] and record["fallback_op_calls"] == [16]
    assert record["fallback_calls_per_token"] == 2.0
    assert record["host_syncs_per_token"] == 2.0
    assert record["harness_syncs_per_token"] == 2.0
    assert record["prefill_host_syncs"] == 2
    assert record["host_cost_note"].startswith(
        "counted by the pretend backend over 7 decode tokens"
    )


def test_the_plan_weighs_a_fallback_as_work_after_its_steps():
    """A fallback blocks no verdict (no step), and is work still: by how many models call it,
    then their calls."""
    from model_support.ops.coverage import ModelOps
    from model_support.ops.plan import fallback_work

    def model(key, calls, fallback):
        return ModelOps(
            key,
            "PASS",
            "pretend",
            list(calls),
            None,
            list(calls.values()),
            "run",
            ops_fallback=fallback,
        )

    models = [
        model("a", {"aten::tanh": 16, "aten::mm": 40}, ["aten::tanh"]),
        model("b", {"aten::tanh": 4, "aten::erf": 90}, ["aten::tanh", "aten::erf"]),
        model("c", {"aten::mm": 8}, []),
    ]
    assert fallback_work(models) == [
        {"op": "aten::tanh", "models": ["a", "b"], "calls": 20},
        {"op": "aten::erf", "models": ["b"], "calls": 90},
    ]


#: tiny-gpt2 probed in compile mode on the CPU (inductor), whose adapter offers torch.profiler's CPU
#: activity; then again with an adapter that offers none (a stack without a profiler): the fields
#: each reads.
COMPILED = """
    import json
    from model_support.probe import devices, run
    from model_support.probe.instruments import profiled
    keys = ("status", "tokens_out", "ops_device_s", "ops_time_source", *profiled.FIELDS, *run.host_cost.FIELDS)
    for offered in (("cpu",), ()):
        devices.Adapter.profiler_activities = offered
        record = run.run_probe("data/models/tiny-gpt2", device="cpu", mode="compile", reference="none", judge=False,
                               perf=False)
        print(json.dumps({k: record[k] for k in keys}))
"""


def test_a_compiled_run_reads_its_operators_and_syncs_from_the_adapters_profiler():
    """No dispatch mode sees a compiled run: the CPU adapter's profiler does. tiny-gpt2's
    compiled generation calls aten operators around and inside its compiled graphs (frame 0
    compiled for the prefill, the first decode step, then dynamic shapes), each timed by its self
    time; it syncs once for the prefill and once per decode token (generate's end-of-sequence
    check, a ``_local_scalar_dense``), none of them the probe's own on the CPU. An adapter that
    offers no profiler reads "not measured", never a guess."""
    env = {**__import__("os").environ}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(COMPILED)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    read, unread = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    assert (read["status"], read["tokens_out"]) == ("PASS", 8)
    assert read["ops_time_source"].startswith(
        "torch.profiler (compiled: fused kernels counted as their graph"
    )
    assert read["ops_device_s"] is None  # no census: its operators are not the census's
    ops = read["profiled_ops"]
    assert "Torch-Compiled Region: 0/0" in ops and "aten::_local_scalar_dense" in ops
    assert len(ops) == len(read["profiled_ops_calls"]) == len(read["profiled_ops_s"])
    assert all(n > 0 for n in read["profiled_ops_calls"]) and all(
        s >= 0 for s in read["profiled_ops_s"]
    )
    assert not any(
        "dynamo" in op or "compile" in op.lower()
        for op in ops
        if not op.startswith("Torch-Compiled")
    )
    assert (
        read["host_syncs_per_token"],
        read["harness_syncs_per_token"],
        read["prefill_host_syncs"],
    ) == (1.0, 0.0, 1)
    assert read["fallback_calls_per_token"] is None  # a profiler does not tell a fallback
    assert read["host_cost_note"].startswith(
        "counted by torch.profiler in the compiled run over 7 decode tokens"
    )
    assert (
        unread["status"] == "PASS"
        and unread["profiled_ops"] is None
        and unread["host_syncs_per_token"] is None
    )
    assert unread["ops_time_source"] == (
        "not measured: no census in mode compile, and the cpu adapter offers no profiler for "
        "compiled runs"
    )
    assert unread["host_cost_note"] == "not measured: the CPU is the host"
