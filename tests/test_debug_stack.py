"""``model-support debug`` runs on the stack it says: the environment's stack against the sweep's
(versions and the device backend's own configuration, here the pretend device's faults), said in
one sentence before the notebook runs; an earlier debug notebook is never overwritten; the
terminal summary names the operator the error names; a set-up failure prints its sentence.

The sweep is a sweep.json written by hand (no sweep runs): tiny-llama on the pretend device,
recorded on the stack of docs/devices.md's porting loop that lacks ``aten::rsqrt``, as its first
sweep would be."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from model_support import debug
from model_support.probe import provenance
from model_support.record import schema, store
from model_support.record.sweep_meta import ModelEntry, SweepMeta

REPO = Path(__file__).resolve().parents[1]
#: The porting loop's first stack, and the same stack once aten::rsqrt is implemented
#: (docs/devices.md).
BEFORE = {"devices": 1, "missing_ops": ["aten::rsqrt"]}
AFTER = {"devices": 1, "missing_ops": []}
SWEEP = "loop-20261201T000000Z-abcd"


def write_sweep(data: Path, llama: str, config: dict) -> None:
    SweepMeta(
        sweep_id=SWEEP,
        name="loop",
        created_at="2026-12-01T00:00:00+00:00",
        probe={
            "device": "pretend",
            "dtype": "bfloat16",
            "max_new_tokens": 4,
            "reference": "cpu",
            "seed": 0,
            "perf": False,
        },
        models=[ModelEntry("local:tiny-llama", llama)],
        versions=provenance.versions(),
        device_config={"MODEL_SUPPORT_PRETEND": json.dumps(config)},
    ).write(store.sweep_dir(data, SWEEP))
    record = schema.empty_record(
        sweep_id=SWEEP,
        model_id="local:tiny-llama",
        status=schema.FAIL_GEN,
        failure_signature="NotImplementedError: Could not run 'aten::rsqrt' with arguments from the 'pretend' "
        "backend.",
    )
    store.store_result(data, SWEEP, record, None, "log\n")


def debug_cli(data: Path, config: dict | None) -> subprocess.CompletedProcess:
    import os

    env = {k: v for k, v in os.environ.items() if k != "MODEL_SUPPORT_PRETEND"}
    if config is not None:
        env["MODEL_SUPPORT_PRETEND"] = json.dumps(config)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "model_support.cli",
            "debug",
            SWEEP,
            "tiny-llama",
            "--data-dir",
            str(data),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=900,
    )


def test_the_stack_difference_names_each_version_and_configuration_that_differs():
    meta = SweepMeta(
        sweep_id="s",
        name="s",
        created_at="",
        probe={},
        models=[],
        versions={
            "torch": "2.13.0",
            "transformers": "5.24.0",
            "model_support": "0.1",
            "git_commit": "abc",
        },
        device_config={"MODEL_SUPPORT_PRETEND": '{"missing_ops": ["aten::rsqrt"]}'},
    )
    here = {
        "torch": "2.13.0",
        "transformers": "5.25.0",
        "model_support": "0.2",
        "git_commit": "def",
    }
    # the same JSON, spaced otherwise
    same = {"MODEL_SUPPORT_PRETEND": '{ "missing_ops":["aten::rsqrt"] }'}
    assert debug.stack.differences(meta, here, same) == [
        "transformers 5.25.0 here, 5.24.0 in the sweep"
    ]
    sentence = debug.stack_difference(
        meta, {"status": "FAIL(gen)", "failure_signature": "E: x"}, here, {}
    )
    assert sentence == (
        "This environment's stack is not the one sweep s ran on (transformers 5.25.0 here, 5.24.0 in the sweep; "
        'MODEL_SUPPORT_PRETEND unset here, \'{"missing_ops": ["aten::rsqrt"]}\' in the sweep): the debug notebook '
        "shows this stack, so what it finds can differ from the sweep's verdict (the sweep recorded FAIL(gen): E: x)."
    )
    assert debug.stack_difference(meta, None, {**here, "transformers": "5.24.0"}, same) is None
    older = SweepMeta(
        sweep_id="o", name="o", created_at="", probe={}, models=[], versions=meta.versions
    )
    assert older.device_config is None  # a sweep.json from before: compared on its versions only
    assert (
        debug.stack_difference(older, None, {**here, "transformers": "5.24.0"}, {"X": "1"}) is None
    )


def test_a_sweep_records_the_device_configuration_of_its_environment(monkeypatch):
    from model_support.probe import devices

    monkeypatch.setenv("MODEL_SUPPORT_PRETEND", '{"devices": 2}')
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_flag=1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert devices.stack_configuration() == {
        "LIBTPU_INIT_ARGS": "--xla_flag=1",
        "MODEL_SUPPORT_PRETEND": '{"devices": 2}',
    }
    raw = SweepMeta(
        sweep_id="s", name="s", created_at="", probe={}, models=[], device_config={"A": "1"}
    ).to_dict()
    assert SweepMeta.from_dict(json.loads(json.dumps(raw))).device_config == {"A": "1"}


def test_an_earlier_debug_notebook_is_never_overwritten(tmp_path):
    first = debug.debug_notebook_path(tmp_path, "s", "local:m", out_dir=tmp_path)
    assert first.name == "local_m.ipynb"
    first.write_text("{}")
    second = debug.debug_notebook_path(tmp_path, "s", "local:m", out_dir=tmp_path)
    assert second.name == "local_m-2.ipynb"
    second.write_text("{}")
    assert (
        debug.debug_notebook_path(tmp_path, "s", "local:m", out_dir=tmp_path).name
        == "local_m-3.ipynb"
    )


def test_the_terminal_summary_names_the_operator_the_error_names():
    failure = {
        "module": "model.layers.0.input_layernorm",
        "class": "LlamaRMSNorm",
        "error_type": "NotImplementedError",
        "error_message": "Could not run 'aten::rsqrt' with arguments from the 'pretend' backend. This could be "
        "...",
    }
    result = {
        "forward_failure": failure,
        "first_offender": None,
        "generation": {"ok": False, "step": 0, "seq_len": 5, "failure": failure},
        "tolerance": 0.2,
    }
    text = debug.summary_text(result)
    assert (
        "forward:    raises NotImplementedError on aten::rsqrt in "
        "model.layers.0.input_layernorm (LlamaRMSNorm)" in text
    )
    assert (
        "generate:   fails at step 0 (sequence length 5): NotImplementedError on aten::rsqrt in"
        in text
    )
    assert (
        "only the device fails: first in model.layers.0.input_layernorm (LlamaRMSNorm), "
        "NotImplementedError on aten::rsqrt" in text
    )
    assert debug.named_operator({"error_message": "index out of range in self"}) is None


@pytest.fixture(scope="module")
def loop_data(tmp_path_factory, fixture_models) -> Path:
    data = tmp_path_factory.mktemp("debug-stack")
    write_sweep(data, fixture_models["tiny-llama"]["path"], BEFORE)
    return data


def test_debug_says_before_running_that_the_stack_here_is_not_the_sweeps(loop_data):
    """The porting loop's second stack in the environment, a model of the first sweep debugged:
    the sentence comes first, then the notebook (which finds no failure on this stack), numbered
    after the earlier one."""
    done = debug_cli(loop_data, BEFORE)  # the sweep's own stack: nothing said, the operator named
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("debug notebook: ") and "not the one sweep" not in done.stdout
    first = Path(lines[0].removeprefix("debug notebook: "))
    assert first.name == "local_tiny-llama.ipynb"
    assert (
        "forward:    raises NotImplementedError on aten::rsqrt in model.layers.0.input_layernorm"
        in done.stdout
    )

    done = debug_cli(loop_data, AFTER)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == (
        f"This environment's stack is not the one sweep {SWEEP} ran on (MODEL_SUPPORT_PRETEND "
        f"'{json.dumps(AFTER)}' here, '{json.dumps(BEFORE)}' in the sweep): the debug notebook "
        "shows this stack, so what it finds can differ from the sweep's verdict (the sweep "
        "recorded FAIL(gen): NotImplementedError: Could not run 'aten::rsqrt' with arguments "
        "from the 'pretend' backend.)."
    )
    assert (
        lines[-1]
        == f"stack:      this environment's, not the one sweep {SWEEP} ran on (see the first line)"
    )
    second = Path(lines[1].removeprefix("debug notebook: "))
    assert second.name == "local_tiny-llama-2.ipynb" and first.exists()
    # the earlier finding kept
    assert debug.debug_result_from_notebook(first)["forward_ok"] is False
    assert debug.debug_result_from_notebook(second)["forward_ok"] is True
    outputs = json.dumps(json.loads(second.read_text())["cells"])
    # transformers' progress bars are off in the notebook too
    assert "Loading weights" not in outputs
    # an ipc kernel, as every notebook run of ours
    assert "Kernel is running over TCP" not in done.stderr


def test_a_set_up_failure_prints_its_sentence(loop_data):
    done = debug_cli(loop_data, None)  # the pretend device switched off: its adapter's sentence
    assert done.returncode == 1, done.stderr[-3000:]
    assert (
        "debug notebook stopped at a cell error: DeviceUnavailable: Device 'pretend' was "
        "requested but the pretend accelerator is off here: set MODEL_SUPPORT_PRETEND"
        in done.stdout
    ), done.stdout
    assert "debug notebook: " in done.stdout
