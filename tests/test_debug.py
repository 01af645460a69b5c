"""The debug helpers: which module raises, which module diverges, at which generation step.

Unit tests on tiny models built in memory from configs; then the debug notebook executed for real
with papermill (through ``run_debug_notebook``, as ``model-support debug`` does) on the two
fixtures built to fail: a gpt2 whose position table is too short, a llama that overflows in bf16.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from model_support import debug
from model_support.record import store
from model_support.record.sweep_meta import ModelEntry, SweepMeta, safe_name

PROMPT_LEN = 5


def tiny_llama(**extra):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "llama",
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        **extra,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def tiny_gpt2(n_positions: int):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "gpt2",
        vocab_size=64,
        n_embd=32,
        n_inner=64,
        n_layer=2,
        n_head=4,
        n_positions=n_positions,
        bos_token_id=None,
        eos_token_id=None,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def llama_fp32():
    return tiny_llama()


@pytest.fixture()
def prompt_ids():
    return torch.arange(3, 3 + PROMPT_LEN).unsqueeze(0), torch.ones(1, PROMPT_LEN, dtype=torch.long)


# --- where a forward raises
# -------------------------------------------------------------------------------


class Boom(nn.Module):
    """Stands in for a module whose kernel fails on the device."""

    def forward(self, hidden):
        raise RuntimeError("kernel not implemented for this dtype (planted)")


def test_a_module_that_raises_is_named_with_its_class_input_shapes_and_dtypes(
    llama_fp32, prompt_ids
):
    model = copy.deepcopy(llama_fp32)
    model.model.layers[1].mlp.down_proj = Boom()
    trace = debug.trace_forward(model, *prompt_ids)
    failure = trace.failure
    assert not trace.ok
    assert failure["module"] == "model.layers.1.mlp.down_proj"
    assert failure["class"] == "Boom"
    assert failure["inputs"] == [
        {"arg": "args[0]", "shape": [1, PROMPT_LEN, 64], "dtype": "torch.float32", "device": "cpu"}
    ]
    assert failure["stack"] == [
        "",
        "model",
        "model.layers.1",
        "model.layers.1.mlp",
        "model.layers.1.mlp.down_proj",
    ]
    assert failure["error_type"] == "RuntimeError"
    assert failure["error_message"] == "kernel not implemented for this dtype (planted)"
    assert "Boom" in debug.failure_html(failure, "Forward") and "1, 5, 64" in debug.failure_html(
        failure, "Forward"
    )
    # Every module that finished before it was recorded, in completion order; none after it.
    names = [call["name"] for call in trace.calls]
    assert names[0] == "model.embed_tokens" and names[-1] == "model.layers.1.mlp.up_proj"
    assert "model.layers.0" in names and "model.layers.1" not in names


class Fallback(nn.Module):
    """A parent that catches its first child's exception and carries on, then fails in ``how``."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.tried, self.fails = Boom(), nn.Linear(4, 4)

    def forward(self, x):
        try:
            self.tried(x)
        except RuntimeError as exc:
            if self.how == "rewrap":
                raise ValueError("the optimised path failed") from exc
        if self.how == "own-code":
            raise TypeError(f"unsupported input of shape {tuple(x.shape)}")
        return self.fails(x.to(torch.int64))  # Linear on integers: a real dtype error


class Toy(nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.embed, self.block = nn.Embedding(64, 4), Fallback(how)

    def forward(self, input_ids, attention_mask=None):
        return self.block(self.embed(input_ids))


@pytest.mark.parametrize(
    "how, module, stack, error",
    [
        ("second-child", "block.fails", ["", "block", "block.fails"], "RuntimeError"),
        ("rewrap", "block.tried", ["", "block", "block.tried"], "ValueError"),
        ("own-code", "block", ["", "block"], "TypeError"),
    ],
)
def test_the_culprit_is_right_when_the_model_catches_or_rewraps_exceptions(
    prompt_ids, how, module, stack, error
):
    trace = debug.trace_forward(Toy(how), *prompt_ids)
    assert (trace.failure["module"], trace.failure["stack"], trace.failure["error_type"]) == (
        module,
        stack,
        error,
    )
    assert trace.failure["inputs"][0]["dtype"] == (
        "torch.int64" if how == "second-child" else "torch.float32"
    )


def test_first_tensor_of_tuples_dicts_and_dataclasses():
    from transformers.modeling_outputs import CausalLMOutputWithPast

    a, b = torch.zeros(1), torch.ones(2)

    @dataclasses.dataclass
    class Out:
        cache: object
        hidden: torch.Tensor

    assert debug.first_tensor(a) is a
    assert debug.first_tensor((None, (b, a))) is b
    assert debug.first_tensor({"x": None, "y": b}) is b
    assert debug.first_tensor(Out(cache=None, hidden=b)) is b
    assert debug.first_tensor(CausalLMOutputWithPast(loss=None, logits=a)) is a
    assert debug.first_tensor((None, "text")) is None


# --- where the device diverges from the reference
# ----------------------------------------------------------


@pytest.mark.parametrize(
    "plant, module, why",
    [
        (
            lambda m: m.model.layers[0].mlp.up_proj.weight.mul_(4.0),
            "model.layers.0.mlp.up_proj",
            "relative difference",
        ),
        (
            lambda m: m.model.layers[1].self_attn.v_proj.weight.__setitem__((0, 0), float("inf")),
            "model.layers.1.self_attn.v_proj",
            "non-finite",
        ),
    ],
)
def test_a_planted_divergence_is_the_first_offender(llama_fp32, prompt_ids, plant, module, why):
    device = copy.deepcopy(llama_fp32)
    with torch.no_grad():
        plant(device)
    table = debug.compare_traces(
        debug.trace_forward(device, *prompt_ids), debug.trace_forward(llama_fp32, *prompt_ids)
    )
    offender = debug.first_offender(table)
    assert offender["module"] == module and offender["class"] == "Linear"
    assert why in debug.offender_reason(offender, debug.DEFAULT_TOLERANCE)
    before = table.filter(table["index"] < offender["index"])
    assert before.height > 5 and before["max_abs_diff"].max() == 0.0 and not before["exceeds"].any()
    assert table["first_offender"].sum() == 1
    chart = debug.divergence_chart(table, debug.DEFAULT_TOLERANCE).to_dict()
    assert module in json.dumps(chart)


def test_bf16_rounding_alone_is_not_a_divergence(llama_fp32, prompt_ids):
    device = copy.deepcopy(llama_fp32).to(torch.bfloat16)
    table = debug.compare_traces(
        debug.trace_forward(device, *prompt_ids), debug.trace_forward(llama_fp32, *prompt_ids)
    )
    assert debug.first_offender(table) is None
    # all ran once but model.layers (a ModuleList)
    assert table.height == len(dict(llama_fp32.named_modules())) - 1
    assert table["max_abs_diff"].null_count() == 0
    assert (table["device_dtype"] == "bfloat16").all()
    assert 0 < table["max_rel_diff"].max() < debug.DEFAULT_TOLERANCE


def test_compare_tensors_counts_new_nonfinite_values_and_ignores_shared_ones():
    reference = torch.tensor([1.0, 2.0, float("nan"), 4.0])
    device = torch.tensor([1.0, float("inf"), float("nan"), 3.0])
    stats = debug.compare_tensors(device, reference)
    assert stats["new_nonfinite"] == 1 and stats["device_inf"] == 1 and stats["reference_nan"] == 1
    assert stats["max_abs_diff"] == 1.0 and stats["max_rel_diff"] == 0.25


# --- where generation fails
# --------------------------------------------------------------------------------


def test_generation_failure_step_and_sequence_length(prompt_ids):
    # n_positions = prompt + 3: step s feeds position PROMPT_LEN + s - 1, out of the table at s = 4.
    model = tiny_gpt2(PROMPT_LEN + 3)
    tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=None)
    steps = debug.generate_steps(model, tokenizer, *prompt_ids, max_new_tokens=8)
    assert not steps["ok"]
    assert (steps["step"], steps["seq_len"], steps["tokens_in"]) == (4, PROMPT_LEN + 4, PROMPT_LEN)
    assert steps["tokens_out"] == 4 and steps["forward_calls"] == 5
    assert (
        steps["failure"]["module"] == "transformer.wpe"
        and steps["failure"]["error_type"] == "IndexError"
    )
    assert steps["failure"]["inputs"][0]["shape"] == [1, 1]
    healthy = debug.generate_steps(tiny_gpt2(64), tokenizer, *prompt_ids, max_new_tokens=8)
    assert healthy["ok"] and healthy["tokens_out"] == 8 and healthy["step"] is None


def test_result_is_json_safe_and_names_the_findings(llama_fp32, prompt_ids):
    device = copy.deepcopy(llama_fp32)
    with torch.no_grad():
        device.model.norm.weight.fill_(float("inf"))
    table = debug.compare_traces(
        debug.trace_forward(device, *prompt_ids), debug.trace_forward(llama_fp32, *prompt_ids)
    )
    loaded = {"chat_template_used": False, "tokens_in": PROMPT_LEN, "info": {"model_type": "llama"}}
    generation = {"ok": True, "output_token_ids": [1, 2]}
    reference = {"ok": True, "output_token_ids": [1, 3], "step": None, "failure": None}
    result = debug.build_result(
        {"model_id": "tiny", "tolerance": 0.2},
        loaded,
        "cpu",
        debug.trace_forward(device, *prompt_ids),
        table,
        generation,
        reference,
    )
    json.dumps(result, allow_nan=False)
    assert result["first_offender"]["module"] == "model.norm"
    assert result["generation"]["first_divergence"] == 1
    assert "model.norm" in debug.summary_html(result)


# --- choosing a model of a sweep
# ------------------------------------------------------------------------------

SWEEP = SweepMeta.from_dict(
    {
        "sweep_id": "s1",
        "probe": {"device": "cpu", "dtype": "bfloat16", "reference": "cpu", "max_new_tokens": 8},
        "models": [
            {"model_id": "org/Qwen2-0.5B"},
            {"model_id": "org/Qwen2-1.5B", "overrides": {"dtype": "float16"}},
            {"model_id": "local:tiny-llama", "source": "/abs/models/tiny-llama"},
        ],
    }
)


def test_a_model_is_found_by_id_folder_name_or_unique_fragment():
    assert debug.resolve_model(SWEEP, "org/Qwen2-1.5B").model_id == "org/Qwen2-1.5B"
    assert debug.resolve_model(SWEEP, "org__Qwen2-0.5B").model_id == "org/Qwen2-0.5B"
    assert debug.resolve_model(SWEEP, "tiny-LLAMA").source == "/abs/models/tiny-llama"
    with pytest.raises(
        ValueError, match=r"matches 2 models of sweep s1.*org/Qwen2-0\.5B, org/Qwen2-1\.5B\.$"
    ):
        debug.resolve_model(SWEEP, "qwen2")
    with pytest.raises(
        ValueError,
        match=r"^No model of sweep s1 matches 'gpt2'; candidates: org/Qwen2-0\.5B, .*tiny-llama\.$",
    ):
        debug.resolve_model(SWEEP, "gpt2")


def test_notebook_parameters_come_from_the_sweep_and_typos_are_refused():
    params = debug.debug_parameters(SWEEP, SWEEP.models[1], {"tolerance": 0.5})
    assert params == {
        "device": "cpu",
        "dtype": "float16",
        "max_new_tokens": 8,
        "tolerance": 0.5,
        "model_id": "org/Qwen2-1.5B",
    }  # "reference" is the probe's, not the notebook's
    # loaded from
    assert debug.debug_parameters(SWEEP, SWEEP.models[2])["model_id"] == "/abs/models/tiny-llama"
    with pytest.raises(ValueError, match="'tolerence' is not a parameter of notebooks/debug.ipynb"):
        debug.debug_parameters(SWEEP, SWEEP.models[0], {"tolerence": 0.5})
    with pytest.raises(ValueError, match="tolerance=-1.0 is too small"):
        debug.debug_parameters(SWEEP, SWEEP.models[0], {"tolerance": -1.0})


# --- the notebook, executed for real on the failure fixtures
# ----------------------------------------------------


@pytest.fixture(scope="module")
def fixture_sweep(tmp_path_factory, fixture_models):
    """A sweep folder (sweep.json only) listing the two debug fixtures with CPU probe settings, and
    the debug notebook executed for each (both at once, as two `model-support debug` runs would)."""
    from concurrent.futures import ThreadPoolExecutor

    data_dir = tmp_path_factory.mktemp("debug-data")
    SweepMeta(
        sweep_id="dbg",
        name="dbg",
        created_at="2026-12-01T00:00:00+00:00",
        probe={
            "device": "cpu",
            "dtype": "bfloat16",
            "max_new_tokens": 8,
            "reference": "cpu",
            "reference_max_params": 3_000_000_000,
            "seed": 0,
        },
        models=[ModelEntry(f"local:{name}", fixture_models[name]["path"]) for name in FIXTURES],
    ).write(store.sweep_dir(data_dir, "dbg"))
    with ThreadPoolExecutor(max_workers=len(FIXTURES)) as pool:
        futures = {
            name: pool.submit(debug.run_debug_notebook, data_dir, "dbg", fragment)
            for name, fragment in FIXTURES.items()
        }
        paths = {name: future.result() for name, future in futures.items()}
    return {name: {**fixture_models[name], "notebook": paths[name]} for name in FIXTURES}, data_dir


#: The two fixtures, each with the fragment of its id that the test passes as MODEL.
FIXTURES = {"fail-short-positions": "short-positions", "diverge-bf16-overflow": "diverge-bf16"}


def test_notebook_reports_the_step_and_sequence_length_where_generation_fails(fixture_sweep):
    fixtures, data_dir = fixture_sweep
    entry = fixtures["fail-short-positions"]
    path = entry["notebook"]
    assert (
        path
        == store.sweep_dir(data_dir, "dbg")
        / "debug"
        / f"{safe_name('local:fail-short-positions')}.ipynb"
    )
    result = debug.debug_result_from_notebook(path)
    generation = result["generation"]
    assert not generation["ok"]
    assert generation["step"] == entry["fail_step"]
    assert generation["seq_len"] == entry["fail_seq_len"]
    assert generation["tokens_in"] == entry["tokens_in"] == result["tokens_in"]
    assert (
        generation["failure"]["module"] == "transformer.wpe"
        and generation["failure"]["error_type"] == "IndexError"
    )
    assert (
        result["forward_ok"] and result["first_offender"] is None and result["device_type"] == "cpu"
    )
    assert (
        top_conclusion(path)
        == "fails the same way on the CPU reference: not specific to this device"
    )


def top_conclusion(path) -> str:
    """The one line the debug notebook shows at its top (filled in when the notebook ends)."""
    import re

    import nbformat

    cells = [c for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code"]
    load_cell = next(c for c in cells if "conclusion_slot" in c.source)
    html = next(
        o["data"]["text/html"]
        for o in load_cell.outputs
        if "Conclusion" in o.get("data", {}).get("text/html", "")
    )
    return re.sub(r"<[^>]+>", "", html).removeprefix("Conclusion: ").rstrip(".")


def test_a_notebook_without_a_result_and_an_ambiguous_model_are_refused(fixture_sweep, tmp_path):
    import nbformat

    fixtures, data_dir = fixture_sweep
    empty = tmp_path / "empty.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), str(empty))
    with pytest.raises(ValueError, match="holds no debug result"):
        debug.debug_result_from_notebook(empty)
    with pytest.raises(ValueError, match="matches 2 models of sweep dbg"):
        debug.run_debug_notebook(data_dir, "dbg", "-")
    with pytest.raises(ValueError, match="Sweep 'nope' does not exist"):
        debug.run_debug_notebook(data_dir, "nope", "diverge")
    # TorchTPU's fused eager: refused before a notebook runs on any other device
    for device in ("cpu", "pretend"):
        with pytest.raises(ValueError, match=f"runs on tpu devices only, not on {device}"):
            debug.run_debug_notebook(
                data_dir, "dbg", "diverge", parameters={"mode": "fused", "device": device}
            )


def test_notebook_names_the_module_that_diverges_in_bf16(fixture_sweep):
    import nbformat

    fixtures, _ = fixture_sweep
    entry = fixtures["diverge-bf16-overflow"]
    result = debug.debug_result_from_notebook(entry["notebook"])
    offender = result["first_offender"]
    assert offender["module"] == entry["diverging_module"] == "model.layers.0.mlp.gate_proj"
    assert offender["new_nonfinite"] > 0 and offender["device_dtype"] == "bfloat16"
    assert (
        result["forward_ok"]
        and result["generation"]["ok"]
        and result["reference_dtype"] == "float32"
    )
    outputs = [
        o
        for cell in nbformat.read(str(entry["notebook"]), as_version=4).cells
        for o in cell.get("outputs", [])
    ]
    assert any("image/svg+xml" in o.get("data", {}) for o in outputs)  # the chart, drawn offline
    assert any("First divergence" in o.get("data", {}).get("text/html", "") for o in outputs)
    assert top_conclusion(entry["notebook"]).startswith(
        "only the device diverges: first in model.layers.0.mlp.gate_proj"
    )


def test_the_debug_notebook_and_the_record_say_the_same_about_the_same_run(fixture_sweep):
    """The debug notebook's numerics are the probe's own check (``agreement``), on the same
    settings."""
    from model_support.probe import run as probe

    fixtures, _ = fixture_sweep
    entry = fixtures["diverge-bf16-overflow"]
    result = debug.debug_result_from_notebook(entry["notebook"])
    record = probe.run_probe(
        entry["path"], device="cpu", dtype="bfloat16", reference="cpu", judge=False
    )
    keys = ("numerics", "numerics_step", "numerics_note", "reference_match", "first_divergence")
    assert {k: result["numerics"][k] for k in keys} == {k: record[k] for k in keys}
    assert (record["numerics"], record["numerics_step"]) == ("diverges", 0)
    assert "numerics:   diverges (step 0 of 8" in debug.summary_text(result)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "faults", "expected"),
    [
        (
            "tiny-gpt2",
            {"devices": 1},
            "conclusion: runs and agrees with the CPU reference within tolerance",
        ),
        (
            "tiny-llama",
            {"devices": 1, "missing_ops": ["aten::rsqrt"]},
            "conclusion: only the device fails: first in",
        ),
    ],
)
def test_debug_on_the_pretend_device_reports_only_failures_the_probe_has(
    tmp_path, fixture_models, model, faults, expected
):
    """The tracer ran its forward outside the probe's inference mode: on the pretend device every
    PASS model 'failed' with "Cannot set version_counter for inference tensor" at input_ids.view;
    a real FAIL(gen) (a missing operator) must still be named with its module."""
    import os

    from helpers import cli_debug

    os.environ["MODEL_SUPPORT_PRETEND"] = json.dumps(faults)
    try:
        run = cli_debug(
            tmp_path,
            fixture_models[model]["path"],
            {"device": "pretend", "reference": "cpu", "perf": False},
            {},
            "eager+dynamic",
        )
    finally:
        del os.environ["MODEL_SUPPORT_PRETEND"]
    assert run.returncode == 0, run.stderr[-3000:]
    assert expected in run.stdout, run.stdout
    assert "version_counter" not in run.stdout
    if "missing_ops" in faults:
        assert "RMSNorm" in run.stdout and "rsqrt" in run.stdout


def test_a_failure_only_the_tracer_has_is_said_to_be_the_tracers():
    failure = {
        "error_type": "RuntimeError",
        "error_message": "x",
        "module": "transformer",
        "class": "GPT2Model",
    }
    said = debug.compare.conclusion({"forward_failure": failure, "generation": {"ok": True}})
    assert (
        said.startswith("the tracer's failure, not the model's")
        and "generation ran on the device" in said
    )
    assert debug.compare.conclusion(
        {"forward_failure": failure, "generation": {"ok": False}}
    ).startswith("only the device fails")
