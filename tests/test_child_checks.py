"""The short-lived child processes the sweep asks before it starts (a device's facts, whether
torchvision imports): one that does not answer in time is one sentence, never a traceback."""

from __future__ import annotations

import importlib
import os
import uuid

import pytest

from model_support.probe import devices
from model_support.sweep import definition

#: The module (the package exports its function ``resolve`` under the same name).
resolve = importlib.import_module("model_support.probe.devices.resolve")


def test_a_device_check_that_does_not_answer_is_one_sentence(monkeypatch):
    # no python child starts and answers in 10 ms
    monkeypatch.setattr(resolve, "FACTS_TIMEOUT_S", 0.01)
    # facts are cached per environment
    monkeypatch.setenv("MODEL_SUPPORT_TEST_NONCE", uuid.uuid4().hex)
    facts = devices.facts("gpu")
    assert (facts.type, facts.count, facts.memory_bytes) == ("gpu", 0, None)
    assert facts.problem.startswith(
        "Device 'gpu' could not be checked: asking it for its kind, count and memory"
    )
    assert "did not answer within 0.01 s" in facts.problem
    # what the sweep refuses with, before any model
    assert devices.check_available("gpu") == facts.problem


def _torchvision(tmp_path, monkeypatch, source: str) -> None:
    """A torchvision package whose ``__init__`` is ``source``, installed here (``find_spec`` sees
    it) and in the check's child (PYTHONPATH)."""
    site = tmp_path / "site"
    (site / "torchvision").mkdir(parents=True)
    (site / "torchvision" / "__init__.py").write_text(source)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", f"{site}:{os.environ.get('PYTHONPATH', '')}")


def test_a_torchvision_import_that_hangs_stops_the_sweep_in_one_sentence(tmp_path, monkeypatch):
    _torchvision(tmp_path, monkeypatch, "import time\ntime.sleep(3600)\n")
    monkeypatch.setattr(definition, "VISION_CHECK_TIMEOUT_S", 3.0)
    with pytest.raises(definition.SweepConfigError) as refused:
        definition.check_vision()
    assert str(refused.value).startswith(
        "This environment cannot probe models: importing torchvision did not finish within 3 s"
    )
    assert "pip uninstall torchvision" in str(refused.value)


def test_a_torchvision_that_imports_lets_the_sweep_start(tmp_path, monkeypatch):
    """The check's child itself must run: a torchvision that imports (here one that does nothing
    else) passes, where a child that could not import the check refused every sweep (review,
    2026-12-08: its code named the function's old module)."""
    _torchvision(tmp_path, monkeypatch, "")
    definition.check_vision()  # no SweepConfigError
