"""Keep the real names honest: every torch_tpu name the tpu adapter and the probe use exists in
the torch_tpu 0.2.0 wheel installed from the package index (a dev dependency; no chip is needed
to import it), so an API rename fails this test rather than a sweep on a TPU VM. Skipped only
where the wheel could not be installed. What the adapter assumes they do is checked against the
package, without a chip, by tests/test_torch_tpu_conformance.py; what they do on a chip (the
cache counters, the fused mode, the tpu_dist process group's collectives) only a TPU host can
confirm: see docs/devices.md and bench/device_check_tpu.sh."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from model_support.probe import probe_backend

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "model_support"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch_tpu") is None,
    reason="the torch_tpu wheel is not installed here",
)

#: ``torch.tpu.<name>`` written out, and ``getattr(torch.tpu, "<name>")`` / ``getattr(tpu,
#: "<name>")``.
_DOTTED = re.compile(r"\btorch\.tpu\.([A-Za-z_][\w.]*[A-Za-z0-9_])")
_GETATTR = re.compile(r"getattr\((?:torch\.)?tpu, \"(\w+)\"")
#: The generic adapter's calls: ``self.ask("<name>")`` on torch.accelerator, else on torch.<device>.
_ASKED = re.compile(r"\bask\(\"(\w+)\"")
#: What the tpu adapter asks of torch_tpu's hardware module (``hardware.<name>``,
#: ``torch_tpu_hardware().<name>``) and of its distributed module (``distributed.<name>``).
_HARDWARE = re.compile(r"\b(?:hardware|torch_tpu_hardware\(\))\.([A-Za-z_][\w.]*\w)")
_LAUNCH = re.compile(r"\bdistributed\.([A-Za-z_]\w*)\(")
TPU_ADAPTER = SRC / "probe" / "devices" / "tpu.py"


def _names(pattern: re.Pattern, paths) -> set[str]:
    found = set()
    for path in paths:
        found.update(pattern.findall(path.read_text()))
    return found


def names_used() -> dict[str, list[str]]:
    """What the package's source asks of torch_tpu, found in the source itself (so a new call is
    checked without anyone listing it here)."""
    sources = list(SRC.rglob("*.py"))
    tpu = _names(_DOTTED, sources) | _names(_GETATTR, sources)
    asked = _names(_ASKED, [SRC / "probe" / "devices" / "accelerator.py"])
    hardware = _names(_HARDWARE, [TPU_ADAPTER])
    launch = _names(_LAUNCH, [TPU_ADAPTER])
    return {
        "tpu": sorted(tpu),
        "asked": sorted(asked),
        "hardware": sorted(hardware),
        "launch": sorted(launch),
    }


CHECK = """
import json, sys
import torch, torch_tpu
import torch_tpu._internal.compile  # registers torch.compile's "tpu" backend (the loader imports it on a TPU)
import torch._dynamo
import inspect
names = json.loads(sys.argv[1])

def resolve(owner, dotted):
    for part in dotted.split("."):
        owner = getattr(owner, part)
    return owner

out = {"missing": [], "asked": {}}
for dotted in names["tpu"]:
    try:
        resolve(torch.tpu, dotted)
    except AttributeError:
        out["missing"].append(dotted)
for name in names["asked"]:
    out["asked"][name] = [w for w, o in (("torch.accelerator", torch.accelerator), ("torch.tpu", torch.tpu)) if hasattr(o, name)]
import importlib
from model_support.probe.devices import tpu as adapter
for key, module in (("hardware", adapter.HARDWARE_MODULE), ("launch", adapter.LAUNCH_MODULE)):
    owner = importlib.import_module(module)
    for dotted in names[key]:
        try:
            resolve(owner, dotted)
        except AttributeError:
            out["missing"].append(f"{module}.{dotted}")
out["compile_backends"] = "tpu" in torch._dynamo.list_backends(exclude_tags=())
out["tpu_dist"] = '"tpu_dist"' in inspect.getsource(torch_tpu._loader)
print(json.dumps(out))
"""


def test_every_torch_tpu_name_the_adapter_and_the_probe_use_exists_in_the_wheel():
    used = names_used()
    assert {"_get_cache_hits", "set_eager_mode", "EagerMode.DEFER_AND_FUSE"} <= set(used["tpu"])
    assert {"get_tpu_topology", "get_hbm_bytes_per_device", "get_tpu_device_count"} <= set(
        used["hardware"]
    )
    assert used["launch"] == ["set_tpu_launch_env"]
    env = {
        **os.environ,
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
        "PYTHONWARNINGS": "ignore",
        "TPU_SKIP_MDS_QUERY": "1",
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    done = subprocess.run(
        [sys.executable, "-c", CHECK, json.dumps(used)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["missing"] == [], f"torch_tpu lacks {out['missing']}"
    unanswered = [name for name, owners in out["asked"].items() if not owners]
    assert unanswered == [], f"neither torch.accelerator nor torch.tpu has {unanswered}"
    assert out["compile_backends"], "torch.compile has no 'tpu' backend once torch_tpu is imported"
    assert out["tpu_dist"], "torch_tpu's loader no longer registers the 'tpu_dist' process group"


def test_the_tpu_backend_loads_through_its_torch_backends_entry_point():
    """The tpu adapter loads torch_tpu as torch's autoload does (``probe_backend.load_backend``):
    through the ``torch.backends`` entry point that provides device 'tpu'."""
    found = [
        e
        for e in entry_points(group=probe_backend.BACKENDS_GROUP)
        if probe_backend.backend_device(e.name) == "tpu"
    ]
    assert [e.value for e in found] == ["torch_tpu._loader:load"]
    # its submodule's spec would import the package (and libtpu's setup)
    spec = importlib.util.find_spec("torch_tpu")
    assert spec is not None and spec.submodule_search_locations
    assert (Path(next(iter(spec.submodule_search_locations))) / "_loader.py").is_file()
