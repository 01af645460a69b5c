"""Overlay environments: the project's environment with a few distributions at other versions.

A bisect step is "the same repro script in an environment that differs in one package". Copying the
whole environment per step would cost gigabytes (torch alone); an overlay costs one package:

- a *layer* per (distribution, version, interpreter, source): ``uv pip install --target
  <cache>/layers/... --no-deps`` (``pip install --target`` where uv is absent: the ``bisect`` extra
  brings uv), built once and kept until ``--clean``; from the source the releases were listed from
  (``releases.Source``);
- an *environment* per set of pins, interpreter, base environment and source: a venv (``uv venv``,
  no packages of its own) whose site-packages holds one ``.pth`` line calling ``site.addsitedir`` on
  each layer, then on the project environment's site-packages, every path absolute: the layers come
  first on ``sys.path`` (their packages and their metadata shadow the base ones), and the base's own
  ``.pth`` files (editable installs) are read as usual.

An environment is checked from a folder other than the one the bisect runs in (its own), when it is
built and again the first time this process reuses one (a cache another process or an older version
filled): ``importlib.metadata`` in it must report the pinned versions, else it is built again.
Layers and environments are built under a lock file (``fcntl``), so two bisects sharing a cache
never build or read a half-built one. ``conflicts`` says which requirements between the
distributions a set of pins breaks (a pin between two packages that must move together).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import sys_tags
from packaging.utils import canonicalize_name

from ..engine import children
from .releases import Source

COMPLETE = ".complete"
PTH = "_model_support_overlay.pth"
#: What to install where the pip fallback is used (said once per bisect).
UV_HINT = "uv is not installed: pip install 'model-support[bisect]' builds them faster"


class InstallError(Exception):
    """A distribution that cannot be installed here, or an environment that cannot be built: the
    reason."""


def uv_binary() -> str | None:
    """uv's executable: the ``uv`` package's (the ``bisect`` extra), else one on PATH; None: use
    pip."""
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")


def base_site_dirs() -> list[str]:
    """The project environment's site-packages folders (the ones this interpreter reads),
    absolute."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        dirs.append(site.getusersitepackages())
    return [os.path.abspath(d) for d in dirs]


@functools.cache
def interpreter_tag() -> str:
    """The most specific wheel tag this interpreter installs
    (``cp311-cp311-manylinux_2_39_x86_64``): a layer's files depend on it."""
    return str(next(iter(sys_tags())))


_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_GUARD = threading.Lock()


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold ``path`` (a lock file, created) against the other threads of this process and other
    processes (an ``flock``, dropped by the kernel when its holder dies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _THREAD_GUARD:
        local = _THREAD_LOCKS.setdefault(str(path), threading.Lock())
    with local, open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _reason(out: subprocess.CompletedProcess) -> str:
    lines = [line.strip() for line in (out.stderr or out.stdout or "").splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(("Using ", "Resolved ", "warning:"))]
    return " ".join((useful or lines or [f"exit status {out.returncode}"])[-3:])[:500]


def _tool_version(uv: str | None) -> str:
    """What builds the layers, with its version: uv's package's (else what the binary says), or
    pip's."""
    name = "uv" if uv else "pip"
    try:
        return f"{name} {metadata.version(name)}"
    except metadata.PackageNotFoundError:
        pass
    if uv:
        try:
            said = subprocess.run(
                [uv, "--version"], capture_output=True, text=True, timeout=30
            ).stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            said = []
        return " ".join(said[:2]) or "uv"
    return "pip"


_VERIFY = (
    "import json, sys\n"
    "from importlib import metadata as m\n"
    "def v(n):\n"
    "    try:\n"
    "        return m.version(n)\n"
    "    except m.PackageNotFoundError:\n"
    "        return None\n"
    "print(json.dumps({n: v(n) for n in sys.argv[1:]}))\n"
)


class Overlays:
    """Builds and caches layers and environments under ``cache_dir`` (made absolute: an
    environment's ``.pth`` never depends on the folder a bisect is run from); thread- and
    process-safe."""

    def __init__(self, cache_dir: Path | str, source: Source | Path | str | None = None):
        self.cache = Path(cache_dir).resolve()
        self._source = Source.wheelhouse(source) if isinstance(source, (str, Path)) else source
        self.uv = uv_binary()
        self._verified: set[str] = set()
        self.built = 0  # layers and environments built (not found in the cache) by this object

    @property
    def source(self) -> Source:
        """Where layers come from: the wheelhouse given, else pip's configured index (read when
        first asked)."""
        if self._source is None:
            self._source = Source.configured()
        return self._source

    @property
    def tool(self) -> str:
        """What builds the layers, in words ("uv 0.13.8"; pip, with why and what to install for
        uv)."""
        return _tool_version(self.uv) if self.uv else f"{_tool_version(None)} ({UV_HINT})"

    def layer(self, name: str, version: str) -> Path:
        """The folder holding ``name==version`` alone (its dependencies are the environment's),
        for this interpreter from this source."""
        key = hashlib.sha256(f"{interpreter_tag()} {self.source.key()}".encode()).hexdigest()[:12]
        folder = self.cache / "layers" / f"{canonicalize_name(name)}-{version}-{key}"
        with locked(self.cache / "locks" / f"{folder.name}.lock"):
            if (folder / COMPLETE).exists():
                return folder
            building = folder.with_name(folder.name + ".building")
            shutil.rmtree(building, ignore_errors=True)
            spec = f"{name}=={version}"
            if self.uv:
                command = [
                    self.uv,
                    "pip",
                    "install",
                    "--quiet",
                    "--target",
                    str(building),
                    "--no-deps",
                ]
                command += ["--python", sys.executable, "--cache-dir", str(self.cache / "uv")]
                # any index may hold the version, as for pip
                command += ["--index-strategy", "unsafe-best-match"]
            else:
                command = [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ]
                command += ["--target", str(building), "--no-deps"]
            out = subprocess.run(
                [*command, *self.source.flags(), spec], capture_output=True, text=True
            )
            if out.returncode != 0:
                shutil.rmtree(building, ignore_errors=True)
                raise InstallError(f"{spec} could not be installed: {_reason(out)}")
            shutil.rmtree(folder, ignore_errors=True)
            building.rename(folder)
            (folder / COMPLETE).touch()
            self.built += 1
            return folder

    def env_key(self, pins: dict[str, str]) -> str:
        """16 hex digits naming an environment: its pins, the interpreter, the base environment
        and the source."""
        ident = [
            sorted(pins.items()),
            os.path.realpath(sys.executable),
            base_site_dirs(),
            self.source.key(),
        ]
        return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:16]

    def python(self, pins: dict[str, str]) -> Path:
        """The interpreter of the project's environment with ``pins`` ({name: version}) on top;
        an environment found in the cache is checked once before this object uses it (built again
        if wrong)."""
        layers = [self.layer(name, version) for name, version in sorted(pins.items())]
        key = self.env_key(pins)
        venv = self.cache / "envs" / key
        python = venv / "bin" / "python"
        with locked(self.cache / "locks" / f"env-{key}.lock"):
            if (venv / COMPLETE).exists():
                if key in self._verified:
                    return python
                try:
                    self._verify(venv, pins)
                    self._verified.add(key)
                    return python
                except InstallError:
                    # built by another version of this code, or its layers moved: built again below
                    pass
            self._build(venv, layers, pins)
            self._verified.add(key)
            return python

    def _build(self, venv: Path, layers: list[Path], pins: dict[str, str]) -> None:
        """A fresh venv at ``venv`` whose ``.pth`` puts ``layers`` (absolute), then the base, on
        ``sys.path``."""
        shutil.rmtree(venv, ignore_errors=True)
        if self.uv:
            command = [self.uv, "venv", "--quiet", "--python", sys.executable, str(venv)]
        else:
            command = [sys.executable, "-m", "venv", "--without-pip", str(venv)]
        out = subprocess.run(command, capture_output=True, text=True)
        if out.returncode != 0:
            raise InstallError(f"the overlay environment could not be created: {_reason(out)}")
        purelib = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
        dirs = [*(str(layer.resolve()) for layer in layers), *base_site_dirs()]
        Path(purelib, PTH).write_text(f"import site; list(map(site.addsitedir, {dirs!r}))\n")
        self._verify(venv, pins)
        (venv / COMPLETE).touch()
        self.built += 1

    @staticmethod
    def _verify(venv: Path, pins: dict[str, str]) -> None:
        """``importlib.metadata`` in the environment reports exactly the pinned versions, asked
        from the environment's own folder (not the bisect's): a path the environment holds that
        only resolves from where it was built shows here."""
        python = venv / "bin" / "python"
        command = [str(python), "-c", _VERIFY, *pins]
        try:  # the package's protocol for a short-lived child: its last line of stdout, as JSON
            seen = children.last_json(command, "the overlay environment", 120, cwd=str(venv))
        except OSError as exc:
            raise InstallError(f"the overlay environment could not be started: {exc}") from None
        except children.ChildFailed as exc:
            raise InstallError(
                f"the overlay environment could not report its packages: {exc}"
            ) from None
        seen = seen if isinstance(seen, dict) else {}
        wrong = {n: seen.get(n) for n, v in pins.items() if seen.get(n) != v}
        if wrong:
            raise InstallError(f"the overlay environment shows {wrong} instead of the pins {pins}")

    def clean(self) -> None:
        """Remove every layer and environment (and uv's cache of them)."""
        shutil.rmtree(self.cache, ignore_errors=True)


@dataclass(frozen=True)
class Conflict:
    """``requirer`` at ``requirer_version`` asks for ``requirement``; the environment has
    ``name`` at ``version``."""

    requirer: str
    requirer_version: str
    requirement: str
    name: str
    version: str | None

    def __str__(self) -> str:
        have = f"{self.name} {self.version}" if self.version else f"no {self.name}"
        return (
            f"{self.requirer} {self.requirer_version} requires {self.requirement}, and this "
            f"environment has {have}"
        )


def _requirements(dist: metadata.Distribution) -> list[Requirement]:
    out = []
    for text in dist.requires or []:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            out.append(requirement)
    return out


def conflicts(
    base: dict[str, str], pins: dict[str, str], layers: dict[str, Path]
) -> list[Conflict]:
    """The requirements a set of ``pins`` breaks, in an environment whose other distributions are
    ``base`` ({name: version}): what each pinned distribution requires (read from its layer), and
    what the environment's other distributions require of a pinned one."""
    stack = {**base, **pins}
    found = []
    for name, version in pins.items():
        for dist in metadata.distributions(path=[str(layers[name])]):
            for req in _requirements(dist):
                have = stack.get(canonicalize_name(req.name))
                if have is None or not req.specifier.contains(have, prereleases=True):
                    found.append(
                        Conflict(name, version, str(req), canonicalize_name(req.name), have)
                    )
    pinned = set(pins)
    for dist in metadata.distributions():
        requirer = canonicalize_name(dist.metadata["Name"] or "")
        if requirer in pinned or stack.get(requirer) != dist.version:
            continue
        for req in _requirements(dist):
            name = canonicalize_name(req.name)
            if name in pinned and not req.specifier.contains(pins[name], prereleases=True):
                found.append(Conflict(requirer, dist.version, str(req), name, pins[name]))
    return found
