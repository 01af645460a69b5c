"""TorchTPU's deferred-and-fused eager as a probe mode (``mode: fused``): on a TPU whose
torch_tpu exposes it the generation runs inside
``torch.tpu.set_eager_mode(EagerMode.DEFER_AND_FUSE)``; anywhere else the record says "not
available on this stack" (an ``excluded`` row in a sweep), never a failure."""

from __future__ import annotations

import os
import subprocess
import sys

import polars as pl
import pytest

from helpers import cli_debug, cli_sweep, probe_record
from model_support import analysis
from model_support.probe import probe_params
from model_support.record import store

CLI = [sys.executable, "-m", "model_support.cli"]


def test_fused_is_a_mode_and_a_variant():
    assert "fused" in probe_params.MODES
    assert probe_params.parse_variant("fused+static") == {"mode": "fused", "cache": "static"}
    assert probe_params.variant({"mode": "fused"}) == "fused+dynamic"


def _in_a_child(code: str, autoload: bool) -> list[str]:
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "1" if autoload else "0"}
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.strip().splitlines()


def test_the_tpu_stack_here_exposes_fused_eager_and_the_context_switches_it():
    """torch_tpu 0.2.0 (a dev dependency) exposes the mode without a chip: the context sets it
    and puts the default (DEFER_NEVER) back."""
    lines = _in_a_child(
        "import torch\n"
        "from model_support.probe import probe_compile, probe_core\n"
        "print(probe_compile.fused_eager_missing('tpu'))\n"
        "print(torch.tpu.eager_mode.name)\n"
        "with probe_core.execution_context('fused'):\n"
        "    print(torch.tpu.eager_mode.name)\n"
        "print(torch.tpu.eager_mode.name)\n",
        autoload=True,
    )
    assert lines[-4:] == ["None", "DEFER_NEVER", "DEFER_AND_FUSE", "DEFER_NEVER"]


def test_a_stack_without_it_is_named():
    """Off a TPU the mode does not exist; a torch without torch.tpu (torch_tpu not loaded) says
    which torch_tpu lacks it."""
    lines = _in_a_child(
        "from model_support.probe import probe_compile, probe_core\n"
        "print(probe_compile.fused_eager_missing('cpu'))\n"
        "print(probe_compile.fused_eager_missing('tpu'))\n",
        autoload=False,
    )
    assert (
        lines[-2]
        == "mode 'fused' is TorchTPU's deferred-and-fused eager; it runs on tpu devices only, "
        "not on cpu"
    )
    assert (
        lines[-1].startswith("torch_tpu ")
        and "does not expose torch.tpu.set_eager_mode" in lines[-1]
    )


def test_a_fused_probe_off_a_tpu_records_not_available_instead_of_failing(tmp_path, fixture_models):
    record = probe_record(tmp_path, fixture_models["tiny-llama"]["path"], mode="fused")
    assert (
        record["status"] is None
        and record["failure_stage"] is None
        and record["error_type"] is None
    )
    assert record["variant"] == "fused+dynamic" and record["device_type"] == "cpu"
    assert record["exclusion_reason"].startswith("not available on this stack: mode 'fused'")
    assert record["tokens_out"] is None and record["repro_script"] is None  # nothing ran


@pytest.mark.slow
def test_a_matrix_with_fused_keeps_its_variants_as_excluded_rows_and_the_grid_says_na(
    tmp_path, fixture_models
):
    definition = {
        "name": "fused",
        "probe": {"device": "cpu", "reference": "none"},
        "matrix": {"mode": ["eager", "fused"], "cache": ["dynamic", "static"]},
        "models": [fixture_models["tiny-gpt2"]["path"]],
    }
    data, sweep_id = cli_sweep(tmp_path, definition, "--workers", "2")
    results = pl.read_parquet(store.parquet_file(data, "results", sweep_id))
    excluded = pl.read_parquet(store.parquet_file(data, "excluded", sweep_id))
    assert sorted(results["variant"]) == ["eager+dynamic", "eager+static"] and set(
        results["status"]
    ) == {"PASS"}
    assert sorted(excluded["variant"]) == ["fused+dynamic", "fused+static"]
    assert all(r.startswith("not available on this stack") for r in excluded["exclusion_reason"])
    grid = analysis.verdict_grid(
        store.scan(data, "results"), sweep_id, store.scan(data, "excluded")
    )
    assert grid.row(0) == ("local:tiny-gpt2", "PASS", "PASS", "n/a", "n/a")
    assert grid.columns[1:] == ["eager+dynamic", "eager+static", "fused+dynamic", "fused+static"]
    report = (data / "reports" / f"{sweep_id}.html").read_text()
    assert "fused+static" in report and ">n/a</td>" in report


def test_debug_in_fused_off_a_tpu_is_refused_with_one_sentence(tmp_path, fixture_models):
    data = tmp_path / "data"
    path = fixture_models["tiny-llama"]["path"]
    run = cli_debug(data, path, {"device": "cpu"}, {"mode": ["eager", "fused"]}, "fused+dynamic")
    assert run.returncode == 2, run.stderr[-2000:]
    assert (
        "not available on this stack: mode 'fused' is TorchTPU's deferred-and-fused eager"
        in run.stderr
    )
    assert "Traceback" not in run.stderr and not (store.sweep_dir(data, "s") / "debug").exists()


def test_the_terminal_table_lists_a_mode_not_available_as_excluded_with_its_reason():
    import io

    from rich.console import Console

    from model_support.record import schema
    from model_support.render.terminal import verdict_table

    reason = "not available on this stack: mode 'fused' is TorchTPU's deferred-and-fused eager"
    records = [
        schema.empty_record(
            model_id="local:a", variant="eager+dynamic", status="PASS", tokens_in=5, tokens_out=8
        ),
        schema.empty_record(model_id="local:a", variant="fused+dynamic", exclusion_reason=reason),
    ]
    out = io.StringIO()
    verdict_table(records, Console(file=out, width=200, color_system=None))
    lines = out.getvalue().splitlines()
    row = next(line for line in lines if "fused+dynamic" in line)
    assert "excluded" in row and reason in row and "None" not in row
    assert lines[-1] == "PASS: 1  FAIL(load): 0  FAIL(gen): 0  FAIL(other): 0  excluded: 1"
