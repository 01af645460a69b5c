"""Recompiles across prompt lengths (issue 38, item 6): a compiled model with a shape-dependent branch, generated
from three prompt lengths with automatic dynamic shapes off and on, is counted and flagged with the guard behind it.

The model is the graph-break fixture's custom code with its value branch swapped for a branch on the prompt's
length (``shape[1] % 3``): dynamic shapes make the length symbolic at the second length, the branch installs a
guard on it, and the third length (5, 8, 12 tokens: 12 is a multiple of 3, 5 and 8 are not) fails it.
Run in process on the CPU, through the check's own function (dynamo's eager backend: no inductor build)."""

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
    folder = tmp_path_factory.mktemp("recompiles") / "modes-shape-branch"  # its own name: its own module cache
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
        str(shape_branch_model), max_new_tokens=2, trust_remote_code=True, chat_template="none", keep_model=True
    )
    assert result["status"] == "PASS", result["exception"]
    record = {"status": "PASS", "task": "text-generation"}
    settings = {"mode": "compile", "recompile_check": True, "cache": "dynamic"}
    fields = recompiles.recompile_fields(record, settings, result, devices.resolve("cpu"))
    assert fields["recompile_lengths"] == [5, 8, 12], fields
    # automatic dynamic shapes off: every new shape recompiles, the prompt's and the cache's (prefill, decode)
    assert fields["recompiles_static"] == [1, 2, 2]
    # on: the second length makes the prompt's length symbolic; the third fails the branch's guard on it
    assert fields["recompiles_dynamic"][-1] >= 1 and fields["recompile_flag"] == "per length"
    assert "% 3" in fields["recompile_guard"] and "a branch on the prompt's length" in fields["recompile_guard"]
    assert "eager backend" in fields["recompile_note"]
    assert torch._dynamo.config.automatic_dynamic_shapes  # the check leaves dynamo's settings as it found them
    # off, and outside compile mode: a reason, no counts
    off = recompiles.recompile_fields(record, {**settings, "recompile_check": False}, result, None)
    assert off["recompiles_dynamic"] is None and off["recompile_note"] == "not measured: recompile_check=off"
