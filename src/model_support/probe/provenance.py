"""Where a record came from: versions of the stack, this package's git commit, the host.

Computed once per process (they do not change while a kernel lives) and attached to every record, as
lm-evaluation-harness does for its results files. ``versions`` names the few packages a reader
filters by; ``stack`` is every installed distribution (``sweep.json`` keeps it whole, each record
its ``stack_sha``), so a difference in any package between two sweeps is found (``model-support
bisect``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import socket
import subprocess
from importlib import metadata

from packaging.utils import canonicalize_name

from .. import __version__
from ..paths import checkout_root
from ..record.schema import Versions

#: What ``versions`` is besides package versions.
_NOT_PACKAGES = ("python", "model_support", "git_commit")
#: The packages a record's ``versions`` names: the fields of its declaration (``schema.Versions``),
#: kept as the first records had them. Which packages make up a device backend is its adapter's to
#: say (``backend_versions``).
PACKAGES = tuple(name for name in Versions.__annotations__ if name not in _NOT_PACKAGES)


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


#: How long one git command may take (a checkout on a hung network file system would otherwise hang
#: every probe).
GIT_TIMEOUT_S = 10.0


def _git(root, *args: str) -> str | None:
    """``git -C root ARGS``'s output, or None when git is missing, fails or does not answer in
    time."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@functools.cache
def git_commit() -> str | None:
    """The commit of the checkout this package was imported from (null for a non-git install), with
    ``-dirty`` when tracked files changed, ``-dirty?`` when git could not tell."""
    root = checkout_root()
    if root is None:
        return None
    commit = _git(root, "rev-parse", "HEAD")
    if not commit:
        return None
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    return commit + ("-dirty?" if dirty is None else "-dirty" if dirty else "")


@functools.cache
def versions() -> dict:
    """The stack as a record's ``versions`` holds it: python, each of ``PACKAGES``, this package
    and its commit."""
    found = {name: package_version(name) for name in PACKAGES}
    return {
        "python": platform.python_version(),
        **found,
        "model_support": __version__,
        "git_commit": git_commit(),
    }


@functools.cache
def stack() -> dict[str, str]:
    """Every distribution this process can import, by canonical name (``transformers``,
    ``torch-tpu``), with its version: the first one on ``sys.path`` wins, as for ``import`` (an
    overlay environment's package shadows the base one's)."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        # <name>-<version>.dist-info names both: no METADATA to parse
        folder = getattr(dist, "_path", None)
        stem = (
            folder.name.removesuffix(".dist-info")
            if folder and folder.name.endswith(".dist-info")
            else ""
        )
        name, _, version = stem.partition("-")
        # an .egg-info (an editable install): read its METADATA (~3 ms each)
        if not (name and version):
            name, version = dist.metadata["Name"] or "", dist.version
        if name:
            found.setdefault(canonicalize_name(name), version)
    return dict(sorted(found.items()))


def stack_sha(packages: dict[str, str] | None = None) -> str:
    """The first 16 hex digits of the sha256 of ``packages`` (default: this process's ``stack``):
    what a record carries instead of the whole list (``sweep.json`` has it)."""
    text = json.dumps(
        stack() if packages is None else dict(sorted(packages.items())), separators=(",", ":")
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def host() -> str:
    return socket.gethostname()
