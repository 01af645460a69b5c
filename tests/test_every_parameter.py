"""Every probe parameter declared in ``probe_params`` reaches the probe through the real notebook, and its
record says so: one papermill run with every parameter at a value that is not its default.

A parameter added to the declaration needs one line in ``NON_DEFAULT`` (and, where the record shows its
effect in a field of its own, one in ``EFFECT``); the test fails until it has it.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers import REPO, run_notebook
from model_support.probe import phases, probe_params, repro

MODEL = REPO / "data" / "models" / "tiny-llama"  # a text model: asked for image-text-to-text, it must not PASS

#: Every declared parameter, at a value that is not its default (paths under the test's folder are set in the test).
NON_DEFAULT = {
    "model_id": "org/never-downloaded",  # a Hub id whose files the snapshot holds: nothing is fetched
    "revision": "main",
    "device": "cpu",
    "dtype": "float32",
    "task": "image-text-to-text",
    "prompt": "Say something.",
    "image_prompt": "What is drawn here?",
    "max_new_tokens": 3,
    "mode": "compile",
    "cache": "static",
    "devices": "auto",
    "device_memory_gb": 4.0,
    "chat_template": "none",
    "trust_remote_code": True,
    "reference": "none",
    "reference_max_params": 1000,
    "numerics_margin": 0.25,
    "numerics_bound": 0.05,
    "judge": False,
    "judge_model": "data/models/tiny-gpt2",
    "seed": 7,
    "record_path": "record.json",
    "sweep_id": "every-20261204T000000Z-abcd",
    "snapshot": str(MODEL),
    "notebook_path": "sweeps/every-20261204T000000Z-abcd/notebooks/org_never-downloaded.ipynb",
    "timeout_s": 600.0,
    "hub_facts": {"likes": 5, "pipeline_tag": "text-generation"},
    "checks": "after",  # the probe stops after its device phase; checks.ipynb runs its checks (as a sweep's host)
}

#: Where the record shows a parameter in a field of its own (or in what it did); every setting is also in the
#: record's ``repro_settings``, which the repro script runs with.
EFFECT = {
    "model_id": lambda r: r["model_id"] == "org/never-downloaded",
    "revision": lambda r: r["revision"] == "main",
    "device": lambda r: r["device_type"] == "cpu",
    "dtype": lambda r: r["dtype"] == "float32",
    # the task asked for, not the config's nor the Hub's (pipeline_tag text-generation): no text-generation PASS
    "task": lambda r: r["task"] == "image-text-to-text" and r["status"] != "PASS",
    "image_prompt": lambda r: r["prompt"] == "What is drawn here?",
    "max_new_tokens": lambda r: r["max_new_tokens"] == 3 and r["variant"] == "compile+static+3t",
    "mode": lambda r: r["mode"] == "compile",
    "cache": lambda r: r["cache"] == "static",
    "devices": lambda r: r["memory_estimate_bytes"] is not None,  # planned: only for devices other than 1
    "trust_remote_code": lambda r: r["trust_remote_code"] is True,
    "reference": lambda r: r["reference_note"] == "attribution switched off (reference='none')",
    "seed": lambda r: r["seed"] == 7,
    "sweep_id": lambda r: r["sweep_id"] == NON_DEFAULT["sweep_id"],
    "snapshot": lambda r: r["model_type"] == "llama",  # loaded from the snapshot's config
    "notebook_path": lambda r: r["notebook_path"] == NON_DEFAULT["notebook_path"],
    "hub_facts": lambda r: r["likes"] == 5 and r["pipeline_tag"] == "text-generation",
}


def test_every_declared_parameter_reaches_the_record(tmp_path):
    declared = {p.name: p.default for p in probe_params.PROBE_PARAMS}
    assert set(NON_DEFAULT) == set(declared), "give each declared parameter a non-default value here"
    assert set(EFFECT) <= set(declared)
    assert all(NON_DEFAULT[name] != default for name, default in declared.items())
    values = {**NON_DEFAULT, "record_path": str(tmp_path / NON_DEFAULT["record_path"])}
    run_notebook("probe.ipynb", tmp_path / "out.ipynb", **values)
    record = json.loads(Path(values["record_path"]).read_text())  # record_path: written where it said
    assert record["reference_note"] == phases.PENDING  # checks "after": the device phase ends the probe ...
    state = tmp_path / phases.STATE_FILE
    run_notebook("checks.ipynb", tmp_path / "checks.ipynb", checks_state=str(state), record_path=values["record_path"])
    record = json.loads(Path(values["record_path"]).read_text())  # ... and the host's checks finish its record
    settings = json.loads(record["repro_settings"])
    assert set(settings) == set(repro.SETTING_NAMES)
    for name in probe_params.SETTINGS:
        assert settings[name] == NON_DEFAULT[name], name
    missed = [name for name, reflected in EFFECT.items() if not reflected(record)]
    assert not missed, {name: record.get(name) for name in missed}
