"""model-support bisect, for real: a wheelhouse written by the test, two real sweeps whose probes
ran on two releases of its package (each sweep run from an overlay environment), and the bisect
naming the package and the first release that changed a fixture model; a flaky model reported
flaky; a release with no wheel for this Python skipped with its reason. Offline: releases come
from the wheelhouse (--find-links, --no-index)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fixtures.wheelhouse import FLAKY_FORWARD, SWITCH_FORWARD, custom_model, wheelhouse, write_wheel
from helpers import REPO
from model_support.bisect import releases, results, stacks
from model_support.bisect.envs import InstallError, Overlays, conflicts
from model_support.bisect.releases import Release
from model_support.bisect.search import split
from model_support.probe import provenance
from model_support.record import store
from model_support.record.sweep_meta import SweepMeta

CLI = [sys.executable, "-m", "model_support.cli"]
VERSIONS = ["1.0", "1.1", "1.2", "2.0", "2.1"]


@pytest.fixture(scope="module")
def two_sweeps(tmp_path_factory, fixture_models):
    """Sweep A on tinyswitch 1.0 (and tinydecoy 1.0), sweep B on tinyswitch 2.1 (tinydecoy 1.1),
    each run by `model-support sweep` inside an overlay environment holding those releases."""
    tmp = tmp_path_factory.mktemp("bisect")
    wheels = wheelhouse(tmp / "wheels", VERSIONS, broken_from="2.0", no_wheel=("1.1",))
    source = REPO / "data" / "models" / "modes-graph-break"
    switch = custom_model(source, tmp / "models" / "switch", SWITCH_FORWARD)
    flaky = custom_model(source, tmp / "models" / "flaky", FLAKY_FORWARD)
    env = {
        **os.environ,
        "HF_MODULES_CACHE": str(tmp / "hf-modules"),
        "BISECT_FLAKY_COUNTER": str(tmp / "flaky-count"),
    }
    data = tmp / "data"
    # the default cache: the bisects below find these environments there
    cache = data / "bisect-envs"
    overlays = Overlays(cache, wheels)
    ids = []
    for name, pins in (
        ("before", {"tinyswitch": "1.0", "tinydecoy": "1.0"}),
        ("after", {"tinyswitch": "2.1", "tinydecoy": "1.1"}),
    ):
        definition = {
            "name": name,
            "probe": {
                "device": "cpu",
                "reference": "none",
                "judge": False,
                "trust_remote_code": True,
            },
            "timeout_s": 300,
            "workers": 2,
            "models": [str(switch), str(flaky)],
        }
        path = tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(definition))
        command = [
            str(overlays.python(pins)),
            "-m",
            "model_support.cli",
            "sweep",
            str(path),
            "--no-report",
        ]
        run = subprocess.run(
            [*command, "--data-dir", str(data)], capture_output=True, text=True, cwd=REPO, env=env
        )
        assert run.returncode == 0, run.stderr[-3000:]
        ids.append(next(s for s in store.list_sweeps(data) if s not in ids))
    return {"data": data, "a": ids[0], "b": ids[1], "wheels": wheels, "cache": cache, "env": env}


def cli(two_sweeps, *args: str, cwd=REPO, data_dir=None) -> subprocess.CompletedProcess:
    command = [*CLI, *args, "--data-dir", str(data_dir or two_sweeps["data"])]
    return subprocess.run(
        command, capture_output=True, text=True, cwd=cwd, env=two_sweeps["env"], timeout=900
    )


def test_sweeps_record_the_whole_stack_they_ran_on(two_sweeps):
    data, a, b = two_sweeps["data"], two_sweeps["a"], two_sweeps["b"]
    meta_a, meta_b = store.read_sweep(data, a), store.read_sweep(data, b)
    assert meta_a.stack["tinyswitch"] == "1.0" and meta_b.stack["tinyswitch"] == "2.1"
    assert meta_a.stack["torch"] == meta_a.versions["torch"]
    changes = [str(c) for c in stacks.sweep_stack_changes(data, a, b)]
    assert changes == ["tinydecoy 1.0 -> 1.1", "tinyswitch 1.0 -> 2.1"]
    # each row points at its sweep's stack by hash (a few bytes, not the list)
    for sweep_id, meta in ((a, meta_a), (b, meta_b)):
        assert {r["stack_sha"] for r in store.read_records(data, sweep_id)} == {
            provenance.stack_sha(meta.stack)
        }
    verdicts = {r["model_id"]: r["status"] for r in store.read_records(data, b)}
    assert verdicts == {"local:switch": "FAIL(gen)", "local:flaky": "FAIL(gen)"}
    assert {r["status"] for r in store.read_records(data, a)} == {"PASS"}


def test_bisect_names_the_package_and_the_first_release(two_sweeps):
    """Run as from a project root: the data folder relative (``data``), the cache its default
    (``data/bisect-envs``)."""
    a, b = two_sweeps["a"], two_sweeps["b"]
    root = two_sweeps["data"].parent
    wheels = str(two_sweeps["wheels"])
    run = cli(
        two_sweeps, "bisect", a, b, "--find-links", wheels, "--json", cwd=root, data_dir="data"
    )
    assert run.returncode == 0, run.stderr[-3000:]
    answers = {x["model_id"]: x for x in json.loads(run.stdout)}
    switch = answers["local:switch"]
    assert switch["status"] == "found", switch
    assert (switch["package"], switch["last_same"], switch["first_changed"]) == (
        "tinyswitch",
        "1.2",
        "2.0",
    )
    assert switch["verdicts"] == {
        "1.0": "PASS",
        "1.2": "PASS",
        "2.0": "FAIL(gen)",
        "2.1": "FAIL(gen)",
    }
    # the decoy's swap was tried and did not bring the PASS back
    assert any(
        s["step"] == "swap" and s["package"] == "tinydecoy" and s["verdict"] == "FAIL(gen)"
        for s in switch["steps"]
    )
    (skipped,) = switch["skipped"]
    assert skipped["version"] == "1.1" and "no wheel for this Python" in skipped["reason"]
    assert switch["unsplit"] is None and switch["seconds"] > 0
    flaky = answers["local:flaky"]
    assert flaky["status"] == "flaky" and flaky["package"] is None, flaky
    # stored with sweep B, and shown where the change is
    assert results.changed_by(two_sweeps["data"], b, a) == {
        ("local:switch", "eager+dynamic"): "tinyswitch 2.0"
    }
    diff = cli(two_sweeps, "diff", a, b)
    assert "changed by tinyswitch 2.0" in diff.stdout and "tinyswitch 1.0 -> 2.1" in diff.stdout, (
        diff.stdout
    )
    # the report's header and its changed rows, and the explorer's data, say the same
    from model_support import analysis
    from model_support.render import html, sections

    tables = analysis.report_tables(two_sweeps["data"], b, a)
    sections.add_bisect(tables, two_sweeps["data"], b, a)  # what the report notebook does
    page = html.header_html(tables, b, a) + sections.changes_html(tables, b, a)
    assert "tinydecoy 1.0 -&gt; 1.1, tinyswitch 1.0 -&gt; 2.1" in page
    assert "changed by" in page and "tinyswitch 2.0" in page
    from model_support.render.explorer import explorer_data

    data = explorer_data(two_sweeps["data"])
    ((entry, _sweep, said),) = data["changed_by"]
    assert data["models"][entry][0] == "local:switch" and said == "tinyswitch 2.0"


def test_single_record_form_from_another_folder_and_clean(two_sweeps, tmp_path):
    """From another folder with an absolute --data-dir, reusing the environments the bisect above
    built from the project root (the same default cache): the same first release."""
    b, cache = two_sweeps["b"], two_sweeps["cache"]
    wheels = str(two_sweeps["wheels"])
    args = [
        "bisect",
        b,
        "switch",
        "--package",
        "tinyswitch",
        "--from",
        "1.0",
        "--find-links",
        wheels,
    ]
    run = cli(two_sweeps, *args, "--json", "--clean", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    (answer,) = json.loads(run.stdout)
    assert answer["status"] == "found", answer
    assert (answer["package"], answer["last_same"], answer["first_changed"]) == (
        "tinyswitch",
        "1.2",
        "2.0",
    )
    assert not cache.exists()  # --clean removed the overlay environments


def test_search_says_the_range_it_could_not_split():
    inner = [Release("1.1"), Release("1.2", skip="no wheel for this Python"), Release("1.3")]
    verdicts = {"1.1": "PASS", "1.3": "FAIL(gen)"}
    lo, hi, skipped = split(inner, "PASS", verdicts.__getitem__)
    # 1.1 .. 1.3: 1.2 untried
    assert (lo, hi) == (0, 2) and skipped == {1: "no wheel for this Python"}

    def uninstallable(version):
        raise InstallError(f"tinyswitch=={version}: conflict")

    assert split([Release("1.5")], "PASS", uninstallable) == (
        -1,
        1,
        {0: "tinyswitch==1.5: conflict"},
    )


def test_releases_between_leave_out_pre_releases_and_yanked():
    found = [Release(v) for v in ("1.0", "1.1rc1", "1.1", "1.2", "2.0")] + [
        Release("1.3", yanked=True)
    ]
    assert [r.version for r in releases.between(found, "1.0", "2.0")] == ["1.1", "1.2"]
    assert [r.version for r in releases.between(found, "2.0", "1.0", pre=True, yanked=True)] == [
        "1.3",
        "1.2",
        "1.1",
        "1.1rc1",
    ]


def test_older_sweep_json_reads_its_few_versions_as_the_stack():
    meta = SweepMeta.from_dict(
        {
            "sweep_id": "old-20260101T000000Z",
            "probe": {},
            "models": [],
            "versions": {"torch": "2.9", "python": "3.11"},
        }
    )
    assert meta.stack == {} and stacks.sweep_stack(meta) == {"torch": "2.9"}
    assert (
        stacks.changes_line(stacks.stack_changes({"torch": "2.9"}, {"torch": "2.10"}))
        == "packages that differ: torch 2.9 -> 2.10"
    )


def test_a_pin_between_two_packages_is_found_and_an_overlay_shadows_the_base(tmp_path):
    """pinned 2.0 requires helper>=2 (pinned 1.0 does not): swapping helper back alone breaks
    that pin."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    write_wheel(wheels, "pinned", "1.0", {"pinned/__init__.py": "V = 1\n"})
    write_wheel(wheels, "pinned", "2.0", {"pinned/__init__.py": "V = 2\n"}, requires=("helper>=2",))
    for version in ("1.0", "2.0"):
        write_wheel(wheels, "helper", version, {"helper/__init__.py": f"V = {version!r}\n"})
    overlays = Overlays(tmp_path / "envs", wheels)
    layers = {n: overlays.layer(n, v) for n, v in (("pinned", "2.0"), ("helper", "1.0"))}
    (conflict,) = conflicts({}, {"pinned": "2.0", "helper": "1.0"}, layers)
    assert str(conflict) == "pinned 2.0 requires helper>=2, and this environment has helper 1.0"
    assert (
        conflicts(
            {},
            {"pinned": "2.0", "helper": "2.0"},
            {**layers, "helper": overlays.layer("helper", "2.0")},
        )
        == []
    )
    # an overlay's distribution comes first: its version is the one imported and the one metadata
    # reports
    python = overlays.python({"helper": "2.0"})
    code = "import helper, importlib.metadata as m, polars; print(helper.V, m.version('helper'))"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["2.0", "2.0"]  # and the project's packages (polars) still import
    with pytest.raises(InstallError, match="pinned==3.0 could not be installed"):
        overlays.layer("pinned", "3.0")


def test_pip_builds_the_overlays_where_uv_is_absent(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    write_wheel(wheels, "helper", "3.0", {"helper/__init__.py": "V = 3\n"})
    overlays = Overlays(tmp_path / "envs", wheels)
    overlays.uv = None  # what uv_binary() gives without the uv package or a uv on PATH
    assert (
        overlays.tool.startswith("pip ") and "pip install 'model-support[bisect]'" in overlays.tool
    )
    python = overlays.python({"helper": "3.0"})
    out = subprocess.run(
        [str(python), "-c", "import helper; print(helper.V)"], capture_output=True, text=True
    )
    assert out.stdout.strip() == "3", out.stderr[-2000:]
    overlays.clean()
    assert not (tmp_path / "envs").exists()


def test_many_differing_packages_are_halved_before_one_is_swapped_alone(tmp_path):
    """Six packages moved; the fourth did it: found in 2 runs (two halvings, the second of it
    alone), not 4."""
    from model_support.bisect.search import Bisector, Job
    from model_support.bisect.stacks import Change, Row

    # the repro script's answer: A's verdict while pkg-d is at A's version
    class Counting(Bisector):
        def run(self, job, step, pins, package=None, version=None):
            job.steps.append({"step": step, "package": package})
            return "PASS" if pins.get("pkg-d") == "1" else "FAIL(gen)"

        def _conflicts(self, pins):
            return []  # no pins between these packages

    changes = [Change(f"pkg-{c}", "1", "2") for c in "abcdef"]
    bisector = Counting(Overlays(tmp_path))
    row = Row("local:m", "eager+dynamic", "PASS", "FAIL(gen)", "", [], 60.0)
    job = Job(row, {c.name: "1" for c in changes}, {c.name: "2" for c in changes}, changes)
    pins_b = {c.name: "2" for c in changes}
    change, pins, together = bisector.find_package(
        job, pins_b, {c.name: "1" for c in changes}, "PASS"
    )
    assert change.name == "pkg-d" and pins["pkg-d"] == "1" and together == []
    assert [s["package"] for s in job.steps] == ["pkg-a, pkg-b, pkg-c", "pkg-d"]


def test_bad_input_is_one_sentence_before_anything_runs(tmp_path):
    from click.testing import CliRunner

    from model_support.cli import main

    data = ["--data-dir", str(tmp_path)]
    for args, said in (
        ([], "Give two sweeps"),
        (["s", "m", "--package", "torch"], "--package needs --from VERSION"),
        (["a", "b", "--from", "1.0"], "--from and --to go with --package"),
        (["a", "b"], "Sweep 'a' does not exist"),
    ):
        result = CliRunner().invoke(main, ["bisect", *args, *data])
        assert result.exit_code == 2 and said in result.output, (args, result.output)


# -- the search over real overlay environments, with tiny scripts instead of a model's repro
# ------------------
#: A stand-in repro script: imports the packages of the row's stack and prints a verdict line, as a
#: repro script does (``{"status": ...}``); a package that refuses to import leaves no verdict.
VERDICT_OF = """import json
{imports}
print(json.dumps({{"status": "PASS" if {passes} else "FAIL(gen)"}}))
"""
#: A release that checks, at import, the version of another package (as transformers checks
#: huggingface-hub).
NEEDS_OLD = """import {other}
if not {other}.V.startswith("1."):
    raise ImportError("{name} {version} needs {other}<2, found " + {other}.V)
V = {version!r}
GOOD = {good}
"""


@pytest.fixture(scope="module")
def small_wheels(tmp_path_factory):
    """Wheels of small packages: ``needy`` (1.0 declares hubby<2 and 1.5 only checks it at
    import; 3.0 is the one that breaks), ``hubby`` 2.0, and ``pkga``..``pkgd`` 1.0 and 2.0 (pkga
    1.0 imports only beside pkgc 1.0, undeclared); with a cache of overlays shared by the tests."""
    folder = tmp_path_factory.mktemp("small-wheels")
    write_wheel(folder, "hubby", "2.0", {"hubby/__init__.py": 'V = "2.0"\n'})
    for version, requires in (("1.0", ("hubby<2",)), ("1.5", ())):
        text = NEEDS_OLD.format(other="hubby", name="needy", version=version, good=True)
        write_wheel(folder, "needy", version, {"needy/__init__.py": text}, requires=requires)
    for version, good in (("2.0", True), ("3.0", False)):
        write_wheel(
            folder, "needy", version, {"needy/__init__.py": f"V = {version!r}\nGOOD = {good}\n"}
        )
    for name in ("pkga", "pkgb", "pkgc", "pkgd"):
        for version in ("1.0", "2.0"):
            text = f"V = {version!r}\n"
            if (name, version) == ("pkga", "1.0"):
                text = NEEDS_OLD.format(other="pkgc", name=name, version=version, good=True)
            write_wheel(folder, name, version, {f"{name}/__init__.py": text})
    return {"wheels": folder, "cache": folder.parent / "small-envs"}


def small_job(script: str, stack_a: dict, stack_b: dict, verdict_a, verdict_b):
    """A row run by ``script`` whose stacks are ``stack_a`` and ``stack_b`` (every differing
    package a candidate)."""
    from model_support.bisect.search import Job
    from model_support.bisect.stacks import Row

    row = Row("local:small", "eager+dynamic", verdict_a, verdict_b, script, [], 60.0)
    return Job(row, stack_a, stack_b, stacks.stack_changes(stack_a, stack_b))


def test_a_release_that_conflicts_is_named_with_the_requirement_and_skipped(small_wheels):
    """--from needy 1.0 requires hubby<2 beside hubby 2.0 (declared); 1.5 refuses hubby 2.0 at
    import (not declared): both skipped with the requirement, and the search starts at 2.0, the
    nearest that runs."""
    from model_support.bisect.search import Bisector

    bisector = Bisector(Overlays(small_wheels["cache"], small_wheels["wheels"]))
    script = VERDICT_OF.format(imports="import needy", passes="needy.GOOD")
    stack_b = {"needy": "3.0", "hubby": "2.0"}
    job = small_job(script, {**stack_b, "needy": "1.0"}, stack_b, None, "FAIL(gen)")
    answer = bisector.bisect(job)
    assert answer["status"] == "found", answer
    assert (answer["package"], answer["last_same"], answer["first_changed"]) == (
        "needy",
        "2.0",
        "3.0",
    )
    skipped = {s["version"]: s["reason"] for s in answer["skipped"]}
    assert skipped["1.0"] == (
        "needy 1.0 cannot run with this stack: needy 1.0 requires hubby<2, and this "
        "environment has hubby 2.0"
    )
    assert skipped["1.5"] == (
        "needy 1.5 gave no verdict with this stack (exit status 1: ImportError: needy 1.5 "
        "needs hubby<2, found 2.0)"
    )
    assert answer["note"] == (
        "needy 1.0 (--from) cannot run with this stack (see skipped): skipped, and the search "
        "starts at 2.0, the nearest release that runs."
    )


def test_a_half_that_cannot_be_built_falls_back_to_one_by_one(small_wheels):
    """pkgb did it; swapping the first half (pkga, pkgb) gives no verdict (pkga 1.0 imports only
    beside pkgc 1.0): that says nothing of the other half, and the one-by-one swaps still name
    pkgb."""
    from model_support.bisect.search import Bisector

    bisector = Bisector(Overlays(small_wheels["cache"], small_wheels["wheels"]))
    names = ("pkga", "pkgb", "pkgc", "pkgd")
    script = VERDICT_OF.format(
        imports="\n".join(f"import {n}" for n in names), passes='pkgb.V == "1.0"'
    )
    job = small_job(
        script, dict.fromkeys(names, "1.0"), dict.fromkeys(names, "2.0"), "PASS", "FAIL(gen)"
    )
    answer = bisector.bisect(job)
    assert (answer["status"], answer["package"], answer["together"]) == ("found", "pkgb", []), (
        answer
    )
    half = next(s for s in answer["steps"] if s["package"] == "pkga, pkgb")
    assert (
        half["verdict"] is None
        and "inconclusive" in half["note"]
        and "ImportError: pkga 1.0" in half["note"]
    )
    assert answer["installer"].startswith(("uv ", "pip "))


def test_halves_move_what_a_pin_ties_to_them_and_the_answer_is_checked(tmp_path):
    """torch, torchvision and transformers differ; torch did it; each torchvision needs its own
    torch. The half (torch) moves torchvision with it, and the package named is the one whose own
    swap restored A."""
    from model_support.bisect.envs import Conflict
    from model_support.bisect.search import Bisector

    # a fake environment builder: verdicts and pins from the rule above, nothing built
    class Pinned(Bisector):
        def run(self, job, step, pins, package=None, version=None):
            job.steps.append({"step": step, "package": package})
            if pins.get("torch", "2") != pins.get("torchvision", "2"):
                return None  # torchvision does not import beside another torch
            return "PASS" if pins.get("torch") == "1" else "FAIL(gen)"

        def _conflicts(self, pins):
            torch, vision = pins.get("torch", "2"), pins.get("torchvision", "2")
            return (
                []
                if torch == vision
                else [Conflict("torchvision", vision, f"torch=={vision}", "torch", torch)]
            )

    names = ("torch", "torchvision", "transformers")
    job = small_job("", dict.fromkeys(names, "1"), dict.fromkeys(names, "2"), "PASS", "FAIL(gen)")
    change, pins, together = Pinned(Overlays(tmp_path)).find_package(
        job, dict.fromkeys(names, "2"), dict.fromkeys(names, "1"), "PASS"
    )
    assert (change.name, together) == ("torch", ["torchvision"]) and pins["torch"] == pins[
        "torchvision"
    ] == "1"
    assert [s["package"] for s in job.steps] == [
        "torch (with torchvision)",
        "torch (with torchvision)",
    ]


def test_an_environment_works_from_any_folder_and_is_rechecked_when_reused(tmp_path, monkeypatch):
    """Built from one folder with a relative cache path, used from another; one whose .pth lists
    a relative layer (as an older version wrote) is found wrong when reused and built again."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    write_wheel(wheels, "helper", "2.0", {"helper/__init__.py": "V = '2.0'\n"})
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir(), elsewhere.mkdir()
    monkeypatch.chdir(here)
    python = here / Overlays("cache", wheels).python({"helper": "2.0"})
    code = ["-c", "import helper; print(helper.V)"]
    out = subprocess.run([str(python), *code], capture_output=True, text=True, cwd=elsewhere)
    assert out.stdout.strip() == "2.0", out.stderr[-2000:]
    (pth,) = (here / "cache" / "envs").glob(
        "*/lib/python*/site-packages/_model_support_overlay.pth"
    )
    # a relative layer path
    relative = pth.read_text().replace(str((here / "cache").resolve()), "cache")
    assert "'cache/layers/helper-2.0" in relative
    pth.write_text(relative)
    monkeypatch.chdir(elsewhere)
    python = Overlays(here / "cache", wheels).python({"helper": "2.0"})
    out = subprocess.run([str(python), *code], capture_output=True, text=True, cwd=elsewhere)
    assert out.stdout.strip() == "2.0", out.stderr[-2000:]


def test_layers_are_keyed_on_their_source(tmp_path):
    """helper 1.0 from two wheelhouses (a vendor's build and PyPI's, say) are two layers, not
    one."""
    cache, pythons = tmp_path / "envs", []
    for vendor in ("pypi", "vendor"):
        (tmp_path / vendor).mkdir()
        write_wheel(tmp_path / vendor, "helper", "1.0", {"helper/__init__.py": f"V = {vendor!r}\n"})
        pythons.append(Overlays(cache, tmp_path / vendor).python({"helper": "1.0"}))
    code = ["-c", "import helper; print(helper.V)"]
    said = [
        subprocess.run([str(p), *code], capture_output=True, text=True).stdout.strip()
        for p in pythons
    ]
    assert said == ["pypi", "vendor"]


def test_a_step_that_times_out_ends_its_whole_process_group(tmp_path):
    from model_support.bisect.search import run_repro

    script = tmp_path / "hang.py"
    pid_file = tmp_path / "child.pid"
    script.write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(20)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    verdict, note, said = run_repro(Path(sys.executable), script, [], timeout_s=1)
    assert (verdict, note, said) == ("FAIL(other)", "timed out after 1 s", {})
    child, deadline = int(pid_file.read_text()), time.monotonic() + 5
    while running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(child)  # the script's own child ended with it


def running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_each_answer_is_stored_as_it_finishes_and_one_that_could_not_run_replaces_none(tmp_path):
    """One row's unexpected exception is that row's answer; the other rows' answers are stored;
    an answer that could not run never replaces a stored one."""
    from model_support.bisect import forms as bisect_run
    from model_support.bisect.search import Bisector

    class OneBug(Bisector):
        def _bisect(self, job):
            if job.row.model_id == "local:bug":
                raise RuntimeError("a bug in one row")
            return {"status": "found", "package": "pkg", "first_changed": "2.0", "note": ""}

    (tmp_path / "sweeps" / "b-20260101T000000Z").mkdir(parents=True)
    jobs = [small_job("", {}, {}, "PASS", "FAIL(gen)") for _ in range(2)]
    jobs[0].row.model_id = "local:bug"
    store_each = bisect_run._store_each(tmp_path, "b-20260101T000000Z", "a")
    answers = OneBug(Overlays(tmp_path / "envs")).bisect_all(jobs, 2, None, store_each)
    assert [a["status"] for a in answers] == ["could not run", "found"]
    assert answers[0]["note"] == "the bisect stopped: RuntimeError: a bug in one row"
    stored = {
        a["model_id"]: a["status"] for a in results.read_answers(tmp_path, "b-20260101T000000Z")
    }
    assert stored == {"local:bug": "could not run", "local:small": "found"}
    # a later bisect whose steps could not run the pins
    store_each({**answers[1], "status": "could not run"})
    assert results.changed_by(tmp_path, "b-20260101T000000Z", "a") == {
        ("local:small", "eager+dynamic"): "pkg 2.0"
    }


def test_releases_are_listed_from_the_configured_index(tmp_path, monkeypatch):
    """pip's configured index (PEP 691 JSON over HTTP here) and an extra one (PEP 503 HTML in a
    folder): yanked and Requires-Python read from them; the installers are given the same source."""
    import http.server
    import threading

    files = [
        {"filename": "tinyswitch-1.0-py3-none-any.whl"},
        {"filename": "tinyswitch-1.1-py3-none-any.whl", "yanked": "broken"},
        {"filename": "tinyswitch-1.2.tar.gz", "requires-python": ">=4"},
    ]

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            found = self.path == "/simple/tinyswitch/" and "json" in self.headers.get("Accept", "")
            body = json.dumps(
                {"meta": {"api-version": "1.0"}, "name": "tinyswitch", "files": files}
            ).encode()
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            self.end_headers()
            self.wfile.write(body if found else b"")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    extra = tmp_path / "simple" / "tinyswitch"
    extra.mkdir(parents=True)
    (extra / "index.html").write_text(
        '<a href="../../f/tinyswitch-2.0-py3-none-any.whl#sha256=00">x</a>'
    )
    index = f"http://127.0.0.1:{server.server_port}/simple"
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", index)
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", (tmp_path / "simple").as_uri())
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    try:
        source = releases.Source.configured()
        found = {r.version: (r.yanked, r.skip) for r in releases.releases_of("TinySwitch", source)}
    finally:
        server.shutdown()
    assert found == {
        "1.0": (False, None),
        "1.1": (True, None),
        "1.2": (False, found["1.2"][1]),
        "2.0": (False, None),
    }
    assert found["1.2"][1].startswith("requires Python >=4")
    assert source.flags() == [
        "--index-url",
        index,
        "--extra-index-url",
        (tmp_path / "simple").as_uri(),
    ]


def test_two_sweeps_differing_only_in_the_backends_settings_say_so(tmp_path):
    """Two pretend sweeps that differ only in MODEL_SUPPORT_PRETEND read "same package versions"
    before: the backend's configuration is part of the stack."""
    for sweep_id, config in (
        ("a-20261201T000000Z", {"devices": 1, "missing_ops": ["aten::rsqrt"]}),
        ("b-20261202T000000Z", {"devices": 1}),
    ):
        SweepMeta(
            sweep_id=sweep_id,
            name="p",
            created_at="2026-12-0" + sweep_id[8] + "T00:00:00+00:00",
            probe={"device": "pretend", "perf": False},
            models=[],
            stack={"torch": "2.13.0"},
            device_config={"MODEL_SUPPORT_PRETEND": json.dumps(config)},
        ).write(store.sweep_dir(tmp_path, sweep_id))
    line = stacks.sweep_changes_line(tmp_path, "a-20261201T000000Z", "b-20261202T000000Z")
    assert (
        line
        == "backend settings that differ: MODEL_SUPPORT_PRETEND: missing_ops '[\"aten::rsqrt\"]' "
        "-> (unset)"
    )
    assert (
        stacks.changes_line([], settings=[])
        == "same package versions in both sweeps and the same backend settings"
    )
    # not recorded: unknown
    assert stacks.changes_line([], settings=None) == "same package versions in both sweeps"


def test_a_backend_setting_is_recorded_only_where_its_adapter_declares_it_safe_to_show():
    from model_support.probe.devices.base import Adapter
    from model_support.probe.devices.tpu import TpuAdapter

    class Vendor(Adapter):
        config_vars = ("VENDOR_*",)
        config_shown = ("VENDOR_FLAGS",)

    environ = {"VENDOR_FLAGS": "--fast", "VENDOR_LICENSE_KEY": "s3cret", "HOME": "/root"}
    found = Vendor.configuration(environ)
    assert found["VENDOR_FLAGS"] == "--fast" and "s3cret" not in json.dumps(found)
    # a change still shows as a change
    assert found["VENDOR_LICENSE_KEY"].startswith("<not shown: sha256 ")
    # what a repro script sets
    assert Vendor.configuration(environ, shown_only=True) == {"VENDOR_FLAGS": "--fast"}
    # the harness's own per-probe variables (a chip's pinning, a rank's place) and the host's own
    # (its accelerator type, issue 58's review: two hosts' records read as two stacks) are not the
    # stack's configuration
    tpu = {
        "LIBTPU_INIT_ARGS": "--xla_x",
        "TPU_VISIBLE_CHIPS": "0",
        "TPU_PROCESS_PORT": "8476",
        "TPU_ACCELERATOR_TYPE": "v5e",
        "TPU_MIN_LOG_LEVEL": "0",
    }
    assert TpuAdapter.configuration(tpu) == {
        "LIBTPU_INIT_ARGS": "--xla_x",
        "TPU_MIN_LOG_LEVEL": "0",
    }
