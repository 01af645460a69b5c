"""A warm parent for notebook kernels: torch and transformers imported once, every kernel a fork of
it.

Why: most of a small model's probe is not the model. A kernel process spends ~5 CPU seconds starting
Python, ipykernel, torch and transformers, the same for every model; a sweep of 40 tiny models on 2
cores spends most of its CPU there, and so does the test suite (~250 probes). The zygote pays that
once: it imports them, then forks a kernel for each request. Each kernel is still its own process
(its own memory, its own fate: one that dies, hangs or is killed touches no other), started in the
folder, with the environment and the stdout/stderr files its caller asked for; only the imports done
before the fork are shared.

What keeps a forked kernel the kernel a fresh one would have been:

- The environment: the preloaded imports read theirs at import time (``OMP_NUM_THREADS`` in libgomp,
  ``HF_HUB_OFFLINE`` in huggingface_hub, ``TRANSFORMERS_VERBOSITY``, every ``PYTHON*``), so a
  request is forked only when its environment equals the zygote's in everything but the variables
  read after the fork (``LATE_PREFIXES``, ``LATE_SUFFIXES``, ``LATE_NAMES``: a probe's own files,
  its device pinning, the token). Any other difference gets a fresh process, as without a zygote
  (``fork_kernel`` returns None and the caller launches as usual).
- No device backend before the fork: the zygote only serves with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``
  (the probe's device adapter loads its backend in the kernel, after the fork), and never on a CUDA
  or ROCm build of torch (a GPU driver initialised before a fork is unusable in the child: there
  every kernel starts fresh).
- What else a fresh process inherits: the requester's resource limits (``ulimit -n``, memory) and
  umask are set in the child; a hard limit above the zygote's own cannot be, and gets a fresh
  process.
- Its exit status: the zygote reaps each kernel and sends its status (negative: the signal, as
  ``Popen.returncode``) on the request's connection; a kernel whose requester goes away (killed,
  timed out) is killed with its whole process tree, as a fresh kernel would die with its parent.

``MODEL_SUPPORT_KERNEL_ZYGOTE`` names the zygote's socket; unset (or not answering) means fresh
kernels, ``off`` says never. The sweep's local executor starts one per sweep (``serve_here``); the
test suite one per pytest worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .. import backend_env
from . import children, kernel_side

ZYGOTE_ENV = "MODEL_SUPPORT_KERNEL_ZYGOTE"
#: ``MODEL_SUPPORT_KERNEL_ZYGOTE=off``: every kernel a fresh process (the benchmark's baseline, or a
#: doubt).
OFF = "off"
#: Variables a request may set otherwise than the zygote: nothing imported before the fork reads
#: them.
LATE_PREFIXES = ("MODEL_SUPPORT_", "JPY_", "PYTEST_")
LATE_SUFFIXES = ("_VISIBLE_DEVICES", "_VISIBLE_CHIPS")
#: the token, the terminal's size, polars' jemalloc (polars is not preloaded), the shell's last
#: command
LATE_NAMES = frozenset({"HF_TOKEN", "COLUMNS", "LINES", "_RJEM_MALLOC_CONF", "_"})
#: What every kernel of ours imports, nothing device-bound (the probe's ``WARM_UP`` less the
#: package: the kernel's modules and ``kernel_side.STACK``), and not ipykernel's kernel app: it
#: reads ``JPY_PARENT_PID`` when it is imported (0.1 s to import in the kernel).
PRELOAD = "import IPython, zmq, tornado.ioloop, ipykernel.ipkernel\n" + kernel_side.STACK
_MAX_MESSAGE = 1 << 20
#: The resource limits a kernel gets from its requester, as a fresh process inherits them
#: (``ulimit``).
LIMITS = (
    "RLIMIT_NOFILE",
    "RLIMIT_AS",
    "RLIMIT_DATA",
    "RLIMIT_STACK",
    "RLIMIT_CPU",
    "RLIMIT_FSIZE",
    "RLIMIT_CORE",
    "RLIMIT_NPROC",
    "RLIMIT_MEMLOCK",
)


def process_state() -> dict:
    """What a fresh process inherits besides its environment: the resource limits and the umask."""
    import resource

    limits = {
        name: list(resource.getrlimit(getattr(resource, name)))
        for name in LIMITS
        if hasattr(resource, name)
    }
    umask = next(
        (
            line.split()[1]
            for line in Path("/proc/self/status").read_text().splitlines()
            if line.startswith("Umask:")
        ),
        "0022",
    )
    return {"limits": limits, "umask": int(umask, 8)}


def _cannot_inherit(limits: dict) -> list[str]:
    """The limits a child of the zygote could not be given (a hard limit above the zygote's own)."""
    import resource

    def above(wanted: int, ours: int) -> bool:
        return ours != resource.RLIM_INFINITY and (
            wanted == resource.RLIM_INFINITY or wanted > ours
        )

    return [
        name
        for name, (_, hard) in limits.items()
        if above(hard, resource.getrlimit(getattr(resource, name))[1])
    ]


def late(name: str) -> bool:
    """Whether variable ``name`` is read only after the fork, so that a request may set it
    otherwise."""
    return name in LATE_NAMES or name.startswith(LATE_PREFIXES) or name.endswith(LATE_SUFFIXES)


#: Every kernel of ours turns device backend autoload off before it imports torch (the probe's
#: device adapter, the standby's warm-up): unset there is off, as in the zygote.
AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"


def same_environment(ours: dict, theirs: dict) -> list[str]:
    """The variables, read before the fork, that ``theirs`` sets otherwise than ``ours`` (empty:
    forkable)."""
    ours, theirs = {AUTOLOAD: "0", **ours}, {AUTOLOAD: "0", **theirs}
    keys = {k for k in ours.keys() | theirs.keys() if not late(k)}
    return sorted(k for k in keys if ours.get(k) != theirs.get(k))


# --- the zygote's side
# ------------------------------------------------------------------------------


def _child(
    request: dict, fds: list[int], listener: socket.socket, connections: list[socket.socket]
) -> None:
    """In the forked kernel: become what ``python -m MODULE ARGS`` started there would be, then
    run it."""
    code = 1
    try:
        listener.close()
        for conn in connections:
            conn.close()
        # its own process group, as jupyter_client starts a kernel (signals go to the group)
        os.setsid()
        children.die_with_parent()  # dies with the zygote
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import resource

        for name, (soft, hard) in request.get("limits", {}).items():
            resource.setrlimit(getattr(resource, name), (soft, hard))
        if "umask" in request:
            os.umask(request["umask"])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        argv = request["argv"]  # [python, -m, module, *args]
        sys.argv = [argv[2], *argv[3:]]
        sys.path[0] = request["cwd"]  # what `python -m` puts first
        import runpy

        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # noqa: BLE001 whatever the kernel raised ends it, as it would a fresh process
        import traceback

        traceback.print_exc()
    finally:
        # what a fresh interpreter's exit would do, less module teardown
        with contextlib.suppress(Exception):
            import atexit

            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _send(conn: socket.socket, message: dict) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(message).encode() + b"\n")


def serve(path: str, owner: int) -> None:
    """The zygote: import ``PRELOAD``, then fork a kernel per request on the socket at ``path``
    until the process that started it (``owner``) ends (``python -m model_support.engine.zygote
    PATH OWNER_PID``)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)  # requests wait here while the imports below run
    environment = dict(os.environ)
    # frozen out of the collector's sight, in every kernel forked from here too
    kernel_side.preload(PRELOAD)
    import torch

    if (
        torch.version.cuda
        or getattr(torch.version, "hip", None)
        or "ipykernel.kernelapp" in sys.modules
    ):
        # a GPU build (module docstring), or the kernel app imported too early: no forks
        listener.close()
        return
    # what the imports set themselves (torch's inductor cache folder): a fresh kernel's imports
    # would set it too
    preloaded = {k: v for k, v in os.environ.items() if environment.get(k) != v}
    kernels: dict[int, socket.socket] = {}  # pid -> its requester's connection
    while os.getppid() == owner:
        readable, _, _ = select.select([listener, *kernels.values()], [], [], 0.5)
        for ready in readable:
            if ready is listener:
                conn, _ = listener.accept()
                try:
                    message, fds, _, _ = socket.recv_fds(conn, _MAX_MESSAGE, 3)
                    request = json.loads(message)
                except (OSError, ValueError):
                    conn.close()
                    continue
                # a variable the imports set themselves is as they set it, or not set yet (they will
                # set it)
                differs = same_environment(
                    {**environment, **preloaded}, {**preloaded, **request["env"]}
                )
                differs += _cannot_inherit(request.get("limits", {}))
                # would it fork for this environment (``serves``)? nothing forked
                if request.get("check"):
                    _send(conn, {"refused": differs} if differs else {"serves": True})
                    conn.close()
                    continue
                if (
                    differs
                    or len(fds) != 3
                    or request["argv"][0] != sys.executable
                    or request["argv"][1] != "-m"
                ):
                    for fd in fds:
                        os.close(fd)
                    _send(conn, {"refused": differs or ["the command"]})
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    request["env"] = {**request["env"], **preloaded}
                    _child(request, fds, listener, [conn, *kernels.values()])
                for fd in fds:
                    os.close(fd)
                kernels[pid] = conn
                _send(conn, {"pid": pid})
            else:  # a requester closed its end (it ended, or was killed): its kernel goes with it
                pid = next(p for p, c in kernels.items() if c is ready)
                with contextlib.suppress(OSError):
                    if ready.recv(1):
                        continue
                children.kill_tree(pid, reap=False)  # the loop below reaps it (its exit status)
        while kernels:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid in kernels:
                conn = kernels.pop(pid)
                _send(conn, {"exit": os.waitstatus_to_exitcode(status)})
                conn.close()
    for pid in list(kernels):
        # the zygote ends: its kernels with it (init reaps them)
        children.kill_tree(pid, reap=False)


# --- the requester's side
# --------------------------------------------------------------------------


class ForkedKernel:
    """The ``subprocess.Popen`` a kernel provisioner expects, for a kernel the zygote forked:
    ``poll``, ``wait``, ``send_signal``, ``kill``, ``terminate``, ``pid``, ``returncode``. The
    connection stays open for the kernel's life (closing it, or this process ending, kills the
    kernel)."""

    stdin = stdout = stderr = None
    lost = False  # the zygote ended under it (``kernels.RecordingKernelManager.harness_lost``)

    def __init__(self, conn: socket.socket, pid: int):
        self._conn, self.pid = conn, pid
        self.returncode: int | None = None
        self._buffer = b""

    def poll(self, block: float = 0.0) -> int | None:
        if self.returncode is not None:
            return self.returncode
        ready, _, _ = select.select([self._conn], [], [], block)
        if ready:
            chunk = self._conn.recv(4096)
            # the zygote died, and its kernels with it: the harness's loss, not the model's
            if not chunk:
                self.lost = True
                self.returncode = -signal.SIGKILL
            self._buffer += chunk
            if b"\n" in self._buffer:
                self.returncode = int(json.loads(self._buffer.split(b"\n", 1)[0])["exit"])
            if self.returncode is not None:
                self._conn.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll(block=0.1) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"kernel {self.pid}", timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def _fd(stream, default: int) -> tuple[int, bool]:
    """A file descriptor for one of the kernel's standard streams (``Popen``'s
    stdin/stdout/stderr argument); whether it was opened here (to close once sent)."""
    if stream is None:
        return os.dup(default), True
    if stream in (subprocess.PIPE, subprocess.DEVNULL):
        return os.open(os.devnull, os.O_WRONLY), True
    if isinstance(stream, int):
        return stream, False
    return stream.fileno(), False


def fork_kernel(
    cmd: list[str], env: dict, cwd: str | None, stdout=None, stderr=None
) -> ForkedKernel | None:
    """The kernel ``cmd`` forked by this process's zygote (``MODEL_SUPPORT_KERNEL_ZYGOTE``), or
    None where there is none, it does not answer, or it refuses (an environment it cannot serve):
    then launch as usual."""
    path = os.environ.get(ZYGOTE_ENV)
    if not path or len(cmd) < 3 or cmd[1] != "-m":
        return None
    fds = [(os.open(os.devnull, os.O_RDONLY), True), _fd(stdout, 1), _fd(stderr, 2)]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(120)  # its imports take seconds; a zygote that never answers is no zygote
        conn.connect(path)
        request = {"argv": cmd, "env": env, "cwd": str(cwd or os.getcwd()), **process_state()}
        socket.send_fds(conn, [json.dumps(request).encode()], [fd for fd, _ in fds])
        answer = conn.makefile("rb").readline()
        message = json.loads(answer) if answer else {}
    except (OSError, ValueError):
        conn.close()
        return None
    finally:
        for fd, ours in fds:
            if ours:
                os.close(fd)
    if "pid" not in message:
        conn.close()
        return None
    conn.settimeout(None)
    return ForkedKernel(conn, int(message["pid"]))


def start(env: dict | None = None) -> tuple[subprocess.Popen, str] | None:
    """A zygote for this process's kernels (it dies with this process), its socket path: None
    where it could not serve (device backend autoload on)."""
    env = backend_env.child_environ(env)  # the backend each kernel loads is its adapter's to choose
    if env.get(AUTOLOAD) != "0":
        return None
    folder = tempfile.mkdtemp(prefix="z", dir="/tmp")  # socket paths must stay short (< 108 bytes)
    path = os.path.join(folder, "s")
    proc = subprocess.Popen(
        [children.interpreter(env), "-m", "model_support.engine.zygote", path, str(os.getpid())],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,  # its imports' warnings: each kernel's own imports are its own
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while not Path(path).exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return (proc, path) if Path(path).exists() else None


def serves(path: str | None, env: dict) -> bool:
    """Whether a zygote listens at ``path`` and would fork kernels with environment ``env``."""
    if not path or not os.path.exists(path):
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.settimeout(120)  # it answers once its imports are done
            conn.connect(path)
            conn.sendall(json.dumps({"check": True, "env": env, **process_state()}).encode())
            conn.shutdown(socket.SHUT_WR)
            answer = conn.makefile("rb").readline()
        except OSError:
            return False
    return bool(answer) and "serves" in json.loads(answer)


def serve_here(env: dict | None = None) -> subprocess.Popen | None:
    """Unless a zygote already serves this process's kernels (``MODEL_SUPPORT_KERNEL_ZYGOTE``
    names one that would fork them), start one with this process's environment updated by
    ``env``, and name it in ``os.environ`` so that this process and those it starts fork their
    kernels from it; the zygote (to ``stop``), or None."""
    wanted = {**os.environ, **(env or {})}
    if os.environ.get(ZYGOTE_ENV) == OFF or serves(os.environ.get(ZYGOTE_ENV), wanted):
        return None
    started = start(env)
    if started is None:
        return None
    _named_before[started[0].pid] = os.environ.get(ZYGOTE_ENV)
    os.environ[ZYGOTE_ENV] = started[1]
    return started[0]


# a zygote's pid -> the one named before it (an environment it refused)
_named_before: dict[int, str | None] = {}


def stop(proc: subprocess.Popen | None) -> None:
    """End a zygote ``serve_here`` started (its kernels end with it) and stop naming it."""
    if proc is None:
        return
    before = _named_before.pop(proc.pid, None)
    if before is None:
        os.environ.pop(ZYGOTE_ENV, None)
    else:
        os.environ[ZYGOTE_ENV] = before
    proc.kill()
    proc.wait()


if __name__ == "__main__":
    children.die_with_parent()  # dies with its starter
    starter = int(sys.argv[2])
    try:
        # a starter killed before the line above ran (a sweep SIGKILLed as it began) left it an
        # orphan: end now, as the death signal would have ended it (seen: a zygote holding its
        # imports for hours after such a kill)
        if os.getppid() == starter:
            serve(sys.argv[1], starter)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(sys.argv[1])  # none when it ended before it listened
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(sys.argv[1]))
