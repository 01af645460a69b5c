"""A package's releases between two versions: from a wheelhouse (``--find-links DIR``: nightlies, a
vendor's builds) or the package index (PyPI's JSON API). Pre-releases and yanked releases are left out
unless asked; a release with no file this Python can install (only wheels for other interpreters or
platforms, no sdist) is kept, with that reason, so the answer can say which range it could not split.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from packaging.tags import sys_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

PYPI_JSON = "https://pypi.org/pypi/{name}/json"


@dataclass
class Release:
    version: str
    files: list[str] = field(default_factory=list)
    #: Why it cannot be installed here (None: it can).
    skip: str | None = None
    yanked: bool = False


def _installable(files: list[str]) -> str | None:
    """None when one of ``files`` installs on this interpreter, else the reason."""
    here = set(sys_tags())
    wheels = []
    for name in files:
        if name.endswith(".whl"):
            try:
                tags = parse_wheel_filename(name)[3]
            except InvalidWheelFilename:
                continue
            if tags & here:
                return None
            wheels.append(name)
        elif name.endswith((".tar.gz", ".zip")):
            return None  # an sdist: uv builds it
    tag = next(iter(sys_tags()))
    return f"no wheel for this Python ({tag}): only {', '.join(sorted(wheels)) or 'no files'}"


def _version_of(name: str) -> tuple[str, Version] | None:
    try:
        if name.endswith(".whl"):
            dist, version, *_ = parse_wheel_filename(name)
        elif name.endswith((".tar.gz", ".zip")):
            dist, version = parse_sdist_filename(name)
        else:
            return None
    except (InvalidWheelFilename, InvalidVersion, ValueError):
        return None
    return canonicalize_name(dist), version


def wheelhouse_releases(name: str, folder: Path) -> list[Release]:
    """The releases of ``name`` whose files lie in ``folder``, oldest first."""
    wanted = canonicalize_name(name)
    found: dict[Version, list[str]] = {}
    for path in sorted(Path(folder).iterdir()):
        parsed = _version_of(path.name)
        if parsed and parsed[0] == wanted:
            found.setdefault(parsed[1], []).append(path.name)
    return [Release(str(v), files, _installable(files)) for v, files in sorted(found.items())]


def index_releases(name: str, url: str = PYPI_JSON) -> list[Release]:
    """The releases of ``name`` on the package index, oldest first (a release with no files left out)."""
    with urllib.request.urlopen(url.format(name=canonicalize_name(name)), timeout=30) as answer:
        raw = json.load(answer)
    out = []
    for version, files in raw.get("releases", {}).items():
        if not files:
            continue
        try:
            Version(version)
        except InvalidVersion:
            continue
        names = [f["filename"] for f in files]
        out.append(Release(version, names, _installable(names), yanked=all(f.get("yanked") for f in files)))
    return sorted(out, key=lambda r: Version(r.version))


def between(releases: list[Release], start: str, end: str, *, pre: bool = False, yanked: bool = False) -> list[Release]:
    """The releases strictly between ``start`` and ``end``, in the order from ``start`` to ``end`` (either
    may be the newer); pre-releases (unless ``pre``, or an end is one) and yanked ones (unless ``yanked``)
    left out."""
    lo, hi = sorted((Version(start), Version(end)))
    keep_pre = pre or lo.is_prerelease or hi.is_prerelease
    inside = [
        r
        for r in releases
        if lo < Version(r.version) < hi
        and (keep_pre or not Version(r.version).is_prerelease)
        and (yanked or not r.yanked)
    ]
    inside.sort(key=lambda r: Version(r.version), reverse=Version(start) > Version(end))
    return inside


def releases_of(name: str, find_links: Path | None = None) -> list[Release]:
    """The wheelhouse's releases when ``find_links`` is given, else the index's."""
    return wheelhouse_releases(name, find_links) if find_links else index_releases(name)
