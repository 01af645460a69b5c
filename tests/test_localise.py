"""The first wrong operator (``model-support localise``, ``debug.localise``) and its one-operator
repro script.

On the pretend device, each stack fault at a time: ``wrong_ops`` on one operator (a norm's
``aten::rsqrt``, the MLP's ``aten::silu``, attention's ``aten::bmm``) is named as exactly that
operator in exactly its module, with no operator downstream flagged; noise the size of bf16 rounding
on every matrix product is not flagged, every value off by 2% is. The saved script exits 1 on the
faulty stack and 0 with the fault removed. The pretend backend registers a device for the life of a
process, so each stack is a child process (run side by side); the tolerance and the inputs file's
checks run here on the CPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from model_support.debug import localise, op_check, op_repro
from model_support.errors import UserError
from model_support.probe.records import new_record
from model_support.record import store
from model_support.record.sweep_meta import ModelEntry, SweepMeta
from model_support.render.html import MODEL_NUMBERS
from model_support_pretend import PretendConfigError, parse

MODEL = "tiny-llama"
#: CUDA's flash attention kernel, and the pretend device's own attention kernel (its
#: ``sdpa_kernel``).
FLASH, OWN = "aten::_scaled_dot_product_flash_attention", "pretend::attention"
#: Each case: its stack, and the operator and module the localiser must name (None: nothing is
#: wrong).
CASES = {
    "rsqrt": ({"wrong_ops": ["aten::rsqrt"]}, "aten::rsqrt", "model.layers.0.input_layernorm"),
    "silu": ({"wrong_ops": ["aten::silu"]}, "aten::silu", "model.layers.0.mlp.act_fn"),
    "bf16-noise": ({"wrong_ops": {"aten::mm": 0.0039, "aten::bmm": 0.0039}}, None, None),
    "two-percent": (
        {"wrong_ops": {"aten::mm": 0.02}},
        "aten::mm",
        "model.layers.0.self_attn.q_proj",
    ),
    # attention run as CUDA runs it, one fused kernel the CPU has none of: replayed through the math
    # attention
    "flash": ({"sdpa_kernel": "flash", "wrong_ops": [FLASH]}, FLASH, "model.layers.0.self_attn"),
    "flash-healthy": ({"sdpa_kernel": "flash"}, None, None),
    # attention run as a kernel of the device's own, which nothing replays: not judged, and said
    # first
    "own-then-silu": (
        {"sdpa_kernel": "own", "wrong_ops": ["aten::silu"]},
        "aten::silu",
        "model.layers.0.mlp.act_fn",
    ),
}
#: The wrong operator is one the CPU cannot run (a kernel registered for the device alone): not
#: judged, never agreeing.
NOT_JUDGED_CASE = {"sdpa_kernel": "own", "wrong_ops": [OWN]}
#: The case run through the command line: inside attention (sdpa decomposed, as the census does).
CLI_CASE = ({"wrong_ops": ["aten::bmm"]}, "aten::bmm", "model.layers.0.self_attn")


def child_env(config: dict | None, **extra) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **extra}
    env.pop("MODEL_SUPPORT_PRETEND", None)
    if config is not None:
        env["MODEL_SUPPORT_PRETEND"] = json.dumps(config)
    return env


def pretend_sweep(data: Path, path: str, config: dict, device: str = "pretend") -> None:
    """A one-model sweep ``s`` on the pretend stack ``config``, with the model's record (the
    runner's own record of a PASS; nothing probed: the localiser reruns the model itself)."""
    SweepMeta(
        sweep_id="s",
        name="s",
        created_at="2026-12-01T00:00:00+00:00",
        probe={"device": device, "dtype": "bfloat16", "perf": False},
        models=[ModelEntry(f"local:{MODEL}", path)],
        device_config={"MODEL_SUPPORT_PRETEND": json.dumps(config)} if device == "pretend" else {},
    ).write(store.sweep_dir(data, "s"))
    record = new_record(
        f"local:{MODEL}", {"device": device}, sweep_id="s", status="PASS", device_type=device
    )
    store.store_result(data, "s", record, None, "")


def run_library(data: Path, config: dict) -> subprocess.CompletedProcess:
    code = f"""
        import json
        from model_support.debug import localise
        print(json.dumps(localise.localise({str(data)!r}, "s", {MODEL!r})))
    """
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=child_env(config),
        timeout=300,
    )


def run_cli(data: Path, config: dict) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "model_support.cli",
        "localise",
        "s",
        MODEL,
        "--json",
        "--data-dir",
        str(data),
    ]
    return subprocess.run(
        command, capture_output=True, text=True, env=child_env(config), timeout=300
    )


def run_script(script: Path, config: dict | None = None, **env) -> subprocess.CompletedProcess:
    """A one-operator script run with plain python in its folder (nothing of this project on its
    path)."""
    return subprocess.run(
        [sys.executable, script.name],
        capture_output=True,
        text=True,
        env=child_env(config, **env),
        cwd=script.parent,
        timeout=300,
    )


@pytest.fixture(scope="module")
def localised(tmp_path_factory, fixture_models) -> dict:
    """Every case localised at once, each on its own stack in its own process: name -> (result,
    data folder)."""
    path = fixture_models[MODEL]["path"]
    jobs = {}
    with ThreadPoolExecutor(max_workers=3) as pool:
        stacks = {name: config for name, (config, _, _) in {**CASES, "cli": CLI_CASE}.items()}
        for name, config in {**stacks, "not-judged": NOT_JUDGED_CASE}.items():
            data = tmp_path_factory.mktemp(f"localise-{name}")
            pretend_sweep(data, path, config)
            jobs[name] = (
                pool.submit(run_cli if name == "cli" else run_library, data, config),
                data,
            )
        done = {name: (job.result(), data) for name, (job, data) in jobs.items()}
    results = {}
    for name, (run, data) in done.items():
        assert run.returncode == 0, f"{name}: {run.stderr[-3000:]}"
        results[name] = (json.loads(run.stdout.strip().splitlines()[-1]), data)
    return results


@pytest.mark.slow
@pytest.mark.parametrize("case", [*CASES, "cli"])
def test_each_fault_is_named_as_exactly_its_operator_and_module(localised, case):
    result, data = localised[case]
    _, operator, module = CLI_CASE if case == "cli" else CASES[case]
    assert set(localise.KEYS) <= set(result)
    assert (result["operator"], result["module"]) == (operator, module), result["summary"]
    if operator is None:  # nothing invented: the finding is a sentence
        assert result["repro"] is None and result["wrong_ops"] == [] and result["ops_checked"] > 200
        assert result["summary"].startswith("No operator is wrong")
        return
    assert result["overload"] == "default"
    # not one operator downstream of it
    assert {w["operator"] for w in result["wrong_ops"]} == {operator}
    assert result["shapes"] and len(result["shapes"]) == len(result["dtypes"])
    assert result["max_abs_error"] > 0 and result["max_rel_error"] > 0
    stored = localise.stored(data, "s", f"local:{MODEL}")
    assert stored == result  # beside the record
    assert Path(result["repro"]).parent == store.sweep_dir(data, "s") / localise.LOCALISED


@pytest.mark.slow
def test_the_two_percent_fault_is_two_percent_and_attention_is_decomposed(localised):
    two = localised["two-percent"][0]
    assert 0.015 < two["rms_rel_error"] < 0.03 and two["dtypes"] == ["bfloat16", "bfloat16"]
    attention = localised["cli"][0]
    # the bmm, not sdpa
    assert attention["module_class"] == "LlamaAttention" and len(attention["shapes"]) == 2


@pytest.mark.slow
def test_the_one_operator_script_fails_on_the_faulty_stack_and_passes_without_the_fault(localised):
    result, _ = localised["cli"]
    script = Path(result["repro"])
    (inputs,) = (script.parent / op_repro.INPUTS).glob("*.pt")
    assert inputs.stem == hashlib.sha256(inputs.read_bytes()).hexdigest()  # stored by its content
    assert inputs.stat().st_size < 1_000_000

    # the script sets the stack's configuration itself, as the sweep's repro scripts do
    faulty = run_script(script)
    assert faulty.returncode == 1, faulty.stderr[-2000:]
    assert (
        "WRONG" in faulty.stdout and "on pretend" in faulty.stdout and "on the CPU" in faulty.stdout
    )
    # the same stack with the fault removed
    healthy = run_script(script, {}, MODEL_SUPPORT_REPRO_KEEP_CONFIG="1")
    assert healthy.returncode == 0, healthy.stdout[-2000:] + healthy.stderr[-2000:]
    assert "they agree" in healthy.stdout


@pytest.mark.slow
def test_a_fused_attention_kernel_the_cpu_cannot_run_is_judged_through_the_math_attention(
    localised,
):
    wrong, _ = localised["flash"]
    assert wrong["summary"].startswith(
        f"The first wrong operator of {wrong['ops_checked']} checked is {FLASH}"
    )
    assert wrong["module_class"] == "LlamaAttention" and wrong["ops_not_judged"] == 0
    healthy, _ = localised["flash-healthy"]
    assert healthy["ops_not_judged"] == 0 and healthy["summary"].startswith("No operator is wrong")
    # its output and logsumexp compared; what the math attention does not make is named, never
    # counted as agreeing
    (unjudged,) = healthy["outputs_not_judged"]
    assert unjudged["operator"] == FLASH and "rng_state" in unjudged["outputs"]
    assert not {"output", "logsumexp"} & set(unjudged["outputs"])
    # the script replays it as the localiser did: through the math attention
    script = Path(wrong["repro"])
    faulty = run_script(script)
    assert faulty.returncode == 1 and "WRONG" in faulty.stdout, (
        faulty.stdout[-2000:] + faulty.stderr[-2000:]
    )
    fixed = run_script(script, {"sdpa_kernel": "flash"}, MODEL_SUPPORT_REPRO_KEEP_CONFIG="1")
    assert fixed.returncode == 0 and "they agree" in fixed.stdout, (
        fixed.stdout[-2000:] + fixed.stderr[-2000:]
    )


@pytest.mark.slow
def test_an_operator_the_cpu_cannot_run_is_not_judged_and_never_agrees(localised):
    # the wrong operator is the device's own: nothing can replay it
    result, _ = localised["not-judged"]
    assert result["operator"] is None and result["ops_not_judged"] == 2  # one per layer
    assert {o["operator"] for o in result["not_judged_ops"]} == {OWN}
    assert "the CPU cannot run it" in result["not_judged_ops"][0]["reason"]
    assert result["summary"].startswith(
        f"Not every operator was judged: 2 of the {result['ops_checked'] + 2}"
    )
    assert (
        "No operator is wrong" not in result["summary"]
        and f"all {result['ops_checked']}" not in result["summary"]
    )
    # an operator not judged before the first wrong one: said first
    first, _ = localised["own-then-silu"]
    assert first["operator"] == "aten::silu" and first["ops_not_judged"] == 2
    assert first["summary"].startswith(
        f"1 operator before the first wrong one could not be judged ({OWN}"
    )
    assert "The first wrong operator of" in first["summary"]


@pytest.mark.slow
def test_the_reports_row_links_the_finding(localised):
    import polars as pl

    from model_support.analysis.report_tables import with_files
    from model_support.render.html import _model_row

    _, data = localised["cli"]
    models = pl.DataFrame(
        {"model_id": [f"local:{MODEL}"], "variant": ["eager+dynamic"], "repro_sha256": [None]}
    )
    row = with_files(data, "s", models).row(0, named=True)
    assert (
        row["localised"] == f"sweeps/s/localised/local_{MODEL}.json"
        and row["localised_operator"] == "aten::bmm"
    )
    row.update(
        check=None, numerics_step=None, status="PASS", num_params=1, task=None, attribution=None
    )
    row.update(
        check_note=None,
        failure_signature=None,
        failure_stage=None,
        **{c[0]: None for c in MODEL_NUMBERS},
    )
    cells = _model_row(row, "s", variants=False, tasks=False)
    assert ("wrong op: aten::bmm", f"../sweeps/s/localised/local_{MODEL}.json") in [
        link for c in cells for link in c.links
    ]


def test_the_script_imports_nothing_of_this_package():
    text = op_repro.script(
        {
            "model_id": "m",
            "device": "pretend",
            "device_config": None,
            "operator": "aten::bmm",
            "overload": "default",
            "module": "x",
            "shapes": [],
            "dtypes": [],
            "inputs_sha256": "0" * 64,
        }
    )
    compile(text, "script.py", "exec")
    assert "model_support" not in text.replace("model-support", "")


def test_the_inputs_file_is_read_only_by_its_hash_and_as_tensors(tmp_path):
    data = op_repro.inputs_bytes([torch.ones(2)], {"dim": -1})
    sha = hashlib.sha256(data).hexdigest()
    path = tmp_path / f"{sha}.pt"
    path.write_bytes(data)
    assert torch.equal(op_check.read_inputs(path, sha)["args"][0], torch.ones(2))
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(ValueError, match="not this operator's inputs"):
        op_check.read_inputs(path, sha)
    import io

    buffer = io.BytesIO()
    # a pickle of more than tensors and plain values
    torch.save({"args": [UserError("x")], "kwargs": {}}, buffer)
    path.write_bytes(buffer.getvalue())
    with pytest.raises(Exception, match="Weights only load failed"):
        op_check.read_inputs(path, hashlib.sha256(buffer.getvalue()).hexdigest())


# --- the tolerance, on the CPU
# ---------------------------------------------------------------------------------


def _judged(device, cpu, name="aten::add"):
    return op_check.judge(device, cpu, name)


def test_bf16_rounding_and_another_summation_order_are_not_faults():
    torch.manual_seed(0)
    a, b = torch.randn(64, 512), torch.randn(512, 32)
    exact = a @ b
    assert not _judged(exact.to(torch.bfloat16), exact.to(torch.bfloat16))["wrong"]
    # the reduction split in two
    halves = (a[:, :256] @ b[:256] + a[:, 256:] @ b[256:]).to(torch.bfloat16)
    assert not _judged(halves, exact.to(torch.bfloat16), "aten::mm")["wrong"]
    # a float32 product run in bf16, as a TPU's default precision does
    bf16 = (a.bfloat16() @ b.bfloat16()).float()
    assert not _judged(bf16, exact, "aten::mm")["wrong"]
    assert _judged(bf16, exact, "aten::add")["wrong"]  # not so an elementwise float32 operator


def test_two_percent_one_wrong_value_a_nan_or_an_integer_off_by_one_are_faults():
    torch.manual_seed(0)
    x = torch.randn(64, 64).bfloat16()
    signs = torch.randint(0, 2, x.shape) * 2 - 1
    assert _judged((x.double() * (1 + 0.02 * signs)).bfloat16(), x)["wrong"]
    assert not _judged((x.double() * (1 + 0.0039 * signs)).bfloat16(), x)["wrong"]
    one = x.clone()
    one[3, 5] += 0.5
    assert "value(s) off by more than" in _judged(one, x)["reason"]
    nan = x.clone()
    nan[0, 0] = float("nan")
    assert "non-finite" in _judged(nan, x)["reason"]
    assert _judged(torch.arange(4) + torch.tensor([0, 0, 1, 0]), torch.arange(4))["wrong"]
    assert _judged(torch.ones(2, 3), torch.ones(3, 2))["wrong"]


#: Each fused attention kernel the CPU has none of, called as the sdpa composite calls it (its own
#: argument order): query, key and value, then a float mask where it takes one, causal where it does
#: not, and a scale.
FUSED_CALLS = {
    "aten::_scaled_dot_product_flash_attention": lambda q, k, v, mask: (
        (q, k, v, 0.0, True, False),
        None,
    ),
    "aten::_scaled_dot_product_efficient_attention": lambda q, k, v, mask: (
        (q, k, v, mask, True, 0.0, False),
        mask,
    ),
    "aten::_scaled_dot_product_cudnn_attention": lambda q, k, v, mask: (
        (q, k, v, mask, True, 0.0, False, False),
        mask,
    ),
    "aten::_scaled_dot_product_fused_attention_overrideable": lambda q, k, v, mask: (
        (q, k, v, mask),
        mask,
    ),
}


@pytest.mark.parametrize("name", FUSED_CALLS)
def test_each_fused_attention_kernel_is_replayed_from_its_own_arguments(name):
    """The CPU's own flash attention (another kernel than the math attention) stands for the
    device: its output and logsumexp agree with the replay; made without the mask or the
    causality the call asked for, they do not."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 6, 16).bfloat16() for _ in range(3))
    mask = (torch.randn(1, 1, 6, 6) * 3).bfloat16()
    op = op_check.operator(name, "default")
    args, used_mask = FUSED_CALLS[name](q, k, v, mask)
    with pytest.raises(NotImplementedError):  # the CPU has no kernel of it
        op(*args, scale=0.3)

    # the kernel's outputs, the CPU's flash attention computing the first two
    def device(attn_mask, causal):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=attn_mask, scale=0.3
        )
        rest = [torch.empty(0) for _ in op._schema.returns[2:]]
        return (out, lse, *rest)

    right = device(used_mask, used_mask is None)
    judged = op_check.judge(right, op_check.replay(op, args, {"scale": 0.3}, right), name)
    assert not judged["wrong"], judged["reason"]
    assert set(judged["not_judged"]) == {r.name for r in op._schema.returns[2:]}
    unmasked = device(None, False)  # the mask (or the causality) not applied
    assert op_check.judge(unmasked, op_check.replay(op, args, {"scale": 0.3}, unmasked), name)[
        "wrong"
    ]


def test_the_pretend_noise_fault_is_a_mapping_of_relative_errors():
    config = parse('{"wrong_ops": {"aten::mm": 0.02}}')
    assert config.wrong_ops == frozenset({"aten::mm"}) and config.wrong_by == {"aten::mm": 0.02}
    with pytest.raises(PretendConfigError, match="map names to a relative error > 0"):
        parse('{"wrong_ops": {"aten::mm": 0}}')


def test_the_pretend_attention_kernel_is_one_it_knows():
    assert (
        parse('{"sdpa_kernel": "flash"}').sdpa_kernel == "flash"
        and parse("{}").sdpa_kernel == "math"
    )
    with pytest.raises(
        PretendConfigError, match="'sdpa_kernel' must be one of 'math', 'flash', 'own', not 'fast'"
    ):
        parse('{"sdpa_kernel": "fast"}')


# --- bad input: one sentence, before anything runs
# -------------------------------------------------------------


def test_bad_input_is_one_sentence(tmp_path, fixture_models):
    path = fixture_models[MODEL]["path"]
    pretend_sweep(tmp_path, path, {})
    with pytest.raises(UserError, match="Sweep 'nope' does not exist"):
        localise.localise(tmp_path, "nope", MODEL)
    with pytest.raises(UserError, match="No model of sweep s matches 'gpt'"):
        localise.localise(tmp_path, "s", "gpt")
    with pytest.raises(UserError, match="Sweep s has no record of local:tiny-llama in compile"):
        localise.localise(tmp_path, "s", MODEL, variant="compile+dynamic")
    cpu = tmp_path / "cpu"
    pretend_sweep(cpu, path, {}, device="cpu")
    with pytest.raises(UserError, match="ran on the CPU in sweep s"):
        localise.localise(cpu, "s", MODEL)
