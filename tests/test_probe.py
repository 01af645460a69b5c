"""The probe, executed for real with papermill on every offline fixture (through the smoke
sweep)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from helpers import FAKE_TOKEN, probe_record, run_notebook
from model_support.probe import checks, devices, judge, repro
from model_support.probe import run as probe
from model_support.record import schema

REPO = Path(__file__).resolve().parents[1]
GOLDEN_TOKENS_IN = {"tiny-gpt2": 5, "tiny-opt": 5, "tiny-llama": 26, "tiny-eos-early": 5}


def test_every_fixture_gets_its_expected_verdict_stage_tokens_and_attribution(
    smoke_sweep, fixture_models
):
    wrong = []
    for name, entry in fixture_models.items():
        record = smoke_sweep["by_name"].get(name)
        if record is None:
            wrong.append(f"{name}: no record")
            continue
        expect = entry["expect"]
        got = {
            "status": record["status"],
            "failure_stage": record["failure_stage"],
            "attribution": record["attribution"],
        }
        want = {
            "status": expect["status"],
            "failure_stage": expect["failure_stage"],
            "attribution": expect["attribution"],
        }
        if expect.get("tokens_out") is not None:
            got["tokens_out"], want["tokens_out"] = record["tokens_out"], expect["tokens_out"]
        if got != want:
            wrong.append(
                f"{name}: got {got}, want {want} ({record['error_type']}: "
                f"{record['error_message']})"
            )
    assert not wrong, "\n".join(wrong)


def test_attribution_says_whose_failure_it_is(smoke_sweep):
    """stack: only the device configuration fails; model: the same signature on the reference;
    both: another one (kept); null with the reason when it could not run. The verdict itself
    never changes."""
    by_name = smoke_sweep["by_name"]
    stack, both, big = by_name["attr-stack-fft"], by_name["attr-both"], by_name["attr-too-big"]
    assert stack["status"] == both["status"] == big["status"] == schema.FAIL_GEN
    assert stack["failure_signature"].endswith("@ modeling_fft_logits.forward")
    assert stack["reference_device"] == "cpu:float32" and stack["reference_signature"] is None
    assert both["attribution"] == "both" and both["reference_signature"].startswith(
        "RuntimeError: mat1 and mat2"
    )
    assert both["reference_signature"] != both["failure_signature"]
    assert big["attribution"] is None and "above reference_max_params=1000" in big["reference_note"]
    assert (
        by_name["fail-hang"]["attribution"] is None
        and "no failure to rerun" in by_name["fail-hang"]["reference_note"]
    )
    passing = [r for r in smoke_sweep["records"] if r["status"] == schema.PASS]
    assert passing and all(r["attribution"] is None for r in passing)  # nothing added to a PASS


def test_tokens_in_counts_the_templated_prompt(smoke_sweep):
    by_name = smoke_sweep["by_name"]
    # Golden values: the fixtures' tokenizers are trained deterministically.
    assert by_name["SmolLM2-135M-Instruct"]["chat_template_used"] is True
    assert by_name["SmolLM2-135M-Instruct"]["tokens_in"] == 35
    assert by_name["tiny-llama"]["chat_template_used"] is True
    assert by_name["tiny-gpt2"]["chat_template_used"] is False
    # the template adds tokens
    assert by_name["tiny-llama"]["tokens_in"] > by_name["tiny-gpt2"]["tokens_in"]
    for name in ("tiny-gpt2", "tiny-opt", "tiny-llama", "tiny-eos-early"):
        assert by_name[name]["tokens_in"] == GOLDEN_TOKENS_IN[name], name


def test_smollm2_passes_through_its_chat_template_with_readable_english(smoke_sweep):
    record = smoke_sweep["by_name"]["SmolLM2-135M-Instruct"]
    assert record["status"] == schema.PASS and record["failure_stage"] is None
    assert record["tokens_out"] == 8 and len(record["output_token_ids"]) == 8
    words = re.findall(r"[A-Za-z]{2,}", record["generated_text"])
    assert len(words) >= 3, record["generated_text"]
    assert all(ord(c) < 128 for c in record["generated_text"]), record["generated_text"]
    assert record["model_type"] == "llama" and record["num_params"] > 100_000_000
    assert (
        record["load_s"] > 0 and record["first_token_s"] > 0 and record["decode_tokens_per_s"] > 0
    )
    # cpu: no device memory
    assert record["peak_host_mem_mb"] > 100 and record["peak_device_mem_mb"] is None
    # what its timings ran with
    assert isinstance(record["cpu_threads"], int) and record["cpu_threads"] >= 1
    # The CPU reference is a real comparison on a CPU-only run: another dtype.
    assert record["reference_device"] == "cpu:float32" and isinstance(
        record["reference_match"], bool
    )


def test_a_healthy_pass_agrees_with_the_reference_and_smollm2_is_fluent(smoke_sweep):
    """Is a PASS right? bf16 on the CPU against the float32 reference, teacher-forced on the
    device's tokens: SmolLM2 matches and the judge finds it fluent; every tiny random model
    probed in bf16 (text or image-text-to-text) matches or flips at ties."""
    smol = smoke_sweep["by_name"]["SmolLM2-135M-Instruct"]
    assert (
        smol["numerics"] == "match"
        and smol["reference_match"] is True
        and smol["first_divergence"] is None
    )
    assert smol["reference_agreement"] == 1.0 and 0 <= smol["reference_max_kl"] < 0.1
    assert smol["numerics_note"].startswith("all 8 steps agree")
    assert (
        smol["fluent"] is True
        and smol["fluency_score"] >= judge.MIN_SCORE
        and smol["fluency_note"].startswith("fluent")
    )
    tiny = {
        name: r
        for name, r in smoke_sweep["by_name"].items()
        if name.startswith("tiny-") and r["status"]
    }
    # the vision-language fixtures get the same check, image included
    tasks = [r["task"] for r in tiny.values()]
    # qwen2-vl, qwen2.5-vl, smolvlm need torchvision
    vlms = 8 if importlib.util.find_spec("torchvision") else 5
    assert (tasks.count("text-generation"), tasks.count("image-text-to-text")) == (12, vlms)
    assert {
        name: r["numerics"] for name, r in tiny.items() if r["numerics"] not in ("match", "ties")
    } == {}
    # a sharded run gets the reference and the judge too
    for name in ("sharded-llama", "sharded-mixtral"):
        record = smoke_sweep["by_name"][name]
        assert record["numerics"] in ("match", "ties") and isinstance(record["fluent"], bool), name
    failed = [r for r in smoke_sweep["records"] if r["status"] not in (None, schema.PASS)]
    # only a PASS is checked
    assert failed and all(r["numerics"] is None and r["fluent"] is None for r in failed)


def test_a_pass_above_the_references_limit_gets_the_judge_alone(tmp_path, fixture_models):
    record = probe_record(
        tmp_path,
        fixture_models["SmolLM2-135M-Instruct"]["path"],
        reference="cpu",
        reference_max_params=1000,
    )
    assert (
        record["status"] == schema.PASS
        and record["numerics"] is None
        and record["reference_device"] is None
    )
    assert (
        record["numerics_note"].startswith("no reference: skipped:")
        and "reference_max_params=1000" in (record["numerics_note"])
    )
    assert record["fluent"] is True and record["fluency_score"] >= judge.MIN_SCORE
    off = probe_record(tmp_path, fixture_models["tiny-gpt2"]["path"], judge=False)
    assert (
        off["status"] == schema.PASS
        and off["fluent"] is None
        and off["fluency_note"] == "switched off (judge=false)"
    )
    assert (
        off["numerics"] is None
        and off["numerics_note"] == "no reference: switched off (reference='none')"
    )


def test_weights_newly_initialised_are_fail_load(smoke_sweep):
    for name in ("fail-encoder-only", "fail-truncated-safetensors"):
        record = smoke_sweep["by_name"][name]
        assert record["status"] == schema.FAIL_LOAD and record["failure_stage"] == "load", record[
            "error_message"
        ]
    assert "newly initialised" in smoke_sweep["by_name"]["fail-encoder-only"]["error_message"]


def test_remote_code_is_refused_by_default_and_never_runs(smoke_sweep, fixture_models):
    record = smoke_sweep["by_name"]["fail-remote-code"]
    assert record["status"] == schema.FAIL_LOAD and record["trust_remote_code"] is False
    assert "trust_remote_code" in record["error_message"]
    assert not Path(fixture_models["fail-remote-code"]["marker"]).exists()


def test_generate_failure_records_the_step(smoke_sweep, fixture_models):
    record = smoke_sweep["by_name"]["fail-short-positions"]
    assert record["status"] == schema.FAIL_GEN and record["failure_stage"] == "generate"
    assert record["failed_step"] == fixture_models["fail-short-positions"]["fail_step"]
    assert record["error_type"] and record["traceback"] and record["failure_signature"]


def test_bf16_overflow_diverges_from_the_cpu_reference(smoke_sweep):
    """A PASS that computes NaN: the verdict stays PASS, its check says diverges at step 0, its
    text is not fluent."""
    record = smoke_sweep["by_name"]["diverge-bf16-overflow"]
    assert record["status"] == schema.PASS
    assert record["reference_match"] is False and record["first_divergence"] == 0
    assert (record["numerics"], record["numerics_step"]) == ("diverges", 0)
    assert "the device's logits are not finite" in record["numerics_note"]
    assert record["fluent"] is False and "no visible text" in record["fluency_note"]


def test_executed_notebook_alone_tells_the_verdict(smoke_sweep):
    data_dir = Path(smoke_sweep["data_dir"])
    for name in ("SmolLM2-135M-Instruct", "fail-short-positions"):
        record = smoke_sweep["by_name"][name]
        path = data_dir / record["notebook_path"]
        stored = probe.record_from_notebook(path)
        # the script's body kept once, not in each notebook
        assert stored == {**record, "repro_script": None}
        assert repro.script_of(stored) == record["repro_script"]
        nb = nbformat.read(str(path), as_version=4)
        outputs = [o for c in nb.cells for o in c.get("outputs", []) if "data" in o]
        assert [
            o["data"]["application/json"] for o in outputs if "application/json" in o["data"]
        ] == [stored]
        assert any(record["status"] in o["data"].get("text/html", "") for o in outputs)


@pytest.mark.parametrize("name", ["SmolLM2-135M-Instruct", "fail-short-positions"])
def test_repro_script_reproduces_the_probe_with_plain_python(
    smoke_sweep, fixture_models, tmp_path, name
):
    record = smoke_sweep["by_name"][name]
    script = tmp_path / "repro.py"
    script.write_text(record["repro_script"])
    assert (
        "model_support" not in record["repro_script"] and "papermill" not in record["repro_script"]
    )
    refused = subprocess.run(
        [sys.executable, "-I", str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert (
        refused.returncode == 1
        and f"local:{name} was a local folder: pass its path" in refused.stderr
    )
    folder = fixture_models[name]["path"]  # a local model's folder is the script's argument
    run = subprocess.run(
        [sys.executable, "-I", str(script), folder],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert run.returncode == (0 if record["status"] == schema.PASS else 1), run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    for key in (
        "status",
        "failure_stage",
        "error_type",
        "tokens_in",
        "tokens_out",
        "output_token_ids",
        "failed_step",
    ):
        assert got[key] == record[key], key
    # it runs the reference check too, and says what the record says
    if record["status"] == schema.PASS:
        for key in (
            "reference_device",
            "numerics",
            "numerics_step",
            "reference_match",
            "first_divergence",
        ):
            assert got[key] == record[key], key
        assert got["reference_max_kl"] == pytest.approx(record["reference_max_kl"], abs=1e-6)


def test_a_fake_hf_token_lands_nowhere(smoke_sweep):
    """The smoke sweep ran with a fake token in HF_TOKEN; no file it wrote contains it."""
    data_dir = Path(smoke_sweep["data_dir"])
    files = [p for p in data_dir.rglob("*") if p.is_file()]
    assert len(files) > 50
    leaked = [str(p) for p in files if FAKE_TOKEN.encode() in p.read_bytes()]
    assert not leaked


def test_the_headline_command_probes_one_model(tmp_path, fixture_models):
    """`papermill notebooks/probe.ipynb out.ipynb -p model_id X`, for real, as a user types it."""
    import os

    out, record_path = tmp_path / "out.ipynb", tmp_path / "r.json"
    run = subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "papermill"),
            "notebooks/probe.ipynb",
            str(out),
            "-p",
            "model_id",
            "data/models/tiny-llama",
            "-p",
            "device",
            "cpu",
            "-p",
            "reference",
            "none",
            "-p",
            "record_path",
            str(record_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    record = json.loads(record_path.read_text())
    assert (record["status"], record["model_id"], record["tokens_out"]) == (
        schema.PASS,
        "local:tiny-llama",
        8,
    )
    assert record["output_token_ids"] == fixture_models["tiny-llama"]["expected_token_ids"]
    assert probe.record_from_notebook(out) == {**record, "repro_script": None}
    assert str(REPO) not in record_path.read_text()  # no machine path in the record
    # the early side file is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.ipynb", "r.json"]


def papermill_probe(
    tmp_path: Path, model_id: str, env: dict | None = None
) -> subprocess.CompletedProcess:
    """``papermill notebooks/probe.ipynb out.ipynb -p model_id MODEL -p device cpu``, as a user
    types it."""
    import os

    command = [os.path.join(os.path.dirname(sys.executable), "papermill"), "notebooks/probe.ipynb"]
    command += [str(tmp_path / "out.ipynb"), "-p", "model_id", model_id, "-p", "device", "cpu"]
    command += ["-p", "record_path", str(tmp_path / "r.json")]
    return subprocess.run(
        command,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def the_notebooks_error(out: Path) -> tuple[int, dict]:
    """The executed notebook's error output: (the index of its cell among the code cells, the
    output)."""
    cells = [cell for cell in nbformat.read(out, as_version=4).cells if cell.cell_type == "code"]
    (found,) = [
        (i, o)
        for i, cell in enumerate(cells)
        for o in cell.get("outputs", [])
        if o.output_type == "error"
    ]
    return found


@pytest.mark.parametrize(
    ("model_id", "env", "sentence"),
    [
        (
            "data/models/tiny-gtp2",
            {},
            "model_id 'data/models/tiny-gtp2' is no folder on this machine: did you mean "
            "'data/models/tiny-gpt2'?",
        ),
        (
            "HuggingFaceTB/SmolLM2-135M",
            {"HF_HUB_OFFLINE": "1"},
            "model_id 'HuggingFaceTB/SmolLM2-135M' could not be fetched: model "
            "'HuggingFaceTB/SmolLM2-135M' is not in the local Hugging Face cache "
            "(HF_HUB_CACHE) and offline mode is on (HF_HUB_OFFLINE=1); check the network "
            "(HF_ENDPOINT, HF_HUB_OFFLINE, a proxy) and run the probe again.",
        ),
        (
            "HuggingFaceTB/SmolLM2-135M",
            {
                "HF_HUB_OFFLINE": "0",
                "HF_ENDPOINT": "http://127.0.0.1:9",
                "MODEL_SUPPORT_HUB_BACKOFF_S": "0.01",
            },
            "model_id 'HuggingFaceTB/SmolLM2-135M' could not be fetched: the Hub could not be "
            "reached",
        ),
    ],
    ids=["typo", "offline", "unreachable"],
)
def test_a_model_that_is_not_there_stops_the_notebook_with_one_sentence(
    tmp_path, model_id, env, sentence
):
    """A typo in a local path, or a Hub id while the Hub cannot be reached, is the user's to fix,
    not the model's verdict: the call cell stops with one sentence (the cell's whole traceback),
    papermill exits non-zero, and no record is written."""
    run = papermill_probe(tmp_path, model_id, {"HF_HUB_CACHE": str(tmp_path / "cache"), **env})
    assert run.returncode != 0 and f"ModelUnavailable: {sentence}" in run.stderr, run.stderr[-3000:]
    assert not (tmp_path / "r.json").exists()
    cell, error = the_notebooks_error(tmp_path / "out.ipynb")
    # the parameters, the injected parameters, then the call cell: the first that runs anything
    assert cell == 2
    assert error.ename == "ModelUnavailable" and error.traceback == [
        f"ModelUnavailable: {error.evalue}"
    ]
    assert (
        error.evalue.startswith(sentence)
        and error.evalue.endswith((".", "?"))
        and "\n" not in error.evalue
    )


def test_a_bad_device_name_is_refused_before_anything_runs(tmp_path, fixture_models):
    """``device='GPU'`` was a FAIL(other) record (the user's typo as a verdict): it is bad input,
    refused with what is accepted, and no record is written."""
    import papermill

    with pytest.raises(papermill.PapermillExecutionError) as info:
        run_notebook(
            "probe.ipynb",
            tmp_path / "out.ipynb",
            model_id=fixture_models["tiny-llama"]["path"],
            device="GPU",
            record_path=str(tmp_path / "r.json"),
        )
    assert info.value.ename == "ParameterError"
    assert "device='GPU' is not accepted" in info.value.evalue
    assert not (tmp_path / "r.json").exists()


def test_tpu_without_a_tpu_is_one_clear_sentence(tmp_path, fixture_models):
    out = run_notebook(
        "probe.ipynb",
        tmp_path / "out.ipynb",
        model_id=fixture_models["tiny-llama"]["path"],
        device="tpu",
        record_path=str(tmp_path / "r.json"),
    )
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["status"] == schema.FAIL_OTHER and record["failure_stage"] == "runner"
    assert record["error_message"] == (
        "Device 'tpu' was requested but no TPU is present on this machine "
        "(torch_tpu is installed, but torch.accelerator.is_available() is False)."
    )
    assert probe.record_from_notebook(out)["status"] == schema.FAIL_OTHER


def test_device_adapters_without_accelerators(monkeypatch):
    assert devices.resolve("auto").type == "cpu"
    assert devices.resolve("cpu").peak_memory_mb() == (None, None)
    with pytest.raises(
        devices.DeviceUnavailable, match=r"^Device 'cuda' was requested but no CUDA GPU is visible"
    ):
        devices.resolve("cuda")
    with pytest.raises(
        devices.DeviceUnavailable, match="^Device 'gpu' was requested but this machine has no such"
    ):
        devices.resolve("gpu")  # a well-formed name no backend provides
    monkeypatch.setattr(devices.tpu, "torch_tpu_installed", lambda: False)
    with pytest.raises(devices.DeviceUnavailable, match="torch_tpu package is not installed"):
        devices.resolve("tpu")


def test_verdicts_of_probe_core_match_the_schema():
    from model_support.probe import probe_core

    assert (
        probe_core.PASS,
        probe_core.FAIL_LOAD,
        probe_core.FAIL_GEN,
        probe_core.FAIL_OTHER,
    ) == schema.VERDICTS
    assert (
        probe_core.classify("generate", RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))
        == schema.FAIL_OTHER
    )
    assert probe_core.classify("generate", IndexError("index out of range")) == schema.FAIL_GEN
    assert probe_core.classify("load", OSError("missing")) == schema.FAIL_LOAD
    assert probe_core.classify("template", ValueError("bad")) == schema.FAIL_OTHER
    assert checks.first_divergence([1, 2, 3], [1, 2, 4]) == 2
    assert checks.first_divergence([1, 2], [1, 2, 3]) == 2
    assert checks.first_divergence([1, 2], [1, 2]) is None


def test_models_bigger_than_one_device_in_the_smoke_sweep(smoke_sweep):
    """devices auto with a 1 MB pretend device: 2 ranks, tensor or expert parallel; no plan: its
    sentence."""
    by_name = smoke_sweep["by_name"]
    llama, mixtral, gpt2 = (
        by_name["sharded-llama"],
        by_name["sharded-mixtral"],
        by_name["sharded-gpt2"],
    )
    assert (llama["devices_used"], llama["parallelism"], llama["tp_size"]) == (2, "tp", 2)
    assert (mixtral["devices_used"], mixtral["parallelism"], mixtral["ep_size"]) == (2, "ep", 2)
    assert llama["memory_estimate_bytes"] > 1_000_000 and len(mixtral["generate_s_per_rank"]) == 2
    assert gpt2["error_message"] == (
        "GPT2LMHeadModel has no tensor or expert parallel plan, and needs 2 devices: it "
        "cannot run here as shipped"
    )
    assert (
        by_name["tiny-llama"]["devices_used"] == 1
        and by_name["tiny-llama"]["parallelism"] == "none"
    )


def test_a_sharded_probes_repro_script_launches_its_ranks_the_same_way(
    smoke_sweep, fixture_models, tmp_path
):
    record = smoke_sweep["by_name"]["sharded-llama"]
    script = tmp_path / "repro.py"
    script.write_text(record["repro_script"])
    assert "'distributed': {'tp_size': 2}" in record["repro_script"]
    run = subprocess.run(
        [sys.executable, "-I", str(script), fixture_models["sharded-llama"]["path"]],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert (got["status"], got["output_token_ids"]) == (schema.PASS, record["output_token_ids"])


def test_what_runs_a_probe_stays_lean():
    """JupyterLab's server stack (jsonschema's rfc3987 grammar among it: seconds per import)
    stays out."""
    heavy = ("rfc3987_syntax", "lark", "jupyter_server", "jupyterlab", "jupyter_events", "polars")
    code = (
        "import sys, papermill, nbclient, ipykernel.kernelapp; from model_support.probe "
        f"import run; print([m for m in {heavy!r} if m in sys.modules])"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]"


def test_hub_kernels_stay_off(fixture_models):
    """transformers 5.25 swaps layers for kernels downloaded from the Hub by default (and refuses
    devices the ``kernels`` package does not know); the probe loads with them off, so a verdict
    is the stack's kernels."""
    import transformers
    from packaging.version import Version

    from model_support.probe import probe_core

    model, _ = probe_core.load(
        fixture_models["tiny-llama"]["path"], "", "bfloat16", False, "cpu", {}
    )
    assert model.use_kernels is False, transformers.__version__
    plain = transformers.AutoModelForCausalLM.from_pretrained(fixture_models["tiny-llama"]["path"])
    if Version(transformers.__version__) >= Version(
        "5.25"
    ):  # the default this guards against (constraints.txt pins 5.25.0)
        assert plain.use_kernels is True
