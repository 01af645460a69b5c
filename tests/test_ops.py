"""Operators (docs/ops.md): the census each probe records, what a stack does with each operator
(the device adapters' coverage), the verdicts predicted from a census alone and the porting plan,
checked against real sweeps on the pretend device: a CPU sweep's census predicts a pretend
stack's verdicts, model for model, and implementing the plan's first operator makes exactly the
models it unlocks pass."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "model_support.cli"]
PRETEND_VAR = "MODEL_SUPPORT_PRETEND"


def _env(config: dict | None) -> dict:
    env = {**os.environ}
    env.pop(PRETEND_VAR, None)
    if config is not None:
        env[PRETEND_VAR] = json.dumps(config)
    return env


def name_of(key: str) -> str:
    """A fixture's folder name from a plan's model key (``local:tiny-llama [eager+dynamic+4t]``:
    the variant of 4 new tokens)."""
    from model_support.probe.model_ids import display_name

    return display_name(key.split(" [")[0])


def cli(args: list, data: Path, config: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [*CLI, *args, "--data-dir", str(data)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_env(config),
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


# --- the plan and the prediction, on made-up censuses
# --------------------------------------------------


def _model(
    key, ops, missing=(), fallback=(), stages=None, status="PASS", source="run", device="cpu", **row
):
    from model_support.ops import ModelOps

    return ModelOps(
        key=key,
        status=status,
        device_type=device,
        ops=None if ops is None else list(ops),
        stages=stages or ["generate"] * len(ops or ()),
        calls=[1] * len(ops or ()),
        source=source,
        ops_missing=list(missing),
        ops_fallback=list(fallback),
        **row,
    )


def test_a_model_lacking_two_operators_is_unlocked_only_at_the_second():
    from model_support.ops import porting_plan, predict

    models = predict(
        [
            _model(
                "a",
                ["aten::mm", "aten::rsqrt", "aten::silu"],
                missing=["aten::rsqrt", "aten::silu"],
            ),
            _model("b", ["aten::mm", "aten::gelu"], missing=["aten::gelu"]),
            _model("c", ["aten::gelu", "aten::silu"], missing=["aten::gelu", "aten::silu"]),
            _model("d", ["aten::mm"]),
        ]
    )
    steps = porting_plan(models)
    # gelu unlocks b at once; then silu, called by two of the models still blocked, unlocks c; rsqrt
    # last unlocks a
    assert [(s.op, s.unlocks, s.blocks) for s in steps] == [
        ("aten::gelu", ["b"], ["b", "c"]),
        ("aten::silu", ["c"], ["a", "c"]),
        ("aten::rsqrt", ["a"], ["a"]),
    ]
    assert [m.predicted for m in models] == ["FAIL(gen)", "FAIL(gen)", "FAIL(gen)", "PASS"]


def test_the_prediction_is_the_stage_of_the_first_missing_operator_and_a_fallback_passes():
    from model_support.ops import predict
    from model_support.probe.devices import FALLBACK, IMPLEMENTED, MISSING

    coverage = {
        "aten::_to_copy": MISSING,
        "aten::mm": IMPLEMENTED,
        "aten::tanh": FALLBACK,
        "aten::gelu": MISSING,
    }
    loads, falls, gelu, own, none = predict(
        [
            _model("loads", ["aten::_to_copy", "aten::gelu"], stages=["load", "generate"]),
            _model("falls", ["aten::mm", "aten::tanh"]),
            _model("gelu", ["aten::mm", "aten::gelu"]),
            # failed on the reference too
            _model("own", ["aten::mm"], status="FAIL(gen)", source="partial"),
            _model("none", [], status="FAIL(load)"),
        ],
        coverage,
    )
    assert (loads.predicted, loads.first_missing) == ("FAIL(load)", "aten::_to_copy")
    assert (falls.predicted, falls.ops_fallback) == ("PASS", ["aten::tanh"])
    assert (gelu.predicted, gelu.ops_missing) == ("FAIL(gen)", ["aten::gelu"])
    assert own.predicted == "FAIL(gen)"
    none.ops = None
    assert predict([none], coverage)[0].predicted == "FAIL(load)"


def test_the_plan_counts_cumulative_unlocks_and_groups_operators_that_only_unlock_together():
    """Every model needs two operators the stack lacks (missing, or crashing: a runtime abort):
    no single operator unlocks any model, so the plan's steps are the pairs, each with the models
    predicted PASS once it is done; a model that fails on its own too (the CPU reference fails)
    is in no step, and said so."""
    from model_support.ops import porting_plan, predict
    from model_support.ops.plan import plan_json
    from model_support.record.ops_table import CRASHES, IMPLEMENTED, MISSING

    coverage = {
        "aten::mm": IMPLEMENTED,
        "aten::rsqrt": MISSING,
        "aten::silu": MISSING,
        "aten::gelu": MISSING,
    }
    coverage |= {"aten::relu": CRASHES}
    models = predict(
        [
            _model("a", ["aten::mm", "aten::rsqrt", "aten::silu"]),
            _model("b", ["aten::rsqrt", "aten::mm", "aten::silu"]),
            _model("c", ["aten::relu", "aten::gelu"]),
            _model(
                "own",
                ["aten::rsqrt", "aten::gelu"],
                status="FAIL(gen)",
                source="partial",
                attribution="model",
            ),
            _model("fine", ["aten::mm"]),
        ],
        coverage,
    )
    steps = porting_plan(models)
    assert [(s.ops, s.unlocks, s.passing) for s in steps] == [
        (("aten::rsqrt", "aten::silu"), ["a", "b"], 3),  # fine passes already: 1, then 3 of 5
        (("aten::gelu", "aten::relu"), ["c"], 4),
    ]
    assert steps[1].faults == {"aten::gelu": "missing", "aten::relu": "crashes"}
    assert [m.predicted for m in models] == [
        "FAIL(gen)",
        "FAIL(gen)",
        "FAIL(other)",
        "FAIL(gen)",
        "PASS",
    ]
    answer = plan_json(models, steps)
    assert answer["passing"] == 1 and answer["plan"][0]["op"] == "aten::rsqrt + aten::silu"
    assert answer["blocked"] == [
        {"by": "its own failure: the CPU reference fails too", "models": ["own"]}
    ]


def test_the_plan_on_the_sweeps_own_stack_counts_its_aborts_and_its_wrong_output():
    """On the sweep's own stack the rows are the coverage: a kernel that died, the stack's (the
    CPU reference passed), names the operator its runtime aborted in: a step of the plan; a PASS
    whose output diverges from the reference names no operator: it stays blocked, said so; a
    failure of the stack's that names none stays too."""
    from model_support.ops import porting_plan, predict, still_blocked
    from model_support.ops.plan import DIVERGES, UNNAMED
    from model_support.probe.census import stopped_by

    died = (
        "the kernel died (killed by SIGABRT); it last said: pretend runtime: fatal error in "
        "aten::relu; aborting"
    )
    dead = {"error_type": "DeadKernelError", "attribution": "stack", "failure_stage": "runner"}
    stopped = stopped_by({**dead, "error_message": died})
    models = predict(
        [
            _model(
                "opt",
                None,
                status="FAIL(other)",
                source=None,
                stopped=stopped,
                device="pretend",
                **dead,
            ),
            _model("wrong", ["aten::mm"], numerics="diverges", device="pretend"),
            _model(
                "dtype",
                ["aten::_to_copy"],
                status="FAIL(load)",
                source="reference",
                attribution="stack",
            ),
            _model("fine", ["aten::mm"], numerics="match", device="pretend"),
        ]
    )
    assert stopped == "aten::relu" and [m.predicted for m in models] == [
        "FAIL(other)",
        "PASS",
        "FAIL(load)",
        "PASS",
    ]
    (step,) = porting_plan(models)
    assert (step.op, step.faults, step.unlocks, step.passing) == (
        "aten::relu",
        {"aten::relu": "crashes"},
        ["opt"],
        2,
    )
    assert still_blocked(models) == [(DIVERGES, ["wrong"]), (UNNAMED, ["dtype"])]


# --- the census and the adapters' coverage
# --------------------------------------------------------------


def test_the_census_counts_what_a_compiled_backend_receives():
    import torch

    from model_support.probe.census_mode import Census

    layer = torch.nn.Linear(4, 3)
    counted = Census("cpu")
    with torch.inference_mode(), counted:
        counted.enter("load")
        layer(torch.ones(2, 4))  # the host's own work: not counted on the CPU
        counted.enter("generate")
        for _ in range(3):
            torch.nn.functional.gelu(layer(torch.ones(2, 4)))
    fields = counted.fields("run")
    # aten::linear (CompositeImplicitAutograd) reaches a backend as its parts: aten::t and
    # aten::addmm
    assert "aten::linear" not in fields["ops"]
    assert {"aten::t", "aten::addmm", "aten::gelu"} <= set(fields["ops"])
    calls = dict(zip(fields["ops"], fields["ops_calls"]))
    assert calls["aten::addmm"] == 3 and calls["aten::gelu"] == 3
    assert set(fields["ops_stages"]) == {"generate"} and fields["ops_source"] == "run"


def test_the_pretend_adapter_answers_from_its_configuration(monkeypatch):
    from model_support_pretend.adapter import PretendAdapter
    from model_support_pretend.config import parse

    monkeypatch.setenv(
        PRETEND_VAR, json.dumps({"missing_ops": ["aten::add"], "fallback_ops": ["aten::tanh"]})
    )
    coverage = PretendAdapter("pretend").op_coverage(["aten::add.Tensor", "aten::tanh", "aten::mm"])
    assert coverage == {
        "aten::add.Tensor": "missing",
        "aten::tanh": "fallback",
        "aten::mm": "implemented",
    }
    assert parse('{"fallback_ops": ["aten::tanh"]}').fallback_ops == frozenset({"aten::tanh"})


def test_the_pretend_coverage_knows_its_aborts_wrong_operators_and_refused_dtypes(monkeypatch):
    """``ops --on pretend`` reads the stack's every fault: a model calling an operator its
    runtime aborts in is FAIL(other), as a dead kernel is; one run in a dtype the stack refuses
    is FAIL(load), at the weights' copy; one calling a wrong operator passes, and no step of the
    plan counts it before that operator is fixed. Off (the variable unset), the coverage is one
    sentence, never an empty answer that predicts every model PASS."""
    from model_support.ops import porting_plan, predict
    from model_support.ops.coverage import census_ops
    from model_support.probe.devices import DeviceUnavailable
    from model_support_pretend.adapter import PretendAdapter

    config = {
        "crash_ops": ["aten::relu"],
        "wrong_ops": ["aten::mm"],
        "unsupported_dtypes": ["float16"],
    }
    monkeypatch.setenv(PRETEND_VAR, json.dumps(config))
    models = [
        _model("opt", ["aten::relu", "aten::addmm"], dtype="bfloat16"),
        _model(
            "half", ["aten::_to_copy", "aten::addmm"], stages=["load", "generate"], dtype="float16"
        ),
        _model("llama", ["aten::mm", "aten::silu"], dtype="bfloat16"),
    ]
    coverage = PretendAdapter("pretend").op_coverage(census_ops(models))
    assert coverage["aten::relu"] == "crashes" and coverage["aten::mm"] == "wrong"
    assert (coverage["dtype::float16"], coverage["dtype::bfloat16"]) == ("missing", "implemented")
    opt, half, llama = predict(models, coverage)
    assert (opt.predicted, opt.first_missing, opt.ops_crashing) == (
        "FAIL(other)",
        "aten::relu",
        ["aten::relu"],
    )
    assert (half.predicted, half.first_missing) == ("FAIL(load)", "dtype::float16")
    assert (llama.predicted, llama.ops_wrong, llama.passes) == ("PASS", ["aten::mm"], False)
    assert [(s.op, s.unlocks, s.passing) for s in porting_plan(models)] == [
        ("aten::mm", ["llama"], 1),
        ("aten::relu", ["opt"], 2),
        ("dtype::float16", ["half"], 3),
    ]
    monkeypatch.delenv(PRETEND_VAR)
    with pytest.raises(DeviceUnavailable, match="the pretend accelerator is off here"):
        PretendAdapter("pretend").op_coverage(["aten::mm"])


def test_a_stopped_runs_census_keeps_the_devices_operators_and_the_one_that_stopped_it():
    """The CPU reference of a run stopped at ``aten::bmm`` calls its own attention kernel, never
    bmm: its census completes the device's partial one (what the reference alone called, after
    it), never replaces it; the operator a stack's failure names is missing whatever the adapter
    read."""
    from model_support.probe import census

    partial = {
        "ops": ["aten::_to_copy", "aten::mm", "aten::bmm"],
        "ops_stages": ["load", "generate", "generate"],
        "ops_calls": [20, 3, 1],
        "ops_source": "partial",
        "ops_sig_ops": ["aten::_to_copy", "aten::mm", "aten::bmm"],
        "ops_sig_dtypes": ["bf16->bf16", "bf16,bf16", "bf16,bf16"],
        "ops_sig_calls": [20, 3, 1],
        "ops_sig_min_rank": [1, 2, 3],
        "ops_sig_max_rank": [2, 2, 3],
    }
    reference = {
        "ops": ["aten::mm", "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::silu"],
        "ops_stages": ["generate"] * 3,
        "ops_calls": [40, 8, 8],
        "ops_source": "reference",
        "ops_sig_ops": [
            "aten::mm",
            "aten::mm",
            "aten::_scaled_dot_product_flash_attention_for_cpu",
            "aten::silu",
        ],
        "ops_sig_dtypes": ["bf16,bf16", "f32,f32", "bf16,bf16,bf16", "bf16"],
        "ops_sig_calls": [38, 2, 8, 8],
        "ops_sig_min_rank": [1, 2, 4, 3],
        "ops_sig_max_rank": [3, 2, 4, 3],
    }
    done = census.completed(partial, reference)
    assert done == {
        "ops": [*partial["ops"], "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::silu"],
        "ops_stages": ["load", "generate", "generate", "generate", "generate"],
        "ops_calls": [20, 40, 1, 8, 8],
        "ops_source": "reference",
        # per (operator, signature): a shared one keeps the larger count and the widest ranks, the
        # rest follow
        "ops_sig_ops": [
            *partial["ops"],
            "aten::mm",
            "aten::_scaled_dot_product_flash_attention_for_cpu",
            "aten::silu",
        ],
        "ops_sig_dtypes": [
            "bf16->bf16",
            "bf16,bf16",
            "bf16,bf16",
            "f32,f32",
            "bf16,bf16,bf16",
            "bf16",
        ],
        "ops_sig_calls": [20, 38, 1, 2, 8, 8],
        "ops_sig_min_rank": [1, 1, 3, 2, 4, 3],
        "ops_sig_max_rank": [2, 3, 3, 2, 4, 3],
    }
    failure = {
        "attribution": "stack",
        "error_message": "Could not run 'aten::bmm' with arguments from the 'x' backend",
    }
    assert census.stopped_by(failure) == "aten::bmm"
    # the reference fails too: not the stack's
    assert census.stopped_by({**failure, "attribution": "model"}) is None
    fields = census.coverage_fields(
        done["ops"], dict.fromkeys(done["ops"], "implemented"), "aten::bmm"
    )
    assert fields == {"ops_missing": ["aten::bmm"], "ops_fallback": [], "ops_unknown": []}


#: Skip where the torch_tpu wheel is not installed, without importing it here (its loader writes
#: into os.environ).
needs_torch_tpu = pytest.mark.skipif(
    importlib.util.find_spec("torch_tpu") is None, reason="torch_tpu not installed"
)


@needs_torch_tpu
def test_the_generic_adapter_reads_a_real_stacks_registrations():
    """torch_tpu 0.2.0 registers its kernels (and a boxed fallback) for PrivateUse1 on import,
    TPU or not: the generic adapter's reading of them, in a child process (importing torch_tpu
    renames nothing, but costs). Its boxed fallback raises while its CPU fallback is off, the
    default (issue 58, item 2): an operator only it catches is missing
    (tests/test_torch_tpu_contracts.py checks the switch)."""
    code = textwrap.dedent(
        """
        import json, warnings
        warnings.simplefilter("ignore")
        from model_support.probe import devices
        devices.load_backend("tpu")
        ops = ["aten::rsqrt", "aten::linear", "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_to_copy",
               "nosuch::op"]
        print(json.dumps(devices.adapter_for("tpu").op_coverage(ops)))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(None), timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    coverage = json.loads(done.stdout.strip().splitlines()[-1])
    assert coverage == {
        # a structured op: its default kernel runs torch_tpu's aten::rsqrt.out
        "aten::rsqrt": "implemented",
        "aten::linear": "implemented",  # torch_tpu registers the composite itself
        # no kernel: torch_tpu's boxed fallback catches it, and raises with its CPU fallback off
        # (the default)
        "aten::_scaled_dot_product_flash_attention_for_cpu": "missing",
        "aten::_to_copy": "implemented",
        "nosuch::op": "unknown",
    }


#: An operator with no TPU kernel that only torch_tpu 0.2.0's boxed fallback catches (the CPU's
#: attention kernel).
FALLBACK_ONLY = "aten::_scaled_dot_product_flash_attention_for_cpu"


def _census_sweep(data: Path, sweep_id: str, censuses: dict[str, list[str]]) -> None:
    """A CPU sweep of PASS rows with the given censuses (model id -> operators), written and
    compacted, nothing run."""
    from model_support.record import schema, store
    from model_support.record.sweep_meta import ModelEntry, SweepMeta

    records = [
        schema.empty_record(
            sweep_id=sweep_id,
            model_id=model_id,
            status="PASS",
            variant=schema.DEFAULT_VARIANT,
            device_type="cpu",
            dtype="float32",
            ops=ops,
            ops_stages=["generate"] * len(ops),
            ops_calls=[1] * len(ops),
            ops_source="run",
            ops_missing=[],
            ops_fallback=[],
            ops_unknown=[],
        )
        for model_id, ops in censuses.items()
    ]
    models = [ModelEntry(r["model_id"]) for r in records]
    SweepMeta(
        sweep_id=sweep_id,
        name="census",
        created_at="2026-12-01T00:00:00+00:00",
        probe={},
        models=models,
    ).write(store.sweep_dir(data, sweep_id))
    for record in records:
        store.store_result(data, sweep_id, record, None, "log\n")
    store.compact(data, sweep_id)


@needs_torch_tpu
def test_ops_on_tpu_predicts_an_operator_only_the_fallback_catches_missing_and_names_the_switch(
    tmp_path,
):
    """Issue 58, item 2: ``ops --on tpu`` of a census calling an operator only torch_tpu's boxed
    fallback catches predicts it missing (FAIL(gen)), not a PASS with a fallback: torch_tpu's CPU
    fallback is off by default, and such an operator raises "not implemented for TPU". The step
    that fixes it names the switch that would make it a CPU fallback; a model that never calls it
    still passes."""
    sweep = "census-20261201T000000Z-0001"
    _census_sweep(
        tmp_path,
        sweep,
        {
            "local:attends": ["aten::_to_copy", "aten::mm", FALLBACK_ONLY],
            "local:plain": ["aten::mm", "aten::add.Tensor"],
        },
    )
    switch = "torch_tpu._internal.execution_mode.enable_cpu_fallback = True"
    answer = json.loads(cli(["ops", sweep, "--on", "tpu", "--json"], tmp_path).stdout)
    attends, plain = answer["models"]["local:attends"], answer["models"]["local:plain"]
    assert (attends["predicted"], attends["ops_missing"], attends["ops_fallback"]) == (
        "FAIL(gen)",
        [FALLBACK_ONLY],
        [],
    )
    assert attends["notes"][FALLBACK_ONLY].startswith(
        "missing while the tpu stack's CPU fallback is off"
    )
    assert switch in attends["notes"][FALLBACK_ONLY] and plain["predicted"] == "PASS"
    (step,) = answer["plan"]
    assert (step["op"], step["faults"], step["unlocks"]) == (
        FALLBACK_ONLY,
        {FALLBACK_ONLY: "missing"},
        ["local:attends"],
    )
    assert switch in step["notes"][FALLBACK_ONLY]
    text = cli(["ops", sweep, "--on", "tpu"], tmp_path).stdout
    # the plan's step says the switch
    assert "FAIL(gen)" in text and f"{switch} makes it a CPU fallback" in text


def test_the_pretend_tpu_contract_without_a_cpu_fallback_predicts_its_fallback_operators_missing(
    monkeypatch,
):
    """The pretend device playing TorchTPU's contract (``no_fallback``): its ``fallback_ops`` are
    missing while its CPU fallback switch is off (the model calling one FAIL(gen), the step
    naming the switch), a fallback once it is on."""
    from model_support.ops import porting_plan, predict
    from model_support.ops.coverage import StackCoverage, census_ops
    from model_support_pretend import device
    from model_support_pretend.adapter import PretendAdapter

    monkeypatch.setenv(
        PRETEND_VAR, json.dumps({"fallback_ops": ["aten::tanh"], "no_fallback": True})
    )
    monkeypatch.setattr(device, "enable_cpu_fallback", False)
    models = [
        _model("gpt2", ["aten::mm", "aten::tanh"]),
        _model("llama", ["aten::mm", "aten::silu"]),
    ]
    coverage, notes = PretendAdapter("pretend").coverage_with_notes(census_ops(models))
    assert (coverage["aten::tanh"], coverage["aten::mm"]) == ("missing", "implemented")
    assert PretendAdapter("pretend").op_coverage(["aten::tanh"]) == {"aten::tanh": "missing"}
    gpt2, llama = predict(models, StackCoverage(coverage, notes))
    assert (gpt2.predicted, gpt2.ops_missing, llama.predicted) == (
        "FAIL(gen)",
        ["aten::tanh"],
        "PASS",
    )
    (step,) = porting_plan(models)
    assert step.fault("aten::tanh") == (
        "missing while the pretend stack's CPU fallback is off: "
        "torch.pretend.enable_cpu_fallback = True makes it a CPU fallback"
    )
    # the switch on: a CPU fallback, the model passes
    monkeypatch.setattr(device, "enable_cpu_fallback", True)
    coverage, notes = PretendAdapter("pretend").coverage_with_notes(census_ops(models))
    gpt2, _ = predict(models, StackCoverage(coverage, notes))
    assert (coverage["aten::tanh"], gpt2.predicted, gpt2.ops_fallback) == (
        "fallback",
        "PASS",
        ["aten::tanh"],
    )
    # no contract: a fallback, no note
    monkeypatch.setenv(PRETEND_VAR, json.dumps({"fallback_ops": ["aten::tanh"]}))
    assert PretendAdapter("pretend").coverage_with_notes(["aten::tanh"]) == (
        {"aten::tanh": "fallback"},
        {},
    )


NO_FALLBACK_RUN = """
import json
from model_support.probe import devices  # first: no backend autoloads with torch
from model_support.probe.census import operator_named
import torch
devices.load_backend("pretend")
x = torch.ones(3, device="pretend")
try:
    torch.tanh(x)
    said = None
except NotImplementedError as exc:
    said = str(exc)
torch.pretend.enable_cpu_fallback = True  # the contract's switch, as a user turns TorchTPU's on
print(json.dumps({"said": said, "named": operator_named(said), "after": torch.tanh(x).cpu().tolist()}))
"""


def test_the_pretend_tpu_contract_raises_at_a_fallback_operator_until_its_switch_is_on():
    """The contract played at run time: ``aten::tanh`` raises as TorchTPU's fallback does with
    its CPU fallback off (the census names the operator from the error, so a stopped run's row
    lists it missing), and runs once ``torch.pretend.enable_cpu_fallback`` is set."""
    config = {"fallback_ops": ["aten::tanh"], "no_fallback": True}
    done = subprocess.run(
        [sys.executable, "-c", NO_FALLBACK_RUN],
        capture_output=True,
        text=True,
        env=_env(config),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert (
        out["said"] == "'aten::tanh' is not implemented for pretend. Please file a feature request"
    )
    assert out["named"] == "aten::tanh" and out["after"] == [0.7615941762924194] * 3


def test_a_stack_this_machine_lacks_is_one_sentence():
    """``--on cuda`` with a CPU-only torch: no kernels to read, said in one sentence (no
    prediction of all-missing)."""
    import torch

    if torch.cuda.is_available() or torch._C._dispatch_has_kernel_for_dispatch_key(
        "aten::empty.memory_format", "CUDA"
    ):
        pytest.skip("this machine has a CUDA stack")
    done = subprocess.run(
        [sys.executable, "-m", "model_support.ops", "cuda"],
        input='["aten::mm"]',
        capture_output=True,
        text=True,
        env=_env(None),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {
        "problem": f"torch {torch.__version__} here registers no kernels for dispatch key CUDA: this "
        "machine has no such stack to read (install its backend, or run where it is)."
    }


def test_a_device_this_machine_does_not_know_is_named_with_those_it_can_read():
    """``--on gpu``: no such device here, in the user's word, and the stacks this machine can
    read (not the dispatcher's PrivateUse1 that an unknown name would be read as)."""
    done = subprocess.run(
        [sys.executable, "-m", "model_support.ops", "gpu"],
        input='["aten::mm"]',
        capture_output=True,
        text=True,
        env=_env(None),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    problem = json.loads(done.stdout)["problem"]
    assert problem.startswith(
        "There is no device 'gpu' here (an NVIDIA or AMD GPU is cuda); this machine can read"
    )
    assert "cpu, " in problem and "pretend" in problem and "PrivateUse1" not in problem


def test_a_stack_whose_coverage_does_not_come_in_time_is_one_sentence(monkeypatch):
    """The child that reads a stack's coverage is given a time; past it, one sentence, never a
    traceback."""
    from model_support.errors import UserError
    from model_support.ops import coverage

    # no python starts that fast: a real timeout
    monkeypatch.setattr(coverage, "COVERAGE_TIMEOUT_S", 0.01)
    with pytest.raises(UserError) as caught:
        coverage.stack_coverage("cpu", ["aten::mm"])
    assert str(caught.value) == (
        "The cpu stack's coverage could not be read here: its backend did not answer within 0.01 s."
    )


def test_the_note_on_where_the_census_was_taken_says_which_models():
    """A pretend sweep whose stopped runs were completed by their CPU reference, and one model's
    census from the CPU, predicted ``--on pretend``: the note names the one taken elsewhere and
    the completed ones, never "taken on cpu, pretend, not pretend"."""
    from model_support.ops import porting_plan, predict
    from model_support.render.ops import ops_text

    models = predict(
        [
            _model("a", ["aten::mm"], device="pretend"),
            _model(
                "b",
                ["aten::mm", "aten::bmm"],
                device="pretend",
                source="reference",
                status="FAIL(gen)",
            ),
            _model("c", ["aten::mm"], device="cpu"),
        ],
        {"aten::mm": "implemented", "aten::bmm": "missing"},
    )
    text = " ".join(ops_text(models, porting_plan(models), "pretend", {"cpu", "pretend"}).split())
    assert "not pretend" in text and "cpu, pretend" not in text
    assert "The census of 1 of 3 models was taken on cpu, not pretend" in text
    assert (
        "1 stopped run on pretend ends its census with what the CPU reference alone called." in text
    )


def test_the_operator_status_words_are_declared_once():
    """``implemented`` / ``fallback`` / ``missing`` / ``unknown`` (and the ops config's ``CPU
    fallback``) are declared in ``record.ops_table`` only: the device adapters, the census and
    ``ops`` import them."""
    import ast

    from model_support.probe import devices
    from model_support.record import ops_table

    assert devices.OP_STATUSES is ops_table.OP_STATUSES
    declared = []
    for root in (REPO / "src", REPO / "pretend" / "src"):
        for path in root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and node.value in (
                    "implemented",
                    "fallback",
                    "CPU fallback",
                ):
                    declared.append(path.relative_to(REPO).as_posix())
    assert set(declared) == {"src/model_support/record/ops_table.py"}


def test_the_ops_config_is_linear_in_the_models():
    """Compaction's ``ops`` rows look each model up in a set: the model ids are compared a number
    of times that grows with the models, not with their square (a list searched per row was)."""
    from model_support.record.ops_table import op_rows

    compared = [0]

    class Counted(str):
        __hash__ = str.__hash__

        def __eq__(self, other):
            compared[0] += 1
            return str.__eq__(self, other)

    base = {
        "sweep_id": "s",
        "device_type": "pretend",
        "versions": None,
        "ops": ["aten::mm"],
        "ops_calls": [1],
    }
    rows = op_rows({**base, "model_id": Counted(f"m{i}")} for i in range(2000))
    assert rows[0]["probes"] == 2000 and len(rows[0]["models"]) == 2000
    assert compared[0] < 2000


def test_an_unknown_sweep_is_one_sentence(tmp_path):
    """``ops NOSUCH``: the known ids in one sentence, exit 2, no traceback (a pulled dataset with
    rows and no sweep.json is known: the report reads its ops tables, see test_report's wholly
    excluded sweep)."""
    done = subprocess.run(
        [*CLI, "ops", "nosuch-20261201T000000Z", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_env(None),
        timeout=300,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert (
        "Sweep 'nosuch-20261201T000000Z' does not exist under" in done.stderr
        and "known sweeps: none yet" in done.stderr
    )


def test_the_ops_config_rows():
    from model_support.record.ops_table import op_rows

    base = {"sweep_id": "s", "device_type": "pretend", "versions": None, "exclusion_reason": None}
    rows = op_rows(
        [
            {
                **base,
                "model_id": "a",
                "ops": ["aten::mm", "aten::rsqrt"],
                "ops_calls": [4, 2],
                "ops_missing": ["aten::rsqrt"],
            },
            {
                **base,
                "model_id": "b",
                "ops": ["aten::mm", "aten::tanh"],
                "ops_calls": [2, 6],
                "ops_fallback": ["aten::tanh"],
            },
            {**base, "model_id": "c", "ops": None},
        ]
    )
    assert [
        (r["op"], r["status"], r["models"], r["calls"], r["calls_per_probe"]) for r in rows
    ] == [
        ("aten::mm", "implemented", ["a", "b"], 6, 3.0),
        ("aten::tanh", "CPU fallback", ["b"], 6, 6.0),
        ("aten::rsqrt", "missing", ["a"], 2, 2.0),
    ]


# --- real sweeps: a CPU census predicts a pretend stack; the plan's first step, implemented
# ---------------

#: A handful of tiny fixtures: RMSNorm and SiLU (llama), GELU (gpt-neox), gelu_new's tanh (gpt2),
#: ReLU (opt), and one that fails on its own everywhere (no weights).
MODELS = ["tiny-llama", "tiny-gpt-neox", "tiny-gpt2", "tiny-opt", "fail-missing-weights"]
#: The stack: three operators missing, one falling back; then the plan's first step implemented.
STACK = {"missing_ops": ["aten::rsqrt", "aten::silu", "aten::gelu"], "fallback_ops": ["aten::tanh"]}
NEXT = {"missing_ops": ["aten::rsqrt", "aten::silu"], "fallback_ops": ["aten::tanh"]}


def _definition(path: Path, device: str) -> Path:
    import yaml

    probe = {
        "device": device,
        "max_new_tokens": 4,
        "judge": False,
        "reference": "cpu" if device != "cpu" else "none",
        "perf": False,
    }
    models = [str(REPO / "data" / "models" / m) for m in MODELS]
    path.write_text(
        yaml.safe_dump({"name": f"ops-{device}", "probe": probe, "models": models, "workers": 1})
    )
    return path


@pytest.fixture(scope="module")
def ops_loop(tmp_path_factory, fixture_models) -> dict:
    """A CPU sweep of MODELS; the prediction on STACK from it; a sweep on STACK; a sweep on NEXT."""
    from model_support.probe.model_ids import display_name
    from model_support.record import store

    tmp = tmp_path_factory.mktemp("ops")
    data = tmp / "data"
    sweeps = {}
    for name, device, config, report in (
        ("cpu", "cpu", None, False),
        ("stack", "pretend", STACK, True),
    ):
        before = set(store.list_sweeps(data)) if data.exists() else set()
        cli(
            [
                "sweep",
                str(_definition(tmp / f"{name}.yaml", device)),
                *([] if report else ["--no-report"]),
            ],
            data,
            config,
        )
        (sweeps[name],) = set(store.list_sweeps(data)) - before
        if name == "cpu":
            predicted = json.loads(
                cli(["ops", sweeps["cpu"], "--on", "pretend", "--json"], data, STACK).stdout
            )
    plan = json.loads(cli(["ops", sweeps["stack"], "--json"], data, None).stdout)
    text = cli(["ops", sweeps["cpu"], "--on", "pretend"], data, STACK).stdout
    before = set(store.list_sweeps(data))
    cli(["sweep", str(_definition(tmp / "next.yaml", "pretend")), "--no-report"], data, NEXT)
    (sweeps["next"],) = set(store.list_sweeps(data)) - before
    records = {
        k: {display_name(r["model_id"]): r for r in store.read_records(data, s)}
        for k, s in sweeps.items()
    }
    return {
        "data": data,
        "sweeps": sweeps,
        "records": records,
        "predicted": predicted,
        "plan": plan,
        "text": text,
    }


def test_a_cpu_sweep_records_every_fixtures_census(ops_loop):
    records = ops_loop["records"]["cpu"]
    for name in ("tiny-llama", "tiny-gpt-neox", "tiny-gpt2", "tiny-opt"):
        r = records[name]
        assert r["status"] == "PASS" and r["ops_source"] == "run", name
        assert len(r["ops"]) == len(r["ops_stages"]) == len(r["ops_calls"]) > 20
        assert r["ops_missing"] == [] and r["ops_fallback"] == []  # the CPU runs what it ran
    assert {"aten::rsqrt", "aten::silu"} <= set(records["tiny-llama"]["ops"])
    assert (
        "aten::gelu" in records["tiny-gpt-neox"]["ops"]
        and "aten::tanh" in records["tiny-gpt2"]["ops"]
    )
    # it stopped loading: a census of nothing, and no reference ran
    weightless = records["fail-missing-weights"]
    assert (weightless["status"], weightless["ops"], weightless["ops_source"]) == (
        "FAIL(load)",
        [],
        "partial",
    )


def test_the_prediction_from_the_cpu_census_is_the_pretend_sweeps_verdict_model_for_model(ops_loop):
    predicted = {name_of(k): v for k, v in ops_loop["predicted"]["models"].items()}
    actual = ops_loop["records"]["stack"]
    assert {name: p["predicted"] for name, p in predicted.items()} == {
        n: r["status"] for n, r in actual.items()
    }
    assert predicted["tiny-llama"]["ops_missing"] == ["aten::rsqrt", "aten::silu"]
    assert predicted["tiny-gpt2"] == {
        "ops_missing": [],
        "ops_crashing": [],
        "ops_wrong": [],
        "ops_fallback": ["aten::tanh"],
        "predicted": "PASS",
    }
    assert {r["status"] for r in actual.values()} == {"PASS", "FAIL(gen)", "FAIL(load)"}


def test_the_ops_command_prints_the_predictions_the_plan_and_where_the_census_came_from(ops_loop):
    text = ops_loop["text"]
    assert (
        "Predicted on the pretend stack of this machine" in text
        and "What to implement next" in text
    )
    llama = next(line for line in text.splitlines() if "tiny-llama" in line)
    # recorded on the CPU, predicted here
    assert "PASS" in llama and "FAIL(gen)" in llama and "aten::rsqrt" in llama
    assert "The census was taken on cpu, not pretend" in " ".join(text.split())
    # which configuration of the backend it predicted for (with MODEL_SUPPORT_PRETEND unset:
    # refused, see below)
    said = next(
        line
        for line in text.splitlines()
        if line.startswith("predicted for pretend as this environment")
    )
    assert "MODEL_SUPPORT_PRETEND=" in said and "aten::rsqrt" in said
    assert ops_loop["predicted"]["configuration"] == {"MODEL_SUPPORT_PRETEND": json.dumps(STACK)}


def test_a_stopped_run_takes_its_census_from_the_reference_and_records_what_the_stack_lacks(
    ops_loop,
):
    llama = ops_loop["records"]["stack"]["tiny-llama"]
    assert (llama["status"], llama["attribution"], llama["ops_source"]) == (
        "FAIL(gen)",
        "stack",
        "reference",
    )
    # the second one too, which the run never reached
    assert llama["ops_missing"] == ["aten::rsqrt", "aten::silu"]
    gpt2 = ops_loop["records"]["stack"]["tiny-gpt2"]  # falls back, passes, counted
    assert (gpt2["status"], gpt2["ops_source"], gpt2["ops_fallback"]) == (
        "PASS",
        "run",
        ["aten::tanh"],
    )
    assert gpt2["ops_calls"][gpt2["ops"].index("aten::tanh")] > 0
    assert (
        "aten::_to_copy" in gpt2["ops"]
        and gpt2["ops_stages"][gpt2["ops"].index("aten::_to_copy")] == "load"
    )


def test_the_plan_and_implementing_its_first_operator_makes_exactly_its_unlocks_pass(ops_loop):
    plan = ops_loop["plan"]["plan"]
    named = [
        (s["op"], sorted(map(name_of, s["unlocks"])), sorted(map(name_of, s["blocks"])))
        for s in plan
    ]
    assert named == [
        ("aten::gelu", ["tiny-gpt-neox"], ["tiny-gpt-neox"]),
        # llama lacks two: they only unlock together
        ("aten::rsqrt + aten::silu", ["tiny-llama"], ["tiny-llama"]),
    ]
    # gpt2, opt pass already
    assert [s["passing"] for s in plan] == [3, 4] and ops_loop["plan"]["passing"] == 2
    assert ops_loop["plan"]["blocked"] == [
        {
            "by": "its own failure: the CPU reference fails too",
            "models": [ops_loop["plan"]["blocked"][0]["models"][0]],
        }
    ]
    assert name_of(ops_loop["plan"]["blocked"][0]["models"][0]) == "fail-missing-weights"
    before, after = ops_loop["records"]["stack"], ops_loop["records"]["next"]
    newly = sorted(
        n for n in after if after[n]["status"] == "PASS" and before[n]["status"] != "PASS"
    )
    assert newly == named[0][1]
    assert all(after[n]["status"] == before[n]["status"] for n in after if n not in newly)


def test_the_report_says_what_to_implement_next_and_the_fallbacks(ops_loop):
    html = (ops_loop["data"] / "reports" / f"{ops_loop['sweeps']['stack']}.html").read_text()
    assert "What to implement next" in html
    plan = html[html.index("The porting plan") :]
    assert plan.index("aten::gelu") < plan.index("aten::rsqrt") < plan.index("aten::silu")
    assert "CPU fallbacks, the most-run first" in html and "aten::tanh" in plan
    # the explorer's lacks column: the census' missing ops
    from model_support.render.explorer import explorer_data

    lacks = {o[7] for o in explorer_data(ops_loop["data"])["outcomes"] if o[7]}
    assert lacks == {"aten::rsqrt, aten::silu", "aten::gelu"}


def test_the_diff_says_which_operators_the_stack_gained(ops_loop):
    data, sweeps = ops_loop["data"], ops_loop["sweeps"]
    out = cli(["diff", sweeps["stack"], sweeps["next"]], data).stdout
    assert "operators gained: aten::gelu (missing -> implemented)" in out


def test_the_ops_config_loads_with_datasets(ops_loop):
    import datasets

    data = ops_loop["data"]
    ops = datasets.load_dataset(str(data), "ops", split="train").to_polars()
    stack = ops.filter(ops["sweep_id"] == ops_loop["sweeps"]["stack"])
    status = dict(zip(stack["op"], stack["status"]))
    assert status["aten::rsqrt"] == "missing" and status["aten::tanh"] == "CPU fallback"
    assert status["aten::mm"] == "implemented"
    assert "config_name: ops" in (data / "README.md").read_text()


def test_the_pretend_census_keeps_each_operators_dtype_signatures_and_ranks(ops_loop):
    """A real census on the pretend device: tiny-llama's RMSNorm upcasts to float32 before
    ``aten::rsqrt`` (the stack lacks it: the run stopped there, counted before it raised), on a
    (batch, positions, 1) tensor: ``f32``, 3 dims; per operator the signatures' calls add up to
    its calls."""
    llama = ops_loop["records"]["stack"]["tiny-llama"]
    sigs = list(
        zip(
            *(
                llama[f]
                for f in ("ops_sig_ops", "ops_sig_dtypes", "ops_sig_min_rank", "ops_sig_max_rank")
            )
        )
    )
    assert [s[1:] for s in sigs if s[0] == "aten::rsqrt"] == [("f32", 3, 3)]
    # the upcast before it; silu, which the stopped run never reached, from its CPU reference (in
    # bfloat16)
    assert {("aten::_to_copy", "bf16->f32"), ("aten::silu", "bf16")} <= {s[:2] for s in sigs}
    gpt2 = ops_loop["records"]["stack"]["tiny-gpt2"]  # a PASS: its own census, whole
    calls = dict(zip(gpt2["ops"], gpt2["ops_calls"]))
    for op in gpt2["ops"]:
        assert calls[op] == sum(
            c for o, c in zip(gpt2["ops_sig_ops"], gpt2["ops_sig_calls"]) if o == op
        ), op
    # timed on the pretend device's host clock
    assert len(gpt2["ops_sig_device_s"]) == len(gpt2["ops_sig_ops"])


def test_the_ops_config_has_a_row_per_operator_and_dtype_signature(ops_loop):
    from model_support.record import store

    rows = store.scan_ops(ops_loop["data"]).collect()
    stack = rows.filter(rows["sweep_id"] == ops_loop["sweeps"]["stack"])
    # one row per (operator, signature)
    assert stack.select("op", "dtypes").n_unique() == stack.height
    rsqrt = stack.filter(stack["op"] == "aten::rsqrt").to_dicts()
    assert [(r["dtypes"], r["min_rank"], r["max_rank"], r["status"]) for r in rsqrt] == [
        ("f32", 3, 3, "missing")
    ]
    # bf16->f32, f32->bf16, ...
    assert len(set(stack.filter(stack["op"] == "aten::_to_copy")["dtypes"])) >= 2


def test_the_plans_steps_name_the_dtypes_and_ranks_to_implement(ops_loop):
    plan = ops_loop["plan"]["plan"]
    assert [s["precise"] for s in plan] == [
        "aten::gelu for bf16, 3 dims",
        "aten::rsqrt for f32, 3 dims + aten::silu for bf16, 3 dims",
    ]
    assert plan[1]["signatures"]["aten::rsqrt"] == [
        {
            "dtypes": "f32",
            "min_rank": 3,
            "max_rank": 3,
            "calls": plan[1]["signatures"]["aten::rsqrt"][0]["calls"],
        }
    ]
    # the terminal's plan, from the CPU census
    assert "aten::rsqrt for f32, 3 dims" in ops_loop["text"]


#: A stack without ``aten::bmm``: every attention on the pretend device takes the math path, which
#: needs it; the CPU reference never calls it (its attention is its own flash kernel).
NO_BMM = {"missing_ops": ["aten::bmm"]}


@pytest.mark.slow
def test_a_stack_lacking_bmm_lists_it_on_every_failing_row_and_ops_predicts_those_failures(
    tmp_path, fixture_models
):
    """A real sweep on a stack lacking ``aten::bmm``: each FAIL(gen) row keeps the device's
    census (the weights' ``aten::_to_copy`` at load, then the math attention's ``aten::bmm``,
    where it stopped) completed by what the CPU reference alone called, lists bmm as missing, and
    ``ops`` predicts the failures on the sweep's own stack (a census replaced by the reference's
    lost bmm: no missing operator, every model predicted PASS)."""
    import yaml

    from model_support.probe.model_ids import display_name
    from model_support.record import store

    probe = {
        "device": "pretend",
        "max_new_tokens": 2,
        "judge": False,
        "reference": "cpu",
        "perf": False,
    }
    models = [str(REPO / "data" / "models" / m) for m in ("tiny-llama", "tiny-gpt2")]
    definition = tmp_path / "bmm.yaml"
    definition.write_text(
        yaml.safe_dump({"name": "no-bmm", "probe": probe, "models": models, "workers": 1})
    )
    data = tmp_path / "data"
    cli(["sweep", str(definition), "--no-report"], data, NO_BMM)
    (sweep,) = store.list_sweeps(data)
    rows = {display_name(r["model_id"]): r for r in store.read_records(data, sweep)}
    assert set(rows) == {"tiny-llama", "tiny-gpt2"}
    for name, r in rows.items():
        assert (r["status"], r["attribution"], r["ops_source"]) == (
            "FAIL(gen)",
            "stack",
            "reference",
        ), name
        assert r["error_message"].startswith("Could not run 'aten::bmm'"), name
        assert r["ops_missing"] == ["aten::bmm"], name
        assert r["ops_stages"][r["ops"].index("aten::bmm")] == "generate", name
        # the device's census, kept
        assert r["ops_stages"][r["ops"].index("aten::_to_copy")] == "load", name
    answer = json.loads(cli(["ops", sweep, "--json"], data).stdout)
    predicted = {
        name_of(k): (m["predicted"], m["ops_missing"]) for k, m in answer["models"].items()
    }
    assert predicted == {name: ("FAIL(gen)", ["aten::bmm"]) for name in rows}
    (step,) = answer["plan"]
    assert (step["op"], sorted(map(name_of, step["unlocks"])), step["passing"]) == (
        "aten::bmm",
        sorted(rows),
        2,
    )
