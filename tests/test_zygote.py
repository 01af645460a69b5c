"""The kernel zygote (engine.zygote): kernels forked from a warm process, and still each its own
process.

Real kernels through the engine's kernel manager, a real zygote process; nothing mocked.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from helpers import REPO


def _start_zygote():
    from model_support.engine import zygote

    started = zygote.start()
    assert started is not None, "the zygote did not start"
    return started


@pytest.fixture(scope="module")
def zygote_here():
    """A zygote of this module's own (not the session's), named in the environment: (its process,
    its socket)."""
    from model_support.engine import zygote

    proc, path = _start_zygote()
    before = os.environ.get(zygote.ZYGOTE_ENV)
    os.environ[zygote.ZYGOTE_ENV] = path
    yield proc, path
    os.environ.pop(zygote.ZYGOTE_ENV)
    if before is not None:
        os.environ[zygote.ZYGOTE_ENV] = before
    proc.kill()
    proc.wait()


def _notebook(tmp_path: Path, *sources: str) -> Path:
    path = tmp_path / "nb.ipynb"
    nbformat.write(
        nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources]), path
    )
    return path


FACTS = (
    "import json, os, sys\npreloaded = 'torch' in sys.modules and 'transformers' in "
    "sys.modules\nprint(json.dumps({'ppid': os.getppid(), 'pid': os.getpid(), 'cwd': os.getcwd(), 'preloaded': preloaded, 'late': os.environ.get('MODEL_SUPPORT_ZYGOTE_TEST'), 'pgid': os.getpgid(0), 'nofile': __import__('resource').getrlimit(__import__('resource').RLIMIT_NOFILE)[0]}))"
)


def _facts(out: Path) -> dict:
    return json.loads(nbformat.read(out, 4).cells[0].outputs[0]["text"])


def test_a_kernel_is_a_fork_of_the_zygote_with_its_own_folder_environment_and_group(
    zygote_here, tmp_path, monkeypatch
):
    from model_support.engine.notebooks import run_notebook

    proc, _ = zygote_here
    # read after the fork: may differ
    monkeypatch.setenv("MODEL_SUPPORT_ZYGOTE_TEST", "this probe's own")
    monkeypatch.chdir(tmp_path)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # `ulimit -n`: the requester's, not the zygote's
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft - 7, hard))
    try:
        facts = _facts(run_notebook(_notebook(tmp_path, FACTS), tmp_path / "out.ipynb", {}))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert facts["nofile"] == soft - 7
    # forked, torch and transformers already imported
    assert facts["ppid"] == proc.pid and facts["preloaded"]
    assert facts["cwd"] == str(tmp_path) and facts["late"] == "this probe's own"
    assert facts["pgid"] == facts["pid"]  # its own process group, as jupyter_client starts a kernel


def test_an_environment_the_imports_read_gets_a_fresh_kernel(zygote_here, tmp_path, monkeypatch):
    from model_support.engine import zygote
    from model_support.engine.notebooks import run_notebook

    proc, _ = zygote_here
    assert zygote.same_environment({"HF_TOKEN": "a", "PYTEST_X": "1"}, {"HF_TOKEN": "b"}) == []
    # every kernel of ours sets it
    assert zygote.same_environment({}, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}) == []
    assert zygote.same_environment(
        {"HF_HUB_OFFLINE": "1"}, {"HF_HUB_OFFLINE": "0", "OMP_NUM_THREADS": "1"}
    ) == [
        "HF_HUB_OFFLINE",
        "OMP_NUM_THREADS",
    ]
    _, path = zygote_here
    # not the suite's own (conftest sets it)
    threads = "2" if os.environ.get("OMP_NUM_THREADS") == "1" else "1"
    assert zygote.serves(path, dict(os.environ)) and not zygote.serves(
        path, {**os.environ, "OMP_NUM_THREADS": threads}
    )
    # libgomp read it when torch was imported in the zygote
    monkeypatch.setenv("OMP_NUM_THREADS", threads)
    facts = _facts(run_notebook(_notebook(tmp_path, FACTS), tmp_path / "out.ipynb", {}))
    assert facts["ppid"] == os.getpid() and not facts["preloaded"]  # launched as without a zygote


def test_a_kernel_killed_by_a_signal_is_known_by_that_signal(zygote_here, tmp_path):

    from model_support.engine.kernels import ipc_kernel
    from model_support.engine.notebooks import run_notebook

    notebook = _notebook(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGABRT)")
    with ipc_kernel() as km:
        with pytest.raises(Exception) as raised:  # noqa: PT011 whatever papermill makes of a dead kernel, checked below
            run_notebook(notebook, tmp_path / "out.ipynb", {}, km=km)
        assert type(raised.value).__name__ == "DeadKernelError"
        assert (
            km.provisioner is not None and type(km.provisioner.process).__name__ == "ForkedKernel"
        )
        assert km.exit_status == -signal.SIGABRT and not km.harness_lost


STARTER = """
import os, sys, time
from model_support.engine.kernels import ipc_kernel
from jupyter_core.utils import run_sync
with ipc_kernel() as km:
    run_sync(km.start_kernel)()
    print(km.provisioner.process.pid, type(km.provisioner.process).__name__, flush=True)
    time.sleep(600)
"""


def _gone(pid: int, within: float) -> bool:
    deadline = time.time() + within
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_a_kernel_whose_owner_is_killed_goes_with_it(zygote_here):
    owner = subprocess.Popen(
        [sys.executable, "-c", STARTER], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert owner.stdout is not None
        pid, kind = owner.stdout.readline().split()
        assert kind == "ForkedKernel"
        os.kill(owner.pid, signal.SIGKILL)  # as a sweep kills a probe process past its timeout
        owner.wait()
        assert _gone(int(pid), within=10), (
            "the forked kernel outlived the process that asked for it"
        )
    finally:
        owner.kill()


def test_a_zygote_that_ends_under_a_kernel_is_the_harness_not_the_model(monkeypatch):
    from jupyter_core.utils import run_sync

    from model_support.engine import zygote
    from model_support.engine.kernels import ipc_kernel

    proc, path = _start_zygote()  # its own: this test ends it
    monkeypatch.setenv(zygote.ZYGOTE_ENV, path)
    with ipc_kernel() as km:
        run_sync(km.start_kernel)()
        kernel = km.provisioner.process
        assert type(kernel).__name__ == "ForkedKernel"
        proc.kill()  # its kernels die with it (PR_SET_PDEATHSIG)
        proc.wait()
        assert _gone(kernel.pid, within=10)
        assert not run_sync(km.is_alive)()
        assert km.harness_lost and km.exit_status == -signal.SIGKILL


def test_a_zygote_whose_starter_is_already_gone_ends_at_once():
    """A sweep SIGKILLed just as it started its zygote, before the zygote asked to die with it,
    left the zygote serving as an orphan with torch imported (seen for hours after
    test_resume_after_sigkill): a zygote whose starter is no longer its parent ends at once, its
    socket removed."""
    import tempfile

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a starter that is not there any more (its pid is not this test's)
    path = os.path.join(tempfile.mkdtemp(prefix="z", dir="/tmp"), "s")
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    zygote = subprocess.Popen(
        [sys.executable, "-m", "model_support.engine.zygote", path, str(gone.pid)], env=env
    )
    try:
        assert zygote.wait(timeout=60) == 0
    finally:
        zygote.kill()
    assert not os.path.exists(path) and not os.path.exists(os.path.dirname(path))


# --- engine.children: one way to end a process tree, to die with a parent, to ask a child for JSON
# ----------------


def _pid_in(path: Path, within: float = 30.0) -> int:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text.endswith("\n"):
            return int(text)
        time.sleep(0.02)
    raise AssertionError(f"no pid in {path}")


def _ended(pid: int, within: float) -> bool:
    """Whether ``pid`` ended within ``within`` seconds: gone, or a zombie its new parent has not
    reaped yet (this host's first process reaps orphans only every second or so)."""
    import psutil

    deadline = time.time() + within
    while time.time() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def test_a_process_tree_is_ended_whole_with_its_groups_and_its_strays(tmp_path):
    """``children.kill_tree``: the root; a child of it that leads a session of its own (as a
    kernel and a sharded rank do); an orphan in that child's group, no longer under the root (its
    parent exited: re-parented, it is found by its group only); a stray of the same job elsewhere
    (``also``). All ended, the root reaped, when it returns."""
    import psutil

    from model_support.engine import children

    # a line of Python that starts another
    def python(code: str, *args: str, session: bool = False) -> str:
        more = ", start_new_session=True" if session else ""
        return f"subprocess.Popen([sys.executable, '-c', {code!r}, *{list(args)!r}]{more})"

    head = "import os, subprocess, sys, time; "
    leaf = head + "open(sys.argv[1], 'w').write(f'{os.getpid()}\\n'); time.sleep(60)"
    orphaned = head + python(leaf, str(tmp_path / "orphan"))  # starts it and exits
    leader = head + python(orphaned) + ".wait(); time.sleep(60)"
    root = subprocess.Popen(
        [sys.executable, "-c", head + python(leader, session=True) + "; time.sleep(60)"]
    )
    stray = subprocess.Popen(
        [sys.executable, "-c", leaf, str(tmp_path / "stray")], start_new_session=True
    )
    orphan_pid, stray_pid = _pid_in(tmp_path / "orphan"), _pid_in(tmp_path / "stray")
    assert orphan_pid not in [p.pid for p in psutil.Process(root.pid).children(recursive=True)]
    started = time.monotonic()
    children.kill_tree(root, also=[psutil.Process(stray_pid)])
    assert time.monotonic() - started < 10 and root.returncode == -signal.SIGKILL
    assert stray.wait(timeout=10) == -signal.SIGKILL
    assert _ended(orphan_pid, within=10)


def test_a_child_that_asks_to_die_with_its_parent_does(tmp_path):
    """``children.die_with_parent``: a process between the runner and a probe SIGKILLed, the
    probe goes too."""
    leaf = (
        "import os, sys, time; from model_support.engine import children; "
        "children.die_with_parent(); open(sys.argv[1], 'w').write(f'{os.getpid()}\\n'); "
        "time.sleep(60)"
    )
    middle = (
        f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {leaf!r}, "
        "sys.argv[1]]); time.sleep(60)"
    )
    parent = subprocess.Popen([sys.executable, "-c", middle, str(tmp_path / "leaf")])
    leaf_pid = _pid_in(tmp_path / "leaf")
    parent.kill()
    parent.wait()
    assert _ended(leaf_pid, within=10)


#: A sitecustomize that makes every Python started with it (the short-lived children below) hang at
#: once, with a grandchild that holds its output open: the case a plain ``subprocess.run(timeout=)``
#: waited out in full.
_HANG = """
import os, subprocess, sys, time
if os.environ.get("MODEL_SUPPORT_TEST_HANG"):
    os.environ.pop("MODEL_SUPPORT_TEST_HANG")
    code = "import os, sys, time; open(sys.argv[1], 'a').write(f'{os.getpid()}\\\\n'); time.sleep(120)"
    subprocess.Popen([sys.executable, "-c", code, os.environ["MODEL_SUPPORT_TEST_HANG_PIDS"]])
    time.sleep(120)
"""


@pytest.mark.parametrize("child", ["device facts", "stack coverage", "attribution of a dead probe"])
def test_a_child_asked_for_json_that_hangs_is_ended_with_its_group_in_one_sentence(
    child, tmp_path, monkeypatch
):
    """The three children whose answer is their last line of JSON (a device's facts, a stack's
    coverage, the CPU reference of a probe whose kernel died) share one timeout: past it their
    whole process group is killed (a grandchild kept the caller waiting out its own sleep) and
    the caller says in one sentence what did not answer."""
    import importlib

    from model_support.errors import UserError
    from model_support.ops import coverage
    from model_support.sweep.worker import deaths

    resolve = importlib.import_module("model_support.probe.devices.resolve")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_HANG)
    pids = tmp_path / "pids"
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("MODEL_SUPPORT_TEST_HANG", "1")
    monkeypatch.setenv("MODEL_SUPPORT_TEST_HANG_PIDS", str(pids))
    monkeypatch.setattr(resolve, "FACTS_TIMEOUT_S", 1.0)
    monkeypatch.setattr(coverage, "COVERAGE_TIMEOUT_S", 1.0)
    started = time.monotonic()
    if child == "device facts":
        # facts are cached per environment: this one is new (the pids path)
        said = resolve.facts("gpu").problem
        assert said.startswith(
            "Device 'gpu' could not be checked: asking it for its kind, count and memory did not "
        )
    elif child == "stack coverage":
        with pytest.raises(UserError) as caught:
            coverage.stack_coverage("cpu", ["aten::mm"])
        said = str(caught.value)
        assert (
            said == "The cpu stack's coverage could not be read here: its backend did not answer "
            "within 1 s."
        )
    else:
        started_probe = {"record": {"num_params": 1000, "device_type": "pretend"}, "settings": {}}
        said = deaths._attribute_death(started_probe, timeout_s=1.0)["reference_note"]
        assert said == "attribution not run: the reference did not answer within 1 s"
    assert "did not answer within 1 s" in said and said.count(". ") <= 1
    assert time.monotonic() - started < 15
    assert _ended(_pid_in(pids), within=10)  # the grandchild went with its group
