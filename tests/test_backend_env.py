"""One owner of the backend environment (issue 54, item 1; ``model_support/backend_env.py``):
torch autoloads no backend in a process of ours, whatever the shell set, and what a backend
package writes into ``os.environ`` as it loads (torch_tpu 0.2.0: the autoload switch back as "1",
``TPU_LIBRARY_PATH``, ``TORCHINDUCTOR_CACHE_DIR``) is its own: never a child's environment, never
the recorded backend configuration.

Each case runs in a fresh interpreter with the shell's environment (``helpers.SHELL_ENVIRON``:
the autoload unset, as a new user's shell has it) and torch_tpu installed, as ``make`` installs
it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from helpers import REPO, SHELL_ENVIRON


def child(code: str, **env: str) -> dict:
    """``code`` run by a fresh python with the shell's environment plus ``env``; the JSON it
    printed last."""
    environ = {k: v for k, v in SHELL_ENVIRON.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**environ, **env},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_package_first_keeps_torch_tpu_out_of_torch_whatever_the_shell_set():
    """A user who exported the autoload as 1 (or left it unset) gets no torch_tpu in a process of
    ours: torch's PrivateUse1 stays free for the backend the probe's device needs, and nothing of
    libtpu joins the environment."""
    code = """
        import json, os, sys
        import model_support
        import torch
        print(json.dumps({"tpu": "torch_tpu" in sys.modules, "name": torch._C._get_privateuse1_backend_name(),
                          "autoload": os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD"),
                          "libtpu": "TPU_LIBRARY_PATH" in os.environ}))
    """
    for shell in ({}, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}):
        assert child(code, **shell) == {
            "tpu": False,
            "name": "privateuseone",
            "autoload": "0",
            "libtpu": False,
        }


def test_what_a_backend_writes_as_it_loads_is_neither_a_childs_nor_the_recorded_configuration():
    """torch_tpu loaded through its entry point (as the tpu adapter loads it) writes
    ``TPU_LIBRARY_PATH`` and the inductor cache folder into ``os.environ``: the tpu adapter's
    recorded configuration leaves it out (``TPU_*`` is its configuration's pattern), a child's
    environment does not carry it, the autoload stays "0"; a TPU variable the user set is kept in
    both."""
    code = """
        import json, os
        import model_support
        from model_support import backend_env
        from model_support.probe.devices import adapter_for, backends
        backends.load_backend("tpu")
        child = backend_env.child_environ()
        print(json.dumps({"here": "TPU_LIBRARY_PATH" in os.environ, "written": sorted(backend_env.backend_written()),
                          "config": adapter_for("tpu").configuration(), "child_libtpu": "TPU_LIBRARY_PATH" in child,
                          "child_user": child.get("TPU_USER_SETTING"), "autoload": child["TORCH_DEVICE_BACKEND_AUTOLOAD"],
                          "autoload_here": os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"]}))
    """
    found = child(code, TPU_USER_SETTING="kept", PYTHONWARNINGS="ignore")
    assert found["here"] and "TPU_LIBRARY_PATH" in found["written"], found
    assert found["config"] == {"TPU_USER_SETTING": "kept"}, found
    assert not found["child_libtpu"] and found["child_user"] == "kept", found
    assert found["autoload"] == "0" and found["autoload_here"] == "0", found


def test_torch_imported_before_the_package_counts_the_known_backend_writes_as_the_backends():
    """A notebook that imported torch first (the autoload on, torch_tpu loaded): the variables
    backends are known to write are not handed to children as the user's, and the autoload a
    child gets is "0"."""
    code = """
        import json, os
        import torch
        wrote = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD"), "TPU_LIBRARY_PATH" in os.environ
        from model_support import backend_env
        child = backend_env.child_environ()
        print(json.dumps({"wrote": wrote, "child_libtpu": "TPU_LIBRARY_PATH" in child,
                          "autoload": child["TORCH_DEVICE_BACKEND_AUTOLOAD"]}))
    """
    found = child(code, PYTHONWARNINGS="ignore")
    assert found["wrote"] == ["1", True], found  # torch_tpu's loader, as the issue saw it
    assert found == {**found, "child_libtpu": False, "autoload": "0"}, found


def test_a_users_own_tpu_library_path_is_kept_when_torch_was_imported_first():
    """Review: with torch imported before the package and no backend loaded, the user's own
    ``TPU_LIBRARY_PATH`` and inductor cache folder were dropped from children and from the tpu
    adapter's configuration. A value the process started with is the user's
    (``/proc/self/environ``), whatever imported torch first."""
    code = """
        import json, os
        import torch
        from model_support import backend_env
        from model_support.probe.devices import adapter_for
        child = backend_env.child_environ()
        print(json.dumps({"child": [child.get("TPU_LIBRARY_PATH"), child.get("TORCHINDUCTOR_CACHE_DIR")],
                          "config": adapter_for("tpu").configuration()}))
    """
    mine = {
        "TPU_LIBRARY_PATH": "/tmp/my_libtpu.so",
        "TORCHINDUCTOR_CACHE_DIR": "/tmp/my-inductor-cache",
    }
    for autoload in ("0", "1"):
        found = child(code, TORCH_DEVICE_BACKEND_AUTOLOAD=autoload, PYTHONWARNINGS="ignore", **mine)
        assert found["child"] == ["/tmp/my_libtpu.so", "/tmp/my-inductor-cache"], (autoload, found)
        assert found["config"] == {"TPU_LIBRARY_PATH": "/tmp/my_libtpu.so"}, (autoload, found)
