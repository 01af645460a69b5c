"""model-support bisect, for real: a wheelhouse written by the test, two real sweeps whose probes ran on two
releases of its package (each sweep run from an overlay environment), and the bisect naming the package and
the first release that changed a fixture model; a flaky model reported flaky; a release with no wheel for
this Python skipped with its reason. Offline: releases come from the wheelhouse (--find-links, --no-index)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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
    """Sweep A on tinyswitch 1.0 (and tinydecoy 1.0), sweep B on tinyswitch 2.1 (tinydecoy 1.1), each run
    by `model-support sweep` inside an overlay environment holding those releases."""
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
    cache = tmp / "envs"
    overlays = Overlays(cache, wheels)
    data = tmp / "data"
    ids = []
    for name, pins in (
        ("before", {"tinyswitch": "1.0", "tinydecoy": "1.0"}),
        ("after", {"tinyswitch": "2.1", "tinydecoy": "1.1"}),
    ):
        definition = {
            "name": name,
            "probe": {"device": "cpu", "reference": "none", "judge": False, "trust_remote_code": True},
            "timeout_s": 300,
            "workers": 2,
            "models": [str(switch), str(flaky)],
        }
        path = tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(definition))
        command = [str(overlays.python(pins)), "-m", "model_support.cli", "sweep", str(path), "--no-report"]
        run = subprocess.run([*command, "--data-dir", str(data)], capture_output=True, text=True, cwd=REPO, env=env)
        assert run.returncode == 0, run.stderr[-3000:]
        ids.append(next(s for s in store.list_sweeps(data) if s not in ids))
    return {"data": data, "a": ids[0], "b": ids[1], "wheels": wheels, "cache": cache, "env": env}


def cli(two_sweeps, *args: str) -> subprocess.CompletedProcess:
    command = [*CLI, *args, "--data-dir", str(two_sweeps["data"])]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=two_sweeps["env"], timeout=900)


def test_sweeps_record_the_whole_stack_they_ran_on(two_sweeps):
    data, a, b = two_sweeps["data"], two_sweeps["a"], two_sweeps["b"]
    meta_a, meta_b = store.read_sweep(data, a), store.read_sweep(data, b)
    assert meta_a.stack["tinyswitch"] == "1.0" and meta_b.stack["tinyswitch"] == "2.1"
    assert meta_a.stack["torch"] == meta_a.versions["torch"]
    changes = [str(c) for c in stacks.sweep_stack_changes(data, a, b)]
    assert changes == ["tinydecoy 1.0 -> 1.1", "tinyswitch 1.0 -> 2.1"]
    # each row points at its sweep's stack by hash (a few bytes, not the list)
    for sweep_id, meta in ((a, meta_a), (b, meta_b)):
        assert {r["stack_sha"] for r in store.read_records(data, sweep_id)} == {provenance.stack_sha(meta.stack)}
    verdicts = {r["model_id"]: r["status"] for r in store.read_records(data, b)}
    assert verdicts == {"local:switch": "FAIL(gen)", "local:flaky": "FAIL(gen)"}
    assert {r["status"] for r in store.read_records(data, a)} == {"PASS"}


def test_bisect_names_the_package_and_the_first_release(two_sweeps):
    a, b = two_sweeps["a"], two_sweeps["b"]
    run = cli(
        two_sweeps,
        "bisect",
        a,
        b,
        "--find-links",
        str(two_sweeps["wheels"]),
        "--json",
        "--cache-dir",
        str(two_sweeps["cache"]),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    answers = {x["model_id"]: x for x in json.loads(run.stdout)}
    switch = answers["local:switch"]
    assert switch["status"] == "found", switch
    assert (switch["package"], switch["last_same"], switch["first_changed"]) == ("tinyswitch", "1.2", "2.0")
    assert switch["verdicts"] == {"1.0": "PASS", "1.2": "PASS", "2.0": "FAIL(gen)", "2.1": "FAIL(gen)"}
    # the decoy's swap was tried and did not bring the PASS back
    assert any(
        s["step"] == "swap" and s["package"] == "tinydecoy" and s["verdict"] == "FAIL(gen)" for s in switch["steps"]
    )
    (skipped,) = switch["skipped"]
    assert skipped["version"] == "1.1" and "no wheel for this Python" in skipped["reason"]
    assert switch["unsplit"] is None and switch["seconds"] > 0
    flaky = answers["local:flaky"]
    assert flaky["status"] == "flaky" and flaky["package"] is None, flaky
    # stored with sweep B, and shown where the change is
    assert results.changed_by(two_sweeps["data"], b, a) == {("local:switch", "eager+dynamic"): "tinyswitch 2.0"}
    diff = cli(two_sweeps, "diff", a, b)
    assert "changed by tinyswitch 2.0" in diff.stdout and "tinyswitch 1.0 -> 2.1" in diff.stdout, diff.stdout
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


def test_single_record_form_and_clean(two_sweeps):
    b, cache = two_sweeps["b"], two_sweeps["cache"]
    wheels = str(two_sweeps["wheels"])
    args = ["bisect", b, "switch", "--package", "tinyswitch", "--from", "1.0", "--find-links", wheels]
    run = cli(two_sweeps, *args, "--json", "--cache-dir", str(cache), "--clean")
    assert run.returncode == 0, run.stderr[-3000:]
    (answer,) = json.loads(run.stdout)
    assert (answer["package"], answer["last_same"], answer["first_changed"]) == ("tinyswitch", "1.2", "2.0")
    assert not cache.exists()  # --clean removed the overlay environments


def test_search_says_the_range_it_could_not_split():
    inner = [Release("1.1"), Release("1.2", skip="no wheel for this Python"), Release("1.3")]
    verdicts = {"1.1": "PASS", "1.3": "FAIL(gen)"}
    lo, hi, skipped = split(inner, "PASS", verdicts.__getitem__)
    assert (lo, hi) == (0, 2) and skipped == {1: "no wheel for this Python"}  # 1.1 .. 1.3: 1.2 untried

    def uninstallable(version):
        raise InstallError(f"tinyswitch=={version}: conflict")

    assert split([Release("1.5")], "PASS", uninstallable) == (-1, 1, {0: "tinyswitch==1.5: conflict"})


def test_releases_between_leave_out_pre_releases_and_yanked():
    found = [Release(v) for v in ("1.0", "1.1rc1", "1.1", "1.2", "2.0")] + [Release("1.3", yanked=True)]
    assert [r.version for r in releases.between(found, "1.0", "2.0")] == ["1.1", "1.2"]
    assert [r.version for r in releases.between(found, "2.0", "1.0", pre=True, yanked=True)] == [
        "1.3",
        "1.2",
        "1.1",
        "1.1rc1",
    ]


def test_older_sweep_json_reads_its_few_versions_as_the_stack():
    meta = SweepMeta.from_dict(
        {"sweep_id": "old-20260101T000000Z", "probe": {}, "models": [], "versions": {"torch": "2.9", "python": "3.11"}}
    )
    assert meta.stack == {} and stacks.sweep_stack(meta) == {"torch": "2.9"}
    assert (
        stacks.changes_line(stacks.stack_changes({"torch": "2.9"}, {"torch": "2.10"}))
        == "packages that differ: torch 2.9 -> 2.10"
    )


def test_a_pin_between_two_packages_is_found_and_an_overlay_shadows_the_base(tmp_path):
    """pinned 2.0 requires helper>=2 (pinned 1.0 does not): swapping helper back alone breaks that pin."""
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
        conflicts({}, {"pinned": "2.0", "helper": "2.0"}, {**layers, "helper": overlays.layer("helper", "2.0")}) == []
    )
    # an overlay's distribution comes first: its version is the one imported and the one metadata reports
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
    python = overlays.python({"helper": "3.0"})
    out = subprocess.run([str(python), "-c", "import helper; print(helper.V)"], capture_output=True, text=True)
    assert out.stdout.strip() == "3", out.stderr[-2000:]
    overlays.clean()
    assert not (tmp_path / "envs").exists()


def test_many_differing_packages_are_halved_before_one_is_swapped_alone(tmp_path):
    """Six packages moved; the fourth did it: found in 2 runs (two halvings, the second of it alone), not 4."""
    from model_support.bisect.search import Bisector, Job
    from model_support.bisect.stacks import Change, Row

    class Counting(Bisector):  # the repro script's answer: A's verdict while pkg-d is at A's version
        def run(self, job, step, pins, package=None, version=None):
            job.steps.append({"step": step, "package": package})
            return "PASS" if pins.get("pkg-d") == "1" else "FAIL(gen)"

        def _conflicts(self, pins):
            return []  # no pins between these packages

    changes = [Change(f"pkg-{c}", "1", "2") for c in "abcdef"]
    bisector = Counting(Overlays(tmp_path), find_links=None)
    row = Row("local:m", "eager+dynamic", "PASS", "FAIL(gen)", "", [], 60.0)
    job = Job(row, {c.name: "1" for c in changes}, {c.name: "2" for c in changes}, changes)
    pins_b = {c.name: "2" for c in changes}
    change, pins, together = bisector.find_package(job, pins_b, {c.name: "1" for c in changes}, "PASS")
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
