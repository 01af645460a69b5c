"""A full disk: nothing half-written passes for done, and the runner says what happened in one
sentence.

The data folder sits on a real, small file system (a tmpfs mounted for the test; the tests skip
where mounting is not allowed) that fills while the sweep runs. Afterwards every stored record has
a whole notebook, no temporary file remains, the command ended with one sentence (no traceback),
and ``--resume`` after making room stores every model exactly once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from model_support.record import schema, store
from model_support.record.sweep_meta import ModelEntry, SweepMeta

pytestmark = pytest.mark.slow
CLI = [sys.executable, "-m", "model_support.cli"]
MODELS = (
    "tiny-llama",
    "tiny-gpt2",
    "tiny-opt",
    "tiny-qwen2",
    "tiny-mistral",
    "tiny-gemma",
    "tiny-phi3",
    "tiny-granite",
)


@pytest.fixture
def small_disk(tmp_path):
    """mount(size) -> a folder on a tmpfs of that size; resize(size) grows it in place ("making
    room")."""
    mounted = []

    def mount(size: str) -> Path:
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip()})")
        mounted.append(folder)
        return folder

    def resize(folder: Path, size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(folder)], check=True)

    mount.resize = resize
    yield mount
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def sweep_file(tmp_path: Path, fixture_models: dict, names=MODELS) -> Path:
    path = tmp_path / "eight.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "disk",
                "probe": {"device": "cpu", "reference": "none"},
                "models": [fixture_models[n]["path"] for n in names],
            }
        )
    )
    return path


def leftovers(folder: Path) -> list[str]:
    return [
        str(p)
        for p in folder.rglob("*")
        if p.name.endswith(".tmp") or ".tmp-" in p.name or p.name.endswith(".partial.ipynb")
    ]


def whole_notebooks(data: Path) -> None:
    """Every stored record has a readable executed notebook (and its log)."""
    for sweep in (data / "sweeps").iterdir():
        for path in (sweep / "records").glob("*.json"):
            record = json.loads(path.read_text())
            nbformat.read(str(data / record["notebook_path"]), as_version=4)  # raises if cut
            assert (sweep / "logs" / f"{path.stem}.log").is_file()


def one_sentence(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert lines[-1].startswith("Error: "), stderr[-3000:]
    return lines[-1]


def test_a_disk_that_fills_mid_sweep_stops_it_in_one_sentence_and_resume_finishes(
    small_disk, tmp_path, fixture_models
):
    data = (
        small_disk("200k") / "data"
    )  # the check passes (8 x 24 kB), the notebooks, logs, records and the repro body do not fit
    run = subprocess.run(
        [
            *CLI,
            "sweep",
            str(sweep_file(tmp_path, fixture_models)),
            "--data-dir",
            str(data),
            "--workers",
            "2",
            "--no-report",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 1, run.stderr[-3000:]
    sentence = one_sentence(run.stderr)
    sweep_id = next((data / "sweeps").iterdir()).name
    assert "no space left on its disk" in sentence and "KB free" in sentence
    assert (
        "of 8 models are stored" in sentence
        and f"model-support sweep --resume {sweep_id}" in sentence
    )
    whole_notebooks(data)
    assert not leftovers(data)
    stored = len(list((data / "sweeps" / sweep_id / "records").glob("*.json")))
    assert stored < len(MODELS)

    small_disk.resize(data.parent, "20m")  # make room
    resumed = subprocess.run(
        [*CLI, "sweep", "--resume", sweep_id, "--data-dir", str(data), "--no-report"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    records = list((data / "sweeps" / sweep_id / "records").glob("*.json"))
    assert len(records) == len(MODELS)
    whole_notebooks(data)
    assert len(list((data / "sweeps" / sweep_id / "notebooks").glob("*.ipynb"))) == len(MODELS)
    rows = store.scan(data).collect()
    # each exactly once
    assert rows.height == len(MODELS) and rows["model_id"].n_unique() == len(MODELS)
    assert set(rows["status"]) == {"PASS"}, (
        rows.filter(rows["status"] != "PASS")
        .select("model_id", "status", "error_type", "error_message")
        .rows()
    )
    assert not leftovers(data)


def test_a_disk_clearly_too_small_is_refused_before_anything_runs(
    small_disk, tmp_path, fixture_models
):
    data = small_disk("64k") / "data"
    run = subprocess.run(
        [*CLI, "sweep", str(sweep_file(tmp_path, fixture_models)), "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1
    sentence = one_sentence(run.stderr)
    assert "clearly too little for this sweep" in sentence and "and the report" in sentence
    assert not data.exists() or not any(data.iterdir())


def test_the_room_check_counts_every_variant_of_the_matrix(small_disk, tmp_path, fixture_models):
    """One model in 8 variants writes 8 notebooks, logs and records: 64 KB holds one model's (24
    kB), not eight."""
    data = small_disk("64k") / "data"
    path = tmp_path / "matrix.yaml"
    matrix = {
        "mode": ["eager", "compile"],
        "cache": ["dynamic", "static"],
        "max_new_tokens": [8, 16],
    }
    path.write_text(
        yaml.safe_dump(
            {
                "name": "matrix",
                "probe": {"device": "cpu", "reference": "none"},
                "models": [fixture_models["tiny-llama"]["path"]],
                "matrix": matrix,
            }
        )
    )
    run = subprocess.run(
        [*CLI, "sweep", str(path), "--data-dir", str(data), "--no-report"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1
    sentence = one_sentence(run.stderr)
    assert (
        "clearly too little for this sweep" in sentence
        and "8 probes' notebooks, logs and records" in sentence
    )
    assert not data.exists() or not any(data.iterdir())


def test_compaction_and_the_card_on_a_full_disk_leave_no_temp_file(small_disk):
    """The Parquet compaction and the dataset card fail loudly on a full disk and leave nothing
    behind."""
    data = small_disk("512k") / "data"
    SweepMeta(
        sweep_id="s",
        name="s",
        created_at="2026-12-01T00:00:00+00:00",
        probe={},
        models=[ModelEntry(f"org/m{i}") for i in range(20)],
    ).write(store.sweep_dir(data, "s"))
    for i in range(20):
        store.store_result(
            data,
            "s",
            schema.empty_record(
                sweep_id="s", model_id=f"org/m{i}", status="PASS", generated_text="x" * 2000
            ),
            None,
            "log\n",
        )
    before = store.compact(data, "s")
    assert before == (20, 0)
    parquet = store.parquet_file(data, "results", "s").read_bytes()
    ballast = data / "ballast"
    with open(ballast, "wb", buffering=0) as handle:  # fill the disk to the last block
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass
    for i in range(20, 40):  # the records are already there; more rows make a larger file
        try:
            store.store_result(
                data,
                "s",
                schema.empty_record(sweep_id="s", model_id=f"org/m{i}", status="PASS"),
                None,
                "",
            )
        except OSError:
            break
    with pytest.raises(OSError):
        store.compact(data, "s")
    assert not leftovers(data)
    # the old file is intact
    assert store.parquet_file(data, "results", "s").read_bytes() == parquet
    card = (data / "README.md").read_text()
    with pytest.raises(OSError):
        store.write_dataset_card(data)
    # the old card is intact
    assert not leftovers(data) and (data / "README.md").read_text() == card


def test_a_report_that_does_not_fit_says_the_data_is_safe_and_how_to_finish(
    small_disk, tmp_path, fixture_models
):
    data = small_disk("2m") / "data"
    names = MODELS[:4]
    run = subprocess.run(
        [
            *CLI,
            "sweep",
            str(sweep_file(tmp_path, fixture_models, names)),
            "--data-dir",
            str(data),
            "--workers",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 1, run.stderr[-3000:]
    sentence = one_sentence(run.stderr)
    sweep_id = next((data / "sweeps").iterdir()).name
    assert sentence.startswith(
        f"Error: Could not write the report of {sweep_id} (no space left on its disk"
    )
    assert (
        "records and Parquet files are complete" in sentence
        and f"model-support report {sweep_id}" in sentence
    )
    assert store.scan(data).collect().height == len(names)  # the data is safe
    whole_notebooks(data)
    assert not leftovers(data)
