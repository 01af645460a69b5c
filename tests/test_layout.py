"""The package's rooms as `.importlinter` declares them (docs/design.md, "Layout")."""

from __future__ import annotations

import configparser
import pkgutil
from pathlib import Path

import model_support
import model_support.probe
from model_support.probe import repro

REPO = Path(__file__).resolve().parents[1]
#: The modules whose source is every repro script's body (``repro.BODY_MODULES``).
REPRO_BODY = {module.__name__ for module in repro.BODY_MODULES}


def _contracts() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(REPO / ".importlinter")
    return config


def _listed(config, section: str, key: str) -> set[str]:
    return {line.strip() for line in config[section][key].splitlines() if line.strip()}


def test_the_repro_body_is_forbidden_every_other_room_and_probe_module():
    """A new room or probe module must be added to the forbidden contract, or the repro body
    could import it."""
    config = _contracts()
    assert _listed(config, "importlinter:contract:repro-body", "source_modules") == REPRO_BODY
    rooms = {
        f"model_support.{m.name}"
        for m in pkgutil.iter_modules(model_support.__path__)
        if m.name != "notebooks"
    }
    probe_modules = {
        f"model_support.probe.{m.name}" for m in pkgutil.iter_modules(model_support.probe.__path__)
    }
    expected = (rooms - {"model_support.probe"}) | (probe_modules - REPRO_BODY)
    assert _listed(config, "importlinter:contract:repro-body", "forbidden_modules") == expected


def test_every_room_is_in_the_layers():
    config = _contracts()
    layered = set()
    for line in _listed(config, "importlinter:contract:layers", "layers"):
        layered.update(part.strip() for part in line.replace("|", ":").split(":"))
    rooms = {
        f"model_support.{m.name}"
        for m in pkgutil.iter_modules(model_support.__path__)
        if m.name != "notebooks"
    }
    assert rooms == layered
