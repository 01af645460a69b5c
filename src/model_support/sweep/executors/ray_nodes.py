"""The Ray executor's nodes and the stack each task carries (``ray``'s module docstring says
why): the driver's variables that make the stack, set in a task's worker for its run and put back
after (``carried_environ``, ``stack_here``); each node's versions of the stack and digest of the
project's code (``node_stack``, ``code_digest``), checked against the driver's before any probe
runs (``check_nodes``) and by the first task on a node that joins later (``refused_here``)."""

from __future__ import annotations

import functools
import hashlib
import os
import socket
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ... import backend_env, paths
from ...engine import zygote
from ...errors import UserError
from ...probe import devices

#: The project's own settings that travel with each task besides ``MODEL_SUPPORT_*``
#: (``carried_name``): where the Hub is and its cache, offline switches, tokens (set as the driver
#: has them; each unset on the node where it has none).
CARRIED_NAMES = frozenset(
    {
        "HF_HOME",
        "HF_HUB_CACHE",
        "HF_ENDPOINT",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_HUB_DISABLE_TELEMETRY",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
    }
)


#: The project's prefix: its settings a probe reads (``MODEL_SUPPORT_KERNEL_START_S``,
#: ``MODEL_SUPPORT_PHASES``, ``MODEL_SUPPORT_HUB_*``, ``MODEL_SUPPORT_MODELS_DIR``, ...) travel, but
#: ``PER_PROCESS``.
CARRIED_PREFIX = "MODEL_SUPPORT_"


#: Project variables that name one process's own things (its zygote's socket, its device phase's
#: file, its flight recorder, its device gate, an overlay interpreter on this host, a fault injected
#: into this process): never carried and never unset: each process of the harness sets them for its
#: children.
PER_PROCESS = frozenset(
    {
        zygote.ZYGOTE_ENV,
        "MODEL_SUPPORT_DEVICE_PHASE_FILE",
        "MODEL_SUPPORT_FLIGHT_FILE",
        "MODEL_SUPPORT_DEVICE_GATE",
        "MODEL_SUPPORT_PROBE_PYTHON",
        "MODEL_SUPPORT_STOP_AT_WRITE",
    }
)


def carried_name(name: str) -> bool:
    """Whether ``name`` is one of the project's own settings that travel with a task
    (``CARRIED_NAMES``, the ``MODEL_SUPPORT_*`` settings but ``PER_PROCESS``)."""
    return name in CARRIED_NAMES or (name.startswith(CARRIED_PREFIX) and name not in PER_PROCESS)


def _config_names(environ: dict[str, str]) -> set[str]:
    """Every registered backend adapter's configuration variables set in ``environ`` (its
    ``config_vars``, not its harness variables: those Ray and the harness set per process)."""
    return {name for cls in devices.registered().values() for name in cls.config_names(environ)}


def carried_environ(extra: Iterable[str] = ()) -> dict[str, str]:
    """What each Ray task carries from the driver (module docstring): the driver's values, as the
    user and the project set them (``backend_env.user_environ``), of the backends' configuration
    variables, the project's settings (``carried_name``) and ``extra`` (the names of the sweep's
    ``stacks:`` env), those set only."""
    environ = backend_env.user_environ()
    names = _config_names(environ) | {name for name in environ if carried_name(name)} | set(extra)
    return {name: environ[name] for name in sorted(names) if name in environ}


def carried_here(carried: dict[str, str], extra: Iterable[str]) -> dict[str, str | None]:
    """In the task's process: {name: value, or None to unset} that makes its environment the
    driver's for the stack: ``carried`` set, and each variable of the same kinds set here but not
    on the driver unset."""
    here = dict(os.environ)
    names = _config_names(here) | {name for name in here if carried_name(name)} | set(extra)
    return {name: carried.get(name) for name in names | set(carried)}


@contextmanager
def stack_here(carried: dict[str, str], extra: Iterable[str] = ()) -> Iterator[None]:
    """This Ray worker's environment with the driver's stack (``carried_here``) while the task
    runs, its own put back after (the worker serves the sweep's next tasks, maybe of another
    stack)."""
    wanted = carried_here(carried, extra)
    before = {name: os.environ.get(name) for name in wanted}
    backend_env.put_back(wanted)  # set or unset, as the driver's stack has it
    try:
        yield
    finally:
        backend_env.put_back(before)


def capped_words(asked: int, have: int, resource: str) -> str:
    """The line a sweep capped to the cluster's devices prints (``RayExecutor._connect``)."""
    what = "CPUs" if resource == "CPU" else f"{resource} devices"
    return (
        f"The Ray cluster has {have} {what} now: running {have} probe(s) at once, not the "
        f"{asked} asked (--workers); add nodes for more."
    )


#: Seconds every node gets to say its stack's versions (``check_nodes``): a task of no CPU, pinned
#: to the node.
NODE_CHECK_S = 120.0


#: ``node_stack``'s name for ``code_digest``.
CODE = "model_support code"


#: ``node_stack``'s note of where its code is read from (host and folder), never compared itself: a
#: node that reads the driver's very files has the driver's code, and comparing two digests of them
#: taken a second apart would only catch an edit made in between (a checkout being worked on while a
#: local Ray runs its sweep).
WHERE = "_code_read_from"


def code_digest() -> str:
    """16 hex digits of a sha256 over this process's ``model_support`` package: each file's path
    in it and its bytes (modules, the notebooks the probes run, templates; no caches, nothing
    hidden). The package's version is 0.1.0 whatever its code, so two nodes with other project
    code said the same version: this tells them apart."""
    root = paths.package_file()
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        inside = path.relative_to(root)
        if path.is_file() and path.suffix not in (".pyc", ".pyo") and not _hidden_or_cache(inside):
            body = path.read_bytes()
            digest.update(f"{inside.as_posix()}\0{len(body)}\0".encode())
            digest.update(body)
    return digest.hexdigest()[:16]


def _hidden_or_cache(inside: Path) -> bool:
    return any(part.startswith(".") or part == "__pycache__" for part in inside.parts)


def node_stack(device: str) -> dict[str, str]:
    """What a node must share with the driver: python's version, the record's packages' (torch,
    transformers, ...), model_support's and its code's (``code_digest``), and the device's
    backend packages (``backend_versions``); a package missing here is "not installed"."""
    from ...probe import provenance

    found = {
        name: str(version or "not installed") for name, version in provenance.versions().items()
    }
    # a node need not be a checkout: the code's digest says what it runs
    found.pop("git_commit", None)
    found[CODE] = code_digest()
    found[WHERE] = _files_identity()
    for line in devices.adapter_for(device).backend_versions():
        name, _, version = line.rpartition(" ")
        found[name or line] = version
    for name in devices.adapter_for(device).packages():
        if "*" not in name and not any(
            key.replace("_", "-") == name.replace("_", "-") for key in found
        ):
            found[name] = "not installed"
    return found


def _files_identity() -> str:
    """Which files this process's model_support is read from, as only the same files on the same
    machine say it: the boot's id (a container on the host shares it; another machine does not),
    the package folder's device and inode (a container's own image, or another checkout at the
    same path, has others) and its path. A host name and a path alone are not enough: two
    machines both called ``ubuntu`` with ``/opt/venv`` would pass."""
    folder = Path(paths.package_file())
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = socket.gethostname()
    try:
        where = folder.stat()
        inode = f"{where.st_dev}:{where.st_ino}"
    except OSError:
        inode = "?"
    return f"{boot}:{inode}:{folder}"


def _node_stack_task(device: str) -> tuple[str, dict[str, str]]:
    """The node check's Ray task (``check_nodes``): its host's name and ``node_stack``."""
    return socket.gethostname(), node_stack(device)


def stack_differences(driver: dict[str, str], node: dict[str, str]) -> list[str]:
    """``package X (the driver has Y)`` for each package (or the code: unless the node reads the
    driver's own files, ``WHERE``) whose version differs."""
    same_files = WHERE in driver and driver[WHERE] == node.get(WHERE)
    return [
        f"{name} {node.get(name, 'not installed')} (the driver has {version})"
        for name, version in driver.items()
        if name != WHERE
        and not (name == CODE and same_files)
        and node.get(name, "not installed") != version
    ]


class Checked:
    """What the driver found when it joined (``check_nodes``): the nodes that share its stack,
    and that stack. Each task carries it: on a node that joined after (``refused_here``) the task
    first compares that node's stack."""

    def __init__(self, device: str, nodes: frozenset[str], stack: dict[str, str]):
        self.device, self.nodes, self.stack = device, nodes, stack


def check_nodes(device: str) -> Checked:
    """Before any probe: every alive node of the cluster runs a task of no CPU pinned to it
    (``NodeAffinitySchedulingStrategy``) that says its stack (``node_stack``); a node whose stack
    differs from the driver's, or that cannot run model_support, is refused in one sentence
    naming it and what differs. Returns the nodes checked and the driver's stack."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    mine = node_stack(device)
    remote = ray.remote(_node_stack_task)
    asked = {}
    for node in ray.nodes():
        if node.get("Alive", True):
            strategy = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            ref = remote.options(num_cpus=0, max_retries=0, scheduling_strategy=strategy).remote(
                device
            )
            asked[ref] = node
    wrong = []
    for ref, node in asked.items():
        where = f"{node.get('NodeManagerAddress', '?')} (node {node['NodeID'][:12]})"
        try:
            host, theirs = ray.get(ref, timeout=NODE_CHECK_S)
        except ray.exceptions.GetTimeoutError:
            wrong.append(f"the Ray node at {where} did not say its stack within {NODE_CHECK_S:g} s")
            continue
        except ray.exceptions.RayError as exc:
            wrong.append(f"the Ray node at {where} could not run model_support ({first_line(exc)})")
            continue
        found = stack_differences(mine, theirs)
        if found:
            wrong.append(f"the Ray node {host} at {where} has {', '.join(found)}")
    if wrong:
        raise UserError(
            f"{'; '.join(wrong)}: a node must run the driver's stack, so install the driver's "
            "versions and code there (or take the node out of the cluster) before this sweep "
            "runs on it."
        )
    return Checked(device, frozenset(node["NodeID"] for node in asked.values()), mine)


@functools.cache
def _this_nodes_stack(device: str) -> dict[str, str]:
    """``node_stack`` of this Ray worker's node, once per worker (a worker serves one sweep)."""
    return node_stack(device)


def refused_here(checked: Checked | None) -> str | None:
    """In a Ray task: why this node may run no probe of the sweep, or None. A node the driver
    checked when it joined may; one that joined later may when its stack is the driver's."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    if checked is None or node in checked.nodes:
        return None
    found = stack_differences(checked.stack, _this_nodes_stack(checked.device))
    if not found:
        return None
    return (
        f"the Ray node {socket.gethostname()} (node {node[:12]}) joined the cluster after the "
        f"sweep checked its nodes and has {', '.join(found)}: install the driver's stack "
        "there, or take it out of the cluster"
    )


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
