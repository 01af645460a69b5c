"""Every probe parameter declared in ``probe_params`` reaches the probe through the real notebook,
and its record says so: one papermill run with every parameter at a value that is not its default.

A parameter added to the declaration needs one line in ``NON_DEFAULT`` (and, where the record shows
its effect in a field of its own, one in ``EFFECT``); the test fails until it has it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import REPO, run_notebook
from model_support.probe import phases, probe_params, repro

# a text model: asked for image-text-to-text, it must not PASS
MODEL = REPO / "data" / "models" / "tiny-llama"

#: Every declared parameter, at a value that is not its default (paths under the test's folder are
#: set in the test).
NON_DEFAULT = {
    # a Hub id whose files the snapshot holds: nothing is fetched
    "model_id": "org/never-downloaded",
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
    # the task asked (image-text-to-text) is no PASS of tiny-llama: no long text (test_long_text.py)
    "long_text": "on",
    "long_text_tokens": 32,
    "judge": False,
    "judge_model": "data/models/tiny-gpt2",
    "seed": 7,
    "perf": "off",
    "perf_tokens": 6,
    "perf_repeats": 2,
    "perf_spread": 0.1,
    "perf_budget": 0.5,
    "perf_trace": True,  # perf off: nothing profiled (tests/test_perf_trace.py keeps a trace)
    "recompile_check": "on",
    # on the CPU, the host itself: nothing put there, and still a what-if run, kept apart
    "host_ops": "missing",
    # compile mode: no census either way (tests/test_census_sampled.py: sampled, full and off)
    "census": "full",
    "flight_recorder": "on",  # the CPU: no recorder (tests/test_instruments.py)
    "host_cost": "off",
    "record_path": "record.json",
    "sweep_id": "every-20261204T000000Z-abcd",
    "snapshot": str(MODEL),
    "notebook_path": "sweeps/every-20261204T000000Z-abcd/notebooks/org_never-downloaded.ipynb",
    "timeout_s": 600.0,
    "hub_facts": {"likes": 5, "pipeline_tag": "text-generation"},
    "stack_name": "no-rsqrt",
    # the probe stops after its device phase; checks.ipynb runs its checks (as a sweep's host)
    "checks": "after",
}

#: Where the record shows a parameter in a field of its own (or in what it did); every setting is
#: also in the record's ``repro_settings``, which the repro script runs with.
EFFECT = {
    "model_id": lambda r: r["model_id"] == "org/never-downloaded",
    "revision": lambda r: r["revision"] == "main",
    "device": lambda r: r["device_type"] == "cpu",
    "dtype": lambda r: r["dtype"] == "float32",
    # the task asked for, not the config's nor the Hub's (pipeline_tag text-generation): no
    # text-generation PASS
    "task": lambda r: r["task"] == "image-text-to-text" and r["status"] != "PASS",
    "image_prompt": lambda r: r["prompt"] == "What is drawn here?",
    "max_new_tokens": lambda r: (
        r["max_new_tokens"] == 3 and r["variant"] == "compile+static+3t@no-rsqrt"
    ),
    "stack_name": lambda r: r["stack_name"] == "no-rsqrt",  # and the variant's "@no-rsqrt"
    "mode": lambda r: r["mode"] == "compile",
    "cache": lambda r: r["cache"] == "static",
    # planned: only for devices other than 1
    "devices": lambda r: r["memory_estimate_bytes"] is not None,
    "trust_remote_code": lambda r: r["trust_remote_code"] is True,
    "reference": lambda r: r["reference_note"] == "attribution switched off (reference='none')",
    "seed": lambda r: r["seed"] == 7,
    "perf": lambda r: r["perf_note"] == "not measured: perf=off",
    "sweep_id": lambda r: r["sweep_id"] == NON_DEFAULT["sweep_id"],
    "snapshot": lambda r: r["model_type"] == "llama",  # loaded from the snapshot's config
    "notebook_path": lambda r: r["notebook_path"] == NON_DEFAULT["notebook_path"],
    "hub_facts": lambda r: r["likes"] == 5 and r["pipeline_tag"] == "text-generation",
    "host_ops": lambda r: (
        r["what_if"] is True and r["host_ops"] == "missing" and r["host_ops_run"] == []
    ),
}


def test_every_declared_parameter_reaches_the_record(tmp_path):
    declared = {p.name: p.default for p in probe_params.PROBE_PARAMS}
    assert set(NON_DEFAULT) == set(declared), (
        "give each declared parameter a non-default value here"
    )
    assert set(EFFECT) <= set(declared)
    assert all(NON_DEFAULT[name] != default for name, default in declared.items())
    values = {**NON_DEFAULT, "record_path": str(tmp_path / NON_DEFAULT["record_path"])}
    run_notebook("probe.ipynb", tmp_path / "out.ipynb", **values)
    # record_path: written where it said
    record = json.loads(Path(values["record_path"]).read_text())
    # checks "after": the device phase ends the probe ...
    assert record["reference_note"] == phases.PENDING
    state = tmp_path / phases.STATE_FILE
    run_notebook(
        "checks.ipynb",
        tmp_path / "checks.ipynb",
        checks_state=str(state),
        record_path=values["record_path"],
    )
    # ... and the host's checks finish its record
    record = json.loads(Path(values["record_path"]).read_text())
    settings = json.loads(record["repro_settings"])
    assert set(settings) == set(repro.SETTING_NAMES)
    for name in probe_params.SETTINGS:
        assert settings[name] == NON_DEFAULT[name], name
    missed = [name for name, reflected in EFFECT.items() if not reflected(record)]
    assert not missed, {name: record.get(name) for name in missed}


# -------------------------------------------------------------------------------------------- bad
# input, refused by the notebook's first cell before anything runs: papermill fails, no record is
# written


def refused(tmp_path: Path, **parameters):
    """The probe notebook run with ``parameters`` (and a record_path): papermill's error, after
    checking that no record (nor the record's early repro script) was written."""
    import papermill

    record_path = tmp_path / "record.json"
    with pytest.raises(papermill.PapermillExecutionError) as info:
        run_notebook(
            "probe.ipynb",
            tmp_path / "out.ipynb",
            model_id=str(MODEL),
            record_path=str(record_path),
            **parameters,
        )
    assert not list(tmp_path.glob("record*")), list(tmp_path.iterdir())
    return info.value


def test_a_mistyped_parameter_is_refused_with_what_it_accepts(tmp_path):
    """``-p devcie cpu`` ran the default device (papermill only warns of the name) and ``-p dtype
    float99`` wrote a FAIL(other) record: each mistake is now one sentence, the closest declared
    name or what is accepted."""
    error = refused(
        tmp_path, devcie="cpu", dtype="float99", numerics_margin=float("nan"), max_new_tokens="8"
    )
    assert error.ename == "ParameterError"
    assert error.evalue.splitlines() == [
        "4 mistakes in the parameters of notebooks/probe.ipynb:",
        "'devcie' is not a parameter of notebooks/probe.ipynb; did you mean 'device'?",
        "dtype='float99' is not accepted; use one of bfloat16, float16, float32, float64, "
        "half, float, double.",
        "probe parameter 'max_new_tokens' must be an integer >= 1, not str '8'.",
        "numerics_margin=nan is not a finite number; use a number >= 0.",
    ]


def test_a_typo_in_the_backends_configuration_is_refused_not_a_verdict(tmp_path, monkeypatch):
    """A backend that does not start with its configuration (a typo in MODEL_SUPPORT_PRETEND; a
    bad LIBTPU_INIT_ARGS alike) was a FAIL(other) record at stage runner: the user's typo as a
    verdict."""
    # every key it accepts, as the sentence lists them
    from model_support_pretend.config import KEYS

    monkeypatch.setenv("MODEL_SUPPORT_PRETEND", '{"devcies": 2}')
    error = refused(tmp_path, device="pretend")
    assert error.ename == "BackendConfigError"
    assert error.evalue == (
        "The pretend backend does not start with the configuration MODEL_SUPPORT_PRETEND sets "
        "here (PretendConfigError: MODEL_SUPPORT_PRETEND: unknown key(s) devcies; accepted: "
        f"{', '.join(KEYS)}); fix MODEL_SUPPORT_PRETEND, or unset it, and run again."
    )
    from model_support.probe.devices import misconfigured

    with pytest.raises(
        misconfigured.BackendConfigError, match="The pretend backend does not start"
    ):
        # auto skipped a backend that failed: the CPU instead, silently
        misconfigured.refuse("auto")
    monkeypatch.delenv("MODEL_SUPPORT_PRETEND")
    # not configured: the device is not here, which the probe records (design)
    misconfigured.refuse("pretend")
