"""Sweep definitions are validated before anything runs: one sentence naming the problem."""

from pathlib import Path

import pytest
import yaml

from model_support import params
from model_support.params import SweepConfigError

REPO = Path(__file__).resolve().parents[1]


def refuse(raw) -> str:
    with pytest.raises(SweepConfigError) as info:
        params.parse(raw, source="t.yaml", base=REPO)
    message = str(info.value)
    assert "\n" not in message and message.endswith(".")
    return message


def test_unknown_top_level_key_is_named_with_accepted_keys():
    message = refuse({"name": "x", "modles": ["a"]})
    assert "'modles'" in message and "models" in message and "workers" in message


def test_probe_setting_not_declared_by_the_notebook_is_refused():
    message = refuse({"name": "x", "models": ["a"], "probe": {"max_new_tokenz": 3}})
    assert "'max_new_tokenz'" in message and "notebooks/probe.ipynb" in message
    assert "max_new_tokens" in message  # the accepted names are listed


def test_wrong_types_are_refused():
    assert "'max_new_tokens' must be int" in refuse({"name": "x", "models": ["a"], "probe": {"max_new_tokens": "8"}})
    assert "must be bool" in refuse({"name": "x", "models": ["a"], "probe": {"trust_remote_code": "yes"}})
    assert "'workers' must be int" in refuse({"name": "x", "models": ["a"], "workers": 1.5})
    assert "'timeout_s' must be int or float" in refuse({"name": "x", "models": ["a"], "timeout_s": True})


def test_per_model_overrides_are_checked_and_runner_owned_parameters_refused():
    assert "'dtypo'" in refuse({"name": "x", "models": [{"id": "a", "overrides": {"dtypo": "x"}}]})
    assert "set by the sweep runner" in refuse({"name": "x", "models": ["a"], "probe": {"record_path": "r.json"}})


def test_other_mistakes():
    assert "'name' is missing" in refuse({"models": ["a"]})
    assert "listed twice" in refuse({"name": "x", "models": ["a", "a"]})
    assert "no models" in refuse({"name": "x", "models": []})
    assert "executor" in refuse({"name": "x", "models": ["a"], "executor": "slurm"})
    assert "needs both" in refuse({"name": "x", "models": ["a"], "exclude": [{"id": "b"}]})


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(SweepConfigError, match="does not exist"):
        params.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SweepConfigError, match="not valid YAML"):
        params.load(bad)


def test_hub_rankings_offline_say_so(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    message = refuse({"name": "x", "models_from_hub": {"task": "text-generation", "sort": "trending", "limit": 5}})
    assert "no Hub access" in message


def test_exclusions_and_local_paths():
    parsed = params.parse(
        {"name": "x", "models": ["notebooks", {"id": "b", "exclude": "not a text model"}], "exclude": [{"id": "c", "reason": "too large"}]},
        source="t.yaml", base=REPO,
    )
    assert [m.model_id for m in parsed.models] == [str(REPO / "notebooks")]  # an existing folder becomes absolute
    assert parsed.excluded == {"b": "not a text model", "c": "too large"}


@pytest.mark.parametrize("path", sorted((REPO / "params").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_params_file_is_valid(path, monkeypatch):
    """Consistency: every params file's keys exist in the notebook's parameters."""
    monkeypatch.chdir(REPO)
    raw = yaml.safe_load(path.read_text())
    raw.pop("models_from_hub", None)  # needs network
    parsed = params.parse(raw, source=path.name, base=REPO)
    assert parsed.models
