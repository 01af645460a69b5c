"""What the tpu adapter assumes of torch_tpu, checked against the installed 0.2.0 package with no
chip (issue 58, items 2, 3 and 5): a release that changes one of these fails the test named for it,
not a sweep on a TPU VM.

- **The CPU fallback** (item 2): torch_tpu registers a boxed fallback for PrivateUse1 but its CPU
  fallback is off by default (``torch_tpu._internal.execution_mode.enable_cpu_fallback``, a Python
  property, no environment variable): an operator only that fallback catches raises "'<op>' is not
  implemented for TPU". The adapter reads the switch (``fallback_runs``) and calls such an operator
  missing while it is off, fallback once it is on, naming it.
- **The compile patch** (item 3): torch_tpu patches torch.compile, when its device initialises, to
  give its ``tpu`` backend ``dynamic=False``, and that backend refuses dynamic=True. The probe reads
  the stack's ``dynamic`` from torch.compile itself (``probe_compile.compile_dynamic``) and then
  generates with the static KV cache.
- **The settings** (item 5): the ``TORCH_TPU_*`` variables its binary reads that change results or
  timings are the adapter's configuration; the ones its own launcher writes are the harness's; the
  blocking switch its binary reads is ``TORCH_TPU_LAUNCH_BLOCKING``.

torch_tpu is imported in one child process for the module (it takes seconds, and it must not load
into pytest's process); the binary's variable names are read from the installed file, nothing
imported.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch_tpu") is None,
    reason="the torch_tpu wheel is not installed here",
)

#: The settings of torch_tpu 0.2.0 that change what a run gives or how fast (docs/devices.md,
#: "Settings").
RESULT_SETTINGS = (
    "TORCH_TPU_DEFER_AND_FUSE",
    "TORCH_TPU_LAUNCH_BLOCKING",
    "TORCH_TPU_INTERNAL_XLA_OPTIONS",
    "TORCH_TPU_TIER2_COMPILATION_CACHE",
    "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT",
    "TORCH_TPU_ENABLE_DEBUG_CHECKS",
)
#: An operator with no TPU kernel that only torch_tpu 0.2.0's boxed fallback catches (the CPU's
#: attention kernel).
FALLBACK_ONLY = "aten::_scaled_dot_product_flash_attention_for_cpu"
#: What torch_tpu 0.2.0's fallback says when its CPU fallback is off.
NOT_IMPLEMENTED = "' is not implemented for TPU. Please file a feature request"

CHILD = textwrap.dedent(
    """
    import inspect, json
    from model_support.probe import devices, probe_compile, probe_core
    devices.load_backend("tpu")  # torch_tpu's own entry point; no chip: no device, its registrations all the same
    import torch
    import torch_tpu._internal.compile  # registers the "tpu" compile backend (its loader does, on a TPU)
    from torch_tpu import _loader
    from torch_tpu._internal import execution_mode
    from torch_tpu._internal.compile._backend import TpuBackend

    adapter = devices.adapter_for("tpu")
    asked = [FALLBACK_ONLY, "aten::mm", "aten::_to_copy"]
    out = {
        "default": execution_mode.enable_cpu_fallback,
        "boxed_fallback": torch._C._dispatch_has_backend_fallback(torch._C.DispatchKey.PrivateUse1),
        "runs_off": list(adapter.fallback_runs()),
        "coverage_off": list(adapter.coverage_with_notes(asked)),
        "op_coverage_off": adapter.op_coverage(asked),
    }
    execution_mode.enable_cpu_fallback = True  # torch_tpu's own switch, as a user turns it on
    out["switched"] = execution_mode.enable_cpu_fallback
    out["runs_on"] = list(adapter.fallback_runs())
    out["coverage_on"] = list(adapter.coverage_with_notes(asked))
    execution_mode.enable_cpu_fallback = False
    # the compile patch, installed as its device's initialisation installs it (no chip: it is not, by itself)
    out["patch_installed_at_init"] = "torch.compile = _default_tpu_compile" in inspect.getsource(_loader._init_device_impl)
    unpatched = {name: probe_compile.compile_dynamic(name) for name in ("tpu", "inductor")}
    torch.compile = _loader._default_tpu_compile
    out["dynamic"] = {name: probe_compile.compile_dynamic(name) for name in ("tpu", "inductor", "aot_eager")}
    out["dynamic_unpatched"] = unpatched
    out["explicit"] = probe_compile.compile_dynamic(adapter.compile_backend())
    out["refuses_dynamic"] = "dynamic=True" in inspect.getsource(TpuBackend.__call__) and (
        "assume_static_by_default" in inspect.getsource(TpuBackend.__call__)
    )
    print(json.dumps(out))
    """
).replace("FALLBACK_ONLY", repr(FALLBACK_ONLY))


@pytest.fixture(scope="module")
def torch_tpu_facts() -> dict:
    """What the installed torch_tpu says, asked once in a child process that loads it (no chip
    here)."""
    env = {
        **os.environ,
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
        "PYTHONWARNINGS": "ignore",
        "TPU_SKIP_MDS_QUERY": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _package() -> Path:
    spec = importlib.util.find_spec("torch_tpu")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


@functools.cache
def _glue_library() -> Path:
    """torch_tpu's glue library for the torch installed here (it ships one per torch release it
    supports)."""
    import torch

    major, minor, patch = re.match(r"(\d+)\.(\d+)\.(\d+)", torch.__version__).groups()  # type: ignore[union-attr]
    tag = f"{major}_{minor}_{patch}"
    found = _package() / "csrc" / "common" / f"glue_{tag}" / f"libpywrap_{tag}_common.so"
    assert found.exists(), f"torch_tpu ships no glue library for torch {torch.__version__}"
    return found


@functools.cache
def _binary_variables() -> frozenset[str]:
    """The TORCH_TPU_* names in torch_tpu's glue library (what its C++ reads: ``strings`` on the
    file)."""
    return frozenset(
        m.decode() for m in re.findall(rb"(?<![A-Z0-9_])TORCH_TPU_[A-Z0-9_]+", _binary())
    )


@functools.cache
def _binary() -> bytes:
    return _glue_library().read_bytes()


def _written_by_torch_tpu() -> set[str]:
    """The TORCH_TPU_* variables torch_tpu's Python writes into the environment itself
    (``get_and_set_str_env_once``: its launcher's, for a sharded run's ranks to agree on)."""
    pattern = re.compile(r"get_and_set_str_env_once\(\s*\"(TORCH_TPU_\w+)\"")
    return {name for path in _package().rglob("*.py") for name in pattern.findall(path.read_text())}


# --- item 2: the CPU fallback
# ---------------------------------------------------------------------------------


def test_torch_tpu_s_cpu_fallback_is_off_by_default_and_its_switch_is_the_one_the_adapter_names(
    torch_tpu_facts,
):
    from model_support.probe.devices.tpu import TpuAdapter

    # registered: the registrations alone would say "fallback"
    assert torch_tpu_facts["boxed_fallback"] is True
    assert torch_tpu_facts["default"] is False
    # the property the adapter names is the one that turns it on
    assert torch_tpu_facts["switched"] is True
    switch = f"{TpuAdapter.cpu_fallback_switch} = True"
    assert torch_tpu_facts["runs_off"] == [False, switch] and torch_tpu_facts["runs_on"] == [
        True,
        switch,
    ]
    # what it raises when off, and says when on, are in its binary
    assert NOT_IMPLEMENTED.encode() in _binary()
    assert b"' is not implemented for TPU. Falling back to CPU" in _binary()


def test_an_operator_only_the_fallback_catches_is_missing_while_it_is_off_and_says_the_switch(
    torch_tpu_facts,
):
    from model_support.probe.devices.tpu import TpuAdapter

    coverage, notes = torch_tpu_facts["coverage_off"]
    assert coverage == {
        FALLBACK_ONLY: "missing",
        "aten::mm": "implemented",
        "aten::_to_copy": "implemented",
    }
    # what a probe's row records (ops_missing) agrees
    assert torch_tpu_facts["op_coverage_off"] == coverage
    assert (
        list(notes) == [FALLBACK_ONLY]
        and f"{TpuAdapter.cpu_fallback_switch} = True makes it" in notes[FALLBACK_ONLY]
    )
    on, on_notes = torch_tpu_facts["coverage_on"]
    assert on[FALLBACK_ONLY] == "fallback" and "CPU fallback is on" in on_notes[FALLBACK_ONLY]


# --- item 3: the compile patch
# ----------------------------------------------------------------------------------


def test_torch_tpu_compiles_its_backend_with_dynamic_false_and_the_probe_reads_it(torch_tpu_facts):
    """Its loader installs the patch at device initialisation; patched, torch.compile gives
    ``tpu`` (the adapter's backend) dynamic=False and leaves other backends to torch's default;
    its backend refuses dynamic=True."""
    assert torch_tpu_facts["patch_installed_at_init"] is True
    # no chip: not installed
    assert torch_tpu_facts["dynamic_unpatched"] == {"tpu": None, "inductor": None}
    assert torch_tpu_facts["dynamic"] == {"tpu": False, "inductor": None, "aot_eager": None}
    # the tpu adapter's backend: a compiled probe takes the static cache
    assert torch_tpu_facts["explicit"] is False
    assert torch_tpu_facts["refuses_dynamic"] is True


# --- item 5: the settings
# ---------------------------------------------------------------------------------------


#: Every TORCH_TPU_ variable torch_tpu 0.2.0's binary reads, and whose it is: the stack's (recorded:
#: it changes results, timings or what is kept), the harness's (a run's launch, set per probe) or
#: the host's (its ports and devices). A release that reads a new one fails the test below until it
#: is placed here (review: a check that every name matched ``TORCH_TPU_*`` could not fail).
TORCH_TPU_VARIABLES = {
    **dict.fromkeys(RESULT_SETTINGS, "stack"),
    **dict.fromkeys(
        (
            "TORCH_TPU_INTERNAL_DETECT_REPEATED_OPS",
            "TORCH_TPU_INTERNAL_DISABLE_INPLACE_BUFFER_DONATION",
            "TORCH_TPU_INTERNAL_DUMP_MLIR_PASSES_TO",
            "TORCH_TPU_INTERNAL_ENABLE_MLIR_CSE",
            "TORCH_TPU_INTERNAL_ENABLE_REASSOCIATE_NORM_WEIGHTS",
            "TORCH_TPU_INTERNAL_MATERIALIZE_COLLECTIVE_TENSORS",
            "TORCH_TPU_INTERNAL_SKINNY_SC_OFFLOAD",
            "TORCH_TPU_INTERNAL_SPLIT_RNG_STATE_UPDATE",
            "TORCH_TPU_INTERNAL_TIER3_COMPILATION_CACHE_LOCAL_BACKUP_TASK",
            "TORCH_TPU_PROFILER_OUTPUT_DIR",
            "TORCH_TPU_SPMD_HANDSHAKE_STAGE",
        ),
        "stack",
    ),
    **dict.fromkeys(("TORCH_TPU_SLICEBUILDER_ADDRESSES", "TORCH_TPU_TOPOLOGY"), "harness"),
    "TORCH_TPU_DEVICES_PER_HOST": "host",
}


def test_every_torch_tpu_setting_that_changes_results_is_read_by_its_binary_and_recorded():
    from model_support.probe.devices.base import _matches
    from model_support.probe.devices.tpu import TpuAdapter

    read = _binary_variables()
    assert set(RESULT_SETTINGS) <= read, set(RESULT_SETTINGS) - read
    environ = {name: "1" for name in RESULT_SETTINGS}
    assert TpuAdapter.configuration(environ) == environ  # each recorded, with its value
    assert read == set(TORCH_TPU_VARIABLES), {"unplaced": read - set(TORCH_TPU_VARIABLES)}
    for name, whose in TORCH_TPU_VARIABLES.items():
        recorded = name in TpuAdapter.configuration({name: "1"})
        assert recorded == (whose == "stack"), name
        assert (name in TpuAdapter.harness_vars) == (whose == "harness"), name
        assert _matches(name, TpuAdapter.node_vars) == (whose == "host"), name


def test_the_variables_torch_tpu_s_launcher_writes_are_the_harness_s_not_the_stack_s():
    from model_support.probe.devices.tpu import TpuAdapter

    written = _written_by_torch_tpu()
    assert {"TORCH_TPU_SLICEBUILDER_ADDRESSES", "TORCH_TPU_TOPOLOGY"} <= written, written
    assert written <= set(TpuAdapter.harness_vars)
    environ = {**dict.fromkeys(written, "x"), "TORCH_TPU_DEFER_AND_FUSE": "1"}
    assert TpuAdapter.configuration(environ) == {"TORCH_TPU_DEFER_AND_FUSE": "1"}


def test_the_blocking_rerun_uses_the_switch_torch_tpu_s_binary_reads():
    from model_support.probe.devices.tpu import TpuAdapter

    read = _binary_variables()
    assert (
        TpuAdapter.blocking_env == {"TORCH_TPU_LAUNCH_BLOCKING": "1"}
        and set(TpuAdapter.blocking_env) <= read
    )
    # the name the project once used is no variable of torch_tpu's
    assert not re.search(rb"(?<![A-Z0-9_])TPU_LAUNCH_BLOCKING", _binary())
