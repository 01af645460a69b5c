"""The prepared check for the first TPU host (``bench/device_check_tpu.sh``): what only a chip can say about the tpu
adapter. Everything else about torch_tpu 0.2.0 is checked against the installed package, without a chip, by
``tests/test_torch_tpu_conformance.py`` (docs/devices.md, "The TPU: what is verified where").

Nothing is downloaded (the tiny fixtures are built here, offline). Each step prints what it verified (``ok``) and
what it found otherwise (``NO``), and is guarded: a step that fails is recorded with its error and the next runs;
a step that would start past ``--budget-s`` is skipped and says so.

1. chips: torch_tpu's count, generation, slice shapes and HBM table (as the adapter reads them, from the PCI bus),
   against what the loaded runtime says (torch.accelerator's count, ``torch.tpu.get_device_name``);
2. pinning: two processes pinned to chips 0 and 1 by the adapter's ``pinning_env`` both run at once (one chip per
   process), and a third pinned to a chip the first holds is refused, naming ``TPU_VISIBLE_DEVICES``;
3. a probe (papermill, tiny-llama, eager) on one pinned chip: its verdict, device count, name and peak memory;
4. a sharded probe over 2 chips (or the smallest slice torch_tpu has above 1) granted at the end of the host, while
   another process holds chip 0: each rank opens the chip it was granted (a rank opening chip LOCAL_RANK would
   collide), with the launch environment torch_tpu's ``set_tpu_launch_env`` set up, and ``cpu:gloo,tpu:tpu_dist``;
5. memory: the adapter's HBM per device (torch_tpu's table) against ``get_device_properties`` and
   ``torch.accelerator.get_memory_info``; whether ``torch.accelerator.max_memory_allocated`` answers;
6. compile mode (``torch.compile(backend="tpu")``) with the recompile check on: compile time, graphs, matches eager,
   the recompiles per prompt length, and the compilation cache's hits and misses, then again in a fresh process
   with the same tier-2 cache folder (does a second process hit it?).

Results: ``<out>/device_check_tpu.json``. Exit status 0 when every step verified what it checks, 1 otherwise, 2 with
"no TPU here" on a host where torch_tpu finds no chip (nothing else runs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# this checkout's package, the offline fixture builders
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# libtpu would retry the cloud metadata server for minutes
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

NO_TPU_STATUS = 2
MODEL = "tiny-llama"

#: A child that loads torch_tpu as the probe does, runs one operation on its chip and says what it
#: saw: the runtime's own view of the chip variables (read from the C environment, where the runtime
#: writes them), torch's count.
CHIP_CHILD = r"""
import ctypes, json, os, sys, time
from model_support.probe.devices import load_backend
load_backend("tpu")
import torch
x = torch.ones(1024, device="tpu")
total = float((x * 2).sum().item())
getenv = ctypes.CDLL(None).getenv
getenv.restype = ctypes.c_char_p
seen = {n: (getenv(n.encode()) or b"").decode() or None for n in ("TPU_VISIBLE_DEVICES", "TPU_VISIBLE_CHIPS")}
print(json.dumps({"sum": total, "count": torch.accelerator.device_count(), "runtime_env": seen}), flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""

MEMORY_CHILD = r"""
import json
from model_support.probe import devices
adapter = devices.resolve("tpu")
import torch
out = {"table_bytes": adapter.device_memory_bytes()}
for name, call in (("properties_bytes", lambda: torch.tpu.get_device_properties().total_memory),
                   ("memory_info", lambda: list(torch.accelerator.get_memory_info()))):
    try:
        out[name] = call()
    except Exception as exc:
        out[name] = f"{type(exc).__name__}: {exc}"
adapter.reset_peak_memory()
x = torch.ones(64 * 2**20, device="tpu")  # 256 MiB of float32
adapter.synchronize()
out["peak_mb"], out["peak_source"] = adapter.peak_memory_mb()
try:
    out["generic_peak_bytes"] = torch.accelerator.max_memory_allocated()
except Exception as exc:
    out["generic_peak_bytes"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out, default=str))
"""


class Check:
    """The results, step by step, within a time budget; each step returns what it found and the
    sentences it verified (``ok``) or did not (``no``)."""

    def __init__(self, budget_s: float):
        self.started, self.budget_s = time.time(), budget_s
        self.steps: dict[str, dict] = {}

    def step(self, name: str, estimate_s: float, fn, *args) -> dict:
        left = self.budget_s - (time.time() - self.started)
        if left < estimate_s:
            self.steps[name] = {
                "skipped": f"{left:.0f} s of the budget left, the step needs about {estimate_s:.0f} s"
            }
            print(f"== {name}: skipped ({self.steps[name]['skipped']})", flush=True)
            return self.steps[name]
        began = time.time()
        print(f"== {name}", flush=True)
        try:
            found = fn(*args)
        except Exception as exc:  # noqa: BLE001 a failed step is a result; the next step still runs
            found = {
                "no": [f"raised {type(exc).__name__}: {exc}"],
                "traceback": traceback.format_exc()[-2000:],
            }
        found["wall_s"] = round(time.time() - began, 1)
        for sentence in found.get("ok", []):
            print(f"  ok  {sentence}", flush=True)
        for sentence in found.get("no", []):
            print(f"  NO  {sentence}", flush=True)
        self.steps[name] = found
        return found


def _verdict(found: dict, claim: bool, sentence: str, otherwise: str | None = None) -> None:
    found.setdefault("ok" if claim else "no", []).append(
        sentence if claim else otherwise or f"not so: {sentence}"
    )


def env(extra: dict | None = None) -> dict:
    return {
        **os.environ,
        "PYTHONPATH": f"{REPO / 'src'}:{os.environ.get('PYTHONPATH', '')}",
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
        **(extra or {}),
    }


def pinned(chips: tuple[int, ...]) -> dict:
    from model_support.probe.devices import pinning_env

    return pinning_env("tpu", chips)


def chips(scratch: Path) -> dict:
    from model_support.probe.devices import adapter_for, tpu

    hardware = tpu.torch_tpu_hardware()
    adapter = adapter_for("tpu")
    found: dict = {
        "generation": tpu.tpu_generation(),
        "count": hardware.get_tpu_device_count(),
        "devices_per_chip": hardware.get_devices_per_chip(),
        "hbm_bytes_per_device": hardware.get_hbm_bytes_per_device(),
        "shapes": {},
    }
    for n in (1, 2, 4, 8):
        try:
            found["shapes"][n] = tpu.chip_shape(n)
        except ValueError as exc:
            found["shapes"][n] = f"none ({exc})"
    _verdict(
        found,
        found["count"] > 0,
        f"torch_tpu finds {found['count']} {found['generation']} chips bound to VFIO",
    )
    done = subprocess.run(
        [sys.executable, "-c", CHIP_CHILD], env=env(), capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        _verdict(
            found, False, "", f"an unpinned process could not run on the TPU: {done.stderr[-800:]}"
        )
        return found
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    found["unpinned_process"] = seen
    _verdict(
        found,
        seen["count"] == found["count"],
        "torch.accelerator.device_count() in an unpinned process is torch_tpu's count "
        f"({seen['count']})",
        f"torch.accelerator.device_count() says {seen['count']}, torch_tpu's hardware module "
        f"{found['count']}: the adapter counts chips with the latter (and a probe's grant)",
    )
    found["adapter_device_count_unpinned"] = adapter.device_count()
    return found


def pinning(scratch: Path) -> dict:
    found: dict = {}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHIP_CHILD, "20"],
            env=env(pinned((chip,))),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for chip in (0, 1)
    ]
    try:
        first = [p.stdout.readline() for p in procs]  # type: ignore[union-attr]  # piped
        seen = [json.loads(line) if line.strip() else None for line in first]
        found["pinned_processes"] = seen
        _verdict(
            found,
            all(s and s["count"] == 1 for s in seen),
            "two processes pinned to chips 0 and 1 (TPU_VISIBLE_DEVICES) run at once, each "
            "seeing one chip",
            f"the pinned processes said {seen} (stderr of the first: "
            f"{'' if procs[0].poll() is None else procs[0].stderr.read()[-800:]})",  # type: ignore[union-attr]
        )
        collide = subprocess.run(
            [sys.executable, "-c", CHIP_CHILD],
            env=env(pinned((0,))),
            capture_output=True,
            text=True,
            timeout=300,
        )
        found["collision_stderr"] = collide.stderr[-1500:]
        _verdict(
            found,
            collide.returncode != 0 and "TPU_VISIBLE_DEVICES" in collide.stderr,
            "a third process pinned to chip 0 while another holds it is refused, naming "
            "TPU_VISIBLE_DEVICES",
            f"a process pinned to a held chip ended with status {collide.returncode}, its "
            "stderr not naming TPU_VISIBLE_DEVICES",
        )
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return found


def papermill_probe(
    scratch: Path, name: str, chips_: tuple[int, ...], extra_env: dict | None = None, **params
):
    """``papermill notebooks/probe.ipynb out.ipynb -p model_id X -p device tpu``, pinned as the
    sweep pins it."""
    out, record_path = scratch / f"{name}.ipynb", scratch / f"{name}.json"
    model = str(REPO / "data" / "models" / MODEL)
    command = [
        sys.executable,
        "-m",
        "papermill",
        "notebooks/probe.ipynb",
        str(out),
        "-p",
        "model_id",
        model,
    ]
    for key, value in {
        "device": "tpu",
        "record_path": str(record_path),
        "judge": False,
        **params,
    }.items():
        command += ["-p", key, str(value)]
    done = subprocess.run(
        command,
        cwd=REPO,
        env=env({**pinned(chips_), **(extra_env or {})}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-1500:])
    return json.loads(record_path.read_text())


def probe(scratch: Path) -> dict:
    record = papermill_probe(scratch, "probe-eager", (0,))
    keys = (
        "status",
        "device_name",
        "device_count",
        "peak_device_mem_mb",
        "device_mem_source",
        "numerics",
        "error_message",
    )
    found = {k: record.get(k) for k in keys}
    _verdict(
        found,
        record["status"] == "PASS",
        f"tiny-llama passes eagerly on a chip ({record.get('numerics')})",
    )
    _verdict(found, record["device_count"] == 1, "the probe's device_count is its one pinned chip")
    _verdict(
        found,
        bool(record.get("peak_device_mem_mb")),
        f"peak device memory is measured ({record.get('peak_device_mem_mb')} MiB from "
        f"{record.get('device_mem_source')})",
        "no peak device memory: torch.accelerator.max_memory_allocated does not answer on a TPU",
    )
    return found


def sharded(scratch: Path) -> dict:
    from model_support.probe.devices import tpu

    count = tpu.torch_tpu_hardware().get_tpu_device_count()
    sizes = []
    for n in (2, 4, 8):
        try:
            tpu.chip_shape(n)
            sizes.append(n)
        except ValueError:
            continue
    found: dict = {"slice_sizes": sizes}
    size = next((n for n in sizes if n <= count), None)
    if size is None:
        _verdict(
            found, False, "", f"torch_tpu has no slice of 2, 4 or 8 chips on this {count}-chip host"
        )
        return found
    # the end of the host: not chips 0..size-1, which LOCAL_RANK would open
    block = tuple(range(count - size, count))
    found["granted"] = list(block)
    holder = None
    # another process holds chip 0 throughout: a rank opening chip LOCAL_RANK would collide
    if 0 not in block:
        holder = subprocess.Popen(
            [sys.executable, "-c", CHIP_CHILD, "600"],
            env=env(pinned((0,))),
            stdout=subprocess.PIPE,
            text=True,
        )
        holder.stdout.readline()  # type: ignore[union-attr]  # piped: it holds chip 0 from here
    try:
        record = papermill_probe(scratch, "probe-sharded", block, devices=size, reference="none")
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
    keys = (
        "status",
        "devices_used",
        "parallelism",
        "tp_size",
        "ranks_agree",
        "rank_errors",
        "error_message",
    )
    found.update({k: record.get(k) for k in keys})
    _verdict(
        found,
        record["status"] == "PASS" and record["devices_used"] == size,
        f"a {size}-rank tensor-parallel probe on chips {list(block)} passes, with torch_tpu's "
        "launch environment (set_tpu_launch_env) and cpu:gloo,tpu:tpu_dist"
        + (
            ", while chip 0 was held by another process: each rank opened its granted chip"
            if holder
            else ""
        ),
        f"the sharded probe: {record['status']}: {record.get('error_message')} "
        f"{record.get('rank_errors')}",
    )
    return found


def memory(scratch: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD],
        env=env(pinned((0,))),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-1500:])
    found = json.loads(done.stdout.strip().splitlines()[-1])
    _verdict(
        found,
        found["properties_bytes"] == found["table_bytes"],
        f"torch_tpu's HBM table ({found['table_bytes']} B per device) is what "
        "get_device_properties says",
        f"get_device_properties says {found['properties_bytes']}, torch_tpu's table "
        f"{found['table_bytes']}",
    )
    _verdict(
        found,
        bool(found["peak_mb"]) and found["peak_mb"] >= 256,
        f"the peak after a 256 MiB tensor reads {found['peak_mb']} MiB from {found['peak_source']}",
        f"the peak after a 256 MiB tensor reads {found['peak_mb']} ({found['peak_source']}): "
        "not measured",
    )
    return found


def compiled(scratch: Path) -> dict:
    cache = {"TORCH_TPU_TIER2_COMPILATION_CACHE": str(scratch / "tier2-cache")}
    keys = (
        "status", "compile_backend", "compile_s", "graphs", "graph_breaks", "matches_eager", "compile_cache_hits",
        "compile_cache_misses", "recompile_lengths", "recompiles_static", "recompiles_dynamic", "recompile_flag",
        "recompile_guard", "recompile_note", "error_message",
    )  # fmt: skip
    first = papermill_probe(
        scratch, "probe-compile", (0,), cache, mode="compile", recompile_check="on"
    )
    again = papermill_probe(
        scratch, "probe-compile-again", (0,), cache, mode="compile", recompile_check="off"
    )
    found: dict = {
        "first": {k: first.get(k) for k in keys},
        "again": {k: again.get(k) for k in keys},
    }
    _verdict(
        found,
        first["status"] == "PASS" and first["compile_backend"] == "tpu",
        f"compile mode passes with backend tpu ({first.get('compile_s')} s, "
        f"{first.get('graphs')} graphs, matches eager: {first.get('matches_eager')})",
    )
    _verdict(
        found,
        first.get("compile_cache_misses") is not None,
        f"the compilation cache counts: {first.get('compile_cache_misses')} misses, "
        f"{first.get('compile_cache_hits')} hits; a second process with the same tier-2 "
        f"folder: {again.get('compile_cache_hits')} hits",
        "torch.tpu._get_cache_misses does not answer",
    )
    _verdict(
        found,
        first.get("recompile_lengths") is not None,
        f"the recompile check ran: static {first.get('recompiles_static')}, dynamic "
        f"{first.get('recompiles_dynamic')} per length ({first.get('recompile_flag')})",
        f"the recompile check did not run: {first.get('recompile_note')}",
    )
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--out", type=Path, default=HERE / "results", help="where device_check_tpu.json goes"
    )
    parser.add_argument(
        "--budget-s", type=float, default=500.0, help="stop starting steps past this"
    )
    args = parser.parse_args()
    from model_support.probe.devices import tpu

    if not tpu.torch_tpu_installed():
        print(
            "no TPU here: torch_tpu is not installed (on a TPU VM: pip install -e '.[tpu]')",
            file=sys.stderr,
        )
        return NO_TPU_STATUS
    if not tpu.tpu_hardware_visible():
        print(
            "no TPU here: torch_tpu finds no TPU chip on this host (its hardware module sees "
            "no Google PCI device bound to VFIO); run this on a TPU VM",
            file=sys.stderr,
        )
        return NO_TPU_STATUS
    scratch = Path(
        os.environ.get("DEVICE_CHECK_SCRATCH") or tempfile.mkdtemp(prefix="device-check-tpu-")
    ).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    check = Check(args.budget_s)
    from fixtures.build import build_fixtures

    build_fixtures(REPO / "data" / "models", names=[MODEL])
    check.step("chips", 30, chips, scratch)
    check.step("pinning", 60, pinning, scratch)
    check.step("probe", 60, probe, scratch)
    check.step("sharded", 120, sharded, scratch)
    check.step("memory", 40, memory, scratch)
    check.step("compile", 150, compiled, scratch)
    results = {
        "device": "tpu",
        "generation": tpu.tpu_generation(),
        "steps": check.steps,
        "wall_s": round(time.time() - check.started, 1),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "device_check_tpu.json").write_text(
        json.dumps(results, indent=1, default=str) + "\n"
    )
    print(f"wrote {args.out / 'device_check_tpu.json'} in {results['wall_s']} s")
    unverified = [name for name, step in check.steps.items() if step.get("no") or "skipped" in step]
    return 1 if unverified else 0


if __name__ == "__main__":
    sys.exit(main())
