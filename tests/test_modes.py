"""Execution modes: torch.compile and the static KV cache, as probe parameters and as a sweep
matrix.

On this CPU machine compile means torch.compile with the inductor backend (a real compilation: a C++
build per graph). The probes run for real through papermill; the matrix sweep through the CLI.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers import cli_debug, cli_sweep, probe_record, stored_records
from model_support.probe import probe_params
from model_support.probe import run as probe
from model_support.record import schema, store

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "model_support.cli"]


def test_compile_with_a_static_cache_passes_and_counts_its_compilation(tmp_path, fixture_models):
    # tiny-llama: the same code path as a real-size model (inductor compiling SmolLM2 on 2 cores
    # took 124 s of the suite; bench/bench_modes.py compiles it, with its timings)
    record = probe_record(tmp_path, "data/models/tiny-llama", mode="compile", cache="static")
    assert (record["status"], record["variant"], record["mode"], record["cache"]) == (
        "PASS",
        "compile+static",
        "compile",
        "static",
    )
    assert record["compile_backend"] == "inductor" and record["compile_s"] > 0
    # the first forward carries the compilation
    assert record["compile_s"] == record["first_token_s"]
    assert record["graphs"] >= 1 and record["recompilations"] == record["graphs"] - 1
    assert record["graph_breaks"] == 0 and record["matches_eager"] is True


def test_graph_breaks_are_reported_with_their_reasons(tmp_path, fixture_models):
    record = probe_record(
        tmp_path,
        fixture_models["modes-graph-break"]["path"],
        mode="compile",
        trust_remote_code=True,
    )
    assert record["status"] == "PASS" and record["variant"] == "compile+dynamic"
    assert record["graph_breaks"] >= 1 and record["graph_break_reasons"]
    # bool(tensor) in the branch is a Tensor.item() that dynamo does not trace: the break and its
    # reason
    assert any("item()" in reason for reason in record["graph_break_reasons"]), record[
        "graph_break_reasons"
    ]
    (tmp_path / "eager").mkdir()
    eager = probe_record(
        tmp_path / "eager", fixture_models["modes-graph-break"]["path"], trust_remote_code=True
    )
    # nothing compiled, nothing counted
    assert eager["variant"] == "eager+dynamic" and eager["graphs"] is None


def test_variant_labels_round_trip():
    for settings in (
        {"mode": "compile", "cache": "static"},
        {"mode": "eager", "cache": "dynamic", "max_new_tokens": 32},
    ):
        label = probe_params.variant(settings)
        assert probe_params.parse_variant(label) == settings
    assert probe_params.variant({}) == schema.DEFAULT_VARIANT == "eager+dynamic"
    with pytest.raises(probe_params.ParameterError, match="is not a variant"):
        probe_params.parse_variant("fast+furious")


def test_a_matrix_sweep_has_one_row_per_model_and_variant_and_resumes_after_sigkill(
    tmp_path, fixture_models
):
    models = [fixture_models[n]["path"] for n in ("tiny-gpt2", "fail-missing-weights")]
    definition = tmp_path / "matrix.yaml"
    definition.write_text(
        yaml.safe_dump(
            {
                "name": "matrix",
                "probe": {"device": "cpu", "reference": "none"},
                "matrix": {"cache": ["dynamic", "static"], "max_new_tokens": [8, 4]},
                "models": models,
            }
        )
    )
    data = tmp_path / "data"
    runner = subprocess.Popen(
        [*CLI, "sweep", str(definition), "--data-dir", str(data), "--workers", "1", "--no-report"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 600
    while time.time() < deadline and len(list(data.glob("sweeps/*/records/*.json"))) < 2:
        time.sleep(0.05)
    runner.send_signal(signal.SIGKILL)
    runner.wait()
    sweep_id = next((data / "sweeps").iterdir()).name
    resumed = subprocess.run(
        [*CLI, "sweep", "--resume", sweep_id, "--data-dir", str(data), "--no-report"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = store.scan(data).collect()
    pairs = sorted(rows.select("model_id", "variant").iter_rows())
    want = sorted(
        (f"local:{n}", v)
        for n in ("tiny-gpt2", "fail-missing-weights")
        for v in ("eager+dynamic", "eager+dynamic+4t", "eager+static", "eager+static+4t")
    )
    assert pairs == want  # exactly models x variants, none lost, none twice
    passed = rows.filter(rows["model_id"] == "local:tiny-gpt2")
    assert set(passed["status"]) == {"PASS"} and sorted(passed["tokens_out"].to_list()) == [
        4,
        4,
        8,
        8,
    ]
    assert len(list((data / "sweeps" / sweep_id / "notebooks").glob("*.ipynb"))) == 8
    meta = store.read_sweep(data, sweep_id)
    assert meta.matrix == {"cache": ["dynamic", "static"], "max_new_tokens": [8, 4]}


def test_debug_in_a_compiled_variant_explains_the_graph_breaks(tmp_path, fixture_models):
    from model_support import debug

    data = tmp_path / "data"
    path = fixture_models["modes-graph-break"]["path"]
    probe_settings = {"device": "cpu", "trust_remote_code": True, "reference": "none"}
    run = cli_debug(data, path, probe_settings, {"mode": ["eager", "compile"]}, "compile+dynamic")
    assert run.returncode == 0, run.stderr[-3000:]
    notebook = (
        store.sweep_dir(data, "s") / "debug" / "local_modes-graph-break@compile_dynamic.ipynb"
    )
    assert notebook.is_file(), run.stdout
    import nbformat

    cells = nbformat.read(str(notebook), as_version=4).cells
    html = "".join(
        o.get("data", {}).get("text/html", "") for c in cells for o in c.get("outputs", [])
    )
    # the reason and the user-code line
    assert "graph break(s)" in html and "modeling_graph_break.py" in html
    assert debug.debug_result_from_notebook(notebook)["model_id"] == path
    assert probe.record_from_notebook(notebook) is None  # a debug notebook holds no probe record


def test_a_model_that_refuses_a_static_cache_fails_only_in_static_variants(
    tmp_path, fixture_models
):
    """The tiny DeepSeek-V4: transformers' StaticCache has no layer for its
    heavily_compressed_attention, a real limit. The CPU reference reruns the failure with the
    same cache (the model's, not the stack's), and the record's repro script, which carries the
    cache, fails the same way."""
    path = fixture_models["modes-static-deepseek-v4"]["path"]
    matrix = {"cache": ["dynamic", "static"]}
    data, sweep_id = cli_sweep(
        tmp_path, {"name": "static", "probe": {"device": "cpu"}, "matrix": matrix, "models": [path]}
    )
    records = {r["variant"]: r for r in stored_records(data, sweep_id)}
    dynamic, static = records["eager+dynamic"], records["eager+static"]
    assert (
        dynamic["status"] == "PASS"
        and dynamic["tokens_out"] == 8
        and dynamic["reference_match"] is True
    )
    assert (static["status"], static["failure_stage"], static["error_type"]) == (
        "FAIL(gen)",
        "generate",
        "KeyError",
    )
    assert "heavily_compressed_attention" in static["error_message"]
    assert static["failure_signature"] == "KeyError: '<name>' @ cache_utils.<listcomp>"
    assert static["attribution"] == "model" and static["reference_device"] == "cpu:float32"
    script = tmp_path / "repro.py"
    script.write_text(static["repro_script"])
    repro = subprocess.run(
        [sys.executable, str(script), path],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert repro.returncode == 1, repro.stderr[-2000:]
    result = json.loads(repro.stdout.strip().splitlines()[-1])
    assert (result["status"], result["failure_stage"], result["error_type"]) == (
        "FAIL(gen)",
        "generate",
        "KeyError",
    )


def test_a_model_that_fails_eagerly_too_is_not_the_compilers_failure(tmp_path, fixture_models):
    """attr-both's linalg.inv in bfloat16: compiled, dynamo's fake tensors raise first (an error
    of torch._dynamo), but plain eager raises as well, so the record keeps eager's error at stage
    generate."""
    record = probe_record(
        tmp_path, fixture_models["attr-both"]["path"], mode="compile", trust_remote_code=True
    )
    assert (record["status"], record["failure_stage"], record["variant"]) == (
        "FAIL(gen)",
        "generate",
        "compile+dynamic",
    )
    assert record["error_message"].startswith("linalg.inv: Low precision dtypes not supported")
    assert "torch._dynamo" not in record["error_type"] and record["graphs"] is not None


def test_debug_in_a_static_variant_generates_with_the_static_cache(tmp_path, fixture_models):
    """The debug notebook's step-by-step generation uses the variant's KV cache, so the DeepSeek-V4
    fixture's static-cache failure shows there (before the first forward: step 0, no module)."""
    from model_support import debug

    data = tmp_path / "data"
    path = fixture_models["modes-static-deepseek-v4"]["path"]
    run = cli_debug(
        data,
        path,
        {"device": "cpu", "reference": "none"},
        {"cache": ["dynamic", "static"]},
        "eager+static",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = debug.debug_result_from_notebook(
        store.sweep_dir(data, "s") / "debug" / "local_modes-static-deepseek-v4@eager_static.ipynb"
    )
    assert (result["mode"], result["cache"]) == ("eager", "static")
    # one plain forward is fine: only the static cache is refused
    assert result["forward_ok"] is True
    generation = result["generation"]
    assert generation["step"] == 0 and "heavily_compressed_attention" in str(generation["failure"])


def test_a_backend_that_fails_to_compile_a_model_that_generates_eagerly_is_stage_compile(
    fixture_models,
):
    """The compile stage end to end, through torch.compile's real machinery: the backend here is
    a test double that refuses every graph (as a backend missing a lowering does). No real model
    fails only when compiled on torch 2.13's inductor (see the README), so the fixture set has
    none; this checks the classification: FAIL(gen) at stage compile, because plain eager
    generates."""
    script = f"""
import json, torch
from model_support.probe import probe_core
def refusing_backend(graph_module, example_inputs):
    raise NotImplementedError("no lowering for aten.mm (a backend that cannot compile this graph)")
r = probe_core.run_stages({fixture_models["tiny-llama"]["path"]!r}, device=torch.device("cpu"), mode="compile",
                          compile_backend=refusing_backend)
e = r["exception"]
print(json.dumps({{"status": r["status"], "stage": r["failure_stage"], "module": type(e).__module__,
                  "message": str(e), "tokens_out": r["tokens_out"]}}))
"""
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert (result["status"], result["stage"], result["tokens_out"]) == (
        "FAIL(gen)",
        "compile",
        None,
    )
    assert (
        result["module"].startswith("torch._dynamo")
        and "no lowering for aten.mm" in result["message"]
    )


def test_a_stack_that_compiles_statically_generates_with_the_static_cache(fixture_models):
    """Issue 58, item 3, on the CPU: a stack whose torch.compile gives its backend dynamic=False
    (TorchTPU patches torch.compile so for ``tpu``; here a test double patches it for dynamo's
    ``eager`` backend, as torch_tpu's loader does) has the compiled probe generate with the
    static KV cache: one prefill graph and one decode graph, nowhere near dynamo's recompile
    limit, and the record says both (``compile_dynamic``, ``compile_cache``). Unpatched, the
    probe compiles as before: torch's automatic dynamic shapes, the cache asked for."""
    script = f"""
import functools, json
from model_support.probe import probe_core  # first: no backend autoloads with torch
import torch
def run():
    r = probe_core.run_stages({fixture_models["tiny-llama"]["path"]!r}, device=torch.device("cpu"), mode="compile",
                              compile_backend="eager", max_new_tokens=10, chat_template="none")
    return {{k: r[k] for k in ("status", "compile_dynamic", "compile_cache", "graphs", "recompile_limit_hit",
                               "matches_eager", "tokens_out")}}
out = {{"auto": run()}}
original = torch.compile
@functools.wraps(original)
def static_compile(*args, **kwargs):  # what torch_tpu's loader installs, for its own backend
    if "dynamic" not in kwargs and kwargs.get("backend") == "eager":
        kwargs["dynamic"] = False
    return original(*args, **kwargs)
torch.compile = static_compile
out["static"] = run()
print(json.dumps(out))
"""
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    auto, static = out["auto"], out["static"]
    assert (auto["status"], auto["compile_dynamic"], auto["compile_cache"]) == (
        "PASS",
        None,
        "dynamic",
    )
    assert (static["status"], static["compile_dynamic"], static["compile_cache"]) == (
        "PASS",
        False,
        "static",
    )
    assert (
        static["graphs"] == 2
        and static["recompile_limit_hit"] is False
        and static["matches_eager"] is True
    )
    assert static["tokens_out"] == auto["tokens_out"] == 10 and auto["recompile_limit_hit"] is False
