"""The store under interruption: a process stopped at every write point, and SIGKILLs from outside.

Every write to the data folder goes through ``model_support.fileio`` (checked statically below), so
each of those calls is a write point; ``MODEL_SUPPORT_STOP_AT_WRITE=N`` makes a process SIGKILL
itself just before its N-th. Each scenario runs on ready-made records (no papermill per point) in a
fresh copy of a data folder, stopped at point 1, 2, ... until it runs to the end; after each stop
the next command runs, then the invariant is checked: every record is in the dataset exactly once,
in the config its state says, and every file parses. SQLite and LevelDB are tested this way.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from model_support import fileio
from model_support.record import store
from model_support.record.sweep_meta import ModelEntry, SweepMeta

SRC = Path(__file__).resolve().parents[1] / "src" / "model_support"
MODELS = ["org/a", "org/b", "local:tiny+opt", "local:tiny_opt"]
SWEEP = "faults-20261205T000000Z-abcd"

# What builds the scenario's records, in the test and in the stopped process alike.
RECORDS = """
import hashlib, json
from model_support.record import schema, store
BODY = store.REPRO_BODY_MARK + "\\nprint('the probe')\\n"
SHA = hashlib.sha256(BODY.encode()).hexdigest()
def record(sweep_id, i, model_id):
    r = schema.empty_record(sweep_id=sweep_id, model_id=model_id, status=["PASS", "FAIL(gen)"][i % 2],
                            tokens_in=5 + i, tokens_out=8, versions={"torch": "2.13.0"})
    r["repro_settings"] = json.dumps({"model_id": model_id})
    r["repro_sha256"] = SHA
    r["repro_script"] = "# header\\n" + BODY
    return r
"""

SCENARIOS = {
    # the rest of a sweep's records stored one by one, then compacted (a sweep as its last probes
    # come back)
    "store": "for i, m in list(enumerate(MODELS))[2:]:\n"
    "    store.store_result(D, S, record(S, i, m), b'{}', 'log\\n')\n"
    "store.compact(D, S)\n",
    "exclude": "store.set_exclusion(D, S, 'a broken stack')\n",
    "include": "store.set_exclusion(D, S, None)\n",
    # a resume of a sweep stored under the old names: its records moved, its last model probed,
    # compacted
    "migrate": "store.migrate_names(D, S)\n"
    "store.store_result(D, S, record(S, 3, MODELS[3]), b'{}', 'log\\n')\n"
    "store.compact(D, S)\n",
}
#: The model an older sweep kept under its legacy name ``local_tiny_opt``, which is
#: ``local:tiny_opt``'s own name.
LEGACY = "local:tiny+opt"


def _meta() -> SweepMeta:
    return SweepMeta(
        sweep_id=SWEEP,
        name="faults",
        created_at="2026-12-05T00:00:00+00:00",
        probe={},
        models=[ModelEntry(m) for m in MODELS],
        excluded={"org/gated": "no access"},
    )


def _record(i: int, model_id: str) -> dict:
    """The scenario's record of ``model_id`` (``RECORDS``), built in the test's process."""
    namespace: dict = {}
    exec(RECORDS, namespace)
    return namespace["record"](SWEEP, i, model_id)


def _base(folder: Path, state: str) -> Path:
    """A data folder with the sweep written and compacted: ``half`` (its first two records),
    ``included`` or ``excluded`` (all four), ``legacy`` (the first three, ``LEGACY``'s under the
    name sweeps gave it before names were one to one)."""
    _meta().write(store.sweep_dir(folder, SWEEP))
    stored = {"half": 2, "legacy": 3}.get(state, len(MODELS))
    for i, model in enumerate(MODELS[:stored]):
        store.store_result(folder, SWEEP, _record(i, model), b"{}", "log\n")
    if state == "legacy":
        own = store.record_file(folder, SWEEP, LEGACY)
        own.rename(own.with_name(f"{store.legacy_stem(LEGACY)}.json"))
    if state == "excluded":
        store.set_exclusion(folder, SWEEP, "a broken stack")
    else:
        store.compact(folder, SWEEP)
    return folder


def _run_stopped(data: Path, scenario: str, stop_at: int | None) -> int:
    code = (
        f"{RECORDS}\nfrom pathlib import Path\nD, S, MODELS = Path({str(data)!r}), {SWEEP!r}, "
        f"{MODELS!r}\n"
    )
    env = {**os.environ, fileio.STOP_AT_WRITE: str(stop_at)} if stop_at else dict(os.environ)
    return subprocess.run(
        [sys.executable, "-c", code + SCENARIOS[scenario]], env=env, timeout=120
    ).returncode


def _each_stop(tmp_path: Path, base: Path, scenario: str, check) -> int:
    """Run ``scenario`` on a copy of ``base`` stopped at its write point 1, 2, ... in turn, until
    it runs to its end, calling ``check(point, folder)`` after each stop; returns how many points
    there were."""
    point = 0
    while True:
        point += 1
        data = tmp_path / f"stop{point}"
        shutil.copytree(base, data)
        rc = _run_stopped(data, scenario, point)
        if rc == 0:
            return point - 1  # ran to its end before reaching this point: every point was covered
        assert rc == -signal.SIGKILL, f"stop at write point {point}: exit {rc}"
        check(point, data)
        shutil.rmtree(data)


def _rows(data: Path, config: str) -> list[tuple[str, str | None]]:
    path = store.parquet_file(data, config, SWEEP)
    if not path.exists():
        return []
    table = pq.read_table(path, columns=["model_id", "exclusion_reason"])
    return list(
        zip(table["model_id"].to_pylist(), table["exclusion_reason"].to_pylist(), strict=True)
    )


def _in_dataset(data: Path) -> set[str]:
    return {m for m, _ in _rows(data, "results") + _rows(data, "excluded")}


def _every_file_parses(data: Path) -> None:
    for path in data.rglob("*.json"):
        json.loads(path.read_text())
    for path in data.rglob("*.parquet"):
        if ".cache" not in path.parts:
            pq.read_table(path)
    for path in store.repro_dir(data).glob("*.py"):
        assert hashlib.sha256(path.read_bytes()).hexdigest() == path.stem


def _check_whole(data: Path) -> None:
    """After the next command: every record in the dataset once, in the config its state says;
    files parse."""
    _every_file_parses(data)
    assert not store.interrupted(data)
    records = sorted(r["model_id"] for r in store.iter_records(data, SWEEP))
    assert len(set(records)) == len(records), f"a model read twice: {records}"
    results, excluded = _rows(data, "results"), _rows(data, "excluded")
    seen = sorted([m for m, _ in results] + [m for m, _ in excluded if m != "org/gated"])
    assert seen == records, (results, excluded)
    assert [m for m, _ in excluded].count("org/gated") == 1
    if store.exclusion(data, SWEEP):
        assert not results
    else:
        assert sorted(m for m, _ in results) == records


@pytest.mark.parametrize(
    ("scenario", "before", "next_command"),
    [("store", "half", "compact"), ("exclude", "included", "any"), ("include", "excluded", "any")],
)
def test_a_stop_at_every_write_point_loses_and_doubles_nothing(
    tmp_path, capsys, scenario, before, next_command
):
    base = _base(tmp_path / "base", before)
    moving = _in_dataset(base)
    assert moving, (
        "no row in the dataset before the scenario: the check at the instant of a stop could "
        "not fail"
    )

    def check(point: int, data: Path) -> None:
        # at the instant of the stop: a row that was in the dataset is in one config or both, never
        # in neither
        assert moving <= _in_dataset(data), point
        # what every command does first (the CLI's --data-dir)
        said = store.finish_interrupted(data)
        if next_command == "compact":
            store.compact(data, SWEEP)  # a sweep's --resume or aggregate
        else:
            assert not store.interrupted(data) and all("was finished" in line for line in said)
        _check_whole(data)

    covered = _each_stop(tmp_path, base, scenario, check)
    assert covered >= {"store": 10, "exclude": 6, "include": 6}[scenario]
    with capsys.disabled():
        print(
            f"\n{scenario}: stopped at each of its {covered} write points, nothing lost or doubled"
        )


def _resume(data: Path) -> None:
    """What ``sweep --resume`` does to the store: migrate the names, probe the models without a
    record, compact."""
    store.finish_interrupted(data)
    store.migrate_names(data, SWEEP)
    files = list((store.sweep_dir(data, SWEEP) / "records").glob("*.json"))
    assert len({json.loads(f.read_text())["model_id"] for f in files}) == len(files), (
        "a record under two names"
    )
    for i, model in enumerate(MODELS):
        if store.find_record(data, SWEEP, model) is None:
            store.store_result(data, SWEEP, _record(i, model), b"{}", "log\n")
    store.compact(data, SWEEP)


def test_a_name_migration_stopped_at_any_write_point_doubles_no_row(tmp_path, capsys):
    """A resume moves a record from its legacy name (write the new name, remove the old): stopped
    at each write point, then aggregated (the reader alone meets whatever the stop left), then
    resumed: no model is ever two rows, none is lost, and one record file per model remains."""
    base = _base(tmp_path / "base", "legacy")
    moving = _in_dataset(base)
    assert (
        LEGACY in moving
        and (store.sweep_dir(base, SWEEP) / "records" / "local_tiny_opt.json").exists()
    )
    both_names = []

    def check(point: int, data: Path) -> None:
        assert moving <= _in_dataset(data), point
        store.finish_interrupted(data)
        store.compact(data, SWEEP)  # `model-support aggregate`: no migration, the reader alone
        if "is also under its own name" in capsys.readouterr().err:
            both_names.append(point)
        results = [m for m, _ in _rows(data, "results")]
        assert len(results) == len(set(results)) and set(MODELS[:3]) <= set(results), (
            point,
            results,
        )
        _resume(data)
        _check_whole(data)
        assert sorted(r["model_id"] for r in store.iter_records(data, SWEEP)) == sorted(MODELS)
        assert len(list((store.sweep_dir(data, SWEEP) / "records").glob("*.json"))) == len(
            MODELS
        ), point

    covered = _each_stop(tmp_path, base, "migrate", check)
    assert covered >= 8 and len(both_names) == 1, (covered, both_names)
    with capsys.disabled():
        print(
            f"\nmigrate: stopped at each of its {covered} write points (at {both_names[0]} "
            "under both names)"
        )


def _cli(data: Path, *args: str, **kwargs) -> subprocess.Popen:
    exe = Path(sys.executable).parent / "model-support"
    return subprocess.Popen(
        [str(exe), *args, "--data-dir", str(data)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


#: Kills from outside that must land inside ``exclude``'s change (its journal written, not yet
#: removed), and the most tries to get them: a kill that lands after the change is aimed again,
#: earlier.
INSIDE, TRIES = 4, 12


def _journal(data: Path) -> Path:
    return store.sweep_dir(data, SWEEP) / store.CHANGE


def _wait_for(condition, proc: subprocess.Popen, timeout: float = 60.0) -> bool:
    """Poll ``condition`` every 0.2 ms until it holds (True), or ``proc`` ends or the time is up
    (then its value)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            return condition()
        time.sleep(0.0002)
    return True


def _change_length(data: Path) -> float:
    """How long ``exclude``'s change lasts on this machine: its journal's life, watched from
    outside."""
    proc = _cli(data, "exclude", SWEEP, "--reason", "x")
    assert _wait_for(_journal(data).exists, proc), "the change's journal was never seen"
    began = time.monotonic()
    _wait_for(lambda: not _journal(data).exists(), proc)
    length = time.monotonic() - began
    assert proc.wait(timeout=120) == 0
    return length


def _kill_in_change(data: Path, delay: float) -> bool:
    """Start ``exclude`` on ``data`` and SIGKILL it ``delay`` s after its journal appears;
    whether the kill landed inside the change (the process killed with its journal still there)."""
    proc = _cli(data, "exclude", SWEEP, "--reason", "a broken stack")
    seen = _wait_for(_journal(data).exists, proc)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=120)
    return seen and proc.returncode == -signal.SIGKILL and _journal(data).exists()


def test_exclude_and_include_killed_from_outside_lose_no_row(tmp_path):
    """``model-support exclude`` SIGKILLed from outside at moments spread over its change (aimed
    from the change's measured length, and again earlier when a kill lands after it) until
    ``INSIDE`` kills landed inside: never a row in neither config, and the next command
    (``include``) says it finished the change exactly when one was left."""
    base = _base(tmp_path / "base", "included")
    shutil.copytree(base, tmp_path / "calibrate")
    length = _change_length(tmp_path / "calibrate")
    delays = [length * fraction for fraction in (0.1, 0.35, 0.6, 0.85)]
    landed: list[tuple[float, bool]] = []
    while sum(inside for _, inside in landed) < INSIDE and len(landed) < TRIES:
        delay = delays.pop(0) if delays else landed[-1][0] / 2
        data = tmp_path / f"kill{len(landed)}"
        shutil.copytree(base, data)
        inside = _kill_in_change(data, delay)
        landed.append((delay, inside))
        if not inside:
            delays.append(delay / 2)
        assert set(MODELS) <= _in_dataset(data), (delay, inside)
        nxt = _cli(data, "include", SWEEP)
        _, err = nxt.communicate(timeout=120)
        assert nxt.returncode == 0, err
        assert ("was finished" in err) == inside, (delay, inside, err)
        _check_whole(data)
        assert sorted(m for m, _ in _rows(data, "results")) == sorted(MODELS)
        shutil.rmtree(data)
    hits = sum(inside for _, inside in landed)
    assert hits >= INSIDE, (
        f"{hits} of {len(landed)} kills landed inside the {length:.3f} s change: {landed}"
    )
    print(f"{hits} of {len(landed)} kills landed inside the change ({length:.3f} s long)")


# --- every write goes through fileio
# ---------------------------------------------------------------
#
# The guard parses each source file and finds the calls that write, create, replace or remove a
# file, whatever their arguments look like on the line: ``open`` (and ``Path.open``, ``os.fdopen``,
# ``gzip.open``...) with a mode that writes, ``os.open`` with a creation or write flag,
# ``Path.write_*``, ``touch``, ``unlink``, ``rename`` and ``replace``, ``os`` renames and removals,
# ``shutil`` copies, moves and removals, ``mmap`` (writable unless mapped for reading), temporary
# files, and the libraries' own file writers (Parquet, Polars, torch, papermill). A write outside
# ``fileio`` is allowed only by name (file, function, call) with the reason it does not touch the
# store.

#: A string that is an ``open`` mode; it writes when it has w, a, x or +.
MODE = re.compile(r"[rwaxbtU+]{1,4}(:\w*)?")
OS_WRITE_FLAGS = {"O_CREAT", "O_WRONLY", "O_RDWR", "O_TRUNC", "O_APPEND"}
OS_CHANGES = {"replace", "rename", "renames", "remove", "unlink", "truncate", "link", "symlink"}
SHUTIL_CHANGES = {
    "copy",
    "copy2",
    "copyfile",
    "copytree",
    "move",
    "rmtree",
    "make_archive",
    "unpack_archive",
}
PATH_CHANGES = {"write_text", "write_bytes", "touch", "unlink", "symlink_to", "hardlink_to"}
FRAME_WRITES = {
    "write_parquet",
    "write_csv",
    "write_ipc",
    "write_ndjson",
    "sink_parquet",
    "sink_csv",
    "sink_ipc",
}
LIBRARY_WRITES = {
    "pyarrow.parquet.ParquetWriter",
    "pyarrow.parquet.write_table",
    "torch.save",
    "numpy.save",
    "papermill.execute_notebook",
    "nbformat.write",
    "tempfile.mkstemp",
    "tempfile.NamedTemporaryFile",
    "tempfile.TemporaryFile",
}
IN_MEMORY = {"io.BytesIO", "io.StringIO"}


def _aliases(tree: ast.Module) -> dict[str, str]:
    """What each imported name stands for (``pq`` -> ``pyarrow.parquet``, ``copy`` ->
    ``shutil.copy``)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            for alias in node.names:
                names[alias.asname or alias.name] = f"{module}.{alias.name}"
    return names


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str:
    """A callee's dotted name with its import resolved (``?`` for an expression:
    ``Path(p).touch`` -> ``?.touch``)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    parts.append(aliases.get(node.id, node.id) if isinstance(node, ast.Name) else "?")
    return ".".join(reversed(parts))


def _flags(node: ast.AST | None) -> set[str]:
    """The names an expression mentions (``os.O_WRONLY | os.O_CREAT`` -> {os, O_WRONLY,
    O_CREAT})."""
    if node is None:
        return set()
    return {
        n.attr if isinstance(n, ast.Attribute) else n.id
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute | ast.Name)
    }


def _argument(call: ast.Call, index: int, keyword: str) -> ast.AST | None:
    if len(call.args) > index:
        return call.args[index]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def _writes_by_mode(mode: ast.AST | None) -> bool:
    """Whether an ``open`` mode writes: a literal with w, a, x or +, or an expression it cannot
    read."""
    if mode is None:
        return False
    if not (isinstance(mode, ast.Constant) and isinstance(mode.value, str)):
        return True
    return bool(set(mode.value) & set("wax+"))


def _open_kind(call: ast.Call, name: str) -> str | None:
    """An ``open``-like call that writes: the builtin, ``io.open`` and ``os.fdopen`` take the
    mode second; a method ``open`` (``Path.open``, ``gzip.open``, ``tarfile.open``) takes it
    first or second."""
    if name in ("open", "io.open", "os.fdopen"):
        return "open" if _writes_by_mode(_argument(call, 1, "mode")) else None
    given = [
        a
        for a in call.args[:2]
        if isinstance(a, ast.Constant) and isinstance(a.value, str) and MODE.fullmatch(a.value)
    ]
    mode = given[0] if given else _argument(call, 99, "mode")
    return "open" if _writes_by_mode(mode) else None


def _mmap_writes(call: ast.Call) -> bool:
    """A memory map writes unless mapped for reading (``access=ACCESS_READ``, or a ``prot``
    without PROT_WRITE)."""
    access, prot = _argument(call, 4, "access"), _argument(call, 3, "prot")
    if "ACCESS_READ" in _flags(access):
        return False
    return (
        prot is None
        or "PROT_WRITE" in _flags(prot)
        or not _flags(prot) & {"PROT_READ", "PROT_EXEC"}
    )


def write_kind(call: ast.Call, aliases: dict[str, str], in_memory: set[str]) -> str | None:
    """What file write ``call`` is (``open``, ``os.open``, ``Path.write_text``, ``shutil.move``,
    ``mmap``, ...), or None when it writes no file."""
    name = _dotted(call.func, aliases)
    module, _, last = name.rpartition(".")
    if module.startswith((".", "model_support")):
        return None  # the project's own functions: scanned where they are defined
    if name == "os.open":
        flags = _flags(_argument(call, 1, "flags"))
        return (
            name if flags & OS_WRITE_FLAGS or not any(f.startswith("O_") for f in flags) else None
        )
    if name in ("open", "io.open", "os.fdopen") or (last == "open" and module):
        return _open_kind(call, name)
    if name == "mmap.mmap":
        return name if _mmap_writes(call) else None
    if module == "os" and last in OS_CHANGES or module == "shutil" and last in SHUTIL_CHANGES:
        return name
    if name in LIBRARY_WRITES:
        to = _argument(call, 1, "f") if name in ("torch.save", "numpy.save") else None
        return None if isinstance(to, ast.Name) and to.id in in_memory else name
    if not module:
        return None
    if last in PATH_CHANGES:
        return f"Path.{last}"
    if (
        last in ("rename", "replace")
        and len(call.args) == 1
        and not call.keywords
        and not _mapping(call.args[0])
    ):
        # str.replace takes two arguments; datetime's and Polars' keywords or a mapping
        return f"Path.{last}"
    if last in FRAME_WRITES:
        target = call.args[0] if call.args else None
        return None if isinstance(target, ast.Name) and target.id in in_memory else f"frame.{last}"
    return None


def _mapping(node: ast.AST) -> bool:
    return isinstance(node, ast.Dict | ast.DictComp)


def _in_memory(function: ast.AST, aliases: dict[str, str]) -> set[str]:
    """The names a function binds to an in-memory file (``buffer = io.BytesIO()``): writing to
    them writes no file."""
    return {
        target.id
        for node in ast.walk(function)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and _dotted(node.value.func, aliases) in IN_MEMORY
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def file_writes(source: str) -> list[tuple[str, str, int]]:
    """Every file write in ``source``: (the function it is in, ``Class.method`` or ``<module>``,
    its kind, line)."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    found = []

    def visit(node: ast.AST, where: list[str], in_memory: set[str]) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            where = [*where, node.name]
            if not isinstance(node, ast.ClassDef):
                in_memory = in_memory | _in_memory(node, aliases)
        if isinstance(node, ast.Call) and (kind := write_kind(node, aliases, in_memory)):
            found.append((".".join(where) or "<module>", kind, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, where, in_memory)

    visit(tree, [], set())
    return found


#: What the guard finds and what it does not: (source, the kinds it finds).
GUARD_CASES = [
    ('open(p, "w")', ["open"]),
    # a call inside the path hid the mode from a regex
    ('open(os.path.join(a, f"rank{r}.json"), "w")', ["open"]),
    ('open(p, mode="ab+")', ["open"]),
    ("open(p, how)", ["open"]),  # a mode it cannot read counts as a write
    ('open(p, "rb")', []),
    ('open("w.txt")', []),
    ('Path(p).open("a")', ["open"]),
    ('import gzip\ngzip.open(p, "wt")', ["open"]),
    ('import os\nos.fdopen(fd, "wb")', ["open"]),
    ("import os\nos.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)", ["os.open"]),
    ("import os\nos.open(p, flags)", ["os.open"]),
    ("import os\nos.open(folder, os.O_RDONLY)", []),
    (
        "import mmap\nmmap.mmap(fd, n, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)",
        ["mmap.mmap"],
    ),
    ("import mmap\nmmap.mmap(fd, n)", ["mmap.mmap"]),
    ("import mmap\nmmap.mmap(fd, n, access=mmap.ACCESS_READ)", []),
    ("from mmap import mmap as m\nm(fd, n, prot=PROT_READ)", []),
    ('(work / "x").write_text(t)', ["Path.write_text"]),
    ("p.write_bytes(b)", ["Path.write_bytes"]),
    ("(work / AT_GATE).touch()", ["Path.touch"]),
    ("building.rename(folder)", ["Path.rename"]),
    ("tmp.replace(path)", ["Path.replace"]),
    ('text.replace("/", "__")', []),
    ('frame.rename({"a": "b"})', []),
    ("frame.rename(COLUMNS, strict=False)", []),
    ("import shutil\nshutil.move(a, b)", ["shutil.move"]),
    ("from shutil import copyfile as cp\ncp(a, b)", ["shutil.copyfile"]),
    ("import os\nos.replace(a, b)\nos.unlink(a)", ["os.replace", "os.unlink"]),
    (
        "import pyarrow.parquet as pq\npq.ParquetWriter(tmp, schema)",
        ["pyarrow.parquet.ParquetWriter"],
    ),
    ("def f():\n    frame.write_parquet(path)", ["frame.write_parquet"]),
    ("import io\ndef f():\n    buffer = io.BytesIO()\n    frame.write_parquet(buffer)", []),
    ("import io, torch\ndef f():\n    b = io.BytesIO()\n    torch.save(x, b)", []),
    ("import torch\ntorch.save(x, path)", ["torch.save"]),
    (
        "import tempfile\ntempfile.NamedTemporaryFile('w', delete=False)",
        ["tempfile.NamedTemporaryFile"],
    ),
    (
        "from ..record import store\nstore.write_parquet(rows, path)",
        [],
    ),  # the project's own: scanned in dataset_files.py
]


@pytest.mark.parametrize(("source", "kinds"), GUARD_CASES)
def test_the_write_guard_finds_writes_by_their_call(source, kinds):
    assert [kind for _, kind, _ in file_writes(source)] == kinds


#: Writes that do not touch the store, each named (file, function, call) with why. Everything else
#: is a write to the data folder and goes through ``model_support.fileio``.
NOT_THE_STORE = {
    (
        "record/dataset_files.py",
        "write_parquet",
        "tempfile.mkstemp",
    ): "a Parquet file's temporary copy, a name of its own",
    (
        "record/dataset_files.py",
        "write_parquet",
        "pyarrow.parquet.ParquetWriter",
    ): "the temporary copy, moved in by fileio.replace_file once whole and synced",
    (
        "record/dataset_files.py",
        "write_parquet",
        "Path.unlink",
    ): "the temporary copy of a Parquet file that was not moved in",
    (
        "record/sweep_folders.py",
        "SweepLock.__enter__",
        "open",
    ): "a sweep's lock file (flock), never read",
    (
        "record/sweep_folders.py",
        "data_folder_lock",
        "open",
    ): "the data folder's lock file (flock), never read",
    (
        "render/modes_section.py",
        "_pick",
        "Path.rename",
    ): "a Polars frame's columns renamed by a list, no file",
    (
        "probe/phases.py",
        "save",
        "Path.write_text",
    ): "a probe process's hand-over to its worker, in the probe's work "
    "folder, read once the process has ended",
    (
        "probe/run.py",
        "run_probe",
        "Path.unlink",
    ): "the probe kernel's own marker beside its record, in its work folder",
    (
        "probe/reproduce.py",
        "_rank",
        "open",
    ): "a repro script's rank report in its own temporary folder (the script "
    "runs without the project installed)",
    (
        "probe/instruments/flight_recorder.py",
        "_recorder_class._FlightRecorder.__enter__",
        "os.open",
    ): "the probe's "
    "flight recorder, in its work folder: a fixed-size ring that outlives a dead kernel",
    (
        "probe/instruments/flight_recorder.py",
        "_recorder_class._FlightRecorder.__enter__",
        "mmap.mmap",
    ): "the flight recorder's ring, written through the memory map as the probe runs",
    (
        "probe/sharded/launch.py",
        "run_sharded",
        "shutil.rmtree",
    ): "a sharded probe's ranks' scratch folder, removed",
    (
        "sweep/runner.py",
        "_forget_refused",
        "shutil.rmtree",
    ): "a new sweep refused before anything of it was stored "
    "(no record, no pending file): its folder, so list shows no work to do",
    (
        "probe/sharded/launch.py",
        "_launch_and_wait",
        "open",
    ): "the launcher's log in the ranks' scratch folder",
    (
        "probe/sharded/rank.py",
        "rank_main",
        "Path.write_text",
    ): "a rank's pid file in the ranks' scratch folder",
    (
        "probe/hub_fetch.py",
        "fetch",
        "Path.write_text",
    ): "the Hugging Face cache's ref file (the cache, not the store)",
    (
        "probe/probe_params.py",
        "write_parameters_cells",
        "Path.write_text",
    ): "the package's own notebooks (a developer's command)",
    ("bisect/envs.py", "locked", "open"): "a lock file of the bisect's cache (flock), never read",
    (
        "bisect/envs.py",
        "Overlays.layer",
        "shutil.rmtree",
    ): "a half-built or stale layer of the bisect's cache",
    (
        "bisect/envs.py",
        "Overlays.layer",
        "Path.rename",
    ): "a layer of the bisect's cache, built aside then renamed in",
    ("bisect/envs.py", "Overlays.layer", "Path.touch"): "a cache layer's completion marker",
    (
        "bisect/envs.py",
        "Overlays._build",
        "shutil.rmtree",
    ): "an overlay environment of the bisect's cache, rebuilt",
    (
        "bisect/envs.py",
        "Overlays._build",
        "Path.write_text",
    ): "an overlay environment's .pth file (pip writes there too)",
    (
        "bisect/envs.py",
        "Overlays._build",
        "Path.touch",
    ): "an overlay environment's completion marker",
    ("bisect/envs.py", "Overlays.clean", "shutil.rmtree"): "the bisect's cache, cleared on request",
    (
        "bisect/search.py",
        "Bisector._script",
        "Path.write_text",
    ): "a script of the bisect's cache, named by its text",
    ("engine/kernels.py", "ipc_kernel", "shutil.rmtree"): "a kernel's socket folder under /tmp",
    (
        "engine/notebooks.py",
        "run_notebook",
        "papermill.execute_notebook",
    ): "papermill saves the executed notebook where its caller says: a probe's work folder, the "
    "report's partial file (moved in by fileio.replace_file), a debug session's notebook "
    "(saved after each cell as it runs)",
    ("engine/zygote.py", "_fd", "os.open"): "/dev/null as a kernel's stream",
    ("engine/zygote.py", "<module>", "os.unlink"): "the zygote's socket, removed as it ends",
    (
        "publish/files.py",
        "stage_logs",
        "Path.write_bytes",
    ): "a push's staging folder (a temporary directory)",
    (
        "publish/push.py",
        "_commit",
        "Path.write_text",
    ): "a push's staging folder (a temporary directory)",
    (
        "publish/push.py",
        "_latest_report",
        "Path.write_text",
    ): "a push's staging folder (a temporary directory)",
    (
        "sweep/worker/device_gate.py",
        "await_grant",
        "Path.touch",
    ): "the probe's at-the-gate marker in its work folder",
    (
        "sweep/worker/host_checks.py",
        "run_checks",
        "Path.write_text",
    ): "the host checks' input in the standby's work folder",
    (
        "sweep/worker/deaths.py",
        "_attribute_death",
        "tempfile.NamedTemporaryFile",
    ): "the attribution's input for its child process, in the system's temporary folder",
    (
        "sweep/worker/deaths.py",
        "_attribute_death",
        "os.unlink",
    ): "that input, removed when the child is done",
    ("sweep/worker/process.py", "Standby.__init__", "open"): "a standby's log in its work folder",
    (
        "sweep/worker/process.py",
        "Standby.__init__",
        "shutil.rmtree",
    ): "a standby's work folder, removed when no process started",
    (
        "sweep/worker/process.py",
        "Standby.run",
        "Path.write_text",
    ): "the task handed to a standby, in its work folder",
    (
        "sweep/worker/process.py",
        "Standby.run",
        "shutil.rmtree",
    ): "a standby's work folder, removed once read",
    (
        "sweep/worker/process.py",
        "Standby.discard",
        "shutil.rmtree",
    ): "a standby's work folder, removed unused",
    (
        "sweep/worker/process.py",
        "_execute",
        "open",
    ): "the kernel's stderr in the standby's work folder",
    (
        "sweep/worker/process.py",
        "_execute",
        "Path.touch",
    ): "the standby's warm marker in its work folder",
    (
        "sweep/worker/process.py",
        "_execute",
        "Path.write_text",
    ): "the outcome of a standby whose kernel never started, in its work folder",
    (
        "sweep/worker/process.py",
        "_run_notebook",
        "Path.write_text",
    ): "the probe's outcome in its work folder, read by the worker",
}


def test_every_write_to_the_data_folder_goes_through_fileio():
    """Every file write in ``src/`` outside ``fileio`` is named in ``NOT_THE_STORE`` with its
    reason, and every name there still matches a write (a stale one would let the next write in
    that function pass unread)."""
    unexplained, used = [], set()
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "fileio.py":
            continue
        for function, kind, line in file_writes(path.read_text()):
            key = (rel, function, kind)
            if key in NOT_THE_STORE:
                used.add(key)
            else:
                unexplained.append(f"{rel}:{line}: {kind} in {function}")
    assert not unexplained, "writes that bypass model_support.fileio:\n" + "\n".join(unexplained)
    assert used == set(NOT_THE_STORE), (
        f"exceptions that no longer match a write: {set(NOT_THE_STORE) - used}"
    )
