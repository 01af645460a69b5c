"""The census' dtype signatures (issue 38, item 4): per operator, the dtypes and ranks each call
used; the ``ops`` config one row per operator and signature; a stack that refuses a dtype some
calls use, predicted from the signatures; the plan's step naming dtypes and ranks. The real
pretend sweeps' signatures (tiny-llama's RMSNorm ``aten::rsqrt`` in float32, 3 dims) are checked
in tests/test_ops.py, on its sweeps."""

from __future__ import annotations

import json

PRETEND_VAR = "MODEL_SUPPORT_PRETEND"


def test_the_census_keeps_each_calls_dtypes_and_ranks():
    """A bfloat16 norm upcast to float32 as a llama's RMSNorm is, a concatenation, a factory:
    each call under its canonical signature, with the range of ranks it was called with and its
    calls."""
    import torch

    from model_support.probe.census_mode import Census

    counted = Census("cpu", timed=True)
    x = torch.ones(2, 5, 8, dtype=torch.bfloat16)
    with torch.inference_mode(), counted:
        counted.enter("generate")
        up = x.to(torch.float32)
        torch.rsqrt(up.pow(2).mean(-1, keepdim=True) + 1e-6)  # 3 dims
        torch.rsqrt(torch.ones(4))  # 1 dim
        torch.cat([x, x])
        torch.arange(5)
    fields = counted.fields("run")
    sigs = {
        (op, dtypes): (calls, low, high)
        for op, dtypes, calls, low, high in zip(
            *(
                fields[f]
                for f in (
                    "ops_sig_ops",
                    "ops_sig_dtypes",
                    "ops_sig_calls",
                    "ops_sig_min_rank",
                    "ops_sig_max_rank",
                )
            )
        )
    }
    # the output dtype the call names, after ->
    assert sigs[("aten::_to_copy", "bf16->f32")] == (1, 3, 3)
    assert sigs[("aten::rsqrt", "f32")] == (2, 1, 3)  # one signature, ranks 1 to 3
    assert sigs[("aten::cat", "[bf16]")] == (1, 3, 3)  # a list of tensors: its dtypes in brackets
    # a factory: no tensor argument, the rank of what it made
    assert sigs[("aten::arange", "->i64")] == (1, 1, 1)
    # per operator, the signatures' calls and seconds add up to the operator's
    calls = dict(zip(fields["ops"], fields["ops_calls"]))
    for op in fields["ops"]:
        assert calls[op] == sum(c for (o, _), (c, _, _) in sigs.items() if o == op), op
    times = counted.times()
    assert len(times["ops_sig_device_s"]) == len(fields["ops_sig_ops"])
    assert abs(sum(times["ops_device_s"]) - sum(times["ops_sig_device_s"])) < 1e-9


def test_a_signature_names_its_dtypes_as_torch_does():
    import torch

    from model_support.probe.census import dtype_signature, signature_dtypes

    assert (
        dtype_signature((torch.bfloat16, (torch.float32, torch.bool)), torch.int64)
        == "bf16,[f32,bool]->i64"
    )
    assert dtype_signature(()) == ""
    assert signature_dtypes("bf16,[f32,bool]->i64") == ["bfloat16", "float32", "bool", "int64"]
    assert signature_dtypes("float8_e4m3fn") == ["float8_e4m3fn"]


def test_the_ops_config_has_a_row_per_operator_and_signature():
    """Two models' signatures merge by (operator, signature), calls summed, ranks widened; a
    census from before signatures gives one row per operator, its signature null."""
    from model_support.record.ops_table import op_rows

    base = {
        "sweep_id": "s",
        "device_type": "pretend",
        "versions": None,
        "ops_missing": ["aten::rsqrt"],
    }
    a = {
        **base,
        "model_id": "a",
        "ops": ["aten::rsqrt", "aten::mm"],
        "ops_calls": [4, 3],
        "ops_sig_ops": ["aten::rsqrt", "aten::mm", "aten::mm"],
        "ops_sig_dtypes": ["f32", "bf16,bf16", "f32,f32"],
        "ops_sig_calls": [4, 2, 1],
        "ops_sig_min_rank": [3, 2, 2],
        "ops_sig_max_rank": [3, 2, 2],
    }
    b = {**a, "model_id": "b", "ops_sig_min_rank": [1, 2, 2], "ops_missing": []}
    old = {**base, "model_id": "old", "ops": ["aten::mm"], "ops_calls": [5], "ops_missing": []}
    rows = {(r["op"], r["dtypes"]): r for r in op_rows([a, b, old])}
    assert set(rows) == {
        ("aten::rsqrt", "f32"),
        ("aten::mm", "bf16,bf16"),
        ("aten::mm", "f32,f32"),
        ("aten::mm", None),
    }
    rsqrt = rows[("aten::rsqrt", "f32")]
    assert (rsqrt["status"], rsqrt["calls"], rsqrt["min_rank"], rsqrt["max_rank"]) == (
        "missing",
        8,
        1,
        3,
    )
    assert (
        rows[("aten::mm", "bf16,bf16")]["calls"],
        rows[("aten::mm", "bf16,bf16")]["models"],
    ) == (4, ["a", "b"])
    assert (rows[("aten::mm", None)]["calls"], rows[("aten::mm", None)]["min_rank"]) == (5, None)


def _model(key, sigs, stages=None, dtype="bfloat16"):
    """A made-up census row: ``sigs`` [(op, signature, calls, min rank, max rank)], the operators
    in their order."""
    from model_support.ops import ModelOps

    ops = list(dict.fromkeys(s[0] for s in sigs))
    return ModelOps(
        key=key,
        status="PASS",
        device_type="cpu",
        ops=ops,
        stages=stages or ["generate"] * len(ops),
        calls=[1] * len(ops),
        source="run",
        dtype=dtype,
        signatures=[tuple(s) for s in sigs],
    )


def test_a_stack_refusing_a_dtype_some_calls_use_stops_at_the_first_of_them(monkeypatch):
    """A pretend stack that holds no float32: a bfloat16 model whose norm upcasts to float32 is
    predicted to fail at the upcast (its stage: the generation), the dtype its blocker, the
    plan's step naming the calls that need it; a model that never leaves bfloat16 passes. The
    prediction asks the adapter ``dtype::`` for each dtype a signature names."""
    from model_support.ops import porting_plan, predict
    from model_support.ops.coverage import census_ops
    from model_support_pretend.adapter import PretendAdapter

    monkeypatch.setenv(
        PRETEND_VAR, json.dumps({"unsupported_dtypes": ["float32"], "missing_ops": ["aten::gelu"]})
    )
    llama = _model(
        "llama",
        [
            ("aten::embedding", "bf16,i64", 2, 2, 2),
            ("aten::_to_copy", "bf16->f32", 5, 3, 3),
            ("aten::rsqrt", "f32", 5, 3, 3),
        ],
    )
    plain = _model(
        "plain", [("aten::embedding", "bf16,i64", 2, 2, 2), ("aten::mm", "bf16,bf16", 4, 2, 2)]
    )
    neox = _model("neox", [("aten::mm", "bf16,bf16", 4, 2, 2), ("aten::gelu", "bf16", 2, 3, 3)])
    models = [llama, plain, neox]
    asked = census_ops(models)
    assert {"dtype::float32", "dtype::int64", "dtype::bfloat16"} <= set(asked)
    predict(models, PretendAdapter("pretend").op_coverage(asked))
    assert (llama.predicted, llama.first_missing, llama.blockers) == (
        "FAIL(gen)",
        "dtype::float32",
        ["dtype::float32"],
    )
    assert (plain.predicted, neox.predicted) == ("PASS", "FAIL(gen)")
    steps = {s.op: s for s in porting_plan(models)}
    assert (
        steps["dtype::float32"].precise
        == "dtype::float32 (aten::_to_copy bf16->f32, 3 dims; aten::rsqrt f32, 3 dims)"
    )
    assert steps["aten::gelu"].precise == "aten::gelu for bf16, 3 dims"
    assert steps["aten::gelu"].as_json()["signatures"] == {
        "aten::gelu": [{"dtypes": "bf16", "min_rank": 3, "max_rank": 3, "calls": 2}]
    }


def test_the_plans_line_merges_the_signatures_of_the_models_it_blocks():
    """Two models need ``aten::rsqrt``, in two dtypes and ranks: the step names both, the
    most-called first, with their ranks merged over the models; a census without signatures names
    the operator alone."""
    from model_support.ops import porting_plan, predict

    coverage = {"aten::rsqrt": "missing", "aten::mm": "implemented"}
    a = _model("a", [("aten::mm", "bf16,bf16", 1, 2, 2), ("aten::rsqrt", "f32", 6, 3, 3)])
    b = _model("b", [("aten::rsqrt", "f32", 2, 1, 2), ("aten::rsqrt", "bf16", 1, 2, 2)])
    (step,) = porting_plan(predict([a, b], coverage))
    assert step.precise == "aten::rsqrt for f32, 1-3 dims; bf16, 2 dims"
    old = _model("old", [("aten::rsqrt", "f32", 1, 1, 1)])
    old.signatures = []
    (step,) = porting_plan(predict([old], coverage))
    assert step.precise == "aten::rsqrt"
