"""The pretend accelerator (``model_support_pretend``): a PrivateUse1 backend written in Python
with a stack's faults on demand, and the accelerator path of the project run on it
(docs/devices.md).

The backend's own behaviour is checked in child processes (registering a device renames
PrivateUse1 for the life of a process, which the test process must not do); the probe, sweeps,
debug and repro scripts run for real on it, as they would on a TPU."""

from __future__ import annotations

import html
import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import stored_records
from model_support_pretend import CONFIG_VAR, VISIBLE_VAR, PretendConfigError, parse

REPO = Path(__file__).resolve().parents[1]
TINY = "data/models/tiny-llama"
CLI = [sys.executable, "-m", "model_support.cli"]


def pretend_env(config: dict | None = None, **extra) -> dict:
    import os

    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", **extra}
    if config is not None:
        env[CONFIG_VAR] = json.dumps(config)
    return env


def run_child(code: str, config: dict | None = None, **extra) -> subprocess.CompletedProcess:
    """``code`` in a fresh python with the pretend accelerator configured by ``config``."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=pretend_env(config, **extra),
        cwd=REPO,
        timeout=600,
    )


def child_json(code: str, config: dict | None = None, **extra) -> dict:
    done = run_child(code, config, **extra)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- the configuration
# -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "visible", "words"),
    [
        ("{devices: 2}", None, "MODEL_SUPPORT_PRETEND is not JSON"),
        ("[1]", None, "must be a JSON object"),
        ('{"device": 2}', None, "unknown key(s) device; accepted: devices, memory_gb"),
        ('{"devices": 0}', None, "'devices' must be a whole number >= 1, not 0"),
        ('{"memory_gb": -1}', None, "'memory_gb' must be a number of GB above 0"),
        ('{"missing_ops": "aten::rsqrt"}', None, "'missing_ops' must be a list of names"),
        ('{"slow_ops": {"aten::mm": "1s"}}', None, "'slow_ops' must map operator names to seconds"),
        ('{"launch_us": -1}', None, "'launch_us' must be microseconds >= 0 per kernel, not -1"),
        (
            '{"clock_jitter": 0.5}',
            None,
            "'clock_jitter' must be a relative spread from 0 to below 0.3",
        ),
        (
            '{"devices": 2}',
            "0,2",
            "PRETEND_VISIBLE_DEVICES='0,2' must list distinct device ids below 2",
        ),
        ('{"devices": 2}', "1,1", "must list distinct device ids"),
    ],
)
def test_a_bad_configuration_is_one_sentence(text, visible, words):
    with pytest.raises(PretendConfigError) as caught:
        parse(text, visible)
    assert words in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_configuration_and_its_visibility():
    config = parse(
        '{"devices": 4, "memory_gb": 0.5, "missing_ops": ["aten::rsqrt"], "slow_ops": {"aten::mm": 2}}',
        "3,1",
    )
    assert config.visible == (3, 1) and config.memory_bytes == 500_000_000
    assert config.missing_ops == frozenset({"aten::rsqrt"}) and config.slow_ops == {"aten::mm": 2.0}
    assert parse("", None).visible == (0,) and parse("{}", None).memory_bytes is None


# --- the backend, in a child process
# ------------------------------------------------------------------

BACKEND_CHECKS = """
    import json, time
    import torch
    from model_support.probe import devices, probe_core
    from model_support_pretend import tensor

    adapter = devices.resolve("pretend")  # loads the backend through its torch.backends entry point
    out = {"accelerator": str(torch.accelerator.current_accelerator()), "count": torch.accelerator.device_count(),
           "physical": [torch.pretend.get_device_properties(i).physical_id for i in range(adapter.device_count())]}
    for name in ("max_memory_allocated", "synchronize"):  # torch's generic calls refuse a Python backend
        try:
            getattr(torch.accelerator, name)()
            out[name] = "answered"
        except RuntimeError as exc:
            out[name] = str(exc)[:200]
    cpu = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    x = cpu.to("pretend")
    out["type"], out["device"] = type(x).__name__, str(x.device)
    out["roundtrip"] = torch.equal((x * 2 + 1).cpu(), cpu * 2 + 1)
    out["tolist"] = x.sum(0).tolist()
    out["allocated"] = torch.pretend.memory_allocated()
    y = torch.ones(1000, device="pretend")  # 4000 bytes more
    out["after_ones"] = torch.pretend.memory_allocated()
    del y
    out["after_del"], out["peak"] = torch.pretend.memory_allocated(), torch.pretend.max_memory_allocated()
    out["peak_mb"], out["source"] = adapter.peak_memory_mb()
    try:
        torch.ones(10**6, device="pretend")  # 4 MB: above memory_gb
    except Exception as exc:
        out["oom"] = [type(exc).__name__, str(exc), probe_core.is_oom(exc)]
    try:
        x.rsqrt()
    except NotImplementedError as exc:
        out["missing"] = str(exc)
    out["add_ok"] = torch.equal((x + x).cpu(), cpu + cpu)
    try:
        torch.zeros(2, dtype=torch.float64, device="pretend")
    except TypeError as exc:
        out["dtype"] = str(exc)
    out["float32_ok"] = torch.zeros(2, device="pretend").dtype == torch.float32
    out["wrong"] = (x @ torch.eye(4).to("pretend")).cpu().tolist()
    out["wrong_again"] = (x @ torch.eye(4).to("pretend")).cpu().tolist()
    slept = []
    tensor.time.sleep = slept.append  # the slow operator's stall, recorded rather than waited for
    clock = probe_core.device_clock("pretend")  # torch.pretend.perf_clock: its timeline, as the perf phase reads it
    began = clock()
    (x - x).cpu()
    out["slept"], out["clock_stall"] = list(slept), clock() - began
    x.neg()  # a default overload, slowed under its one name: one stall a call
    out["slept_neg"] = slept[1:]
    began = clock()
    x.view(12)
    out["clock_view"] = clock() - began
    began = clock()
    x + x  # one kernel: 5 us to launch, 144 bytes at 100 GB/s
    out["clock_add"] = clock() - began
    on_one = torch.ones(2, device="pretend:1")
    try:
        torch.ones(2, device="pretend:0") + on_one
    except RuntimeError as exc:
        out["two_devices"] = str(exc)
    out["rank_device"] = str(adapter.rank_device(1))
    out["current"] = torch.pretend.current_device()
    out["compile_backend"], out["distributed"] = adapter.compile_backend(), adapter.distributed_backend()
    print(json.dumps(out))
"""


def test_the_backend_runs_on_the_cpu_underneath_with_its_faults():
    config = {
        "devices": 4,
        "memory_gb": 0.000_01,  # 10,000 bytes
        "missing_ops": ["aten::rsqrt"],
        "unsupported_dtypes": ["float64"],
        "wrong_ops": ["aten::mm"],
        "slow_ops": {"aten::sub.Tensor": 2.5, "aten::neg": 1.5},
    }
    out = child_json(BACKEND_CHECKS, config, **{VISIBLE_VAR: "2,3"})
    assert (out["accelerator"], out["count"], out["physical"]) == ("pretend", 2, [2, 3])
    # as torch_tpu's allocator is not either
    assert "is not a DeviceAllocator" in out["max_memory_allocated"]
    assert out["synchronize"] != "answered"
    assert (out["type"], out["device"], out["roundtrip"]) == ("PretendTensor", "pretend:0", True)
    assert out["tolist"] == [12.0, 15.0, 18.0, 21.0]
    assert out["after_ones"] - out["allocated"] == 4000 and out["after_del"] == out["allocated"]
    assert out["peak"] >= out["after_ones"]
    assert (
        out["peak_mb"] == out["peak"] / 2**20
        and out["source"] == "torch.pretend.max_memory_allocated"
    )
    name, message, classified = out["oom"]
    assert name == "OutOfMemoryError" and classified
    assert message.startswith(
        "pretend out of memory. Tried to allocate 3.81 MiB. Device 0 has a total capacity of"
    )
    assert out["missing"].startswith(
        "Could not run 'aten::rsqrt' with arguments from the 'pretend' backend."
    )
    assert out["add_ok"] and out["float32_ok"]
    assert out["dtype"].startswith("Cannot convert a pretend Tensor to float64 dtype")
    right = [[float(4 * r + c) for c in range(4)] for r in range(3)]
    # wrong, and the same wrong every time
    assert out["wrong"] == [[-v for v in reversed(row)] for row in right]
    assert out["wrong_again"] == out["wrong"]
    assert out["slept"] == [2.5] and out["slept_neg"] == [1.5]
    # its clock: the stall counted whole (plus the subtraction's and the copy's kernels), a view
    # launches nothing, a kernel its launch latency plus its bytes at the bandwidth, with each
    # process's pace within 2% (jitter 1%)
    assert 2.5 < out["clock_stall"] < 2.5 + 1e-4 and out["clock_view"] == 0
    assert 5e-6 * 0.96 < out["clock_add"] < 5e-6 * 1.05
    assert out["two_devices"] == (
        "Expected all tensors to be on the same device, but found at least two devices, "
        "pretend:0 and pretend:1!"
    )
    assert (out["rank_device"], out["current"]) == ("pretend:1", 1)
    assert (out["compile_backend"], out["distributed"]) == ("aot_eager", "cpu:gloo,pretend:pretend")


def test_the_device_clock_is_launch_latency_plus_bytes_at_the_bandwidth_with_a_bounded_pace():
    from model_support_pretend.clock import NOISE_BOUND, DeviceClock

    exact = DeviceClock(launch_s=5e-6, bandwidth_gbs=10, jitter=0)
    exact.kernel(10**9)  # 1 GB at 10 GB/s
    exact.stall(0.25)
    assert exact.now() == 5e-6 + 0.1 + 0.25
    paces = [DeviceClock(5e-6, None, 0.01).pace for _ in range(2000)]
    assert (
        max(paces) - min(paces) <= NOISE_BOUND * 0.01 + 1e-9
        and max(paces) > 1.01
        and min(paces) < 0.99
    )


def test_a_crashing_operator_kills_the_process_as_a_runtime_abort_does():
    done = run_child(
        """
        import torch
        from model_support.probe import devices
        devices.resolve("pretend")
        torch.ones(3, device="pretend").relu()
        print("survived")
        """,
        {"crash_ops": ["aten::relu"]},
    )
    assert done.returncode == -signal.SIGABRT and "survived" not in done.stdout
    assert "pretend runtime: fatal error in aten::relu; aborting" in done.stderr


def test_a_silent_late_abort_names_its_operator_has_its_repro_script_and_is_the_stacks(
    tmp_path, monkeypatch
):
    """Two crashing operators, of which each model reaches one, and a runtime that aborts
    silently (no last words) and late (three operators on, as an asynchronous runtime reports
    it): the flight recorder's last operator is not the culprit, so the probe reruns the silent
    abort once synchronously (PRETEND_LAUNCH_BLOCKING=1, as CUDA_LAUNCH_BLOCKING=1) and the row
    names the operator the model reached, in ``crash_operator`` and in its message and signature
    (two aborts, two signatures); each row has the repro script the probe wrote before it ran,
    and is rerun on the CPU reference, which does not abort: the stack's. (A runtime that names
    its operator is the porting loop's tiny-opt.)"""
    from helpers import cli_sweep
    from model_support.probe.model_ids import display_name

    config = {"crash_ops": ["aten::silu", "aten::gelu"], "crash_message": False, "crash_after": 3}
    monkeypatch.setenv(CONFIG_VAR, json.dumps(config))
    definition = {
        "name": "aborts",
        "probe": {"device": "pretend", "judge": False, "perf": False},
        "models": [TINY, "data/models/tiny-gpt-neox"],
    }
    data, sweep = cli_sweep(tmp_path, definition)
    # the script put together again
    rows = {display_name(r["model_id"]): r for r in stored_records(data, sweep)}
    for name, op in (("tiny-llama", "aten::silu"), ("tiny-gpt-neox", "aten::gelu")):
        row = rows[name]
        said = f"it died in {op} (flight recorder)"
        assert (row["status"], row["error_type"]) == ("FAIL(other)", "DeadKernelError"), name
        assert row["error_message"].startswith(
            "the kernel died (killed by SIGABRT) while the probe ran"
        )
        assert row["error_message"].endswith(said) and row["failure_signature"].endswith(said)
        assert row["crash_operator"] == op, row["crash_operator_note"]
        assert row["crash_operator_note"].startswith(
            "the operator a synchronous rerun (PRETEND_LAUNCH_BLOCKING=1)"
        )
        # it died three later
        assert f"first run's last operator was {op}" not in row["crash_operator_note"]
        assert row["crash_operator_args"].startswith("bfloat16[1, ")
        assert (
            row["repro_script"].startswith("#!/usr/bin/env python")
            and f"local:{name}" in row["repro_script"]
        )
        assert (row["attribution"], row["reference_device"]) == ("stack", "cpu:bfloat16"), row[
            "reference_note"
        ]
    assert rows["tiny-llama"]["failure_signature"] != rows["tiny-gpt-neox"]["failure_signature"]


COMPOSITES = """
    import json
    import torch
    import torch.nn.functional as F
    from model_support.probe import devices

    devices.resolve("pretend")
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4).to("pretend")
    eye = torch.eye(4).to("pretend")
    q = torch.ones(1, 1, 2, 4, device="pretend")
    out = {}
    for mode, context in (("inference_mode", torch.inference_mode), ("no_grad", torch.no_grad), ("grad", torch.enable_grad)):
        with context():
            out[mode] = {"linear": F.linear(x, eye).cpu().tolist()}
            try:
                F.scaled_dot_product_attention(q, q, q)
                out[mode]["sdpa"] = "ran"
            except NotImplementedError as exc:
                out[mode]["sdpa"] = str(exc)
    print(json.dumps(out))
"""


def test_composite_operators_reach_the_backend_as_their_parts_in_every_mode():
    """A C++ backend receives ``aten::linear`` and ``aten::scaled_dot_product_attention`` as the
    operators they decompose into (``CompositeImplicitAutograd``), under
    ``torch.inference_mode()`` (the probe's) as in any other mode: a wrong ``aten::mm`` makes
    linear wrong, a missing ``aten::bmm`` stops attention."""
    out = child_json(COMPOSITES, {"wrong_ops": ["aten::mm"], "missing_ops": ["aten::bmm"]})
    right = [[float(4 * r + c) for c in range(4)] for r in range(3)]
    for mode in ("inference_mode", "no_grad", "grad"):
        assert out[mode]["linear"] == [[-v for v in reversed(row)] for row in right], mode
        assert out[mode]["sdpa"].startswith(
            "Could not run 'aten::bmm' with arguments from the 'pretend' backend."
        ), mode


def test_a_fault_on_an_operator_no_backend_receives_is_refused():
    """A fault on a composite (``aten::linear``) would never happen: refused as a typo is, naming
    the way out."""
    code = """
        import json
        from model_support.probe import devices
        try:
            devices.resolve("pretend")
        except devices.DeviceUnavailable as exc:
            print(json.dumps(str(exc)))
        """
    refused = child_json(code, {"wrong_ops": ["aten::linear"]})
    assert "wrong_ops names 'aten::linear', which no backend receives" in refused
    assert "name one of those" in refused


def test_a_fault_on_an_operator_whose_default_is_torchscripts_takes_its_tensor_forms():
    """``aten::mul`` and ``aten::add`` name no default form a backend receives (their ``default``
    is TorchScript's product and sum of scalars): a fault on the name reaches their tensor forms,
    and the backend loads."""
    code = """
        import json
        import torch
        from model_support.probe import devices
        devices.resolve("pretend")
        x = torch.ones(3, device="pretend")
        try:
            (x + x).cpu()
            added = "ran"
        except Exception as exc:
            added = str(exc)
        print(json.dumps({"mul": (x * x).cpu().tolist(), "add": added}))
        """
    out = child_json(code, {"wrong_ops": ["aten::mul"], "missing_ops": ["aten::add"]})
    assert out["mul"] != [1.0, 1.0, 1.0] and out["add"].startswith("Could not run 'aten::add'"), out


def test_off_unless_configured_and_a_typo_in_a_fault_is_refused():
    code = """
        import json
        from model_support.probe import devices
        try:
            devices.resolve("pretend")
        except devices.DeviceUnavailable as exc:
            print(json.dumps(str(exc)))
        """
    off = child_json(code)
    assert off.startswith(
        "Device 'pretend' was requested but the pretend accelerator is off here: set "
        "MODEL_SUPPORT_PRETEND"
    )
    typo = child_json(code, {"missing_ops": ["aten::rsqrtt"]})
    assert typo.startswith(
        "Device 'pretend' was requested but its backend failed to load: PretendConfigError:"
    )
    assert "missing_ops names 'aten::rsqrtt', which is no operator torch knows" in typo


def test_auto_finds_it_in_the_probe_and_in_the_runner():
    """``device: auto``: the probe loads the backends whose hardware may be here (the pretend
    one: when it is configured) and takes the one torch then reports; the runner asks the same of
    a child process."""
    code = """
        import json
        from model_support.probe import devices
        facts = devices.facts("auto")  # the runner's question: a child process answers
        print(json.dumps([facts.type, facts.count, devices.auto_candidates(), devices.resolve("auto").type]))
        """
    assert child_json(code, {"devices": 3}) == ["pretend", 3, ["pretend"], "pretend"]
    # not configured: auto is the CPU, and no child was asked
    assert child_json(code) == ["cpu", 1, [], "cpu"]


def test_a_sweep_on_a_device_this_machine_lacks_is_refused_before_any_model(tmp_path):
    """Any well-formed accelerator name is a valid parameter; whether this machine has it is
    asked of the device adapters (in a child process), once, before anything runs, with the
    sentence a probe records."""
    import yaml

    definition = tmp_path / "gpu.yaml"
    definition.write_text(
        yaml.safe_dump({"name": "gpu", "probe": {"device": "gpu"}, "models": [TINY]})
    )
    for device_env, sentence in (
        (
            None,
            "Device 'gpu' was requested but this machine has no such accelerator (torch "
            "reports no accelerator)",
        ),
        (
            {"devices": 1},
            "Device 'gpu' was requested but this machine has no such accelerator (the "
            "accelerators here: pretend)",
        ),
    ):
        done = subprocess.run(
            [*CLI, "sweep", str(definition), "--data-dir", str(tmp_path / "data")],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=pretend_env(device_env),
            timeout=600,
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert done.stderr.strip().splitlines()[-1].startswith(f"Error: {sentence}"), done.stderr[
            -2000:
        ]
    assert not (tmp_path / "data").exists()


def test_torch_autoloads_it_through_its_entry_point_as_it_does_torch_tpu():
    """With torch's own autoload on (its default), ``import torch`` alone registers the device."""
    out = child_json(
        "import json, torch; print(json.dumps(str(torch.accelerator.current_accelerator())))",
        {"devices": 1},
        TORCH_DEVICE_BACKEND_AUTOLOAD="1",
        PYTHONWARNINGS="ignore",
    )
    assert out == "pretend"


def test_nothing_in_the_package_knows_the_name():
    """The accelerator path is generic: the pretend device (its own distribution, pretend/) is
    found like any other backend, by its name; the package a user installs never mentions it."""
    src = REPO / "src" / "model_support"
    knowing = [
        str(path.relative_to(REPO))
        for path in src.rglob("*")
        if path.is_file()
        and "__pycache__" not in path.parts
        and "pretend" in path.read_text(errors="ignore").lower()
    ]
    assert knowing == []


# --- the probe on it
# ------------------------------------------------------------------------------------


def test_the_probe_notebook_on_the_pretend_device_gives_the_cpus_tokens(
    tmp_path, monkeypatch, fixture_models
):
    """papermill, ``-p device pretend``: PASS, peak device memory with its source (torch's
    generic counter refuses a Python backend, so the adapter's fallback, the backend's own
    module, answers), and the tokens of the CPU reference: its float32 logits, teacher-forced on
    the device's tokens, agree at every step."""
    from helpers import probe_record

    monkeypatch.setenv(CONFIG_VAR, json.dumps({"devices": 1}))
    record = probe_record(
        tmp_path,
        fixture_models["tiny-llama"]["path"],
        device="pretend",
        reference="cpu",
        perf=False,
    )
    assert (record["status"], record["device_type"], record["device_count"]) == (
        "PASS",
        "pretend",
        1,
    )
    assert record["device_name"] == "Pretend accelerator (CPU underneath)"
    assert (
        record["peak_device_mem_mb"] > 0.1
        and record["device_mem_source"] == "torch.pretend.max_memory_allocated"
    )
    assert (record["reference_device"], record["reference_match"], record["numerics"]) == (
        "cpu:float32",
        True,
        "match",
    )
    assert record["first_divergence"] is None and record["tokens_out"] == 8


@pytest.mark.slow
def test_compile_mode_uses_the_backend_the_adapter_names(tmp_path, monkeypatch, fixture_models):
    """An out-of-tree backend without a compiler of its own compiles with aot_eager: dynamo's
    graphs run through AOTAutograd on the device's tensors."""
    from helpers import probe_record

    monkeypatch.setenv(CONFIG_VAR, json.dumps({}))
    record = probe_record(
        tmp_path,
        fixture_models["tiny-gpt2"]["path"],
        device="pretend",
        mode="compile",
        perf_tokens=4,
        perf_repeats=1,
    )
    assert (record["status"], record["variant"], record["compile_backend"]) == (
        "PASS",
        "compile+dynamic",
        "aot_eager",
    )
    assert record["matches_eager"] is True and record["graphs"] >= 1
    # on an accelerator the compile mode also checks recompiles across prompt lengths
    # (recompile_check=auto)
    assert len(record["recompile_lengths"]) == 3 and len(record["recompiles_static"]) == 3, record[
        "recompile_note"
    ]
    assert "size mismatch" in record["recompile_guard"] and record["recompile_flag"] is None
    # its clock sees only what its dispatch runs, not a compiled graph: a compiled run is timed on
    # the host's clock
    assert record["tpot_s"] > 0 and "on the host's wall clock" in record["perf_note"], record[
        "perf_note"
    ]


def test_a_wrong_or_missing_matrix_product_is_a_wrong_or_failed_run(
    tmp_path, monkeypatch, fixture_models
):
    """tiny-llama's projections are ``aten::linear``, which reaches a backend as ``aten::mm``: on
    a stack with a wrong mm the probe (papermill, inference mode) still generates, and the CPU
    reference says ``diverges``; on one without mm it is FAIL(gen) naming it, the stack's (the
    CPU reference runs)."""
    from helpers import probe_record

    model = fixture_models["tiny-llama"]["path"]
    (tmp_path / "wrong").mkdir()
    (tmp_path / "missing").mkdir()
    monkeypatch.setenv(CONFIG_VAR, json.dumps({"wrong_ops": ["aten::mm"]}))
    wrong = probe_record(
        tmp_path / "wrong", model, device="pretend", reference="cpu", judge=False, perf=False
    )
    assert (wrong["status"], wrong["numerics"]) == ("PASS", "diverges"), (
        wrong["error_message"],
        wrong["numerics_note"],
    )
    monkeypatch.setenv(CONFIG_VAR, json.dumps({"missing_ops": ["aten::mm"]}))
    missing = probe_record(
        tmp_path / "missing", model, device="pretend", reference="cpu", judge=False, perf=False
    )
    assert (missing["status"], missing["failure_stage"], missing["attribution"]) == (
        "FAIL(gen)",
        "generate",
        "stack",
    )
    assert missing["error_message"].startswith(
        "Could not run 'aten::mm' with arguments from the 'pretend' backend."
    )


PROBE = """
    import json, sys
    from model_support.probe import run as probe
    record = probe.run_probe(sys.argv[1], device="pretend", **json.loads(sys.argv[2]))
    print(json.dumps({k: record[k] for k in ("status", "failure_stage", "error_type", "error_message", "attribution")}))
"""


@pytest.mark.parametrize(
    ("config", "settings", "expected", "words"),
    [
        (
            {"unsupported_dtypes": ["float64"]},
            {"dtype": "float64"},
            ("FAIL(load)", "load", "TypeError", "stack"),
            "Cannot convert a pretend Tensor to float64 dtype",
        ),
        (
            {"memory_gb": 0.000_3},  # 300 KB: tiny-llama's weights do not fit
            {},
            ("FAIL(other)", "load", "OutOfMemoryError", "stack"),
            "pretend out of memory. Tried to allocate",
        ),
    ],
    ids=["unsupported dtype", "too little memory"],
)
def test_a_refused_dtype_and_too_little_memory_fail_at_load(
    config, settings, expected, words, fixture_models
):
    """Moving the model to the device is the load stage: a dtype the device lacks is FAIL(load),
    running out of device memory FAIL(other) (out-of-memory always is); both the stack's (the CPU
    reference loads)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(PROBE),
            fixture_models["tiny-llama"]["path"],
            json.dumps(settings),
        ],
        capture_output=True,
        text=True,
        env=pretend_env(config),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert (
        record["status"],
        record["failure_stage"],
        record["error_type"],
        record["attribution"],
    ) == expected
    assert record["error_message"].startswith(words)


# --- a porting team's loop: params/pretend.yaml, before and after one operator is fixed
# -------------------

#: The stack of params/pretend.yaml, and the same stack once aten::rsqrt is implemented.
BEFORE = {"devices": 2, "missing_ops": ["aten::rsqrt", "aten::gelu"], "crash_ops": ["aten::relu"]}
AFTER = {"devices": 2, "missing_ops": ["aten::gelu"], "crash_ops": ["aten::relu"]}


def cli(args: list, config: dict | None, data: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [*CLI, *args, "--data-dir", str(data)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=pretend_env(config),
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def porting_loop(tmp_path_factory, fixture_models) -> dict:
    """params/pretend.yaml swept on the stack BEFORE, then on AFTER, into one data folder (the
    CLI, for real)."""
    from model_support.probe.model_ids import display_name
    from model_support.record import store

    data = tmp_path_factory.mktemp("pretend-data")
    # the perf phase off: not what this loop tests (tests/test_perf.py), and ~1.4 s a PASS on this
    # device
    cli(["sweep", "params/pretend.yaml", "-p", "perf=off"], BEFORE, data)
    (before,) = store.list_sweeps(data)
    cli(["sweep", "params/pretend.yaml", "-p", "perf=off"], AFTER, data)
    (after,) = set(store.list_sweeps(data)) - {before}
    records = {
        sweep: {display_name(r["model_id"]): r for r in stored_records(data, sweep)}
        for sweep in (before, after)
    }
    return {"data": data, "before": before, "after": after, "records": records}


def test_missing_operators_fail_the_models_that_call_them_and_are_the_stacks(porting_loop):
    records = porting_loop["records"][porting_loop["before"]]
    rsqrt = (
        "NotImplementedError: Could not run 'aten::rsqrt' with arguments from the 'pretend' "
        "backend."
    )
    # one cause, one signature, on both models, with no place
    for name in ("tiny-llama", "tiny-qwen2"):
        r = records[name]
        assert (r["status"], r["failure_stage"], r["attribution"]) == (
            "FAIL(gen)",
            "generate",
            "stack",
        ), name
        assert r["failure_signature"].startswith(rsqrt) and " @ " not in r["failure_signature"]
        assert r["reference_device"] == "cpu:bfloat16"
    neox = records["tiny-gpt-neox"]
    assert (neox["status"], neox["attribution"]) == (
        "FAIL(gen)",
        "stack",
    ) and "'aten::gelu'" in neox["error_message"]
    gpt2 = records["tiny-gpt2"]  # it never calls them: the same stack runs it
    assert (gpt2["status"], gpt2["reference_match"]) == ("PASS", True)
    assert gpt2["device_mem_source"] == "torch.pretend.max_memory_allocated"
    opt = records["tiny-opt"]  # the runtime aborted its kernel; the sweep went on
    assert (opt["status"], opt["failure_stage"], opt["error_type"]) == (
        "FAIL(other)",
        "runner",
        "DeadKernelError",
    )
    assert opt["error_message"].endswith(
        "(killed by SIGABRT); it last said: pretend runtime: fatal error in aten::relu; aborting"
    )
    assert opt["attribution"] == "stack" and opt["repro_script"]
    assert {r["device_type"] for r in records.values()} == {"pretend"}
    # pinned: one each
    assert {r["device_count"] for r in records.values() if r["status"] != "FAIL(other)"} == {1}


def test_two_workers_pin_each_probe_to_its_own_device(porting_loop):
    from model_support.record import store

    # AFTER reruns the two runs whose verdict differs from BEFORE's (flakes screened,
    # ``sweep.reruns``): 5 + 2 holds
    for sweep, reruns in (
        (porting_loop["before"], []),
        (porting_loop["after"], ["tiny-llama", "tiny-qwen2"]),
    ):
        lines = (
            (store.sweep_dir(porting_loop["data"], sweep) / "schedule.jsonl")
            .read_text()
            .splitlines()
        )
        grants = [json.loads(line) for line in lines]
        assert len(grants) == 5 + len(reruns) and all(len(g["devices"]) == 1 for g in grants)
        held = sorted(g["model_id"].removeprefix("local:") for g in grants)
        assert sorted(m for m in set(held) if held.count(m) == 2) == reruns
        assert {g["devices"][0] for g in grants} == {0, 1}
        for device in (0, 1):  # never one device twice at once
            spans = sorted((g["start"], g["end"]) for g in grants if g["devices"] == [device])
            assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:])), (
                spans
            )


def test_the_diff_and_the_report_show_what_the_fix_made_pass(porting_loop):
    data, before, after = porting_loop["data"], porting_loop["before"], porting_loop["after"]
    records = porting_loop["records"][after]
    assert records["tiny-llama"]["status"] == records["tiny-qwen2"]["status"] == "PASS"
    assert records["tiny-llama"]["reference_match"] is True
    from model_support.render import terminal

    changes = terminal.diff_table(data, before, after)
    assert changes.select("model_id", "change").rows() == [
        ("local:tiny-llama", "newly passing"),
        ("local:tiny-qwen2", "newly passing"),
    ]
    assert all("'aten::rsqrt'" in was for was in changes["signature_before"])
    assert set(changes["attribution_before"]) == {"stack"}  # what the stack's fix mended
    out = cli(["diff", before, after], AFTER, data).stdout
    assert f"{after} (on pretend) against {before} (on pretend)" in out
    assert out.count("[stack])") == 2
    assert (
        "0 newly broken by the stack, 0 newly suspect, 0 newly failing, 0 newly failing "
        "everywhere, 2 newly passing" in out
    )
    reports = data / "reports"
    report = next(reports.glob(f"{after}*.html")).read_text()
    assert "newly passing" in report and ">pretend<" in report  # the header's device
    assert "whose, before" in report  # the newly passing runs' earlier failures: the stack's
    # the explorer's device column and filter
    assert '"pretend"' in (reports / "index.html").read_text()
    # the two sweeps differ only in the backend's configuration: the diff and the report say which
    # setting (they said "same package versions in both sweeps")
    assert (
        "backend settings that differ: MODEL_SUPPORT_PRETEND" in out
        and "same package versions" not in out
    )
    assert "backend settings that differ: MODEL_SUPPORT_PRETEND" in html.unescape(report)
    assert "backend settings" in report and "aten::rsqrt" in html.unescape(report)


def test_the_junit_export_of_the_pretend_sweep_is_valid_junit_with_a_case_per_model(porting_loop):
    """What a CI system reads: the export of a real sweep, parsed by a JUnit parser and validated
    against the JUnit schema (tests/data/junit.xsd): one case per model, unique names, the FAIL
    rows as failures with their signature."""
    import junitparser
    import xmlschema

    data, before = porting_loop["data"], porting_loop["before"]
    out = data.parent / "before.xml"  # beside the data folder: nothing written into it
    out.write_text(cli(["export", before, "--format", "junit"], BEFORE, data).stdout)
    xmlschema.XMLSchema(str(REPO / "tests" / "data" / "junit.xsd")).validate(str(out))
    (suite,) = list(junitparser.JUnitXml.fromfile(str(out)))
    records = porting_loop["records"][before]
    cases = {case.name: case for case in suite}
    assert len(cases) == suite.tests == len(records)  # one case per model, names unique
    failed = {
        name
        for name, case in cases.items()
        if any(isinstance(r, junitparser.Failure) for r in case.result)
    }
    assert failed == {
        f"{r['model_id']} [{r['variant']}]" for r in records.values() if r["status"] != "PASS"
    }
    rsqrt = cases["local:tiny-llama [eager+dynamic]"].result[0]
    assert (
        rsqrt.type == records["tiny-llama"]["failure_signature"]
        and "FAIL(gen) at generate" in rsqrt.message
    )
    assert suite.failures == len(failed) and all(
        case.is_passed for n, case in cases.items() if n not in failed
    )


def test_debug_names_the_first_module_whose_forward_hits_the_missing_operator(porting_loop):
    from model_support import debug

    cli(["debug", porting_loop["before"], "tiny-llama"], BEFORE, porting_loop["data"])
    from model_support.record import store

    (path,) = (store.sweep_dir(porting_loop["data"], porting_loop["before"]) / "debug").glob(
        "*tiny-llama*.ipynb"
    )
    result = debug.debug_result_from_notebook(path)
    failure = result["forward_failure"]
    assert result["device_type"] == "pretend" and not result["forward_ok"]
    assert (failure["module"], failure["error_type"]) == (
        "model.layers.0.input_layernorm",
        "NotImplementedError",
    )
    assert "aten::rsqrt" in failure["error_message"]


def test_the_repro_script_reproduces_the_failure_on_the_device(
    porting_loop, tmp_path, fixture_models
):
    record = porting_loop["records"][porting_loop["before"]]["tiny-llama"]
    script = tmp_path / "repro.py"
    script.write_text(record["repro_script"])
    folder = fixture_models["tiny-llama"]["path"]
    done = subprocess.run(
        [sys.executable, str(script), folder],
        capture_output=True,
        text=True,
        env=pretend_env(BEFORE),
        timeout=600,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert (out["status"], out["failure_stage"], out["error_type"]) == (
        "FAIL(gen)",
        "generate",
        "NotImplementedError",
    )
    assert out["error_message"] == record["error_message"]
    # the script carries the backend's configuration as the probe ran (device_config): on the fixed
    # stack's environment it sets the sweep's faults again, says so, and reproduces the failure
    again = subprocess.run(
        [sys.executable, str(script), folder],
        capture_output=True,
        text=True,
        env=pretend_env(AFTER),
        timeout=600,
    )
    # said on stdout, where a user reads the run (issue 54: it was on stderr only), with the flag
    # that runs as found
    assert again.returncode == 1 and "setting MODEL_SUPPORT_PRETEND=" in again.stdout, again.stderr[
        -3000:
    ]
    assert "--stack-as-found" in again.stdout
    assert json.loads(again.stdout.strip().splitlines()[-1])["status"] == "FAIL(gen)"
    fixed = subprocess.run(
        [sys.executable, str(script), folder],
        capture_output=True,
        text=True,
        env={**pretend_env(AFTER), "MODEL_SUPPORT_REPRO_KEEP_CONFIG": "1"},
        timeout=600,
    )
    # on the fixed stack it passes, with the CPU's tokens
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert (
        json.loads(fixed.stdout.strip().splitlines()[-1])["output_token_ids"]
        == (porting_loop["records"][porting_loop["after"]]["tiny-llama"]["output_token_ids"])
    )


# --- several devices
# -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_model_bigger_than_one_device_runs_sharded_over_two(tmp_path, fixture_models):
    """``devices: auto`` plans with the pretend device's memory (the runner asks the adapter, in
    a child process): sharded-llama needs 2 devices of its size; its probe holds both
    (schedule.jsonl) and runs one rank per device, tensor parallel, collectives through the
    device's process group (gloo underneath)."""
    from fixtures.sharded_fixtures import DEVICE_MEMORY_GB
    from model_support.record import store

    data = tmp_path / "data"
    definition = tmp_path / "sharded.yaml"
    import yaml

    definition.write_text(
        yaml.safe_dump(
            {
                "name": "sharded",
                "probe": {
                    "device": "pretend",
                    "devices": "auto",
                    "reference": "none",
                    "perf": False,
                },
                "workers": 2,
                "models": [fixture_models["sharded-llama"]["path"]],
            }
        )
    )
    cli(
        ["sweep", str(definition), "--no-report"],
        {"devices": 2, "memory_gb": DEVICE_MEMORY_GB},
        data,
    )
    (sweep,) = store.list_sweeps(data)
    (record,) = stored_records(data, sweep)
    assert (record["status"], record["devices_used"], record["parallelism"]) == ("PASS", 2, "tp"), (
        record["error_type"],
        record["error_message"],
        record["traceback"],
    )
    assert (
        record["device_type"] == "pretend"
        and record["device_mem_source"] == "torch.pretend.max_memory_allocated"
    )
    (grant,) = [
        json.loads(x)
        for x in (store.sweep_dir(data, sweep) / "schedule.jsonl").read_text().splitlines()
    ]
    assert grant["devices"] == [0, 1]
    # its repro script runs the same ranks on the device (it ran them on the CPU, where a stack's
    # fault never shows)
    script = tmp_path / "repro.py"
    script.write_text(record["repro_script"])
    folder = fixture_models["sharded-llama"]["path"]
    config = {"devices": 2, "memory_gb": DEVICE_MEMORY_GB}
    for faults, expect in (({}, "PASS"), ({"missing_ops": ["aten::rsqrt"]}, "FAIL(gen)")):
        done = subprocess.run(
            [sys.executable, str(script), folder],
            capture_output=True,
            text=True,
            # this stack's faults
            env=pretend_env({**config, **faults}, MODEL_SUPPORT_REPRO_KEEP_CONFIG="1"),
            timeout=600,
        )
        out = json.loads(done.stdout.strip().splitlines()[-1])
        assert out["status"] == expect, (done.stderr[-3000:], out)
        if expect == "PASS":
            assert out["output_token_ids"] == record["output_token_ids"]
        else:
            assert (
                "Could not run 'aten::rsqrt'" in out["error_message"]
                and "'pretend' backend" in out["error_message"]
            )


def test_bisect_names_the_backend_setting_that_changed_a_verdict(porting_loop):
    """The two sweeps run the same packages and differ only in MODEL_SUPPORT_PRETEND: the bisect
    could not see it ("no package version differs"); it now names the setting, having run B's
    packages with A's setting."""
    data, before, after = porting_loop["data"], porting_loop["before"], porting_loop["after"]
    done = cli(["bisect", before, after, "--model", "tiny-llama", "--json"], AFTER, data)
    assert done.returncode == 0, done.stderr[-3000:]
    (answer,) = json.loads(done.stdout)
    assert answer["status"] == "a backend setting", answer
    assert [s["name"] for s in answer["setting"]] == ["MODEL_SUPPORT_PRETEND"]
    assert (
        "aten::rsqrt" in answer["setting"][0]["before"]
        and "aten::rsqrt" not in answer["setting"][0]["after"]
    )
    assert [(s["step"], s["verdict"]) for s in answer["steps"]] == [
        ("end B", "PASS"),
        ("end A", "FAIL(gen)"),
        ("A's settings", "FAIL(gen)"),
    ]
