"""``model-support debug`` of a what-if sweep runs the sweep's run: its ``host_ops`` on the
host's CPU kernels for the device's dispatch key, as the probe put them (``debug.hosting``), and
says so; an empty ``-p host_ops ''`` is the stack as it is, said too; a setting that cannot go to
the host is one sentence before anything runs.

On the pretend device whose stack lacks ``aten::rsqrt`` (docs/devices.md's porting loop): a real
what-if sweep of tiny-llama (RMSNorm: rsqrt) with ``host_ops: aten::rsqrt`` passes; its debug
notebook's forward and generation run on the device with rsqrt on the host, the same tokens as
the record; with host_ops emptied the forward raises on aten::rsqrt in the first RMSNorm, as the
stack's own sweep would. The pretend device is registered only in the command's child processes
(the sweep's workers, the notebook's kernel), never in this worker."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from helpers import pretend_cli

PRETEND = {"devices": 1, "missing_ops": ["aten::rsqrt"]}
PROBE = {"device": "pretend", "judge": False, "perf": False, "host_ops": "aten::rsqrt"}


def cli(args: list, data: Path) -> subprocess.CompletedProcess:
    return pretend_cli(args, data, PRETEND)


@pytest.fixture(scope="module")
def what_if(tmp_path_factory, fixture_models) -> dict:
    """A what-if sweep of tiny-llama, rsqrt on the host, and its record."""
    from model_support.record import store

    tmp = tmp_path_factory.mktemp("debug-what-if")
    data = tmp / "data"
    definition = tmp / "rsqrt-on-host.yaml"
    models = [fixture_models["tiny-llama"]["path"]]
    definition.write_text(
        yaml.safe_dump({"name": "rsqrt-on-host", "probe": PROBE, "models": models, "workers": 1})
    )
    done = cli(["sweep", str(definition), "--no-report"], data)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    (sweep_id,) = store.list_sweeps(data)
    record = json.loads(store.find_record(data, sweep_id, "local:tiny-llama", None).read_text())
    return {"data": data, "sweep": sweep_id, "record": record}


def debug(what_if: dict, *parameters: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """``model-support debug SWEEP tiny-llama [-p ...]``, and the result its notebook stored
    (None when none ran)."""
    from model_support import debug as debug_mod

    done = cli(["debug", what_if["sweep"], "tiny-llama", *parameters], what_if["data"])
    notebooks = [line.removeprefix("debug notebook: ") for line in done.stdout.splitlines()]
    notebooks = [Path(line) for line in notebooks if line.endswith(".ipynb")]
    if done.returncode != 0 or not notebooks:
        return done, None
    return done, debug_mod.debug_result_from_notebook(notebooks[0])


def test_the_debug_notebook_runs_the_what_if_sweeps_run_with_its_operators_on_the_host(what_if):
    record = what_if["record"]
    assert record["status"] == "PASS" and record["what_if"] is True, record["failure_signature"]
    assert "aten::rsqrt" in record["host_ops_run"] and record["host_op_names"] == ["aten::rsqrt"]

    done, result = debug(what_if)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == (
        "A what-if debug run (host_ops='aten::rsqrt', as the sweep's what-if run did): "
        "aten::rsqrt on the host's CPU kernels for the device's dispatch key, not the "
        "device's own."
    )
    # the recorded run and the debug run agree: the forward and the generation run on the device,
    # the same tokens
    assert result["forward_ok"] is True and result["forward_failure"] is None
    assert result["generation"]["ok"] is True
    assert result["generation"]["output_token_ids"] == record["output_token_ids"]
    assert (
        result["host_ops"] == record["host_ops"]
        and result["host_ops_run"] == record["host_ops_run"]
    )
    assert result["host_op_names"] == record["host_op_names"] and result["host_op_calls"][0] > 0
    assert "forward:    runs" in done.stdout
    assert lines[-1].startswith(
        "host ops:   A what-if run (host_ops='aten::rsqrt'): aten::rsqrt, aten::rsqrt.out ran "
        "on the host's CPU kernels, not the device's (calls: aten::rsqrt "
    ) and lines[-1].endswith("What it finds is not the stack as it is."), lines[-1]
    notebook = json.dumps(
        json.loads(Path(lines[1].removeprefix("debug notebook: ")).read_text())["cells"]
    )
    assert (
        "Operators on the host" in notebook
        and "A what-if run (host_ops=&#x27;aten::rsqrt&#x27;)" in notebook
    )


def test_an_empty_host_ops_debugs_the_stack_as_it_is_and_says_so(what_if):
    done, result = debug(what_if, "-p", "host_ops", "")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.splitlines()[0] == (
        "host_ops is empty here: the debug notebook runs the stack as it is, not the sweep's "
        "what-if run (host_ops='aten::rsqrt'), so what it finds can differ from the sweep's "
        "record."
    )
    assert (
        "forward:    raises NotImplementedError on aten::rsqrt in model.layers.0.input_layernorm"
        in done.stdout
    )
    assert (
        result["forward_ok"] is False
        and "host_ops" not in result
        and "host ops:" not in done.stdout
    )


@pytest.mark.parametrize(
    ("parameters", "said"),
    [
        (
            ("-p", "host_ops", "aten::rsqrt,aten::view"),
            "aten::view cannot run on the host: it is a view",
        ),
        (
            ("-p", "device", "cpu"),
            "host_ops='aten::rsqrt' cannot run on cpu: the cpu device is the host: its "
            "operators already run on the CPU. Give -p host_ops '' to debug it on cpu with no "
            "operator on the host.",
        ),
    ],
)
def test_a_setting_that_cannot_run_is_refused_before_the_notebook_runs(what_if, parameters, said):
    from model_support.record import store

    folder = store.sweep_dir(what_if["data"], what_if["sweep"]) / "debug"
    before = sorted(folder.glob("*")) if folder.exists() else []
    done, _ = debug(what_if, *parameters)
    assert done.returncode != 0 and said in " ".join(done.stderr.split()), done.stderr
    assert "Traceback" not in done.stderr and "debug notebook" not in done.stdout
    # nothing written, nothing ran
    assert (sorted(folder.glob("*")) if folder.exists() else []) == before
