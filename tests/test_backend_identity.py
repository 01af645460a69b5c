"""A device backend's identity comes from its adapter (docs/devices.md, "What makes a backend"):
each adapter declares the packages (and the toolkit or runtime) that make up its backend; every
record keeps them (``backend_versions``) with the backend's settings (``backend_config``); the
support card and the history read them, never a package name of their own. Model arguments
resolve the same way in every command. No backend name outside the device adapters."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from collections import Counter
from importlib import metadata
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from model_support import analysis
from model_support.analysis.support import support
from model_support.cli import main
from model_support.debug.debug_runner import prepare_debug
from model_support.errors import UserError
from model_support.probe import devices
from model_support.probe.devices import cuda, registry
from model_support.probe.records import new_record
from model_support.record import schema, store
from model_support.record.sweep_meta import ModelEntry, SweepMeta
from model_support_pretend import CONFIG_VAR

REPO = Path(__file__).resolve().parents[1]
PRETEND = f"model-support-pretend {metadata.version('model-support-pretend')}"
# installed here for the tpu adapter's tests
TPU = importlib.util.find_spec("torch_tpu") is not None


def sweep(data: Path, day: int, rows: list[dict], name: str = "pretend") -> str:
    """A sweep of ``rows`` (model id, status, and record fields) written through the store, as a
    sweep would."""
    sweep_id = f"{name}-2026120{day}T000000Z-000{day}"
    SweepMeta(
        sweep_id=sweep_id,
        name=name,
        created_at=f"2026-12-0{day}T00:00:00+00:00",
        probe={},
        models=[ModelEntry(r["model_id"]) for r in rows],
    ).write(store.sweep_dir(data, sweep_id))
    for fields in rows:
        failed = fields["status"] != schema.PASS
        record = schema.empty_record(
            sweep_id=sweep_id,
            started_at=f"2026-12-0{day}T00:00:00+00:00",
            failure_signature="NotImplementedError: aten::rsqrt" if failed else None,
            numerics=None if failed else "match",
            **{"versions": {"torch": "2.13.0", "transformers": "5.0.0"}, **fields},
        )
        store.store_result(data, sweep_id, record, None, "")
    store.compact(data, sweep_id)
    return sweep_id


def on_pretend(model_id: str, status: str, build: str = PRETEND, config: str = "{}") -> dict:
    return {
        "model_id": model_id,
        "status": status,
        "device_type": "pretend",
        "backend_versions": [build],
        "backend_config": json.dumps({CONFIG_VAR: config}),
    }


def recorded_before(model_id: str, status: str, config: str) -> dict:
    """A pretend row as records held it before ``backend_versions`` (record version 19): its
    backend's settings only in its repro script's, and in ``versions`` every package the record
    had a field for (torch_tpu, installed here)."""
    return {
        "model_id": model_id,
        "status": status,
        "device_type": "pretend",
        "versions": {"torch": "2.13.0", "torch_tpu": "0.2.0", "transformers": "5.0.0"},
        "repro_settings": json.dumps({"device": "pretend", "device_config": {CONFIG_VAR: config}}),
    }


# --- what the adapters declare
# ----------------------------------------------------------------------------------


def test_each_adapter_declares_the_packages_of_its_backend():
    """The CPU's backend is torch alone; the pretend backend's adapter (another distribution's,
    by entry point) names its distribution; the generic adapter finds an out-of-tree backend's
    package by its ``torch.backends`` entry point when no adapter declares one; a backend torch
    ships has none; the TPU's are TorchTPU and libtpu."""
    assert devices.adapter_for("cpu").backend_versions() == []
    assert devices.adapter_for("pretend").backend_versions() == [PRETEND]
    # from its entry point
    assert devices.AcceleratorAdapter("pretend").packages() == ("model-support-pretend",)
    assert devices.adapter_for("xpu").backend_versions() == []
    if TPU:
        assert devices.adapter_for("tpu").backend_versions() == [
            f"torch_tpu {metadata.version('torch_tpu')}",
            f"libtpu {metadata.version('libtpu')}",
        ]
    assert devices.adapter_class("tpu").offers("fused") and not devices.adapter_class(
        "pretend"
    ).offers("fused")
    assert devices.adapter_class("cuda").backend_packages and all(
        p.startswith("nvidia-") for p in devices.adapter_class("cuda").backend_packages
    )


def test_cudas_toolkit_is_read_without_importing_torch_as_torch_says_it():
    """The CUDA adapter's runtime versions are read in a sweep's worker too, where torch is not
    imported: the toolkit from torch's own ``version.py``, the same as ``torch.version`` says
    once imported (None here, a CPU build)."""
    code = """
        import json, sys
        from model_support.probe.devices import cuda
        read = [cuda.torch_build("cuda"), cuda.torch_build("hip"), "torch" in sys.modules]
        import torch
        print(json.dumps([read, [torch.version.cuda, torch.version.hip]]))
        """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (cuda_read, hip_read, imported), said = json.loads(done.stdout.strip().splitlines()[-1])
    assert not imported and [cuda_read, hip_read] == said
    runtime = devices.adapter_for("cuda").runtime_versions()
    assert ("cuda-toolkit" in runtime) == bool(said[0]) and (
        "nvidia-driver" in runtime
    ) == cuda.NVIDIA_DRIVER_FILE.exists()


@pytest.mark.parametrize(
    ("text", "version"),
    [
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 "
            "UTC 2024\n",
            "550.54.15",
        ),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release "
            "Build  (dvs-builder@U16)\n",
            "570.86.15",
        ),
        ("", None),
    ],
)
def test_the_nvidia_driver_is_read_from_what_the_kernel_module_says(tmp_path, text, version):
    path = tmp_path / "version"
    path.write_text(text)
    assert cuda.nvidia_driver(path) == version
    assert cuda.nvidia_driver(tmp_path / "absent") is None


# --- what a record keeps
# ----------------------------------------------------------------------------------------


def test_a_record_names_the_backend_and_the_settings_it_ran_with(monkeypatch):
    monkeypatch.setenv(CONFIG_VAR, '{"devices": 2}')
    record = schema.check_record(new_record("local:m", {"device": "pretend"}))
    assert record["backend_versions"] == [PRETEND]
    assert json.loads(record["backend_config"]) == {CONFIG_VAR: '{"devices": 2}'}
    cpu = new_record("local:m", {"device": "cpu"})
    # the pretend settings are not the CPU's
    assert (cpu["backend_versions"], cpu["backend_config"]) == ([], None)
    auto = new_record("local:m", {"device": "auto"})
    # said once the probe has resolved it
    assert (auto["backend_versions"], auto["backend_config"]) == (None, None)


def test_a_probe_on_auto_records_the_backend_it_resolved(fixture_models):
    """The probe's record (``run``) names the backend of the device ``auto`` became, not of none."""
    from test_pretend import child_json  # a fresh python with the pretend accelerator configured

    code = f"""
        import json
        from model_support.probe import run
        record = run.run_probe({fixture_models["tiny-llama"]["path"]!r}, device="auto", reference="none", judge=False, perf=False)
        print(json.dumps({{k: record[k] for k in ("status", "device_type", "backend_versions", "backend_config")}}))
        """
    record = child_json(code, {"devices": 1})
    assert (record["status"], record["device_type"], record["backend_versions"]) == (
        "PASS",
        "pretend",
        [PRETEND],
    )
    assert json.loads(record["backend_config"]) == {CONFIG_VAR: '{"devices": 1}'}


# --- what the card and the history read
# -------------------------------------------------------------------------


@pytest.fixture
def pretend_sweeps(tmp_path):
    """tiny-llama on four pretend sweeps: one stack lacking aten::rsqrt, one with it (twice, its
    setting written with other spacing the second time), and another build of the backend with
    the same setting."""
    lacking = '{"missing_ops": ["aten::rsqrt"]}'
    ids = [
        sweep(tmp_path, 1, [on_pretend("local:tiny-llama", "FAIL(gen)", config=lacking)]),
        sweep(tmp_path, 2, [on_pretend("local:tiny-llama", "PASS", config='{"devices": 1}')]),
        sweep(
            tmp_path,
            3,
            [
                on_pretend(
                    "local:tiny-llama", "PASS", "model-support-pretend 9.9.9", '{"devices": 1}'
                )
            ],
        ),
        sweep(tmp_path, 4, [on_pretend("local:tiny-llama", "PASS", config='{"devices":1}')]),
    ]
    return tmp_path, ids


def test_a_stack_on_the_card_is_its_backend_build_and_its_settings(pretend_sweeps):
    """Two sweeps whose backend settings differ are two stacks, and so are two builds of the
    backend; settings that say the same (JSON spacing aside) are one. The card names the backend
    as its adapter declared it."""
    data, (lacking, fixed, other_build, fixed_again) = pretend_sweeps
    cards = {(c["backend"], c["sweep_id"]): c for c in support("local:tiny-llama", data)}
    assert set(cards) == {
        (PRETEND, fixed_again),
        (PRETEND, lacking),
        ("model-support-pretend 9.9.9", other_build),
    }
    assert [(c["verdict"], c["agreeing"], c["sweeps"]) for c in cards.values()] == [
        ("PASS", 2, 2),  # newest first: the fixed stack, both its sweeps
        ("PASS", 1, 1),
        ("FAIL(gen)", 1, 1),
    ]
    assert cards[(PRETEND, lacking)]["backend_settings"] == {
        CONFIG_VAR: '{"missing_ops": ["aten::rsqrt"]}'
    }
    assert "torch_tpu" not in cards[(PRETEND, lacking)]
    out = CliRunner().invoke(main, ["support", "local:tiny-llama", "--data-dir", str(data)]).output
    line = next(line for line in out.splitlines() if lacking in line)
    assert line.startswith(
        f"pretend [eager+dynamic] torch 2.13.0, {PRETEND}, transformers 5.0.0, {CONFIG_VAR}="
    )
    assert "(1 of 1 sweeps agree)" in line and "torch_tpu" not in out


def test_two_sweeps_whose_backend_settings_differ_are_two_stacks_on_the_card(tmp_path):
    """The porting loop of docs/devices.md as a new user reads its card: a stack lacking
    aten::rsqrt, then the stack with it. Two stacks, each with its own verdict (not "1 of 2
    sweeps agree"), and no package the pretend backend is not made of (torch_tpu is installed
    here, and older rows' ``versions`` name it)."""
    lacking = sweep(
        tmp_path,
        1,
        [recorded_before("local:tiny-llama", "FAIL(gen)", '{"missing_ops": ["aten::rsqrt"]}')],
    )
    fixed = sweep(tmp_path, 2, [recorded_before("local:tiny-llama", "PASS", "{}")])
    cards = support("local:tiny-llama", tmp_path)
    assert [(c["sweep_id"], c["verdict"], c["agreeing"], c["sweeps"]) for c in cards] == [
        (fixed, "PASS", 1, 1),
        (lacking, "FAIL(gen)", 1, 1),
    ]
    assert [c["backend_settings"] for c in cards] == [
        {CONFIG_VAR: "{}"},
        {CONFIG_VAR: '{"missing_ops": ["aten::rsqrt"]}'},
    ]
    # unknown: a record of version 19 did not name the pretend backend's package
    assert cards[0]["backend"] is None
    out = (
        CliRunner()
        .invoke(main, ["support", "local:tiny-llama", "--data-dir", str(tmp_path)])
        .output
    )
    assert (
        "1 of 2" not in out and out.count("(1 of 1 sweeps agree)") == 2 and "torch_tpu" not in out
    )


def test_the_history_is_broken_down_by_the_backend_its_adapter_declared(pretend_sweeps):
    data, (lacking, fixed, other_build, fixed_again) = pretend_sweeps
    results = store.scan(data, "results")
    history = analysis.pass_rate_history(results)
    assert "torch_tpu" not in history.columns
    assert history.select("sweep_id", "backend").rows() == [
        (lacking, PRETEND),
        (fixed, PRETEND),
        (other_build, "model-support-pretend 9.9.9"),
        (fixed_again, PRETEND),
    ]
    by_backend = analysis.pass_rate_by_version(results, "backend")
    assert by_backend.select("version", "sweeps", "passed").rows() == [
        (PRETEND, 3, 2),
        ("model-support-pretend 9.9.9", 1, 1),
    ]


def test_older_files_read_the_backend_from_what_they_recorded(tmp_path):
    """Rows from before ``backend_versions`` and ``backend_config`` (a Parquet file without the
    columns): the backend is what their ``versions`` held of the packages the device's adapter
    declares, and the settings those their repro script set; so an older row and a newer one of
    one stack are one stack on the card."""
    old_settings = json.dumps({"device_config": {"LIBTPU_INIT_ARGS": "--xla_tpu_flag=1"}})
    versions = {
        "torch": "2.13.0",
        "torch_tpu": "0.2.0",
        "libtpu": "0.0.52",
        "transformers": "5.0.0",
    }
    older = {"device_type": "tpu", "versions": versions, "repro_settings": old_settings}
    first = sweep(tmp_path, 1, [{"model_id": "org/m", "status": "PASS", **older}], name="tpu")
    newer = sweep(tmp_path, 2, [{"model_id": "org/m", "status": "FAIL(gen)", **older}], name="tpu")
    path = next((tmp_path / "results").glob(f"sweep={first}/*.parquet"))
    table = pq.read_table(path)
    # as written before version 20
    pq.write_table(table.drop_columns(["backend_versions", "backend_config"]), path)
    record = store.record_file(tmp_path, newer, "org/m")
    fields = {
        "backend_versions": ["torch_tpu 0.2.0", "libtpu 0.0.52"],
        "backend_config": '{"LIBTPU_INIT_ARGS": "--xla_tpu_flag=1"}',
    }
    record.write_text(json.dumps({**json.loads(record.read_text()), **fields}))
    store.compact(tmp_path, newer)
    (card,) = support("org/m", tmp_path)
    assert (card["backend"], card["backend_settings"]) == (
        "torch_tpu 0.2.0, libtpu 0.0.52",
        {"LIBTPU_INIT_ARGS": "--xla_tpu_flag=1"},
    )
    assert (card["verdict"], card["agreeing"], card["sweeps"]) == ("FAIL(gen)", 1, 2)


# --- a model argument resolves as every command resolves it
# -----------------------------------------------------


def test_support_takes_a_models_short_name_as_debug_does(tmp_path):
    sweep(
        tmp_path,
        1,
        [recorded_before(m, "PASS", "{}") for m in ("local:tiny-llama", "local:tiny-qwen2")],
    )
    args = ["--data-dir", str(tmp_path)]
    short = CliRunner().invoke(main, ["support", "tiny-llama", *args])
    assert short.exit_code == 0 and "last verified" in short.output, short.output
    assert short.output == CliRunner().invoke(main, ["support", "local:tiny-llama", *args]).output
    several = CliRunner().invoke(main, ["support", "tiny", *args])
    assert several.exit_code != 0 and "'tiny' matches 2 models of the dataset in" in several.output
    assert "local:tiny-llama, local:tiny-qwen2." in several.output
    typo = CliRunner().invoke(main, ["support", "tiny-lama", *args])
    assert typo.exit_code != 0 and "did you mean local:tiny-llama" in typo.output


# --- a backend's own mode
# -------------------------------------------------------------------------------------------


class OwnModeAdapter(devices.AcceleratorAdapter):
    own_modes = ("fused",)


def test_debug_refuses_a_mode_only_where_the_devices_adapter_offers_none(tmp_path, monkeypatch):
    """``model-support debug ... -p mode fused`` asks the device's adapter whether its backend
    can have the mode: refused on the pretend device and the CPU, taken on a backend whose
    adapter offers it (any name)."""
    monkeypatch.setitem(registry.ADAPTERS, "ownmode", OwnModeAdapter)
    for device in ("ownmode", "pretend", "cpu"):
        SweepMeta(
            sweep_id=f"s-{device}",
            name="s",
            created_at="",
            probe={"device": device},
            models=[ModelEntry("org/m")],
        ).write(store.sweep_dir(tmp_path, f"s-{device}"))
    run = prepare_debug(tmp_path, "s-ownmode", "m", parameters={"mode": "fused"})
    assert run.parameters["mode"] == "fused" and run.parameters["device"] == "ownmode"
    for device in ("pretend", "cpu"):
        with pytest.raises(UserError, match=f"not available on this stack: .*not on {device}"):
            prepare_debug(tmp_path, f"s-{device}", "m", parameters={"mode": "fused"})


# --- no backend name outside the device adapters
# ----------------------------------------------------------------

#: The words of the backends' names (the TPU's packages, the pretend accelerator's device and
#: package). CUDA is not among them: ``torch.cuda`` and ``torch.version.cuda`` are torch's own API,
#: not an out-of-tree backend's.
BACKEND_WORDS = {"tpu", "libtpu", "pretend"}
#: Where one remains, and why (each a ceiling: a new one anywhere fails; remove an entry once its
#: file is fixed).
REMAINING = {
    # the repro body, pasted into every script, may import nothing of the package (.importlinter's
    # repro-body contract), so it cannot ask an adapter: its fused-eager check is TorchTPU's own API
    "probe/probe_compile.py": {"tpu": 7, "torch_tpu": 1},
    # re-exports the tpu adapter's function for tests/test_sharded.py
    "probe/sharded/__init__.py": {"tpu_rank_env": 1},
    # the versions struct's fields: older files have these columns
    "record/schema.py": {"torch_tpu": 1, "libtpu": 1},
}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
        ):
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def backend_names(source: str) -> Counter:
    """The backend names ``source`` uses in code: identifiers (names, attributes, definitions,
    arguments, keywords, imports) one of whose words (split at ``_`` and ``.``) is a backend's,
    and strings that are such an identifier or a dotted or dashed name (``"torch_tpu"``,
    ``"torch.tpu"``, ``"model-support-pretend"``). Docstrings, comments and prose (a string with
    spaces: a sentence for users, which says and decides nothing) are not code."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found: Counter = Counter()
    for node in ast.walk(tree):
        texts = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if re.fullmatch(r"[\w.\-]+", node.value):
                texts.append(node.value)
        else:
            texts += [
                v
                for a in ("id", "attr", "name", "arg", "asname", "module")
                if isinstance(v := getattr(node, a, None), str)
            ]
        found.update(t for t in texts if BACKEND_WORDS & set(re.split(r"[._\-]", t)))
    return found


def test_the_scan_sees_a_backend_name_in_code_and_not_in_prose():
    assert (
        backend_names((REPO / "src/model_support/probe/devices/tpu.py").read_text())["torch_tpu"]
        >= 1
    )
    code = (
        'import torch\n"""Docs about torch_tpu."""\nx = "runs on tpu devices"  # pretend\nif d == '
        '"tpu": torch.tpu.f()\n'
    )
    assert backend_names(code) == Counter({"tpu": 2})


def test_no_backend_name_outside_the_device_adapters():
    """Which backend a row ran on, what it is made of and what it can do is its adapter's to say
    (``probe/devices/``); the rest of the package asks it (the exceptions are ``REMAINING``, each
    with its reason)."""
    root = REPO / "src" / "model_support"
    found = {}
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root).as_posix()
        if not where.startswith("probe/devices/"):
            names = backend_names(path.read_text())
            if names:
                found[where] = dict(names)
    beyond = {
        where: {n: c for n, c in names.items() if c > REMAINING.get(where, {}).get(n, 0)}
        for where, names in found.items()
    }
    assert {where: names for where, names in beyond.items() if names} == {}
    assert set(REMAINING) <= set(found), (
        f"fixed: remove {sorted(set(REMAINING) - set(found))} from REMAINING"
    )
