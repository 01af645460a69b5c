"""What watches a probe while it runs (``probe.instruments``): the flight recorder's file, and what a PASS costs
the host (syncs and CPU fallbacks per decode token, counted by the pretend backend where they happen).

The silent, late abort named by the flight recorder through a synchronous rerun is a real sweep's row:
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
    """A ring of ``SLOTS`` operators, each with its tensor arguments' dtypes and shapes and its stage, read back by
    another reader (the runner) in the order they were dispatched, the last last; composites as their parts."""
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
    assert found is not None and found["meta"] == {"blocking_env": {"X_BLOCKING": "1"}, "device": "cpu"}
    assert found["recorded"] > flight_recorder.SLOTS and len(found["ops"]) == flight_recorder.SLOTS
    last = found["ops"][-1]
    assert last["op"] in ("aten::mm", "aten::addmm") and last["stage"] == "generate"  # linear, decomposed
    assert "float32[2, 3]" in last["args"]
    names = [op["op"] for op in found["ops"]]
    relus = [i for i, name in enumerate(names) if name == "aten::relu" and i > 0]
    assert relus and all(names[i - 1] == "aten::add.Tensor" for i in relus)  # in the order they were dispatched
    assert found["ops"][relus[0] - 1]["args"] == "float32[2, 3]"  # x + 1: a Python number is no tensor argument
    assert flight_recorder.read(tmp_path / "none.bin") is None


def test_the_runners_crash_fields_say_how_the_operator_was_found(tmp_path):
    """Without a rerun: the last operator; with a synchronous rerun that died: its last operator, the first run's
    named in the note; a rerun that did not die: the last operator, and why it may be a later one."""
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
    assert found["crash_operator_note"].endswith("(X_BLOCKING=1) died in; the first run's last operator was aten::neg")
    outcome.write_text(json.dumps({"exit": 0, "blocking_env": {"X_BLOCKING": "1"}}))
    found = flight_recorder.crash_fields(tmp_path, died=True)
    assert (
        found["crash_operator"] == "aten::neg"
        and "ended with exit status 0 without dying" in found["crash_operator_note"]
    )


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


#: tiny-gpt2 (2 layers, gelu_new: one aten::tanh per layer) probed on the pretend device with aten::tanh a CPU
#: fallback: its record's host-cost fields.
HOST_COST = """
    import json
    from model_support.probe import run
    record = run.run_probe("data/models/tiny-gpt2", device="pretend", reference="none", judge=False, perf=False)
    print(json.dumps({k: record[k] for k in ("status", "tokens_out", *run.host_cost.FIELDS)}))
"""


def test_a_pass_counts_its_syncs_and_fallbacks_per_decode_token_where_they_happen():
    """Counted by the backend (its fallback's kernel, its copies out, its ``_local_scalar_dense``), token by token:
    each decode token of tiny-gpt2 runs aten::tanh on the CPU twice (one per layer) and syncs twice (GPT-2's
    forward asks whether the pad token is among its ids; generate's end-of-sequence check asks whether every
    sequence is done); the probe's own two per token (its timer's device sync, the copy of the token its streamer
    is handed) are the harness's. The prompt's prefill is apart: 8 forwards, 16 tanh calls in all."""
    config = {"fallback_ops": ["aten::tanh"]}
    env = {**__import__("os").environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", CONFIG_VAR: json.dumps(config)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(HOST_COST)], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert (record["status"], record["tokens_out"]) == ("PASS", 8)
    assert record["fallback_ops"] == ["aten::tanh"] and record["fallback_op_calls"] == [16]
    assert record["fallback_calls_per_token"] == 2.0
    assert record["host_syncs_per_token"] == 2.0
    assert record["harness_syncs_per_token"] == 2.0
    assert record["prefill_host_syncs"] == 2
    assert record["host_cost_note"].startswith("counted by the pretend backend over 7 decode tokens")


def test_the_plan_weighs_a_fallback_as_work_after_its_steps():
    """A fallback blocks no verdict (no step), and is work still: by how many models call it, then their calls."""
    from model_support.ops.coverage import ModelOps
    from model_support.ops.plan import fallback_work

    def model(key, calls, fallback):
        return ModelOps(key, "PASS", "pretend", list(calls), None, list(calls.values()), "run", ops_fallback=fallback)

    models = [
        model("a", {"aten::tanh": 16, "aten::mm": 40}, ["aten::tanh"]),
        model("b", {"aten::tanh": 4, "aten::erf": 90}, ["aten::tanh", "aten::erf"]),
        model("c", {"aten::mm": 8}, []),
    ]
    assert fallback_work(models) == [
        {"op": "aten::tanh", "models": ["a", "b"], "calls": 20},
        {"op": "aten::erf", "models": ["b"], "calls": 90},
    ]
