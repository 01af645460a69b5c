"""The tpu adapter conforms to the installed torch_tpu 0.2.0, checked without a chip: each
assumption the adapter makes about torch_tpu is a test against the package itself (its entry point,
its hardware module's functions and tables, ``set_tpu_launch_env``'s output, the process groups it
registers, the variables its binary reads), so a release that changes one fails a named test here
rather than a sweep on a TPU VM.

Where a chip would be needed, torch_tpu's own code runs on a faked PCI bus: its hardware module's
scan (``_scan_pci_tpus``) and name (``get_tpu_device_name``) are replaced, every other function and
table is the package's. What only a chip can confirm is listed in docs/devices.md and checked by
``bench/device_check_tpu.sh``.

The checks that need torch_tpu imported (~4-8 s) run in one child process for the whole module
(``package``).
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from model_support.probe import devices
from model_support.probe.devices import tpu
from model_support.probe.devices.tpu import TpuAdapter

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    not tpu.torch_tpu_installed(), reason="the torch_tpu wheel is not installed here"
)

#: PCI device ids of torch_tpu 0.2.0's hardware module, by generation.
V4, V5E, V6E, V7 = "0x005e", "0x0063", "0x006f", "0x0076"

CHILD = r"""
import importlib, json, os, sys
import torch, torch_tpu
import torch.distributed as dist
from torch.distributed.distributed_c10d import BackendConfig
from torch_tpu import _loader
from torch_tpu._internal.utils import hardware
from model_support.probe.devices import tpu
from model_support.probe.sharded.launch import launch_environment

out = {"chips_here": hardware.get_tpu_device_count(), "adapter_sees_hardware": tpu.tpu_hardware_visible()}
out["same_hardware_module"] = tpu.torch_tpu_hardware() is hardware
_loader.load()  # torch's entry point for 'tpu', on this host without a chip
out["device_after_load_without_chips"] = torch._C._get_privateuse1_backend_name()

# a v4 host with 8 chips, on a faked PCI bus: everything else is torch_tpu's
hardware._scan_pci_tpus = lambda: (8, hardware._TOPOLOGY_BY_TPU_PCI_DEVICE_ID["0x005e"])
hardware.get_tpu_device_name = lambda: "TPU v4"
adapter = tpu.TpuAdapter()
out["launch"] = {n: launch_environment("tpu", n) for n in (1, 2, 4, 8)}
out["left_in_environ"] = sorted(n for n in tpu.LAUNCH_VARS if n in os.environ)
os.environ["TORCH_TPU_TOPOLOGY"] = "4,1,1"  # set by an operator: torch_tpu keeps it, and so does the adapter
tpu._LAUNCHED.clear()
out["preset_kept"] = adapter.launch_env(4)["TORCH_TPU_TOPOLOGY"]
out["preset_restored"] = os.environ.pop("TORCH_TPU_TOPOLOGY")
tpu._LAUNCHED.clear()
try:
    adapter.launch_env(3)
    out["refused_3"] = None
except ValueError as exc:
    out["refused_3"] = str(exc)
public = torch.tpu.distributed.set_tpu_launch_env
out["public_launch_is_the_adapters"] = public is importlib.import_module(tpu.LAUNCH_MODULE).set_tpu_launch_env

_loader.load()  # now with chips: torch_tpu registers its device and its process groups (lazily: no runtime starts)
out["device_after_load_with_chips"] = torch._C._get_privateuse1_backend_name()
out["backend_for_tpu_devices"] = dist.Backend.default_device_backend_map.get("tpu")
out["tpu_dist_devices"] = dist.Backend.backend_capability.get("tpu_dist")
out["adapter_group"] = BackendConfig(dist.Backend(adapter.distributed_backend())).get_device_backend_map()
out["tpu_dist_alone"] = BackendConfig(dist.Backend("tpu_dist")).get_device_backend_map()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def package() -> dict:
    """What torch_tpu, imported in a child process, answers (``CHILD``)."""
    env = {
        **os.environ,
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
        "PYTHONWARNINGS": "ignore",
        "TPU_SKIP_MDS_QUERY": "1",  # libtpu would otherwise retry the cloud's metadata server
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    for name in (*tpu.PLACE_VARS, "WORLD_SIZE", "LOCAL_RANK", "RANK"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def host(monkeypatch):
    """``host(pci_id, chips)``: this host as torch_tpu's hardware module would find it with
    ``chips`` chips of the generation whose PCI device id is ``pci_id`` (None: none at all); the
    module's own functions and tables answer."""
    hardware = tpu.torch_tpu_hardware()

    def fake(pci_id: str | None, chips: int = 8):
        table = hardware._TOPOLOGY_BY_TPU_PCI_DEVICE_ID.get(pci_id) if pci_id else None
        name = hardware._PCI_DEVICE_ID_TO_NAME.get(pci_id, "TPU") if pci_id else "TPU"
        monkeypatch.setattr(hardware, "_scan_pci_tpus", lambda: (chips if table else 0, table))
        monkeypatch.setattr(hardware, "get_tpu_device_name", lambda: name)
        for var in (*tpu.PLACE_VARS, "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(var, raising=False)
        return hardware

    return fake


def _glue_library(also_env: bool = False) -> bytes:
    """torch_tpu's compiled glue for the installed torch (``csrc/common/glue_<X_Y_0>``), read as
    bytes; with ``also_env``, its environment module's too (``_internal/env_<X_Y_0>.so``, what
    its Python reads through)."""
    major, minor = importlib.metadata.version("torch").split(".")[:2]
    spec = importlib.util.find_spec("torch_tpu")
    assert spec is not None and spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations)))
    (found,) = glob.glob(
        str(root / "csrc" / "common" / f"glue_{major}_{minor}_0" / "libpywrap_*_common.so")
    )
    binary = Path(found).read_bytes()
    return (
        binary + (root / "_internal" / f"env_{major}_{minor}_0.so").read_bytes()
        if also_env
        else binary
    )


# --- the entry point and the chips
# ------------------------------------------------------------------------------


def test_its_entry_point_registers_tpu_only_where_its_hardware_module_finds_chips(package):
    """The adapter loads torch_tpu through its ``torch.backends`` entry point (``_loader:load``),
    which registers ``tpu`` only when its hardware module counts chips: so the adapter asks that
    module whether a TPU is here."""
    found = [
        e.value
        for e in importlib.metadata.entry_points(group="torch.backends")
        if e.name == "torch_tpu"
    ]
    assert found == ["torch_tpu._loader:load"]
    assert package["chips_here"] == 0 and package["adapter_sees_hardware"] is False
    assert package["same_hardware_module"], (
        "the adapter must ask the hardware module torch_tpu itself uses"
    )
    assert package["device_after_load_without_chips"] == "privateuseone"
    assert package["device_after_load_with_chips"] == "tpu"


def test_chips_are_googles_pci_devices_bound_to_vfio_not_any_dev_accel(host, monkeypatch):
    """Chip detection is torch_tpu's (``get_tpu_device_count``: Google PCI devices bound to
    VFIO): a /dev/accel* of another driver is no TPU, and a host where torch_tpu counts chips is
    one."""
    hardware = host(None)
    monkeypatch.setattr(
        glob, "glob", lambda pattern, **kw: ["/dev/accel0"] if "accel" in pattern else []
    )
    assert hardware._GOOGLE_PCI_VENDOR_ID == "0x1ae0"
    assert not tpu.tpu_hardware_visible() and not TpuAdapter().hardware_visible()
    host(V5E, 4)
    assert tpu.tpu_hardware_visible() and TpuAdapter().hardware_visible()
    assert tpu.tpu_generation() == "TPU v5e"


def test_the_device_count_is_the_probes_chips_not_the_hosts(host, monkeypatch):
    """``device_count`` (recorded, and what ``devices: auto`` plans with) is the chips granted to
    the probe, one in a sharded run's rank; the whole host's, as torch_tpu counts them, only
    where nothing pins the process."""
    host(V6E, 8)
    adapter = TpuAdapter()
    assert adapter.device_count() == adapter.devices_present() == 8
    monkeypatch.setenv("TPU_VISIBLE_DEVICES", "4,5,6,7")
    assert adapter.device_count() == 4
    monkeypatch.setenv("TPU_VISIBLE_DEVICES", "5")
    assert adapter.device_count() == 1
    monkeypatch.delenv("TPU_VISIBLE_DEVICES")
    monkeypatch.setenv("TPU_VISIBLE_CHIPS", "2,3")  # what Ray sets for a task given 2 TPUs
    assert adapter.device_count() == 2


def test_chip_shapes_are_torch_tpus_own_tables(host):
    """Every slice shape is torch_tpu's (``get_tpu_topology``): no 2-chip slice on v5e and v6e,
    "2,2,2" for 8 chips of a v4 or v5p, v7's shapes with its 2 devices per chip; the adapter
    refuses what torch_tpu has no shape for."""
    hardware = host(V4)
    for pci_id, table in hardware._TOPOLOGY_BY_TPU_PCI_DEVICE_ID.items():
        host(pci_id)
        for chips in (1, 2, 3, 4, 8):
            if chips in table:
                assert tpu.chip_shape(chips) == table[chips]
            else:
                with pytest.raises(ValueError, match=f"no slice of {chips} chips"):
                    tpu.chip_shape(chips)
    host(V4)
    assert tpu.chip_shape(8) == "2,2,2"
    host(V7)
    assert tpu.chip_shape(2) == "1,1,1,2" and hardware.get_devices_per_chip() == 2
    for generation in (V5E, V6E):
        host(generation)
        with pytest.raises(ValueError, match="no slice of 2 chips"):
            TpuAdapter().pinning_env((0, 1))
        assert TpuAdapter().pinning_env((4, 5, 6, 7)) == {"TPU_VISIBLE_DEVICES": "4,5,6,7"}
    host(None)  # no TPU here: any count some generation has, its shape unknown
    assert tpu.chip_shape(2) is None
    with pytest.raises(ValueError, match="on any TPU it knows"):
        tpu.chip_shape(3)


def test_memory_is_torch_tpus_table_and_an_unknown_generation_has_none(host):
    """HBM per device is torch_tpu's table for the generation (v7: its 192 GiB chip over 2
    devices); a generation it does not know gets no number, with the reason, never a guessed 16
    GiB."""
    host(V5E)
    assert TpuAdapter().device_memory_bytes() == 16 * 2**30
    host(V7)
    assert TpuAdapter().device_memory_bytes() == 96 * 2**30
    assert TpuAdapter().device_name() == "TPU v7"
    host(None)
    with pytest.raises(devices.DeviceUnavailable, match="knows no HBM size for this TPU"):
        TpuAdapter().device_memory_bytes()
    from model_support.probe.devices.resolve import DeviceFacts

    # what the runner records: null, the probe the reason
    assert DeviceFacts("tpu", 1, None).memory_bytes is None


# --- one chip per process, and the launch environment of a sharded run
# ----------------------------------------------


def test_one_chip_per_process_is_named_by_tpu_visible_devices(host):
    """torch_tpu opens one chip per process, the one ``TPU_VISIBLE_DEVICES`` names (its binary
    reads it, and its collision message tells each process to set it): a probe is pinned with it,
    and each rank of a sharded probe is given its own chip of the grant with it (in a rank its
    runtime reads it before falling back to chip LOCAL_RANK, which for a probe granted chips 4-7
    would be chips 0-3)."""
    glue = _glue_library()
    assert b"TPU_VISIBLE_DEVICES\0" in glue and b"kTpuVisibleDevicesEnvVar" in glue
    assert (
        b"each process must be allocated a distinct device. Please set the $0 environment variable"
        in glue
    )
    host(V6E)
    adapter = TpuAdapter()
    assert adapter.visible_var == tpu.CHIP_VAR == "TPU_VISIBLE_DEVICES"
    assert adapter.pinning_env((3,))["TPU_VISIBLE_DEVICES"] == "3"
    launch = {"TORCH_TPU_SLICEBUILDER_ADDRESSES": "localhost:1,localhost:2,localhost:3,localhost:4"}
    launch["TORCH_TPU_TOPOLOGY"] = "2,2,1"
    granted = {**adapter.pinning_env((4, 5, 6, 7)), **launch}
    ranks = [adapter.rank_env(rank, 4, granted) for rank in range(4)]
    assert [env["TPU_VISIBLE_DEVICES"] for env in ranks] == ["4", "5", "6", "7"]
    assert all(env["TORCH_TPU_TOPOLOGY"] == "2,2,1" for env in ranks)


def test_a_rank_gets_the_launch_environment_torch_tpus_runtime_requires(package):
    """With WORLD_SIZE set (the elastic launch sets it in every rank) torch_tpu's runtime takes
    its distributed path, which requires ``LAUNCH_REQUIRED`` ("missing required environment
    variables for distributed training"); the launcher's parent sets them with torch_tpu's own
    ``set_tpu_launch_env`` (``sharded.launch.launch_environment``): one address per rank, the
    slice shape from its table, nothing left in the probe's own environment."""
    glue = _glue_library()
    assert b"missing required environment variables for distributed training: " in glue
    for name in (*tpu.LAUNCH_REQUIRED, "WORLD_SIZE", "LOCAL_RANK"):
        assert name.encode() + b"\0" in glue, name
    # torch_tpu's v4 table, the faked host's
    shapes = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,2,2"}
    for ranks, launch in package["launch"].items():
        assert set(tpu.LAUNCH_REQUIRED) <= set(launch) <= set(tpu.LAUNCH_VARS)
        assert len(launch["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")) == int(ranks)
        assert launch["TORCH_TPU_TOPOLOGY"] == shapes[int(ranks)]
    assert package["left_in_environ"] == []
    assert package["preset_kept"] == "4,1,1" and package["preset_restored"] == "4,1,1"
    assert "no slice of 3 chips" in package["refused_3"]
    assert package["public_launch_is_the_adapters"], (
        "torch.tpu.distributed.set_tpu_launch_env moved"
    )


def test_the_variables_its_binary_reads_are_the_ones_the_adapter_sets():
    """Each variable the adapter sets for a probe or a rank (``PLACE_VARS``) is one torch_tpu's
    binaries read or write (its glue, or its environment module for what its Python reads: the
    profiling session); a release that drops one fails here."""
    glue = _glue_library(also_env=True)
    missing = [name for name in tpu.PLACE_VARS if name.encode() + b"\0" not in glue]
    assert missing == []


def test_tpu_dist_is_for_tpu_tensors_only_so_the_group_pairs_it_with_gloo(package):
    """torch_tpu registers ``tpu_dist`` (alias ``tpu``) for ``tpu`` devices only: alone, a run's
    CPU tensors have no backend; the adapter's process group gives them gloo."""
    assert package["backend_for_tpu_devices"] == "tpu_dist" and package["tpu_dist_devices"] == [
        "tpu"
    ]
    assert package["tpu_dist_alone"] == {"tpu": "tpu_dist"}
    assert package["adapter_group"] == {"cpu": "gloo", "tpu": "tpu_dist"}
    assert TpuAdapter().distributed_backend() == "cpu:gloo,tpu:tpu_dist"


# --- the prepared check for a TPU host
# -----------------------------------------------------------------------------


def test_the_tpu_device_check_parses_and_refuses_clearly_without_a_chip():
    """``bench/device_check_tpu.sh`` cannot run here: it parses, and says "no TPU here" (exit
    status 2) at once."""
    script = REPO / "bench" / "device_check_tpu.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    if tpu.tpu_hardware_visible():
        pytest.skip("this host has a TPU: the check would run")
    done = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 2 and done.stderr.startswith("no TPU here: "), (
        done.returncode,
        done.stderr[-1000:],
    )
    assert "Traceback" not in done.stderr
