"""Sweep definitions are validated before anything runs: one sentence naming the problem."""

import re
from pathlib import Path

import pytest
import yaml

from model_support.sweep import definition as params
from model_support.sweep.definition import SweepConfigError

REPO = Path(__file__).resolve().parents[1]


def refuse(raw) -> str:
    with pytest.raises(SweepConfigError) as info:
        params.parse(raw, source="t.yaml", base=REPO)
    message = str(info.value)
    # one sentence ("did you mean 'x'?")
    assert "\n" not in message and message.endswith((".", "?"))
    return message


def test_unknown_top_level_key_is_named_with_accepted_keys():
    message = refuse({"name": "x", "modles": ["a"]})
    assert "'modles'" in message and "models" in message and "workers" in message


def test_probe_setting_not_declared_by_the_notebook_is_refused():
    message = refuse({"name": "x", "models": ["a"], "probe": {"max_new_tokenz": 3}})
    assert "'max_new_tokenz'" in message and "notebooks/probe.ipynb" in message
    assert "max_new_tokens" in message  # the accepted names are listed


def test_wrong_types_are_refused():
    assert "'max_new_tokens' must be an integer >= 1, not str '8'" in refuse(
        {"name": "x", "models": ["a"], "probe": {"max_new_tokens": "8"}}
    )
    assert "must be true or false" in refuse(
        {"name": "x", "models": ["a"], "probe": {"trust_remote_code": "yes"}}
    )
    assert "workers must be a whole number of at least 1, not float 1.5" in refuse(
        {"name": "x", "models": ["a"], "workers": 1.5}
    )
    assert "timeout_s must be a number of seconds greater than 0, not bool True" in refuse(
        {"name": "x", "models": ["a"], "timeout_s": True}
    )


def test_per_model_overrides_are_checked_and_runner_owned_parameters_refused():
    assert "'dtypo'" in refuse({"name": "x", "models": [{"id": "a", "overrides": {"dtypo": "x"}}]})
    assert "set by the sweep runner" in refuse(
        {"name": "x", "models": ["a"], "probe": {"record_path": "r.json"}}
    )


def test_other_mistakes():
    assert "'name' is missing" in refuse({"models": ["a"]})
    # ids starting with - (read as an option) or . (hidden)
    for unresumable in ("", "-x", "//", ".hidden"):
        message = refuse({"name": unresumable, "models": ["a"]})
        assert f"name {unresumable!r} cannot name a sweep" in message and "`--resume`" in message
    assert "listed twice" in refuse({"name": "x", "models": ["a", "a"]})
    assert "no models" in refuse({"name": "x", "models": []})
    assert "executor" in refuse({"name": "x", "models": ["a"], "executor": "slurm"})
    assert "needs both" in refuse({"name": "x", "models": ["a"], "exclude": [{"id": "b"}]})


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(SweepConfigError, match="does not exist"):
        params.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nprobe:\n  dtype: float32\n   device: cpu\n")
    with pytest.raises(
        SweepConfigError,
        match=r"bad.yaml, line 4, column 10: not valid YAML: mapping values are not",
    ):
        params.load(bad)


def refuse_file(tmp_path, text: str) -> list[str]:
    """``definition.load`` of a file holding ``text``: its mistakes, one line each (the file
    named on each)."""
    path = tmp_path / "d.yaml"
    path.write_text(text)
    with pytest.raises(SweepConfigError) as info:
        params.load(path, check_device=False)
    lines = str(info.value).splitlines()
    mistakes = lines[1:] if len(lines) > 1 else lines
    assert len(lines) == 1 or lines[0] == f"{len(mistakes)} mistakes in {path}:"
    assert all(
        line.startswith(f"{path}, line ") and line.endswith((".", "?")) for line in mistakes
    ), lines
    return [line.removeprefix(f"{path}, ") for line in mistakes]


def test_every_mistake_of_a_definition_is_listed_with_its_line(tmp_path):
    """Three mistakes, three sentences in the file's order, each with its line; an unknown key
    with the closest known one on every path (the sweep's keys as the probe's)."""
    assert refuse_file(
        tmp_path,
        "name: x\nprobe:\n  dtype: float99\n  devcie: cpu\nmodels:\n  - " + TINY + "\nworkres: 2\n",
    ) == [
        "line 3: probe: dtype='float99' is not accepted; use one of bfloat16, float16, "
        "float32, float64, half, float, double.",
        "line 4: probe: 'devcie' is not a parameter of notebooks/probe.ipynb; did you mean "
        "'device'?",
        "line 7: unknown key 'workres' (did you mean 'workers'?); accepted keys are name, "
        "description, models, exclude, probe, timeout_s, workers, executor, models_from_hub, "
        "cache, prefetch, matrix, stacks, expect, reruns.",
    ]
    nested = (
        "name: x\ncache: {max_bg: 3}\nmodels_from_hub: {sortt: likes}\nexclude: "
        "[{id: a, reasons: b}]\nmodels:\n  - {id: "
        + TINY
        + ", overides: {}}\n  - {id: "
        + TINY
        + ", overrides: {seeds: 1}}\n"
        "matrix: {modes: [eager]}\n"
    )
    assert refuse_file(tmp_path, nested) == [
        "line 2: cache: unknown key 'max_bg' (did you mean 'max_gb'?); accepted keys are dir, "
        "max_gb, keep.",
        "line 3: models_from_hub: unknown key 'sortt' (did you mean 'sort'?); accepted keys "
        "are task, sort, limit.",
        "line 4: exclude[0]: 'reason' is missing; an exclusion needs both 'id' and 'reason'.",
        "line 4: exclude[0]: unknown key 'reasons' (did you mean 'reason'?); accepted keys "
        "are id, reason.",
        "line 6: models[0]: unknown key 'overides' (did you mean 'overrides'?); accepted keys "
        "are id, overrides, timeout_s, exclude.",
        "line 7: models[1].overrides: 'seeds' is not a parameter of notebooks/probe.ipynb; "
        "did you mean 'seed'?",
        "line 8: matrix: 'modes' cannot be a matrix axis; use mode, cache, max_new_tokens.",
    ]


def test_a_yaml_syntax_error_names_its_line_and_column(tmp_path):
    (mistake,) = refuse_file(tmp_path, "name: x\nprobe:\n  dtype: float32\n   device: cpu\n")
    assert mistake == "line 4, column 10: not valid YAML: mapping values are not allowed here."


def test_a_key_given_twice_is_refused_not_replaced(tmp_path):
    """YAML keeps the last of two equal keys: a second ``probe:`` would drop the first's
    settings, silently."""
    text = "name: x\nprobe:\n  dtype: float32\nmodels: [" + TINY + "]\nprobe:\n  device: cpu\n"
    assert refuse_file(tmp_path, text) == [
        "line 5: probe is given twice (first at line 2), and the second would replace the "
        "first; give it once."
    ]
    assert refuse_file(tmp_path, "name: x\nmodels:\n  - {id: a, timeout_s: 5, timeout_s: 6}\n") == [
        "line 3: models[0].timeout_s is given twice (first at line 3), and the second would "
        "replace the first; give it once."
    ]


def test_nan_and_inf_are_refused_wherever_a_number_is_asked(tmp_path):
    """``nan <= 0`` is false: a range check alone let ``.nan`` through as a timeout, a budget or
    a threshold."""
    text = (
        "name: x\ntimeout_s: .nan\ncache: {max_gb: .inf}\n"
        "probe: {numerics_margin: .nan, numerics_bound: .inf, device_memory_gb: .inf}\n"
        "models:\n  - {id: " + TINY + ", timeout_s: -.inf}\n"
    )
    assert refuse_file(tmp_path, text) == [
        "line 2: timeout_s must be a number of seconds greater than 0, not float nan.",
        "line 3: cache.max_gb must be a number of GB greater than 0, not float inf.",
        "line 4: probe: numerics_margin=nan is not a finite number; use a number >= 0.",
        "line 4: probe: numerics_bound=inf is not a finite number; use a number >= 0.",
        "line 4: probe: device_memory_gb=inf is not a finite number; use a number >= 0.",
        "line 6: models[0].timeout_s must be a number of seconds greater than 0, not float -inf.",
    ]


def test_a_record_is_checked_against_its_declaration_when_stored(tmp_path):
    """A wrongly typed field is refused where the record is stored, naming the field and what it
    holds; it used to be stored, and compaction failed on it with Arrow's "Expected bytes, got a
    'int' object" and no column."""
    from model_support.record import schema, store

    record = schema.empty_record(sweep_id="s", model_id="org/m", status="PASS", model_type=7)
    with pytest.raises(
        ValueError,
        match=r"^record of 'org/m': field model_type must be text \(string\), not int 7\.$",
    ):
        store.store_result(tmp_path, "s", record, None, "")
    assert not store.record_file(tmp_path, "s", "org/m", None).exists()
    for field, value, said in (
        ("tokens_in", True, "tokens_in must be an integer (int64), not bool True"),
        (
            "architectures",
            "LlamaForCausalLM",
            "architectures must be a list, not str 'LlamaForCausalLM'",
        ),
        (
            "ops_calls",
            [3, "4"],
            "ops_calls has an item that must be an integer (int64), not str '4'",
        ),
        ("versions", {"torch": 2.9}, "versions.torch must be text (string), not float 2.9"),
    ):
        with pytest.raises(ValueError, match=f"field {re.escape(said)}"):
            schema.check_record({**schema.empty_record(model_id="org/m"), field: value})


def test_hub_rankings_offline_say_so(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    message = refuse(
        {
            "name": "x",
            "models_from_hub": {"task": "text-generation", "sort": "trending", "limit": 5},
        }
    )
    assert "no Hub access" in message


def test_exclusions_and_local_paths():
    parsed = params.parse(
        {
            "name": "x",
            "models": ["notebooks", {"id": "b", "exclude": "not a text model"}],
            "exclude": [{"id": "c", "reason": "too large"}],
        },
        source="t.yaml",
        base=REPO,
    )
    # a local folder gets a portable id; where to load it from stays in sweep.json only
    assert [(m.model_id, m.source) for m in parsed.models] == [
        ("local:notebooks", str((REPO / "notebooks").resolve()))
    ]
    assert parsed.excluded == {"b": "not a text model", "c": "too large"}


@pytest.mark.parametrize("path", sorted((REPO / "params").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_params_file_is_valid(path, monkeypatch):
    """Consistency: every params file's keys exist in the notebook's parameters."""
    monkeypatch.chdir(REPO)
    raw = yaml.safe_load(path.read_text())
    raw.pop("models_from_hub", None)  # needs network
    parsed = params.parse(raw, source=path.name, base=REPO)
    assert parsed.models


# --------------------------------------------------------------------------------------------
# every bad value refused before anything runs: one sentence, no row, no file, no traceback

TINY = "data/models/tiny-llama"


def one_error(output: str) -> str:
    """click's usage error: its usage banner, then one line "Error: <one sentence>"; no
    traceback."""
    lines = [line for line in output.strip().splitlines() if line.strip()]
    assert lines and lines[-1].startswith("Error: "), output
    assert all(line.startswith(("Usage:", "Try ")) for line in lines[:-1]), output
    return lines[-1]


BAD_DEFINITIONS = {
    "negative timeout": (
        {"timeout_s": -5},
        "timeout_s must be a number of seconds greater than 0, not int -5",
    ),
    "zero timeout": (
        {"timeout_s": 0},
        "timeout_s must be a number of seconds greater than 0, not int 0",
    ),
    "nan timeout": (
        {"timeout_s": float("nan")},
        "timeout_s must be a number of seconds greater than 0, not float nan",
    ),
    "inf timeout": (
        {"timeout_s": float("inf")},
        "timeout_s must be a number of seconds greater than 0, not float inf",
    ),
    "nan numerics": (
        {"probe": {"numerics_margin": float("nan")}},
        "numerics_margin=nan is not a finite number",
    ),
    "inf numerics": (
        {"probe": {"numerics_bound": float("inf")}},
        "numerics_bound=inf is not a finite number",
    ),
    "inf device memory": (
        {"probe": {"device_memory_gb": float("inf")}},
        "device_memory_gb=inf is not a finite",
    ),
    "nan cache budget": (
        {"cache": {"max_gb": float("nan")}},
        "cache.max_gb must be a number of GB greater than 0",
    ),
    "not a device name": (
        {"probe": {"device": "GPU 0"}},
        "device='GPU 0' is not accepted; use cpu, auto or an accelerator's name in lower case",
    ),
    "not a float dtype": ({"probe": {"dtype": "float99"}}, "dtype='float99' is not accepted"),
    "integer dtype": ({"probe": {"dtype": "int8"}}, "dtype='int8' is not accepted"),
    "chat_template choice": (
        {"probe": {"chat_template": "maybe"}},
        "chat_template='maybe' is not accepted",
    ),
    "reference choice": (
        {"probe": {"reference": "gpu"}},
        "reference='gpu' is not accepted; use one of cpu, none",
    ),
    "no new tokens": (
        {"probe": {"max_new_tokens": 0}},
        "max_new_tokens=0 is too small; use an integer >= 1",
    ),
    "negative seed": ({"probe": {"seed": -1}}, "seed=-1 is too small"),
    "negative reference limit": (
        {"probe": {"reference_max_params": -1}},
        "reference_max_params=-1 is too small",
    ),
    "string for int": ({"probe": {"max_new_tokens": "8"}}, "must be an integer >= 1, not str"),
    "string for bool": ({"probe": {"trust_remote_code": "yes"}}, "must be true or false"),
    "runner-owned": ({"probe": {"record_path": "r.json"}}, "set by the sweep runner"),
    "typo": (
        {"probe": {"max_new_tokenz": 3}},
        "'max_new_tokenz' is not a parameter of notebooks/probe.ipynb",
    ),
    "zero workers": ({"workers": 0}, "workers must be a whole number of at least 1, not int 0"),
    "float workers": (
        {"workers": 1.5},
        "workers must be a whole number of at least 1, not float 1.5",
    ),
    "unknown key": ({"modles": [TINY]}, "unknown key 'modles' (did you mean 'models'?)"),
    "executor": ({"executor": "slurm"}, "executor must be local or ray, not str 'slurm'"),
    "missing folder": (
        {"models": ["data/models/does-not-exist"]},
        "local model folder 'data/models/does-not-exist' does not exist",
    ),
    "listed twice": ({"models": [TINY, TINY]}, "listed twice"),
    "no models": ({"models": []}, "no models"),
    "bad override": (
        {"models": [{"id": TINY, "overrides": {"dtype": "int4"}}]},
        "dtype='int4' is not accepted",
    ),
    "bad model timeout": (
        {"models": [{"id": TINY, "timeout_s": -1}]},
        "models[0].timeout_s must be a number of seconds greater than 0",
    ),
    "exclusion without reason": ({"exclude": [{"id": "a/b"}]}, "needs both 'id' and 'reason'"),
    "cache budget": (
        {"cache": {"max_gb": 0}},
        "cache.max_gb must be a number of GB greater than 0, not int 0",
    ),
    "cache key": (
        {"cache": {"size": 3}},
        "cache: unknown key 'size'; accepted keys are dir, max_gb, keep",
    ),
    "no name": ({"name": None}, "'name' is missing"),
    "empty name": ({"name": ""}, "name '' cannot name a sweep"),
}


@pytest.mark.parametrize("case", sorted(BAD_DEFINITIONS), ids=lambda c: c.replace(" ", "-"))
def test_bad_definitions_are_refused_by_the_cli_with_one_sentence(case, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from model_support.cli import main

    change, expected = BAD_DEFINITIONS[case]
    raw = {"name": "bad", "probe": {"device": "cpu"}, "models": [TINY], **change}
    raw = {k: v for k, v in raw.items() if v is not None}
    definition = tmp_path / "bad.yaml"
    definition.write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(REPO)
    data_dir = tmp_path / "data"
    result = CliRunner().invoke(main, ["sweep", str(definition), "--data-dir", str(data_dir)])
    assert result.exit_code == 2, result.output
    error = one_error(result.output)
    assert expected in error and error.endswith((".", "?")), result.output
    assert not data_dir.exists()  # no sweep folder, no record, no Parquet row, no temp file


BAD_FLAGS = {
    "zero workers flag": (
        ["sweep", "params/smoke.yaml", "--workers", "0"],
        "0 is not in the range x>=1",
    ),
    "executor flag": (
        ["sweep", "params/smoke.yaml", "--executor", "slurm"],
        "'slurm' is not one of 'local', 'ray'",
    ),
    "nothing to run": (["sweep"], "Give a sweep definition"),
    "missing params file": (["sweep", "params/nope.yaml"], "does not exist"),
    "unknown resume": (
        ["sweep", "--resume", "nope-20260101T000000Z-abcd"],
        "Sweep 'nope-20260101T000000Z-abcd' does not exist",
    ),
    "unknown report": (["report", "nope"], "Sweep 'nope' does not exist"),
    "unknown diff": (["diff", "a", "b"], "Sweep 'a' does not exist"),
    "unknown aggregate": (["aggregate", "nope"], "Sweep 'nope' does not exist"),
    "unknown exclude": (["exclude", "nope", "--reason", "x"], "Sweep 'nope' does not exist"),
    "unknown debug sweep": (["debug", "nope", "tiny"], "Sweep 'nope' does not exist"),
}


@pytest.mark.parametrize("case", sorted(BAD_FLAGS), ids=lambda c: c.replace(" ", "-"))
def test_bad_flags_are_refused_with_one_sentence(case, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from model_support.cli import main

    args, expected = BAD_FLAGS[case]
    monkeypatch.chdir(REPO)
    data_dir = tmp_path / "data"
    result = CliRunner().invoke(main, [*args, "--data-dir", str(data_dir)])
    assert result.exit_code == 2, result.output
    assert expected in one_error(result.output)
    assert not (data_dir / "sweeps").exists() and not (data_dir / "results").exists()


def test_a_device_this_machine_lacks_stops_the_sweep_before_any_model(tmp_path):
    """device: tpu on a host with no TPU: refused up front, with the sentence the probe records."""
    import subprocess
    import sys

    from model_support.probe import devices

    if devices.tpu_hardware_visible():
        pytest.skip("this machine has a TPU")
    definition = tmp_path / "tpu.yaml"
    definition.write_text(
        yaml.safe_dump({"name": "tpu", "probe": {"device": "tpu"}, "models": ["org/model"]})
    )
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "model_support.cli",
            "sweep",
            str(definition),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    expected = (
        (
            "Device 'tpu' was requested but no TPU is present on this machine (torch_tpu is "
            "installed, but torch.accelerator.is_available() is False)."
        )
        if devices.torch_tpu_installed()
        else "torch_tpu"
    )
    assert one_error(run.stderr) == f"Error: {expected}"
    assert not (tmp_path / "data").exists()


def test_a_device_plugin_that_does_not_import_stops_only_its_own_device(tmp_path):
    """Another package's adapter entry point that does not import: a sweep on that device is
    refused in one sentence naming the plugin; a sweep on any other device is not stopped by it
    (it was a traceback for all)."""
    import os
    import subprocess
    import sys

    dist = tmp_path / "site" / "broken_adapter-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-adapter\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[model_support.devices]\nbrokendev = broken_adapter_nowhere:Adapter\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]),
    }
    code = (
        "from model_support.probe.devices import registry\n"
        "print(sorted(registry.stack_configuration()))\n"  # every other adapter is still read
        "print(registry.adapter_class('cpu').__name__)\n"
        "registry.adapter_class('brokendev')\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert run.stdout.splitlines()[1] == "Adapter", run.stderr[-2000:]
    assert (
        "UserError: The device adapter of 'brokendev', broken_adapter_nowhere:Adapter (from "
        "broken-adapter) does not import: ModuleNotFoundError: No module named "
        "'broken_adapter_nowhere'; reinstall that package, or uninstall it to use the generic "
        "adapter." in run.stderr
    )
    definition = tmp_path / "broken.yaml"
    definition.write_text(
        yaml.safe_dump({"name": "broken", "probe": {"device": "brokendev"}, "models": ["org/m"]})
    )
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "model_support.cli",
            "sweep",
            str(definition),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert one_error(run.stderr).startswith(
        "Error: The device adapter of 'brokendev', broken_adapter_nowhere:Adapter"
    )
    assert not (tmp_path / "data" / "sweeps").exists()


def test_the_declaration_agrees_with_the_notebooks_and_torch():
    """One declaration: the notebooks' parameters cells say exactly it; every dtype is a torch
    float."""
    import nbformat
    import papermill
    import torch

    from model_support import paths
    from model_support.probe import probe_params
    from model_support.probe import run as probe

    for name, declared in (
        ("probe", probe_params.PROBE_PARAMS),
        ("debug", probe_params.DEBUG_PARAMS),
    ):
        nb = nbformat.read(str(paths.notebook(name)), as_version=4)
        cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        assert cell.source == probe_params.parameters_cell(declared, f"{name}.ipynb"), name
        inspected = papermill.inspect_notebook(str(paths.notebook(name)))
        assert list(inspected) == [p.name for p in declared]
        for p in declared:
            assert inspected[p.name]["inferred_type_name"] == p.type.__name__, p.name
            assert eval(inspected[p.name]["default"]) == p.default, p.name  # noqa: S307 (our own literal)
    assert probe.DEFAULTS == {
        p.name: p.default for p in probe_params.PROBE_PARAMS if p.name in probe.DEFAULTS
    }
    assert all(getattr(torch, d).is_floating_point for d in probe_params.FLOAT_DTYPES)


def test_probe_settings_given_on_the_command_line_override_the_definition(tmp_path, fixture_models):
    """``model-support sweep DEF --device cpu -p max_new_tokens=3``: a definition tried with
    other settings without editing it; the overrides are checked against the probe's declaration,
    every mistake at once."""
    import subprocess
    import sys

    import yaml

    from model_support.record import store
    from model_support.sweep import definition

    path = tmp_path / "d.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "o",
                "probe": {
                    "device": "auto",
                    "reference": "none",
                    "judge": False,
                    "max_new_tokens": 8,
                },
                "models": [fixture_models["tiny-gpt2"]["path"]],
            }
        )
    )
    loaded = definition.load(
        path, check_device=False, overrides={"device": "cpu", "max_new_tokens": 3}
    )
    assert (loaded.probe["device"], loaded.probe["max_new_tokens"]) == ("cpu", 3)
    cli = [
        sys.executable,
        "-m",
        "model_support.cli",
        "sweep",
        str(path),
        "--data-dir",
        str(tmp_path / "data"),
    ]
    bad = subprocess.run(
        [*cli, "-p", "max_new_tokens=0", "-p", "devcie=cpu", "-p", "nonsense"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "3 mistakes" in bad.stderr, bad.stderr
    assert (
        "'devcie'" in bad.stderr
        and "did you mean 'device'" in bad.stderr
        and "max_new_tokens" in bad.stderr
    )
    assert not (tmp_path / "data" / "sweeps").exists()
    done = subprocess.run(
        [*cli, "--device", "cpu", "-p", "max_new_tokens=3", "--no-report"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (sweep_id,) = store.list_sweeps(tmp_path / "data")
    (record,) = store.read_records(tmp_path / "data", sweep_id)
    assert (record["status"], record["max_new_tokens"], record["device_type"]) == ("PASS", 3, "cpu")
    # what --resume runs
    assert store.read_sweep(tmp_path / "data", sweep_id).probe["max_new_tokens"] == 3
