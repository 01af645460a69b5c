"""Overlay environments: the project's environment with a few distributions at other versions.

A bisect step is "the same repro script in an environment that differs in one package". Copying the
whole environment per step would cost gigabytes (torch alone); an overlay costs one package:

- a *layer* per (distribution, version): ``uv pip install --target <cache>/layers/<name>-<version>
  --no-deps`` (pip where uv is absent), built once and kept until ``--clean``;
- an *environment* per set of pins: a venv (``uv venv``, no packages of its own) whose site-packages
  holds one ``.pth`` line calling ``site.addsitedir`` on each layer, then on the project environment's
  site-packages: the layers come first on ``sys.path`` (their packages and their metadata shadow the base
  ones), and the base's own ``.pth`` files (editable installs) are read as usual.

Each environment is checked once after it is built: ``importlib.metadata`` in it must report the pinned
versions. ``conflicts`` says which requirements between the distributions a set of pins breaks (a pin
between two packages that must move together).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import threading
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

COMPLETE = ".complete"
PTH = "_model_support_overlay.pth"


class InstallError(Exception):
    """A distribution that cannot be installed here, or an environment that cannot be built: the reason."""


def uv_binary() -> str | None:
    """uv's executable: the ``uv`` package's (a dependency), else one on PATH; None: use pip."""
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")


def base_site_dirs() -> list[str]:
    """The project environment's site-packages folders (the ones this interpreter reads)."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        dirs.append(site.getusersitepackages())
    return dirs


def _reason(out: subprocess.CompletedProcess) -> str:
    lines = [line.strip() for line in (out.stderr or out.stdout or "").splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(("Using ", "Resolved ", "warning:"))]
    return " ".join((useful or lines or [f"exit status {out.returncode}"])[-3:])[:500]


class Overlays:
    """Builds and caches layers and environments under ``cache_dir``; thread-safe (models run in parallel)."""

    def __init__(self, cache_dir: Path | str, find_links: Path | str | None = None):
        self.cache = Path(cache_dir)
        self.find_links = Path(find_links).resolve() if find_links else None
        self.uv = uv_binary()
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self.built = 0  # layers and environments built (not found in the cache) by this object

    def _lock(self, key: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def _source_flags(self) -> list[str]:
        return ["--no-index", "--find-links", str(self.find_links)] if self.find_links else []

    def layer(self, name: str, version: str) -> Path:
        """The folder holding ``name==version`` alone (its dependencies are the environment's)."""
        folder = self.cache / "layers" / f"{canonicalize_name(name)}-{version}"
        with self._lock(str(folder)):
            if (folder / COMPLETE).exists():
                return folder
            building = folder.with_name(folder.name + ".building")
            shutil.rmtree(building, ignore_errors=True)
            spec = f"{name}=={version}"
            if self.uv:
                command = [self.uv, "pip", "install", "--quiet", "--target", str(building), "--no-deps"]
                command += ["--python", sys.executable, "--cache-dir", str(self.cache / "uv")]
            else:
                command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
                command += ["--target", str(building), "--no-deps"]
            out = subprocess.run([*command, *self._source_flags(), spec], capture_output=True, text=True)
            if out.returncode != 0:
                shutil.rmtree(building, ignore_errors=True)
                raise InstallError(f"{spec} could not be installed: {_reason(out)}")
            shutil.rmtree(folder, ignore_errors=True)
            building.rename(folder)
            (folder / COMPLETE).touch()
            self.built += 1
            return folder

    def python(self, pins: dict[str, str]) -> Path:
        """The interpreter of the project's environment with ``pins`` ({name: version}) on top."""
        layers = [self.layer(name, version) for name, version in sorted(pins.items())]
        key = hashlib.sha256(json.dumps(sorted(pins.items())).encode()).hexdigest()[:16]
        venv = self.cache / "envs" / key
        python = venv / "bin" / "python"
        with self._lock(str(venv)):
            if (venv / COMPLETE).exists():
                return python
            shutil.rmtree(venv, ignore_errors=True)
            if self.uv:
                command = [self.uv, "venv", "--quiet", "--python", sys.executable, str(venv)]
                out = subprocess.run(command, capture_output=True, text=True)
            else:
                command = [sys.executable, "-m", "venv", "--without-pip", str(venv)]
                out = subprocess.run(command, capture_output=True, text=True)
            if out.returncode != 0:
                raise InstallError(f"the overlay environment could not be created: {_reason(out)}")
            purelib = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
            dirs = [*map(str, layers), *base_site_dirs()]
            Path(purelib, PTH).write_text(f"import site; list(map(site.addsitedir, {dirs!r}))\n")
            self._verify(python, pins)
            (venv / COMPLETE).touch()
            self.built += 1
            return python

    @staticmethod
    def _verify(python: Path, pins: dict[str, str]) -> None:
        """``importlib.metadata`` in the new environment reports exactly the pinned versions."""
        code = "import json, sys; from importlib import metadata as m; print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
        out = subprocess.run([str(python), "-c", code, *pins], capture_output=True, text=True)
        seen = json.loads(out.stdout) if out.returncode == 0 else {}
        wrong = {n: seen.get(n) for n, v in pins.items() if seen.get(n) != v}
        if wrong:
            raise InstallError(f"the overlay environment shows {wrong} instead of the pins {pins}: {_reason(out)}")

    def clean(self) -> None:
        """Remove every layer and environment (and uv's cache of them)."""
        shutil.rmtree(self.cache, ignore_errors=True)


@dataclass(frozen=True)
class Conflict:
    """``requirer`` at ``requirer_version`` asks for ``requirement``; the environment has ``name`` at ``version``."""

    requirer: str
    requirer_version: str
    requirement: str
    name: str
    version: str | None

    def __str__(self) -> str:
        have = f"{self.name} {self.version}" if self.version else f"no {self.name}"
        return f"{self.requirer} {self.requirer_version} requires {self.requirement}, and this environment has {have}"


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


def conflicts(base: dict[str, str], pins: dict[str, str], layers: dict[str, Path]) -> list[Conflict]:
    """The requirements a set of ``pins`` breaks, in an environment whose other distributions are ``base``
    ({name: version}): what each pinned distribution requires (read from its layer), and what the
    environment's other distributions require of a pinned one."""
    stack = {**base, **pins}
    found = []
    for name, version in pins.items():
        for dist in metadata.distributions(path=[str(layers[name])]):
            for req in _requirements(dist):
                have = stack.get(canonicalize_name(req.name))
                if have is None or not req.specifier.contains(have, prereleases=True):
                    found.append(Conflict(name, version, str(req), canonicalize_name(req.name), have))
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
