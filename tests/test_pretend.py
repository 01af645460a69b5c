"""The pretend accelerator (``model_support.testing.pretend``): a PrivateUse1 backend written in Python with
a stack's faults on demand, and the accelerator path of the project run on it (docs/devices.md).

The backend's own behaviour is checked in child processes (registering a device renames PrivateUse1 for
the life of a process, which the test process must not do); the probe, sweeps, debug and repro scripts
run for real on it, as they would on a TPU."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from model_support.testing.pretend import CONFIG_VAR, VISIBLE_VAR, PretendConfigError, parse

REPO = Path(__file__).resolve().parents[1]
TINY = "data/models/tiny-llama"


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


# --- the configuration -------------------------------------------------------------------------------


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
        ('{"devices": 2}', "0,2", "PRETEND_VISIBLE_DEVICES='0,2' must list distinct device ids below 2"),
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
        '{"devices": 4, "memory_gb": 0.5, "missing_ops": ["aten::rsqrt"], "slow_ops": {"aten::mm": 2}}', "3,1"
    )
    assert config.visible == (3, 1) and config.memory_bytes == 500_000_000
    assert config.missing_ops == frozenset({"aten::rsqrt"}) and config.slow_ops == {"aten::mm": 2.0}
    assert parse("", None).visible == (0,) and parse("{}", None).memory_bytes is None


# --- the backend, in a child process ------------------------------------------------------------------

BACKEND_CHECKS = """
    import json, time
    import torch
    from model_support.probe import devices, probe_core
    from model_support.testing.pretend import tensor

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
    tensor.time.sleep = slept.append  # the slow operator's delay, recorded rather than waited for
    (x - x).cpu()
    out["slept"] = slept
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
        "slow_ops": {"aten::sub.Tensor": 2.5},
    }
    out = child_json(BACKEND_CHECKS, config, **{VISIBLE_VAR: "2,3"})
    assert (out["accelerator"], out["count"], out["physical"]) == ("pretend", 2, [2, 3])
    assert "is not a DeviceAllocator" in out["max_memory_allocated"]  # as torch_tpu's allocator is not either
    assert out["synchronize"] != "answered"
    assert (out["type"], out["device"], out["roundtrip"]) == ("PretendTensor", "pretend:0", True)
    assert out["tolist"] == [12.0, 15.0, 18.0, 21.0]
    assert out["after_ones"] - out["allocated"] == 4000 and out["after_del"] == out["allocated"]
    assert out["peak"] >= out["after_ones"]
    assert out["peak_mb"] == out["peak"] / 2**20 and out["source"] == "torch.pretend.max_memory_allocated"
    name, message, classified = out["oom"]
    assert name == "OutOfMemoryError" and classified
    assert message.startswith("pretend out of memory. Tried to allocate 3.81 MiB. Device 0 has a total capacity of")
    assert out["missing"].startswith("Could not run 'aten::rsqrt' with arguments from the 'pretend' backend.")
    assert out["add_ok"] and out["float32_ok"]
    assert out["dtype"].startswith("Cannot convert a pretend Tensor to float64 dtype")
    right = [[float(4 * r + c) for c in range(4)] for r in range(3)]
    assert out["wrong"] == [[-v for v in reversed(row)] for row in right]  # wrong, and the same wrong every time
    assert out["wrong_again"] == out["wrong"]
    assert out["slept"] == [2.5]
    assert out["two_devices"] == (
        "Expected all tensors to be on the same device, but found at least two devices, pretend:0 and pretend:1!"
    )
    assert (out["rank_device"], out["current"]) == ("pretend:1", 1)
    assert (out["compile_backend"], out["distributed"]) == ("aot_eager", "cpu:gloo,pretend:pretend")


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
        "Device 'pretend' was requested but the pretend accelerator is off here: set MODEL_SUPPORT_PRETEND"
    )
    typo = child_json(code, {"missing_ops": ["aten::rsqrtt"]})
    assert typo.startswith("Device 'pretend' was requested but its backend failed to load: PretendConfigError:")
    assert "missing_ops names 'aten::rsqrtt', which is no operator torch knows" in typo


def test_torch_autoloads_it_through_its_entry_point_as_it_does_torch_tpu():
    """With torch's own autoload on (its default), ``import torch`` alone registers the device."""
    out = child_json(
        "import json, torch; print(json.dumps(str(torch.accelerator.current_accelerator())))",
        {"devices": 1},
        TORCH_DEVICE_BACKEND_AUTOLOAD="1",
        PYTHONWARNINGS="ignore",
    )
    assert out == "pretend"


def test_nothing_in_src_outside_the_testing_room_knows_the_name():
    """The accelerator path is generic: the pretend device is found like any other backend, by its name."""
    src = REPO / "src" / "model_support"
    testing = src / "testing"
    knowing = [
        str(path.relative_to(REPO))
        for path in src.rglob("*")
        if path.is_file()
        and testing not in path.parents
        and "__pycache__" not in path.parts
        and "pretend" in path.read_text(errors="ignore").lower()
    ]
    assert knowing == []
