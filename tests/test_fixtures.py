"""The offline fixtures: every one described in the manifest, built once, broken where it should be.

Fast checks on the built folders only; whether each fixture really gets its expected verdict is
the probe's and the smoke sweep's business (they run the probe on every fixture).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# The package lives under src/ and is not installed in every checkout; make it importable here.

from fixtures import build as fixtures  # noqa: E402
from fixtures.vlm_fixtures import VLM_ARCHS  # noqa: E402
from model_support.record.schema import PASS, STAGES, VERDICTS  # noqa: E402

TINY_PASS_MAX_BYTES = 5 * 2**20


@pytest.fixture(scope="module")
def manifest(fixture_models) -> dict:
    """The whole manifest.json, after the session's ``fixture_models`` has built (or reused)
    them."""
    return fixtures.load_manifest(fixtures.default_models_dir())


def tiny_pass(manifest: dict) -> dict:
    """The tiny text-generation models that PASS (the vision-language ones: tests/test_tasks.py)."""
    return {
        name: entry
        for name, entry in manifest["fixtures"].items()
        if name.startswith("tiny-") and entry["expect"]["status"] == PASS and name not in VLM_ARCHS
    }


def test_manifest_lists_every_fixture_with_a_valid_expectation(manifest):
    assert manifest["version"] == fixtures.FIXTURES_VERSION
    assert list(manifest["fixtures"]) == fixtures.FIXTURE_NAMES
    for name, entry in manifest["fixtures"].items():
        expect = entry["expect"]
        assert Path(entry["path"]).is_absolute() and Path(entry["path"]).name == name
        assert (Path(entry["path"]) / ".complete").is_file(), name
        # its processor needs a package this environment lacks: no verdict expected
        if expect["excluded"]:
            assert expect["status"] is None and set(expect["excluded"]) <= {
                "torchvision",
                "num2words",
            }, name
            continue
        assert expect["status"] in VERDICTS, name
        assert (expect["failure_stage"] is None) == (expect["status"] == PASS), name
        assert expect["failure_stage"] is None or expect["failure_stage"] in STAGES, name
        assert (expect["tokens_out"] is not None) == (expect["status"] == PASS), name
        assert isinstance(entry["overrides"], dict) and entry["purpose"].strip(), name
    by_name = manifest["fixtures"]
    assert by_name["tiny-eos-early"]["expect"]["tokens_out"] < fixtures.MAX_NEW_TOKENS
    assert (
        by_name["fail-short-positions"]["fail_seq_len"]
        == by_name["fail-short-positions"]["n_positions"] + 1
    )
    assert 0 < by_name["fail-short-positions"]["fail_step"] < fixtures.MAX_NEW_TOKENS
    assert by_name["diverge-bf16-overflow"]["diverging_module"] == "model.layers.0.mlp.gate_proj"
    overflow = by_name["diverge-bf16-overflow"]
    # bf16 really diverges from float32
    assert overflow["expected_token_ids"] != overflow["reference_token_ids"]
    assert by_name["fail-hang"]["timeout_s"] == 20
    for name in ("fail-kernel-death", "fail-hang"):
        assert by_name[name]["overrides"] == {"trust_remote_code": True}


def test_tiny_pass_models_cover_at_least_eight_architectures(manifest):
    model_types = {
        json.loads((Path(entry["path"]) / "config.json").read_text())["model_type"]
        for entry in tiny_pass(manifest).values()
    }
    assert {"llama", "mistral", "qwen2", "gpt2", "gpt_neox", "opt", "phi3", "gemma"} <= model_types
    assert len(model_types) >= 8


def test_tiny_pass_folders_are_a_few_mb_of_safetensors(manifest):
    for name, entry in tiny_pass(manifest).items():
        folder = Path(entry["path"])
        assert (folder / "model.safetensors").is_file(), name
        assert fixtures.folder_size(folder) < TINY_PASS_MAX_BYTES, name
        if name in fixtures.TINY_ARCHS:  # tiny-eos-early stops early on purpose
            assert entry["expect"]["tokens_out"] == fixtures.MAX_NEW_TOKENS, name


def test_some_tiny_models_have_a_chat_template_and_others_none(manifest):
    with_template = {
        name
        for name, entry in tiny_pass(manifest).items()
        if (Path(entry["path"]) / "chat_template.jinja").is_file()
        or "chat_template"
        in json.loads((Path(entry["path"]) / "tokenizer_config.json").read_text())
    }
    assert set(fixtures.CHAT_TINY) == with_template


def test_remote_code_never_ran(manifest):
    entry = manifest["fixtures"]["fail-remote-code"]
    marker = Path(entry["marker"])
    assert marker.parent == Path(entry["path"]) and marker.name == "REMOTE_CODE_RAN"
    assert str(marker) in (marker.parent / "configuration_remote_code.py").read_text()
    assert not marker.exists(), (
        "the fixture's custom code ran: something loaded it with trust_remote_code"
    )


def test_truncated_safetensors_is_shorter_than_its_header_claims(manifest):
    entry = manifest["fixtures"]["fail-truncated-safetensors"]
    weights = Path(entry["path"]) / "model.safetensors"
    with open(weights, "rb") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(header_len))
    claimed = (
        8 + header_len + max(t["data_offsets"][1] for k, t in header.items() if k != "__metadata__")
    )
    assert claimed == entry["full_size"]
    assert weights.stat().st_size < claimed


def test_missing_weights_fixture_has_config_but_no_weights(manifest):
    folder = Path(manifest["fixtures"]["fail-missing-weights"]["path"])
    assert (folder / "config.json").is_file()
    assert not list(folder.glob("*.safetensors")) and not list(folder.glob("*.bin"))


def test_a_second_build_rebuilds_nothing(manifest, capsys):
    """Every fixture says cached and no completion marker is touched: nothing was built again."""
    models_dir = fixtures.default_models_dir()
    markers = {
        name: (Path(e["path"]) / ".complete").stat().st_mtime_ns
        for name, e in manifest["fixtures"].items()
    }
    again = fixtures.build_fixtures(models_dir)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(fixtures.FIXTURE_NAMES) and all(
        line.endswith(" cached") for line in lines
    ), lines
    assert again == manifest
    assert markers == {
        n: (Path(e["path"]) / ".complete").stat().st_mtime_ns for n, e in again["fixtures"].items()
    }


def test_cli_on_a_built_folder_reports_everything_cached(manifest):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), str(REPO_ROOT / "tests")]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "fixtures.build", "--dir", str(fixtures.default_models_dir())],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [(line.split()[0], line.split()[-1]) for line in lines] == [
        (n, "cached") for n in fixtures.FIXTURE_NAMES
    ]


def test_models_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(fixtures.ENV_MODELS_DIR, str(tmp_path))
    assert fixtures.default_models_dir() == tmp_path
    monkeypatch.delenv(fixtures.ENV_MODELS_DIR)
    assert fixtures.default_models_dir() == REPO_ROOT / "data" / "models"
