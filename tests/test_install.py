"""The package works installed, not only from this checkout: a wheel built from the repo, installed
(non-editable) into a fresh venv outside it, runs a probe and a two-model sweep from another folder.

The fresh venv reuses the project venv's third-party packages through a ``.pth`` line (installing
torch and the rest again would take minutes and prove nothing about this package); the editable
install of the checkout is not visible there (its finder hook lives in a ``.pth`` file of the
project venv, and ``.pth`` files of a directory added that way are not run). The test checks that
``model_support`` really comes from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """This package's wheel, built from the checkout's tracked and unignored files."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in files:
        path = REPO / name
        if path.is_file() and not path.is_symlink():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(root / "dist"),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return next((root / "dist").glob("model_support-*.whl"))


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv with this package's wheel installed; returns its python."""
    root = tmp_path_factory.mktemp("install")
    venv = root / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "project-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "-q",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return python


def test_the_wheel_holds_no_test_code_and_registers_no_torch_backend(wheel):
    """The pretend accelerator and the fixture builders are test code (pretend/,
    tests/fixtures/): a user's install of model-support carries none of it and hooks nothing into
    torch's backend autoload."""
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(
            (archive.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt")),
            "",
        )
    assert any(n.startswith("model_support/probe/") for n in names)  # it is the package
    test_code = [n for n in names if "pretend" in n or "/testing/" in n or "fixtures" in n]
    assert test_code == []
    assert "torch.backends" not in entry_points and "pretend" not in entry_points, entry_points
    assert "[console_scripts]" in entry_points and "model-support" in entry_points


def test_each_dependency_is_where_it_is_used(wheel):
    """``datasets`` (the tests read the dataset back with it; the package never imports it) and
    ``uv`` (only the bisect builds environments with it) are extras, not what every user
    installs."""
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        metadata = next(
            archive.read(n).decode()
            for n in archive.namelist()
            if n.endswith(".dist-info/METADATA")
        )
    required = [
        line
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    names = {
        line.split(":", 1)[1]
        .strip()
        .split(";")[0]
        .split("[")[0]
        .split(">")[0]
        .split("=")[0]
        .strip()
        for line in required
    }
    assert "datasets" not in names and "uv" not in names, sorted(names)
    assert any("uv" in line and 'extra == "bisect"' in line for line in metadata.splitlines())
    import ast

    source = Path(__file__).resolve().parents[1] / "src" / "model_support"
    imported = {
        (alias.name if isinstance(node, ast.Import) else node.module or "").split(".")[0]
        for path in source.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    # (uv is imported by the bisect only, guarded: pip where it is absent)
    assert "datasets" not in imported


def run(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{python.parent}:{os.environ['PATH']}"}
    return subprocess.run(
        [str(python), *args], cwd=cwd, capture_output=True, text=True, timeout=900, env=env
    )


@pytest.mark.slow
def test_the_wheel_ships_its_notebooks_and_runs_a_probe_and_a_sweep_elsewhere(
    installed, fixture_models, tmp_path
):
    where = run(
        installed,
        "-c",
        "import model_support, model_support.paths as p; print(model_support.__file__); "
        "print(p.notebook('probe')); print(p.template('explorer.js'))",
        cwd=tmp_path,
    )
    assert where.returncode == 0, where.stderr
    module, notebook, template = where.stdout.split()
    # the wheel, not the checkout
    assert str(installed.parent.parent) in module and str(REPO) not in module
    assert Path(notebook).is_file() and Path(template).is_file()

    record_path = tmp_path / "r.json"
    probe = run(
        installed,
        "-m",
        "papermill",
        notebook,
        str(tmp_path / "out.ipynb"),
        "-p",
        "model_id",
        fixture_models["tiny-llama"]["path"],
        "-p",
        "device",
        "cpu",
        "-p",
        "reference",
        "none",
        "-p",
        "record_path",
        str(record_path),
        cwd=tmp_path,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    record = json.loads(record_path.read_text())
    assert (record["status"], record["model_id"]) == ("PASS", "local:tiny-llama")
    assert record["versions"]["git_commit"] is None  # not a checkout: no commit to claim

    definition = tmp_path / "two.yaml"
    definition.write_text(
        yaml.safe_dump(
            {
                "name": "two",
                "probe": {"device": "cpu", "reference": "none"},
                "models": [
                    fixture_models[n]["path"] for n in ("tiny-gpt2", "fail-missing-weights")
                ],
            }
        )
    )
    sweep = run(
        installed,
        "-m",
        "model_support.cli",
        "sweep",
        str(definition),
        "--data-dir",
        "data",
        "--no-report",
        cwd=tmp_path,
    )
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    records = [
        json.loads(p.read_text()) for p in (tmp_path / "data" / "sweeps").glob("*/records/*.json")
    ]
    assert sorted((r["model_id"], r["status"]) for r in records) == [
        ("local:fail-missing-weights", "FAIL(load)"),
        ("local:tiny-gpt2", "PASS"),
    ]
