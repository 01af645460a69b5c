"""Shared fixtures, named for what they hold: the offline model fixtures, a real smoke sweep."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

# The environment a shell gave pytest, kept for the tests that run commands as a user types them
# (tests/test_as_typed.py: helpers.SHELL_ENVIRON). Set here, in the first pytest process, before
# anything below changes os.environ; xdist's workers inherit it (their own os.environ is this
# process's, changed).
os.environ.setdefault("MODEL_SUPPORT_TESTS_SHELL_ENV", json.dumps(dict(os.environ)))

import pytest  # noqa: E402

# The test process is a process of ours: importing the package before anything imports torch makes
# torch autoload no device backend here, as in every process of ours (model_support.backend_env),
# with torch_tpu installed.
import model_support  # noqa: E402, F401
from helpers import CHROMIUM, FAKE_TOKEN, REPO, stored_records  # noqa: E402

# No test reaches the Hub: the Hub's protocol is tested against a local server
# (tests/hub_server.py).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Under xdist each worker's probes get their share of the cores (torch's intra-op threads), not all
# of them: two workers each running 2-thread kernels on 2 cores spin in OpenMP waiting for each
# other.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _share = (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _share)))
# datasets caches what it loaded by path; pytest reuses tmp paths across runs, so a session cache of
# its own.
os.environ.setdefault("HF_DATASETS_CACHE", tempfile.mkdtemp(prefix="hf-datasets-"))


#: Variables set by a library the first time a test's process uses it, or by pytest itself, not by
#: the test: pytest's current test (set per phase), polars' allocator settings (set on its import),
#: what ``ray.init`` writes into the driver's process once.
SET_BY_IMPORTS = {"PYTEST_CURRENT_TEST", "_RJEM_MALLOC_CONF"}
SET_BY_IMPORTS |= {
    "RAY_AUTH_MODE",
    "RAY_CLIENT_MODE",
    "RAY_USAGE_STATS_ENABLED",
    "PYTHONBREAKPOINT",
}
# torch's inductor, the first time a test's process compiles
SET_BY_IMPORTS |= {"TORCHINDUCTOR_CACHE_DIR"}
#: Prefixes of the same: inductor's own private switches
#: (``_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR``).
SET_BY_PREFIXES = ("_TORCHINDUCTOR_", "TORCHINDUCTOR_")


@pytest.fixture(autouse=True)
def leaves_the_environment_and_folder_as_it_found_them():
    """A test that leaves ``os.environ`` or the working folder changed fails (and they are put
    back, so one leak fails one test, not every later test of its worker in an order-dependent
    way): a variable set directly and then ``monkeypatch.delenv``-ed is "restored" by monkeypatch
    to the leaked value (test_hub_server's HF_ENDPOINT pointed every later test at a server that
    was shut down). Module and session fixtures' changes are set up before and torn down after
    it, so they are not counted."""
    before, folder = dict(os.environ), os.getcwd()
    yield
    after, here = dict(os.environ), os.getcwd()
    names = {
        n
        for n in before.keys() | after.keys()
        if n not in SET_BY_IMPORTS and not n.startswith(SET_BY_PREFIXES)
    }
    changed = sorted(name for name in names if before.get(name) != after.get(name))
    if changed:
        os.environ.clear()
        os.environ.update(before)
    if here != folder:
        os.chdir(folder)
    assert not changed, f"the test left these environment variables changed: {', '.join(changed)}"
    assert here == folder, f"the test left the working folder changed: {folder} -> {here}"


#: Fixtures that run real sweeps, notebooks or renders: a test using one is slow (not in `make
#: test-fast`).
HEAVY_FIXTURES = {
    "smoke_sweep",
    "real_report",
    "rendered",
    "fixture_sweep",
    "browser",
    "porting_loop",
    "two_sweeps",
}


#: Shared fixtures cheap enough to build once per xdist worker (a cached folder listing, a browser
#: launch): they do not tie the tests that use them to one worker.
PER_WORKER_FIXTURES = {"fixture_models", "browser", "kernel_zygote"}


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects
def pytest_collection_modifyitems(config, items):
    """Mark every test that uses a heavy fixture as slow, so `pytest -m "not slow"` (make test-fast)
    keeps the unit tests and the few real probes that are quick."""
    for item in items:
        if HEAVY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


class XdistGroups:
    """Groups the tests that share a module- or session-scoped fixture, so that under `pytest -n
    2 --dist loadgroup` (make test) each such fixture (the smoke sweep, a module's sweeps) is
    built once, on one worker. xdist 3.8 puts a test in its group by appending ``@group`` to its
    node id through ``item._nodeid``, which pytest 9.2's structured node ids ignore: the id is
    set here as xdist means to."""

    # after deselection, and after xdist's own hook (which finds no id to change)
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        from _pytest.nodeid import NodeId

        # set on xdist's workers by --dist loadgroup
        loadgroup = config.getoption("loadgroup", False)
        for item, group in shared_fixture_groups(items).items():
            item.add_marker(pytest.mark.xdist_group(group))
            if loadgroup and "@" not in item.nodeid:
                item._id = NodeId.parse(f"{item.nodeid}@{group}")


def pytest_configure(config):
    config.pluginmanager.register(XdistGroups(), "model-support-xdist-groups")


def shared_fixture_groups(items) -> dict:
    """{test: group name} for the tests that use one of our module- or session-scoped fixtures (not
    ``PER_WORKER_FIXTURES``): tests that share one, directly or through other tests, form one group,
    named for its first fixture. Tests with none are left to xdist's balancing, one by one."""
    parent: dict = {}

    def root(key):
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    uses: dict = {}
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        shared = [
            (defs[-1].baseid, name)
            for name, defs in (info.name2fixturedefs.items() if info else ())
            if defs and name not in PER_WORKER_FIXTURES and _ours_and_shared(defs[-1])
        ]
        if shared:
            uses[item] = shared
            root(shared[0])
            for key in shared[1:]:
                parent[root(key)] = root(shared[0])
    members: dict = {}
    for key in parent:
        members.setdefault(root(key), []).append(key)
    # a group is named for its session fixture when it has one (the smoke sweep), else its first
    # module's
    names = {r: min(keys, key=lambda k: (k[0].endswith(".py"), k)) for r, keys in members.items()}
    groups = {}
    for item, keys in uses.items():
        baseid, name = names[root(keys[0])]
        groups[item] = f"{Path(baseid).stem if baseid.endswith('.py') else 'conftest'}.{name}"
    return groups


def _ours_and_shared(fixturedef) -> bool:
    """A fixture of this test suite (conftest or a test module), built once per module or
    session."""
    module = getattr(fixturedef.func, "__module__", "") or ""
    return fixturedef.scope in ("module", "package", "session") and (
        module == "conftest" or module.startswith("test_")
    )


@pytest.fixture(scope="session")
def fixture_models() -> dict:
    """The offline fixture models (built once into data/models, cached): name -> manifest entry."""
    from fixtures.build import ensure_fixtures

    return ensure_fixtures()["fixtures"]


@pytest.fixture(scope="session")
def smoke_sweep(tmp_path_factory, fixture_models) -> dict:
    """A real sweep of params/smoke.yaml (every fixture, 2 workers) into a fresh data folder."""
    from model_support.sweep import definition as params
    from model_support.sweep import runner as sweep

    data_dir = tmp_path_factory.mktemp("smoke-data")
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        definition = params.load(REPO / "params" / "smoke.yaml")
    finally:
        os.chdir(cwd)
    previous = os.environ.get("HF_TOKEN")
    os.environ["HF_TOKEN"] = FAKE_TOKEN  # must land in no notebook, record, log or Parquet file
    try:
        summary = sweep.run(definition, data_dir, workers=2)
    finally:
        if previous is None:
            os.environ.pop("HF_TOKEN", None)
        else:
            os.environ["HF_TOKEN"] = previous
    from model_support.probe.model_ids import display_name

    summary["records"] = stored_records(data_dir, summary["sweep_id"])
    summary["by_name"] = {display_name(r["model_id"]): r for r in summary["records"]}
    return summary


@pytest.fixture(scope="session")
def browser():
    """Debian's headless Chromium driven by Playwright (`make browser` installs it; never
    downloaded)."""
    if not CHROMIUM.exists():
        message = (
            f"{CHROMIUM} is absent: run `make browser` (apt-get install chromium); tests never "
            "download one"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield chromium
        chromium.close()


@pytest.fixture(scope="session", autouse=True)
def kernel_zygote():
    """One warm zygote per test process (``engine.zygote``): every kernel the tests start, in
    this process or in the sweeps and CLI runs it starts, is forked from it where its environment
    allows, as a sweep's are. ``MODEL_SUPPORT_KERNEL_ZYGOTE=off`` runs the suite on fresh
    kernels."""
    from model_support.engine import zygote

    proc = zygote.serve_here()
    yield os.environ.get(zygote.ZYGOTE_ENV)
    zygote.stop(proc)
