"""Recompiles across prompt lengths (issue 38, item 6): a compiled model with a shape-dependent
branch, generated from three prompt lengths with automatic dynamic shapes off and on, is counted
and flagged with the guard behind it.

The model is the graph-break fixture's custom code with its value branch swapped for a branch on
the prompt's length (``shape[1] % 3``): dynamic shapes make the length symbolic at the second
length, the branch installs a guard on it, and the third length (5, 8, 12 tokens: 12 is a
multiple of 3, 5 and 8 are not) fails it. Run in process on the CPU, through the check's own
function (dynamo's eager backend: no inductor build)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

VALUE_BRANCH = """        if bool(out.logits[0, -1].argmax() % 2 == 0):
            out.logits = out.logits * 1.0
"""
SHAPE_BRANCH = """        if out.logits.shape[1] % 3 == 0:  # a branch on the prompt's length
            out.logits = out.logits * 1.0
"""


@pytest.fixture(scope="module")
def shape_branch_model(tmp_path_factory, fixture_models) -> Path:
    import torch._dynamo  # noqa: F401  # its import writes TORCHINDUCTOR_CACHE_DIR: here, before a test's env check

    # its own name: its own module cache
    folder = tmp_path_factory.mktemp("recompiles") / "modes-shape-branch"
    shutil.copytree(fixture_models["modes-graph-break"]["path"], folder)
    code = folder / "modeling_graph_break.py"
    assert VALUE_BRANCH in code.read_text()
    code.write_text(code.read_text().replace(VALUE_BRANCH, SHAPE_BRANCH))
    return folder


def test_a_shape_dependent_branch_recompiles_per_length_and_names_its_guard(shape_branch_model):
    import torch

    from model_support.probe import devices, probe_core
    from model_support.probe.instruments import recompiles

    result = probe_core.run_stages(
        str(shape_branch_model),
        max_new_tokens=2,
        trust_remote_code=True,
        chat_template="none",
        keep_model=True,
    )
    assert result["status"] == "PASS", result["exception"]
    record = {"status": "PASS", "task": "text-generation"}
    settings = {"mode": "compile", "recompile_check": True, "cache": "dynamic"}
    fields = recompiles.recompile_fields(record, settings, result, devices.resolve("cpu"))
    assert fields["recompile_lengths"] == [5, 8, 12], fields
    # automatic dynamic shapes off: every new shape recompiles, the prompt's and the cache's
    # (prefill, decode)
    assert fields["recompiles_static"] == [1, 2, 2]
    # on: the second length makes the prompt's length symbolic; the third fails the branch's guard
    # on it
    assert fields["recompiles_dynamic"][-1] >= 1 and fields["recompile_flag"] == "per length"
    assert (
        "% 3" in fields["recompile_guard"]
        and "a branch on the prompt's length" in fields["recompile_guard"]
    )
    assert "eager backend" in fields["recompile_note"]
    # the check leaves dynamo's settings as it found them
    assert torch._dynamo.config.automatic_dynamic_shapes
    # off, and outside compile mode: a reason, no counts
    off = recompiles.recompile_fields(record, {**settings, "recompile_check": False}, result, None)
    assert (
        off["recompiles_dynamic"] is None
        and off["recompile_note"] == "not measured: recompile_check=off"
    )


#: A compiled probe on the pretend device playing TorchTPU's compile contract (``compile_static``:
#: its own backend, which torch.compile gives dynamic=False), then that compile of a function called
#: with ten shapes, as a dynamic KV cache calls the forward with ten cache lengths: what the probe
#: did before it took the static cache.
STATIC_CONTRACT = """
import json
from model_support.probe import devices, probe_core, run  # first: no backend autoloads with torch
import torch
import torch._dynamo
from torch._dynamo.utils import counters

record = run.run_probe(
    "data/models/tiny-gpt2", device="pretend", mode="compile", reference="none", judge=False, perf=False,
    max_new_tokens=10,
)
fields = ("status", "compile_backend", "compile_dynamic", "compile_cache", "graphs", "recompile_limit_hit",
          "matches_eager", "recompile_lengths", "recompiles_backend", "recompile_flag", "recompile_note")
out = {key: record[key] for key in fields}
adapter = devices.resolve("pretend")
torch._dynamo.reset()
counters.clear()
step = torch.compile(lambda x: x * 2, backend=adapter.compile_backend())
for n in range(1, 11):
    step(torch.ones(n, device=adapter.torch_device))
out["every_shape"] = probe_core.compile_counts()
print(json.dumps(out))
"""


def test_a_static_compile_takes_the_static_cache_and_counts_recompiles_on_its_own_backend():
    """Issue 58, item 3, on the pretend device playing TorchTPU's compile contract (torch.compile
    gives its backend dynamic=False, as torch_tpu patches it for ``tpu``): every new shape is a
    new graph, and past dynamo's recompile limit (8) a frame runs eagerly, so with a dynamic KV
    cache (a new length every token) "compiled" would be in name only (``recompile_limit_hit``
    says so: a function called with ten shapes here); the probe generates with the static cache
    instead (2 graphs, the limit never near) and says so (``compile_dynamic``,
    ``compile_cache``), and its recompile check counts on the probe's own backend with its
    dynamic setting (``recompiles_backend``), not dynamo's eager backend with automatic dynamic
    shapes: each new prompt length is a new graph there (flagged per length), which the eager
    series with dynamic shapes would not show."""
    import json
    import os
    import subprocess
    import sys

    from helpers import REPO

    env = {**os.environ, "MODEL_SUPPORT_PRETEND": json.dumps({"compile_static": True})}
    done = subprocess.run(
        [sys.executable, "-c", STATIC_CONTRACT],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert (
        out["status"],
        out["compile_backend"],
        out["compile_dynamic"],
        out["compile_cache"],
    ) == (
        "PASS",
        "pretend",
        False,
        "static",
    )
    assert (
        out["graphs"] <= 3 and out["recompile_limit_hit"] is False and out["matches_eager"] is True
    )
    # the counterfactual: under the contract every new shape is a new graph, up to dynamo's limit,
    # then eager
    assert out["every_shape"]["recompile_limit_hit"] is True and out["every_shape"]["graphs"] == 8
    # recompiles counted as the probe compiles: every new prompt length is a new graph with
    # dynamic=False
    assert out["recompile_lengths"] == [5, 8, 12] and out["recompiles_backend"][1:] == [1, 1]
    assert out["recompile_flag"] == "per length"
    assert "on the probe's own pretend backend (dynamic=False" in out["recompile_note"]
    assert "static KV cache" in out["recompile_note"]
