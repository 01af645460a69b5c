"""Operators (docs/ops.md): the census each probe records, what a stack does with each operator (the device
adapters' coverage), the verdicts predicted from a census alone and the porting plan, checked against real
sweeps on the pretend device: a CPU sweep's census predicts a pretend stack's verdicts, model for model, and
implementing the plan's first operator makes exactly the models it unlocks pass."""

from __future__ import annotations

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
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    env.pop(PRETEND_VAR, None)
    if config is not None:
        env[PRETEND_VAR] = json.dumps(config)
    return env


def name_of(key: str) -> str:
    """A fixture's folder name from a plan's model key (``local:tiny-llama [eager+dynamic+4t]``: the variant of
    4 new tokens)."""
    from model_support.probe.model_ids import display_name

    return display_name(key.split(" [")[0])


def cli(args: list, data: Path, config: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [*CLI, *args, "--data-dir", str(data)], capture_output=True, text=True, cwd=REPO, env=_env(config), timeout=1800
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


# --- the plan and the prediction, on made-up censuses --------------------------------------------------


def _model(key, ops, missing=(), fallback=(), stages=None, status="PASS", source="run"):
    from model_support.ops import ModelOps

    return ModelOps(
        key=key,
        status=status,
        device_type="cpu",
        ops=list(ops),
        stages=stages or ["generate"] * len(ops),
        calls=[1] * len(ops),
        source=source,
        ops_missing=list(missing),
        ops_fallback=list(fallback),
    )


def test_a_model_lacking_two_operators_is_unlocked_only_at_the_second():
    from model_support.ops import porting_plan, predict

    models = predict(
        [
            _model("a", ["aten::mm", "aten::rsqrt", "aten::silu"], missing=["aten::rsqrt", "aten::silu"]),
            _model("b", ["aten::mm", "aten::gelu"], missing=["aten::gelu"]),
            _model("c", ["aten::gelu", "aten::silu"], missing=["aten::gelu", "aten::silu"]),
            _model("d", ["aten::mm"]),
        ]
    )
    steps = porting_plan(models)
    # gelu unlocks b at once; then silu, called by two of the models still blocked, unlocks c; rsqrt last unlocks a
    assert [(s.op, s.unlocks, s.blocks) for s in steps] == [
        ("aten::gelu", ["b"], ["b", "c"]),
        ("aten::silu", ["c"], ["a", "c"]),
        ("aten::rsqrt", ["a"], ["a"]),
    ]
    assert [m.predicted for m in models] == ["FAIL(gen)", "FAIL(gen)", "FAIL(gen)", "PASS"]


def test_the_prediction_is_the_stage_of_the_first_missing_operator_and_a_fallback_passes():
    from model_support.ops import predict
    from model_support.probe.devices import FALLBACK, IMPLEMENTED, MISSING

    coverage = {"aten::_to_copy": MISSING, "aten::mm": IMPLEMENTED, "aten::tanh": FALLBACK, "aten::gelu": MISSING}
    loads, falls, gelu, own, none = predict(
        [
            _model("loads", ["aten::_to_copy", "aten::gelu"], stages=["load", "generate"]),
            _model("falls", ["aten::mm", "aten::tanh"]),
            _model("gelu", ["aten::mm", "aten::gelu"]),
            _model("own", ["aten::mm"], status="FAIL(gen)", source="partial"),  # failed on the reference too
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


# --- the census and the adapters' coverage --------------------------------------------------------------


def test_the_census_counts_what_a_compiled_backend_receives():
    import torch

    from model_support.probe.census import Census

    layer = torch.nn.Linear(4, 3)
    counted = Census("cpu")
    with torch.inference_mode(), counted:
        counted.enter("load")
        layer(torch.ones(2, 4))  # the host's own work: not counted on the CPU
        counted.enter("generate")
        for _ in range(3):
            torch.nn.functional.gelu(layer(torch.ones(2, 4)))
    fields = counted.fields("run")
    # aten::linear (CompositeImplicitAutograd) reaches a backend as its parts: aten::t and aten::addmm
    assert "aten::linear" not in fields["ops"]
    assert {"aten::t", "aten::addmm", "aten::gelu"} <= set(fields["ops"])
    calls = dict(zip(fields["ops"], fields["ops_calls"]))
    assert calls["aten::addmm"] == 3 and calls["aten::gelu"] == 3
    assert set(fields["ops_stages"]) == {"generate"} and fields["ops_source"] == "run"


def test_the_pretend_adapter_answers_from_its_configuration(monkeypatch):
    from model_support_pretend.adapter import PretendAdapter
    from model_support_pretend.config import parse

    monkeypatch.setenv(PRETEND_VAR, json.dumps({"missing_ops": ["aten::add"], "fallback_ops": ["aten::tanh"]}))
    coverage = PretendAdapter("pretend").op_coverage(["aten::add.Tensor", "aten::tanh", "aten::mm"])
    assert coverage == {"aten::add.Tensor": "missing", "aten::tanh": "fallback", "aten::mm": "implemented"}
    assert parse('{"fallback_ops": ["aten::tanh"]}').fallback_ops == frozenset({"aten::tanh"})


def test_the_generic_adapter_reads_a_real_stacks_registrations():
    """torch_tpu 0.2.0 registers its kernels (and a boxed fallback) for PrivateUse1 on import, TPU or not: the
    generic adapter's reading of them, in a child process (importing torch_tpu renames nothing, but costs)."""
    pytest.importorskip("torch_tpu")
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
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(None), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    coverage = json.loads(done.stdout.strip().splitlines()[-1])
    assert coverage == {
        "aten::rsqrt": "implemented",  # a structured op: its default kernel runs torch_tpu's aten::rsqrt.out
        "aten::linear": "implemented",  # torch_tpu registers the composite itself
        "aten::_scaled_dot_product_flash_attention_for_cpu": "fallback",  # no kernel: torch_tpu's boxed fallback
        "aten::_to_copy": "implemented",
        "nosuch::op": "unknown",
    }


def test_a_stack_this_machine_lacks_is_one_sentence():
    """``--on cuda`` with a CPU-only torch: no kernels to read, said in one sentence (no prediction of all-missing)."""
    import torch

    if torch.cuda.is_available() or torch._C._dispatch_has_kernel_for_dispatch_key("aten::empty.memory_format", "CUDA"):
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
        "problem": f"torch {torch.__version__} here registers no kernels for dispatch key CUDA: this machine has no "
        "such stack to read (install its backend, or run where it is)."
    }


def test_an_unknown_sweep_is_one_sentence(tmp_path):
    """``ops NOSUCH``: the known ids in one sentence, exit 2, no traceback (a pulled dataset with rows and no
    sweep.json is known: the report reads its ops tables, see test_report's wholly excluded sweep)."""
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
    assert "Unknown sweep id 'nosuch-20261201T000000Z'; the known sweep ids are: none." in done.stderr


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
    assert [(r["op"], r["status"], r["models"], r["calls"], r["calls_per_probe"]) for r in rows] == [
        ("aten::mm", "implemented", ["a", "b"], 6, 3.0),
        ("aten::tanh", "CPU fallback", ["b"], 6, 6.0),
        ("aten::rsqrt", "missing", ["a"], 2, 2.0),
    ]


# --- real sweeps: a CPU census predicts a pretend stack; the plan's first step, implemented ---------------

#: A handful of tiny fixtures: RMSNorm and SiLU (llama), GELU (gpt-neox), gelu_new's tanh (gpt2), ReLU (opt),
#: and one that fails on its own everywhere (no weights).
MODELS = ["tiny-llama", "tiny-gpt-neox", "tiny-gpt2", "tiny-opt", "fail-missing-weights"]
#: The stack: three operators missing, one falling back; then the plan's first step implemented.
STACK = {"missing_ops": ["aten::rsqrt", "aten::silu", "aten::gelu"], "fallback_ops": ["aten::tanh"]}
NEXT = {"missing_ops": ["aten::rsqrt", "aten::silu"], "fallback_ops": ["aten::tanh"]}


def _definition(path: Path, device: str) -> Path:
    import yaml

    probe = {"device": device, "max_new_tokens": 4, "judge": False, "reference": "cpu" if device != "cpu" else "none"}
    models = [str(REPO / "data" / "models" / m) for m in MODELS]
    path.write_text(yaml.safe_dump({"name": f"ops-{device}", "probe": probe, "models": models, "workers": 1}))
    return path


@pytest.fixture(scope="module")
def ops_loop(tmp_path_factory, fixture_models) -> dict:
    """A CPU sweep of MODELS; the prediction on STACK from it; a sweep on STACK; a sweep on NEXT."""
    from model_support.probe.model_ids import display_name
    from model_support.record import store

    tmp = tmp_path_factory.mktemp("ops")
    data = tmp / "data"
    sweeps = {}
    for name, device, config, report in (("cpu", "cpu", None, False), ("stack", "pretend", STACK, True)):
        before = set(store.list_sweeps(data)) if data.exists() else set()
        cli(
            ["sweep", str(_definition(tmp / f"{name}.yaml", device)), *([] if report else ["--no-report"])],
            data,
            config,
        )
        (sweeps[name],) = set(store.list_sweeps(data)) - before
        if name == "cpu":
            predicted = json.loads(cli(["ops", sweeps["cpu"], "--on", "pretend", "--json"], data, STACK).stdout)
    plan = json.loads(cli(["ops", sweeps["stack"], "--json"], data, None).stdout)
    text = cli(["ops", sweeps["cpu"], "--on", "pretend"], data, STACK).stdout
    before = set(store.list_sweeps(data))
    cli(["sweep", str(_definition(tmp / "next.yaml", "pretend")), "--no-report"], data, NEXT)
    (sweeps["next"],) = set(store.list_sweeps(data)) - before
    records = {k: {display_name(r["model_id"]): r for r in store.read_records(data, s)} for k, s in sweeps.items()}
    return {"data": data, "sweeps": sweeps, "records": records, "predicted": predicted, "plan": plan, "text": text}


def test_a_cpu_sweep_records_every_fixtures_census(ops_loop):
    records = ops_loop["records"]["cpu"]
    for name in ("tiny-llama", "tiny-gpt-neox", "tiny-gpt2", "tiny-opt"):
        r = records[name]
        assert r["status"] == "PASS" and r["ops_source"] == "run", name
        assert len(r["ops"]) == len(r["ops_stages"]) == len(r["ops_calls"]) > 20
        assert r["ops_missing"] == [] and r["ops_fallback"] == []  # the CPU runs what it ran
    assert {"aten::rsqrt", "aten::silu"} <= set(records["tiny-llama"]["ops"])
    assert "aten::gelu" in records["tiny-gpt-neox"]["ops"] and "aten::tanh" in records["tiny-gpt2"]["ops"]
    weightless = records["fail-missing-weights"]  # it stopped loading: a census of nothing, and no reference ran
    assert (weightless["status"], weightless["ops"], weightless["ops_source"]) == ("FAIL(load)", [], "partial")


def test_the_prediction_from_the_cpu_census_is_the_pretend_sweeps_verdict_model_for_model(ops_loop):
    predicted = {name_of(k): v for k, v in ops_loop["predicted"]["models"].items()}
    actual = ops_loop["records"]["stack"]
    assert {name: p["predicted"] for name, p in predicted.items()} == {n: r["status"] for n, r in actual.items()}
    assert predicted["tiny-llama"]["ops_missing"] == ["aten::rsqrt", "aten::silu"]
    assert predicted["tiny-gpt2"] == {"ops_missing": [], "ops_fallback": ["aten::tanh"], "predicted": "PASS"}
    assert {r["status"] for r in actual.values()} == {"PASS", "FAIL(gen)", "FAIL(load)"}


def test_the_ops_command_prints_the_predictions_the_plan_and_where_the_census_came_from(ops_loop):
    text = ops_loop["text"]
    assert "Predicted on the pretend stack of this machine" in text and "What to implement next" in text
    llama = next(line for line in text.splitlines() if "tiny-llama" in line)
    assert "PASS" in llama and "FAIL(gen)" in llama and "aten::rsqrt" in llama  # recorded on the CPU, predicted here
    assert "The census was taken on cpu, not pretend" in " ".join(text.split())


def test_a_stopped_run_takes_its_census_from_the_reference_and_records_what_the_stack_lacks(ops_loop):
    llama = ops_loop["records"]["stack"]["tiny-llama"]
    assert (llama["status"], llama["attribution"], llama["ops_source"]) == ("FAIL(gen)", "stack", "reference")
    assert llama["ops_missing"] == ["aten::rsqrt", "aten::silu"]  # the second one too, which the run never reached
    gpt2 = ops_loop["records"]["stack"]["tiny-gpt2"]  # falls back, passes, counted
    assert (gpt2["status"], gpt2["ops_source"], gpt2["ops_fallback"]) == ("PASS", "run", ["aten::tanh"])
    assert gpt2["ops_calls"][gpt2["ops"].index("aten::tanh")] > 0
    assert "aten::_to_copy" in gpt2["ops"] and gpt2["ops_stages"][gpt2["ops"].index("aten::_to_copy")] == "load"


def test_the_plan_and_implementing_its_first_operator_makes_exactly_its_unlocks_pass(ops_loop):
    plan = ops_loop["plan"]["plan"]
    named = [(s["op"], sorted(map(name_of, s["unlocks"])), sorted(map(name_of, s["blocks"]))) for s in plan]
    assert named == [
        ("aten::gelu", ["tiny-gpt-neox"], ["tiny-gpt-neox"]),
        ("aten::rsqrt", [], ["tiny-llama"]),  # llama lacks two: unlocked only at the second
        ("aten::silu", ["tiny-llama"], ["tiny-llama"]),
    ]
    before, after = ops_loop["records"]["stack"], ops_loop["records"]["next"]
    newly = sorted(n for n in after if after[n]["status"] == "PASS" and before[n]["status"] != "PASS")
    assert newly == named[0][1]
    assert all(after[n]["status"] == before[n]["status"] for n in after if n not in newly)


def test_the_report_says_what_to_implement_next_and_the_fallbacks(ops_loop):
    html = (ops_loop["data"] / "reports" / f"{ops_loop['sweeps']['stack']}.html").read_text()
    assert "What to implement next" in html
    plan = html[html.index("The porting plan") :]
    assert plan.index("aten::gelu") < plan.index("aten::rsqrt") < plan.index("aten::silu")
    assert "CPU fallbacks, the most-run first" in html and "aten::tanh" in plan
    from model_support.render.explorer import explorer_data  # the explorer's lacks column: the census' missing ops

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
