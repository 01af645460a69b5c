"""The README's commands as a user types them (issue 54): each in a child process with the
environment the shell gave pytest (``helpers.SHELL_ENVIRON``: nothing of the test harness in it,
``TORCH_DEVICE_BACKEND_AUTOLOAD`` unset as in a new user's shell) and torch_tpu installed as
``make`` installs it, through the console scripts in the venv.

Why this layer: the rest of the suite ran every command with the autoload switched off by the
harness, so it never saw that a command importing torch (the host-ops check, ``ops --prove``)
autoloaded torch_tpu, whose loader wrote ``TORCH_DEVICE_BACKEND_AUTOLOAD=1`` back into the
environment every probe inherited: what-if probes on the pretend device loaded the TPU runtime
(its kernels took ``PrivateUse1`` over, or libtpu stalled retrying the cloud's metadata server),
and ``TPU_LIBRARY_PATH`` joined the what-if sweep's recorded configuration, so no proof counted.

One porting loop on the pretend device (a stack lacking ``aten::rsqrt``; tiny-llama needs it,
tiny-opt does not): the sweep, ``ops --prove``, ``diff --fail-on``, ``nightly`` (a second sweep
of the same stack, its gate against the first), the record's repro script, and the papermill
probe. Every probe's log is read for the TPU runtime."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import REPO, SHELL_ENVIRON

STACK = {"missing_ops": ["aten::rsqrt"]}
MODELS = ("tiny-llama", "tiny-opt")
PROBE = {"device": "pretend", "max_new_tokens": 2, "judge": False, "perf": "off"}
BIN = Path(sys.executable).parent
#: What the TPU runtime says when it loads (torch_tpu's tcmalloc warning, libtpu's set-up, PJRT's
#: plugin, its lockfile, the path it writes): never in a pretend probe's output.
TPU_RUNTIME = re.compile(
    r"TorchTpu/|tcmalloc|pjrt_api|PjRt|libtpu\.so|TPU_LIBRARY_PATH|lockfile|metadata server", re.I
)


def typed(
    command: list,
    cwd: Path,
    stack: dict | None = STACK,
    timeout: float = 600,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """``command`` as a user types it in a shell (``env``, default the shell's that started
    pytest), ``MODEL_SUPPORT_PRETEND='<stack>'`` before it (the pretend stack is the environment,
    as a real one is: docs/devices.md)."""
    # a new user's shell: the autoload unset, whatever the shell that ran pytest exported
    if env is None:
        env = {k: v for k, v in SHELL_ENVIRON.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    env = dict(env)
    env.pop("MODEL_SUPPORT_PRETEND", None)
    if stack is not None:
        env["MODEL_SUPPORT_PRETEND"] = json.dumps(stack)
    return subprocess.run(
        command, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )


def ok(done: subprocess.CompletedProcess, status: int = 0) -> str:
    assert done.returncode == status, (
        f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout + done.stderr


def outputs(notebook: Path) -> str:
    """What an executed notebook's cells printed and raised (not its source, which names
    TorchTPU's modes)."""
    import nbformat

    cells = nbformat.read(notebook, as_version=4).cells
    return json.dumps([cell.get("outputs", []) for cell in cells])


def probe_logs(data: Path) -> dict[str, str]:
    """Every probe's log and what its executed notebook printed, by path."""
    found = {
        str(p.relative_to(data)): p.read_text(errors="replace")
        for p in data.glob("sweeps/*/logs/*")
    }
    found |= {str(p.relative_to(data)): outputs(p) for p in data.glob("sweeps/*/notebooks/*.ipynb")}
    return found


@pytest.fixture(scope="module")
def loop(tmp_path_factory, fixture_models) -> dict:
    """The loop, run once as typed: sweep, ``ops --prove``, nightly; what each said and how long
    prove took."""
    import time

    tmp = tmp_path_factory.mktemp("as-typed")
    data = tmp / "data"
    definition = tmp / "porting.yaml"
    models = [str(REPO / "data" / "models" / m) for m in MODELS]
    definition.write_text(
        yaml.safe_dump({"name": "porting", "probe": PROBE, "models": models, "workers": 2})
    )
    model_support = str(BIN / "model-support")
    said = {
        "sweep": ok(
            typed(
                [model_support, "sweep", str(definition), "--data-dir", str(data), "--no-report"],
                REPO,
            )
        )
    }
    (stack,) = [p.name for p in (data / "sweeps").iterdir() if (p / "sweep.json").exists()]
    started = time.monotonic()
    said["prove"] = ok(
        typed([model_support, "ops", stack, "--prove", "--data-dir", str(data)], tmp, timeout=420)
    )
    prove_s = time.monotonic() - started
    said["nightly"] = ok(
        typed([model_support, "nightly", str(definition), "--data-dir", str(data)], REPO)
    )
    return {"tmp": tmp, "data": data, "stack": stack, "said": said, "prove_s": prove_s}


def sweep_meta(data: Path, sweep_id: str) -> dict:
    return json.loads((data / "sweeps" / sweep_id / "sweep.json").read_text())


def test_prove_confirms_the_rsqrt_step_with_no_tpu_runtime_in_any_probe(loop):
    """``ops SWEEP --prove`` with the autoload unset confirms the step (it ran: no "predicted:
    not run"), and no probe, of the stack's sweep or the what-if one, loaded the TPU runtime."""
    said = re.sub(r"\s+", " ", loop["said"]["prove"])
    assert "confirmed: 1 of 1 predicted model PASSes and agrees with the reference" in said, said[
        -2000:
    ]
    assert "not run with these operators on the host yet" not in said
    found = {path: TPU_RUNTIME.search(text) for path, text in probe_logs(loop["data"]).items()}
    leaked = {path: match.group(0) for path, match in found.items() if match}
    # the two sweeps' and the what-if sweep's probes were read
    assert len(found) >= 6, sorted(found)
    assert not leaked, leaked


def test_the_what_if_sweep_records_the_stacks_configuration_plus_its_host_ops(loop):
    """The what-if sweep's recorded backend configuration is the stack sweep's (no variable
    torch_tpu wrote for itself), so the proof's run counts as evidence for the stack; its records
    carry the host_ops it ran with."""
    from model_support.record import store

    data, stack = loop["data"], loop["stack"]
    what_if = [
        s
        for s in store.list_sweeps(data)
        if s != stack and sweep_meta(data, s).get("probe", {}).get("host_ops")
    ]
    assert what_if, store.list_sweeps(data)
    stack_meta = sweep_meta(data, stack)
    assert stack_meta["device_config"] == {"MODEL_SUPPORT_PRETEND": json.dumps(STACK)}
    for sweep_id in what_if:
        meta = sweep_meta(data, sweep_id)
        assert meta["device_config"] == stack_meta["device_config"]
        records = store.read_records(data, sweep_id)
        assert records and all(r["host_ops"] == "aten::rsqrt" for r in records)
        assert all(
            r["backend_config"] == json.dumps(stack_meta["device_config"], sort_keys=True)
            for r in records
        )


def test_the_nightly_and_the_gate_pass_on_the_same_stack(loop):
    """The nightly's sweep of the same stack gates against the first (no regression), and the
    gate typed by hand says the same of the two sweeps: tiny-llama FAIL(gen) at rsqrt in both,
    tiny-opt PASS in both."""
    from model_support.record import store

    data = loop["data"]
    stack_sweeps = [
        s
        for s in store.list_sweeps(data)
        if not sweep_meta(data, s).get("probe", {}).get("host_ops")
    ]
    first, second = sorted(stack_sweeps, key=lambda s: sweep_meta(data, s)["created_at"])
    gate = [
        str(BIN / "model-support"),
        "diff",
        first,
        second,
        "--fail-on",
        "regressions,new-failures",
    ]
    said = ok(typed([*gate, "--data-dir", str(data)], REPO))
    assert "passed" in said.lower(), said
    records = {r["model_id"].rpartition(":")[2]: r for r in store.read_records(data, second)}
    assert records["tiny-opt"]["status"] == "PASS"
    assert (
        records["tiny-llama"]["status"] == "FAIL(gen)"
        and "rsqrt" in records["tiny-llama"]["error_message"]
    )


def test_the_records_repro_script_runs_as_typed(loop):
    """``model-support repro SWEEP MODEL > run.py; python run.py FOLDER`` (a model probed from a
    local folder takes that folder): the same verdict, with plain python; no --variant needed
    where the model ran in one variant."""
    data, stack = loop["data"], loop["stack"]
    script = ok(
        typed(
            [str(BIN / "model-support"), "repro", stack, "tiny-opt", "--data-dir", str(data)], REPO
        )
    )
    run = loop["tmp"] / "run.py"
    run.write_text(
        typed(
            [str(BIN / "model-support"), "repro", stack, "tiny-opt", "--data-dir", str(data)], REPO
        ).stdout
    )
    assert script
    # its folder
    done = typed(
        [sys.executable, str(run), str(REPO / "data" / "models" / "tiny-opt")], loop["tmp"]
    )
    said = ok(done)
    assert "PASS" in said and not TPU_RUNTIME.search(said), said[-2000:]


def test_the_papermill_probe_as_typed(loop, tmp_path):
    """``papermill notebooks/probe.ipynb out.ipynb -p model_id ... -p device pretend`` with the
    stack in the shell: tiny-llama fails at rsqrt, the pretend backend's refusal, not
    torch_tpu's."""
    record = tmp_path / "r.json"
    model = str(REPO / "data" / "models" / "tiny-llama")
    command = [
        str(BIN / "papermill"),
        "notebooks/probe.ipynb",
        str(tmp_path / "out.ipynb"),
        "-p",
        "model_id",
        model,
    ]
    command += [
        "-p",
        "device",
        "pretend",
        "-p",
        "max_new_tokens",
        "2",
        "-p",
        "record_path",
        str(record),
    ]
    command += ["-p", "judge", "False", "-p", "perf", "off", "-p", "reference", "none"]
    ok(typed(command, REPO))
    found = json.loads(record.read_text())
    assert found["status"] == "FAIL(gen)" and "rsqrt" in found["error_message"], found[
        "error_message"
    ]
    assert not TPU_RUNTIME.search(outputs(tmp_path / "out.ipynb"))


def test_the_repro_command_an_export_prints_works_on_a_pulled_dataset(loop):
    """Review: exports and support cards print ``model-support repro SWEEP MODEL ...`` for every
    row, and on a dataset pulled without its ``sweeps/`` folder (what a Hub dataset is) that
    command said the sweep does not exist. It reads the row and the data folder's ``repro/``
    bodies there."""
    import shutil

    data, stack, pulled = loop["data"], loop["stack"], loop["tmp"] / "pulled"
    for config in ("results", "excluded"):
        shutil.copytree(data / config, pulled / config)
    shutil.copytree(data / "sweeps" / stack / "repro", pulled / "repro")
    command = [
        str(BIN / "model-support"),
        "export",
        stack,
        "--format",
        "csv",
        "--data-dir",
        str(pulled),
    ]
    assert "model-support repro" in ok(typed(command, REPO))
    script = ok(
        typed(
            [str(BIN / "model-support"), "repro", stack, "tiny-opt", "--data-dir", str(pulled)],
            REPO,
        )
    )
    run = loop["tmp"] / "pulled_run.py"
    run.write_text(script)
    said = ok(
        typed([sys.executable, str(run), str(REPO / "data" / "models" / "tiny-opt")], loop["tmp"])
    )
    assert "PASS" in said, said[-2000:]
