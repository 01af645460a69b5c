"""The headline command, cold: ``papermill notebooks/probe.ipynb out.ipynb -p model_id X`` against the
record's own repro script (``python repro.py X``), side by side in one run, interleaved, on tiny-llama.

Both start a fresh Python, import torch and transformers, load the model and generate 8 tokens; the
difference is what the harness costs a one-off probe: papermill, a kernel, the notebook, the record.
The comparison is like for like: the CPU reference off (``-p reference none``) and the fluency judge off
(``-p judge False``), neither of which the repro script runs here (it has no judge at all). The command as typed,
judge on (its default), runs in the same rounds: its difference from the like-for-like run is the judge's cost,
the probe's own work, not the harness's. Where the papermill probe's time goes (median seconds) is read
from the executed notebook's papermill metadata and the record: papermill's process (Python, papermill's
imports, the notebook read, the exit), the kernel's start, the cell with the stack's imports and the probe
(``duration_s``, the record's), the other cells, the kernel's shutdown; and each command's CPU seconds (its
processes', the kernel's included), steadier than wall time on a shared machine. ``--baseline NOTEBOOK`` also runs an
earlier probe notebook the same way in the same rounds ("before").
Target: the papermill probe at most 1.0 s over the repro script (the medians' difference).

The command line, cold (``--cli``): ``model-support --help`` and ``model-support list`` (a data folder with no
sweeps), each a fresh process, interleaved; ``--baseline-src DIR`` runs them (and the probe, with ``--baseline``)
with an earlier checkout's ``src/`` first on PYTHONPATH too ("before"), e.g. ``git worktree add /tmp/before HEAD~1``.
Target: no slower than before (the medians within their spread).

    .venv/bin/python bench/bench_cold_command.py [--reps 5] [--baseline NOTEBOOK] [--baseline-src DIR] [--cli]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from common import REPO, fixtures, spread, write_results

TARGET_S = 1.0
NOTEBOOK = "notebooks/probe.ipynb"


def timed(args: list[str], cwd: Path, env: dict | None = None) -> tuple[float, float]:
    """Wall seconds of the command, and the CPU seconds of its processes (the kernel's too:
    papermill waits for it)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(args, cwd=cwd, check=True, capture_output=True, timeout=900, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def papermill_command(notebook: str, work: Path, name: str, folder: str, judge: bool) -> list[str]:
    papermill = os.path.join(os.path.dirname(sys.executable), "papermill")
    command = [
        papermill,
        notebook,
        str(work / f"{name}.ipynb"),
        "-p",
        "model_id",
        folder,
        "-p",
        "device",
        "cpu",
    ]
    command += ["-p", "reference", "none", "-p", "record_path", str(work / f"{name}.json")]
    return command if judge else [*command, "-p", "judge", "False"]


def parts(wall: float, notebook: Path, record: Path) -> dict:
    """Where one papermill run's ``wall`` seconds went, from its executed notebook and its
    record."""
    nb = json.loads(notebook.read_text())
    run = nb["metadata"]["papermill"]
    cells = [cell["metadata"]["papermill"] for cell in nb["cells"]]

    def at(stamp: str) -> float:
        return datetime.fromisoformat(stamp).timestamp()

    probe_cell = max(cells, key=lambda cell: cell["duration"] or 0.0)
    probe_s = json.loads(record.read_text())["duration_s"]
    return {
        "papermill_process": wall - run["duration"],
        "kernel_start": at(cells[0]["start_time"]) - at(run["start_time"]),
        "imports_in_kernel": probe_cell["duration"] - probe_s,
        "probe": probe_s,
        "other_cells": at(cells[-1]["end_time"])
        - at(cells[0]["start_time"])
        - probe_cell["duration"],
        "kernel_shutdown": at(run["end_time"]) - at(cells[-1]["end_time"]),
    }


#: What each part of ``parts`` holds, for the README's table.
PARTS = {
    "papermill_process": "papermill's process: Python, papermill's imports, the notebook read, the exit",
    "kernel_start": "the kernel's start (Python, ipykernel, IPython), until it answers",
    "imports_in_kernel": "the probe cell before the probe: model_support's imports, and torch's and transformers' "
    "where the notebook preloads them (before: inside the probe)",
    "probe": "the probe itself (the record's duration_s: load, generate, record)",
    "other_cells": "the other cells, the notebook's writes after each",
    "kernel_shutdown": "the kernel's shutdown, until its process is gone",
}


def with_src(src: str | None) -> dict | None:
    """The environment that imports ``model_support`` from ``src`` (an earlier checkout's), or
    None: this one's."""
    if not src:
        return None
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(Path(src).resolve()), os.environ.get("PYTHONPATH")])
        ),
    }


def cold_cli(reps: int, baseline_src: str | None) -> dict:
    """``model-support --help`` and ``list``, each a fresh process, interleaved with the same
    commands importing ``baseline_src``'s package (before), when given."""
    command = os.path.join(os.path.dirname(sys.executable), "model-support")
    data = Path(tempfile.mkdtemp(prefix="bench-cold-cli-"))
    (data / "sweeps").mkdir()
    runs = {"help": [command, "--help"], "list": [command, "list", "--data-dir", str(data)]}
    envs = {"after": None, **({"before": with_src(baseline_src)} if baseline_src else {})}
    for env in envs.values():  # the disk cache warmed, and each side checked to run
        for args in runs.values():
            subprocess.run(args, cwd=REPO, check=True, capture_output=True, timeout=120, env=env)
    walls = {(side, name): [] for side in envs for name in runs}
    for _ in range(reps):
        for name, args in runs.items():
            for side, env in envs.items():
                walls[(side, name)].append(timed(args, REPO, env)[0])
    found = {side: {name: spread(walls[(side, name)]) for name in runs} for side in envs}
    for name in runs:
        said = f"model-support {' '.join(runs[name][1:2])}: {found['after'][name]['median']:.3f} s"
        if "before" in found:
            said += f" (before {found['before'][name]['median']:.3f} s)"
        print(said)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--baseline", help="an earlier probe notebook, run the same way in the same rounds (before)"
    )
    parser.add_argument(
        "--baseline-src", help="an earlier checkout's src/: its package for the before runs"
    )
    parser.add_argument(
        "--cli", action="store_true", help="only the command line's cold start (--help, list)"
    )
    args = parser.parse_args()
    cli = cold_cli(args.reps * 4, args.baseline_src)
    if args.cli:
        write_results("cold_cli", {"reps": args.reps * 4, **cli})
        return
    folder = fixtures()["tiny-llama"]["path"]
    work = Path(tempfile.mkdtemp(prefix="bench-cold-"))
    runs = {
        "papermill": papermill_command(NOTEBOOK, work, "papermill", folder, judge=False),
        "as_typed": papermill_command(NOTEBOOK, work, "as_typed", folder, judge=True),
    }
    if args.baseline:
        runs["before"] = papermill_command(args.baseline, work, "before", folder, judge=False)
        runs["before_as_typed"] = papermill_command(
            args.baseline, work, "before_as_typed", folder, judge=True
        )
    # warms the disk cache
    subprocess.run(runs["papermill"], cwd=REPO, check=True, capture_output=True, timeout=900)
    (work / "repro.py").write_text(
        json.loads((work / "papermill.json").read_text())["repro_script"]
    )
    runs = {"repro": [sys.executable, str(work / "repro.py"), folder], **runs}
    walls: dict[str, list[float]] = {name: [] for name in runs}
    cpus: dict[str, list[float]] = {name: [] for name in runs}
    split: dict[str, list[dict]] = {name: [] for name in runs if name != "repro"}
    for _ in range(args.reps):
        for name, command in runs.items():
            env = with_src(args.baseline_src) if name.startswith("before") else None
            wall, cpu = timed(command, work if name == "repro" else REPO, env)
            walls[name].append(wall)
            cpus[name].append(cpu)
            if name in split:
                split[name].append(parts(wall, work / f"{name}.ipynb", work / f"{name}.json"))
    script, script_cpu = spread(walls["repro"]), spread(cpus["repro"])

    def measured(name: str) -> dict:
        probe, cpu = spread(walls[name]), spread(cpus[name])
        medians = {
            part: round(statistics.median(s[part] for s in split[name]), 3) for part in PARTS
        }
        return {
            "papermill_probe_s": probe,
            "overhead_s": round(probe["median"] - script["median"], 2),
            "ratio": round(probe["median"] / script["median"], 3),
            "cpu_s": cpu,
            "cpu_overhead_s": round(cpu["median"] - script_cpu["median"], 2),
            "parts_s": medians,
        }

    after, typed = measured("papermill"), measured("as_typed")
    typed["judge_s"] = round(
        typed["papermill_probe_s"]["median"] - after["papermill_probe_s"]["median"], 2
    )
    typed["judge_cpu_s"] = round(typed["cpu_s"]["median"] - after["cpu_s"]["median"], 2)
    results = {
        "model": "tiny-llama",
        "reps": args.reps,
        "repro_script_s": script,
        "repro_script_cpu_s": script_cpu,
        **after,
        "as_typed": typed,
        "target_s": TARGET_S,
        "met": after["overhead_s"] <= TARGET_S,
        "parts": PARTS,
        "cli": cli,
    }
    print(
        f"papermill probe {after['papermill_probe_s']['median']:.2f} s, repro script "
        f"{script['median']:.2f} s: {after['overhead_s']:+.2f} s ({after['ratio']:.2f}x, CPU "
        f"{after['cpu_overhead_s']:+.2f} s); as typed (judge on) {typed['overhead_s']:+.2f} s"
    )
    if args.baseline:
        results["before"] = measured("before")
        results["before"]["as_typed"] = measured("before_as_typed")
        print(
            f"before: {results['before']['overhead_s']:+.2f} s, as typed "
            f"{results['before']['as_typed']['overhead_s']:+.2f} s"
        )
    write_results("cold_command", results)


if __name__ == "__main__":
    main()
