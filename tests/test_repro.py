"""The repro script as the dataset keeps it: each row its settings and its body's hash, each body
once (``repro/<sha256>.py``), the whole script one command away (``model-support repro SWEEP
MODEL``), and that script, run with plain python, reaching the probe's verdict."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import cli_sweep
from model_support.probe import repro
from model_support.record import schema, store

CLI = [sys.executable, "-m", "model_support.cli"]
#: A PASS (with the CPU reference) and a FAIL(gen), their verdicts known
#: (data/models/manifest.json).
MODELS = ("tiny-llama", "fail-short-positions")


@pytest.fixture(scope="module")
def repro_sweep(tmp_path_factory, fixture_models) -> dict:
    tmp = tmp_path_factory.mktemp("repro")
    models = [fixture_models[name]["path"] for name in MODELS]
    data, sweep_id = cli_sweep(tmp, {"name": "repro", "probe": {"device": "cpu"}, "models": models})
    return {
        "data": data,
        "sweep_id": sweep_id,
        "records": {r["model_id"]: r for r in store.read_records(data, sweep_id)},
    }


def cli_repro(data: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, "repro", *args, "--data-dir", str(data)], capture_output=True, text=True, timeout=120
    )


def test_rows_keep_settings_and_a_hash_and_the_body_is_kept_once(repro_sweep):
    import pyarrow.parquet as pq

    data, sweep_id = repro_sweep["data"], repro_sweep["sweep_id"]
    rows = pq.read_table(store.parquet_file(data, "results", sweep_id)).to_pylist()
    assert len(rows) == len(MODELS)
    assert all(r["repro_script"] is None and r["repro_settings"] for r in rows)
    (sha,) = {r["repro_sha256"] for r in rows}  # one body for every row of this code
    assert sha == repro.body()[1]
    assert [p.name for p in store.repro_dir(data, sweep_id).glob("*.py")] == [f"{sha}.py"]
    # beside the Parquet files
    assert [p.name for p in store.repro_dir(data).glob("*.py")] == [f"{sha}.py"]
    assert (store.repro_dir(data) / f"{sha}.py").read_text() == repro.body()[0]
    assert json.loads(rows[0]["repro_settings"])["model_id"] == rows[0]["model_id"]


@pytest.mark.parametrize("name", MODELS)
def test_the_script_model_support_repro_prints_reproduces_the_verdict(
    repro_sweep, fixture_models, tmp_path, name
):
    data, sweep_id = repro_sweep["data"], repro_sweep["sweep_id"]
    record = repro_sweep["records"][f"local:{name}"]
    printed = cli_repro(data, sweep_id, name)
    assert printed.returncode == 0, printed.stderr
    script = printed.stdout
    # the library function says the same
    assert script == repro.script_for(data, sweep_id, f"local:{name}")
    # imports nothing of this package
    assert "model_support" not in script and "papermill" not in script
    path = tmp_path / "run.py"
    path.write_text(script)
    run = subprocess.run(
        [sys.executable, "-I", str(path), fixture_models[name]["path"]],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert run.returncode == (0 if record["status"] == schema.PASS else 1), run.stderr[-3000:]
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
    # the same reference check as the probe's, the same numerics
    if record["status"] == schema.PASS:
        assert (got["numerics"], got["reference_match"]) == (
            record["numerics"],
            record["reference_match"],
        )
        assert got["reference_max_kl"] == pytest.approx(record["reference_max_kl"], abs=1e-6)


def test_older_rows_with_the_whole_script_and_unknown_rows_read(repro_sweep, tmp_path):
    data, sweep_id = repro_sweep["data"], repro_sweep["sweep_id"]
    path = store.record_file(data, sweep_id, "local:tiny-llama")
    older = {**json.loads(path.read_text()), "repro_settings": None, "repro_sha256": None}
    older["repro_script"] = "# an older record's whole script\n"
    assert repro.script_of(older) == older["repro_script"]
    moved = {**older, "repro_script": None, "repro_settings": "{}", "repro_sha256": "0" * 64}
    # a body not copied with the data: said so
    with pytest.raises(repro.UserError, match="repro/<sha256>.py"):
        repro.script_of(moved, tmp_path)
    unknown = cli_repro(data, sweep_id, "no-such-model")
    assert (
        unknown.returncode == 2
        and "No model of sweep" in unknown.stderr
        and "Traceback" not in unknown.stderr
    )


def test_a_script_whose_body_is_not_its_hash_stays_whole(tmp_path):
    record = schema.empty_record(
        model_id="m",
        repro_settings="{}",
        repro_sha256="0" * 64,
        repro_script=f"SETTINGS = {{}}\n{store.REPRO_BODY_MARK} changed after hashing\n",
    )
    assert store.split_repro(record, tmp_path) == record and not list(tmp_path.iterdir())


def test_the_smoke_sweeps_parquet_is_at_most_4_kb_a_row(smoke_sweep):
    """The dataset stopped repeating the repro script: ~36 KB a row before, nearly all of it
    script."""
    import pyarrow.parquet as pq

    files = sorted(Path(smoke_sweep["data_dir"]).glob("*/sweep=*/*.parquet"))
    rows = sum(pq.read_metadata(f).num_rows for f in files)
    assert rows >= 40
    assert sum(f.stat().st_size for f in files) / rows <= 4096


def test_statistics_are_kept_for_declared_columns_only():
    assert set(store.KEY_TEXTS) <= set(schema.FIELDS)
    kept = store.statistics_columns()
    assert (
        "sweep_id" in kept
        and "num_params" in kept
        and "traceback" not in kept
        and "repro_settings" not in kept
    )
