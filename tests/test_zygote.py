"""The kernel zygote (engine.zygote): kernels forked from a warm process, and still each its own process.

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
    """A zygote of this module's own (not the session's), named in the environment: (its process, its socket)."""
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
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources]), path)
    return path


FACTS = (
    "import json, os, sys\n"
    "preloaded = 'torch' in sys.modules and 'transformers' in sys.modules\n"
    "print(json.dumps({'ppid': os.getppid(), 'pid': os.getpid(), 'cwd': os.getcwd(), 'preloaded': preloaded,"
    " 'late': os.environ.get('MODEL_SUPPORT_ZYGOTE_TEST'), 'pgid': os.getpgid(0),"
    " 'nofile': __import__('resource').getrlimit(__import__('resource').RLIMIT_NOFILE)[0]}))"
)


def _facts(out: Path) -> dict:
    return json.loads(nbformat.read(out, 4).cells[0].outputs[0]["text"])


def test_a_kernel_is_a_fork_of_the_zygote_with_its_own_folder_environment_and_group(zygote_here, tmp_path, monkeypatch):
    from model_support.engine.notebooks import run_notebook

    proc, _ = zygote_here
    monkeypatch.setenv("MODEL_SUPPORT_ZYGOTE_TEST", "this probe's own")  # read after the fork: may differ
    monkeypatch.chdir(tmp_path)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft - 7, hard))  # `ulimit -n`: the requester's, not the zygote's
    try:
        facts = _facts(run_notebook(_notebook(tmp_path, FACTS), tmp_path / "out.ipynb", {}))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert facts["nofile"] == soft - 7
    assert facts["ppid"] == proc.pid and facts["preloaded"]  # forked, torch and transformers already imported
    assert facts["cwd"] == str(tmp_path) and facts["late"] == "this probe's own"
    assert facts["pgid"] == facts["pid"]  # its own process group, as jupyter_client starts a kernel


def test_an_environment_the_imports_read_gets_a_fresh_kernel(zygote_here, tmp_path, monkeypatch):
    from model_support.engine import zygote
    from model_support.engine.notebooks import run_notebook

    proc, _ = zygote_here
    assert zygote.same_environment({"HF_TOKEN": "a", "PYTEST_X": "1"}, {"HF_TOKEN": "b"}) == []
    assert zygote.same_environment({}, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}) == []  # every kernel of ours sets it
    assert zygote.same_environment({"HF_HUB_OFFLINE": "1"}, {"HF_HUB_OFFLINE": "0", "OMP_NUM_THREADS": "1"}) == [
        "HF_HUB_OFFLINE",
        "OMP_NUM_THREADS",
    ]
    _, path = zygote_here
    threads = "2" if os.environ.get("OMP_NUM_THREADS") == "1" else "1"  # not the suite's own (conftest sets it)
    assert zygote.serves(path, dict(os.environ)) and not zygote.serves(path, {**os.environ, "OMP_NUM_THREADS": threads})
    monkeypatch.setenv("OMP_NUM_THREADS", threads)  # libgomp read it when torch was imported in the zygote
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
        assert km.provisioner is not None and type(km.provisioner.process).__name__ == "ForkedKernel"
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
    owner = subprocess.Popen([sys.executable, "-c", STARTER], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert owner.stdout is not None
        pid, kind = owner.stdout.readline().split()
        assert kind == "ForkedKernel"
        os.kill(owner.pid, signal.SIGKILL)  # as a sweep kills a probe process past its timeout
        owner.wait()
        assert _gone(int(pid), within=10), "the forked kernel outlived the process that asked for it"
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
    """A sweep SIGKILLed just as it started its zygote, before the zygote asked to die with it, left the zygote
    serving as an orphan with torch imported (seen for hours after test_resume_after_sigkill): a zygote whose
    starter is no longer its parent ends at once, its socket removed."""
    import tempfile

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a starter that is not there any more (its pid is not this test's)
    path = os.path.join(tempfile.mkdtemp(prefix="z", dir="/tmp"), "s")
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    zygote = subprocess.Popen([sys.executable, "-m", "model_support.engine.zygote", path, str(gone.pid)], env=env)
    try:
        assert zygote.wait(timeout=60) == 0
    finally:
        zygote.kill()
    assert not os.path.exists(path) and not os.path.exists(os.path.dirname(path))
