"""The store under interruption: a process stopped at every write point, and SIGKILLs from outside.

Every write to the data folder goes through ``model_support.fileio`` (checked statically below), so each of
those calls is a write point; ``MODEL_SUPPORT_STOP_AT_WRITE=N`` makes a process SIGKILL itself just before its
N-th. Each scenario runs on ready-made records (no papermill per point) in a fresh copy of a data folder,
stopped at point 1, 2, ... until it runs to the end; after each stop the next command runs, then the
invariant is checked: every record is in the dataset exactly once, in the config its state says, and every
file parses. SQLite and LevelDB are tested this way.
"""

from __future__ import annotations

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
    # a sweep's records stored one by one, then compacted (what a sweep does as its probes come back)
    "store": "for i, m in enumerate(MODELS):\n"
    "    store.store_result(D, S, record(S, i, m), b'{}', 'log\\n')\n"
    "store.compact(D, S)\n",
    "exclude": "store.set_exclusion(D, S, 'a broken stack')\n",
    "include": "store.set_exclusion(D, S, None)\n",
}


def _meta() -> SweepMeta:
    return SweepMeta(
        sweep_id=SWEEP,
        name="faults",
        created_at="2026-12-05T00:00:00+00:00",
        probe={},
        models=[ModelEntry(m) for m in MODELS],
        excluded={"org/gated": "no access"},
    )


def _base(folder: Path, state: str) -> Path:
    """A data folder with the sweep written: ``empty`` (no record yet), ``included`` or ``excluded``."""
    _meta().write(store.sweep_dir(folder, SWEEP))
    if state != "empty":
        namespace: dict = {}
        exec(RECORDS, namespace)
        for i, model in enumerate(MODELS):
            store.store_result(folder, SWEEP, namespace["record"](SWEEP, i, model), b"{}", "log\n")
        store.set_exclusion(folder, SWEEP, "a broken stack" if state == "excluded" else None)
    return folder


def _run_stopped(data: Path, scenario: str, stop_at: int | None) -> int:
    code = f"{RECORDS}\nfrom pathlib import Path\nD, S, MODELS = Path({str(data)!r}), {SWEEP!r}, {MODELS!r}\n"
    env = {**os.environ, fileio.STOP_AT_WRITE: str(stop_at)} if stop_at else dict(os.environ)
    return subprocess.run([sys.executable, "-c", code + SCENARIOS[scenario]], env=env, timeout=120).returncode


def _rows(data: Path, config: str) -> list[tuple[str, str | None]]:
    path = store.parquet_file(data, config, SWEEP)
    if not path.exists():
        return []
    table = pq.read_table(path, columns=["model_id", "exclusion_reason"])
    return list(zip(table["model_id"].to_pylist(), table["exclusion_reason"].to_pylist(), strict=True))


def _every_file_parses(data: Path) -> None:
    for path in data.rglob("*.json"):
        json.loads(path.read_text())
    for path in data.rglob("*.parquet"):
        if ".cache" not in path.parts:
            pq.read_table(path)
    for path in store.repro_dir(data).glob("*.py"):
        assert hashlib.sha256(path.read_bytes()).hexdigest() == path.stem


def _check_whole(data: Path) -> None:
    """After the next command: every record in the dataset once, in the config its state says; files parse."""
    _every_file_parses(data)
    assert not store.interrupted(data)
    records = sorted(r["model_id"] for r in store.iter_records(data, SWEEP))
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
    [("store", "empty", "compact"), ("exclude", "included", "any"), ("include", "excluded", "any")],
)
def test_a_stop_at_every_write_point_loses_and_doubles_nothing(tmp_path, capsys, scenario, before, next_command):
    base = _base(tmp_path / "base", before)
    moving = sorted(m for m, _ in _rows(base, "results") + _rows(base, "excluded"))
    point = 0
    while True:
        point += 1
        data = tmp_path / f"stop{point}"
        shutil.copytree(base, data)
        rc = _run_stopped(data, scenario, point)
        if rc == 0:
            break  # ran to its end before reaching this point: every point was covered
        assert rc == -signal.SIGKILL, f"stop at write point {point}: exit {rc}"
        # at the instant of the stop: a row that was in the dataset is in one config or both, never in neither
        assert set(moving) <= {m for m, _ in _rows(data, "results") + _rows(data, "excluded")}, point
        said = store.finish_interrupted(data)  # what every command does first (the CLI's --data-dir)
        if next_command == "compact":
            store.compact(data, SWEEP)  # a sweep's --resume or aggregate
        else:
            assert not store.interrupted(data) and all("was finished" in line for line in said)
        _check_whole(data)
        shutil.rmtree(data)
    covered = point - 1
    assert covered >= {"store": 15, "exclude": 6, "include": 6}[scenario]
    with capsys.disabled():
        print(f"\n{scenario}: stopped at each of its {covered} write points, nothing lost or doubled")


def _cli(data: Path, *args: str, **kwargs) -> subprocess.Popen:
    exe = Path(sys.executable).parent / "model-support"
    return subprocess.Popen(
        [str(exe), *args, "--data-dir", str(data)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
    )


def test_exclude_and_include_killed_from_outside_lose_no_row(tmp_path):
    """``model-support exclude`` and ``include`` SIGKILLed at moments spread over their run: never a row in
    neither config, and the next command says it finished the change."""
    base = _base(tmp_path / "base", "included")
    started = time.monotonic()
    assert _cli(base, "exclude", SWEEP, "--reason", "x").wait(timeout=120) == 0
    whole = time.monotonic() - started
    _cli(base, "include", SWEEP).wait(timeout=120)
    finished = 0
    for i, fraction in enumerate((0.55, 0.7, 0.8, 0.9)):
        data = tmp_path / f"kill{i}"
        shutil.copytree(base, data)
        proc = _cli(data, "exclude", SWEEP, "--reason", "a broken stack")
        time.sleep(whole * fraction)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert set(MODELS) <= {m for m, _ in _rows(data, "results") + _rows(data, "excluded")}
        nxt = _cli(data, "include", SWEEP)
        out, err = nxt.communicate(timeout=120)
        assert nxt.returncode == 0, err
        finished += "was finished" in err
        _check_whole(data)
        assert sorted(m for m, _ in _rows(data, "results")) == sorted(MODELS)
    print(f"{finished} of 4 kills landed inside the change")


# --- every write goes through fileio ---------------------------------------------------------------

WRITES = re.compile(
    r"open\([^)]*['\"][wax]b?\+?['\"]|\.write_text\(|\.write_bytes\(|os\.(replace|rename|remove|unlink)\(|"
    r"shutil\.(copy|copy2|copyfile|move|rmtree|copytree)\(|\.unlink\(|\.touch\(|ParquetWriter\(|pq\.write_table\(|"
    r"\.write_parquet\((?!buffer)|\.rename\((?![{(]|UNPROBED|columns|\w+_COLUMNS)"
)

#: Writes that do not touch the store, each with why: (file, text on the line) -> reason.
NOT_THE_STORE = {
    ("record/store.py", "ParquetWriter(tmp"): "a Parquet file's temporary copy, moved in by fileio.replace_file",
    ("record/store.py", "tmp.unlink("): "the temporary copy of a Parquet file that was not moved in",
    ("record/store.py", 'open(self.path, "a+")'): "a sweep's lock file (flock), never read",
    ("record/store.py", 'open(data_dir / ".lock", "a+")'): "the data folder's lock file (flock), never read",
    ("probe/phases.py", "write_text("): "a probe process's hand-over to its worker, in the probe's work folder",
    ("probe/run.py", "started_path(record_path).unlink"): "the probe kernel's own marker beside its record",
    ("probe/sharded/", ""): "a sharded probe's ranks' scratch folder",
    ("probe/hub_fetch.py", "ref.write_text"): "the Hugging Face cache's ref file (the cache, not the store)",
    ("probe/probe_params.py", "path.write_text"): "the package's own notebooks (a developer's command)",
    ("bisect/", ""): "the bisect's cache of overlay environments and scripts (pip writes there too)",
    ("engine/", ""): "kernels' connection files and the zygote's socket",
    ("publish/files.py", "out.write_bytes"): "a push's staging folder (a temporary directory)",
    ("publish/push.py", ".write_text("): "a push's staging folder (a temporary directory)",
    ("sweep/worker/", ""): "a probe's scratch folder (.work): read by the process that wrote it or its parent",
}


def test_every_write_to_the_data_folder_goes_through_fileio():
    unexplained, used = [], set()
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "fileio.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not WRITES.search(line):
                continue
            keys = [k for k in NOT_THE_STORE if rel.startswith(k[0]) and k[1] in line]
            used.update(keys)
            if not keys:
                unexplained.append(f"{rel}:{number}: {line.strip()}")
    assert not unexplained, "writes that bypass model_support.fileio:\n" + "\n".join(unexplained)
    assert used == set(NOT_THE_STORE), f"exceptions that no longer match a write: {set(NOT_THE_STORE) - used}"
