"""A package's releases between two versions, from the source the overlays install from
(``Source``): a wheelhouse (``--find-links DIR``: nightlies, a vendor's builds; nothing asked of an
index), or the index pip is configured with (``PIP_INDEX_URL``, ``pip config``: ``index-url``,
``extra-index-url``, ``find-links``, ``no-index``), read through the simple API (PEP 691's JSON,
else PEP 503's HTML), so a stack from a vendor's index or a mirror is listed where it is installed
from. Pre-releases and yanked releases are left out unless asked; a release with no file this Python
can install (only wheels for other interpreters or platforms, no sdist; a ``Requires-Python`` this
interpreter is not) is kept, with that reason, so the answer can say which range it could not split.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import sys_tags
from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

PYPI_SIMPLE = "https://pypi.org/simple"
#: PEP 691's JSON first; an index that only speaks PEP 503 answers HTML.
ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"


@dataclass(frozen=True)
class Source:
    """Where releases are listed and layers installed from: the same for both, so a release the
    bisect lists is one it can install."""

    index_urls: tuple[str, ...] = (PYPI_SIMPLE,)
    find_links: tuple[str, ...] = ()
    no_index: bool = False

    @classmethod
    def wheelhouse(cls, folder: Path | str) -> Source:
        """``--find-links DIR``: that folder alone (``--no-index``), by its absolute path."""
        return cls((), (str(Path(folder).resolve()),), True)

    @classmethod
    def configured(cls) -> Source:
        """The source pip is configured with here (its environment variables and config files),
        PyPI's simple API where nothing is set."""
        config = pip_config()
        index = config.get("index-url", "").strip() or PYPI_SIMPLE
        extra = config.get("extra-index-url", "").split()
        links = [
            str(Path(x).resolve()) if "://" not in x else x
            for x in config.get("find-links", "").split()
        ]
        no_index = config.get("no-index", "").strip().lower() in ("1", "true", "yes", "on")
        return cls(() if no_index else (index, *extra), tuple(links), no_index)

    def flags(self) -> list[str]:
        """The same source as pip's and uv's command-line flags (explicit, so uv, which reads no pip
        configuration, installs from where the releases were listed)."""
        out = ["--no-index"] if self.no_index else []
        if self.index_urls:
            out += ["--index-url", self.index_urls[0]]
            for url in self.index_urls[1:]:
                out += ["--extra-index-url", url]
        for link in self.find_links:
            out += ["--find-links", link]
        return out

    def key(self) -> str:
        """16 hex digits naming this source: layers from two sources never share a folder."""
        return hashlib.sha256(
            json.dumps([self.index_urls, self.find_links, self.no_index]).encode()
        ).hexdigest()[:16]

    def __str__(self) -> str:
        said = [f"the index {url}" for url in self.index_urls] + [
            f"--find-links {x}" for x in self.find_links
        ]
        return ", ".join(said) or "nowhere (--no-index and no --find-links)"


def pip_config() -> dict[str, str]:
    """pip's settings that name a source ({"index-url": ..., ...}), as ``pip install`` reads
    them: an environment variable over the ``install`` section over ``global``. Read with ``pip
    config list`` (pip's own reading of its files); the environment variables alone where pip
    cannot say."""
    names = ("index-url", "extra-index-url", "find-links", "no-index")
    found: dict[str, dict[str, str]] = {}
    command = [sys.executable, "-m", "pip", "config", "list"]
    try:
        listed = subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        listed = ""
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if name in names and section in (":env:", "install", "global"):
            found.setdefault(name, {})[section] = value.strip().strip("'\"")
    out = {}
    for name in names:
        env = os.environ.get("PIP_" + name.upper().replace("-", "_"))
        chosen = (
            env
            if env is not None
            else next(
                (
                    found.get(name, {})[s]
                    for s in (":env:", "install", "global")
                    if s in found.get(name, {})
                ),
                None,
            )
        )
        if chosen is not None:
            out[name] = chosen
    return out


@dataclass
class Release:
    version: str
    files: list[str] = field(default_factory=list)
    #: Why it cannot be installed here (None: it can).
    skip: str | None = None
    yanked: bool = False


@dataclass(frozen=True)
class IndexFile:
    """One file a source lists: its name, whether it is yanked, its ``Requires-Python``."""

    filename: str
    yanked: bool = False
    requires_python: str | None = None


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
            return None  # an sdist: the installer builds it
    tag = next(iter(sys_tags()))
    return f"no wheel for this Python ({tag}): only {', '.join(sorted(wheels)) or 'no files'}"


def _python_allows(requires: str | None) -> bool:
    """Whether this interpreter meets a file's ``Requires-Python`` (an unreadable one is not held
    against it)."""
    if not requires:
        return True
    try:
        return SpecifierSet(requires).contains(platform.python_version(), prereleases=True)
    except InvalidSpecifier:
        return True


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


def _releases(name: str, files: list[IndexFile]) -> list[Release]:
    """``files`` of every package grouped into ``name``'s releases, oldest first; a release is
    yanked when all its files are, and skipped (with the reason) when none installs on this
    interpreter."""
    wanted = canonicalize_name(name)
    found: dict[Version, list[IndexFile]] = {}
    for entry in files:
        parsed = _version_of(entry.filename)
        if parsed and parsed[0] == wanted:
            found.setdefault(parsed[1], []).append(entry)
    out = []
    for version, entries in sorted(found.items()):
        names = sorted({e.filename for e in entries})
        usable = [e.filename for e in entries if _python_allows(e.requires_python)]
        if usable:
            skip = _installable(usable)
        else:
            needs = sorted({e.requires_python or "" for e in entries})
            skip = f"requires Python {' or '.join(needs)}; this is {platform.python_version()}"
        out.append(Release(str(version), names, skip, yanked=all(e.yanked for e in entries)))
    return out


def wheelhouse_releases(name: str, folder: Path) -> list[Release]:
    """The releases of ``name`` whose files lie in ``folder``, oldest first."""
    return _releases(name, [IndexFile(path.name) for path in sorted(Path(folder).iterdir())])


class _Anchors(HTMLParser):
    """The links of a PEP 503 page: (file name, yanked, Requires-Python)."""

    def __init__(self) -> None:
        super().__init__()
        self.files: list[IndexFile] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag != "a":
            return
        given = dict(attrs)
        href = given.get("href") or ""
        filename = urllib.parse.unquote(urllib.parse.urlsplit(href).path.rsplit("/", 1)[-1])
        if filename:
            self.files.append(
                IndexFile(
                    filename, "data-yanked" in given, given.get("data-requires-python") or None
                )
            )


def _read(url: str) -> tuple[bytes, str]:
    """(body, content type) of a simple-API page; a ``file:`` folder reads as its index.html, as
    pip does."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "file":
        path = Path(urllib.request.url2pathname(parts.path))
        path = path / "index.html" if path.is_dir() else path
        return path.read_bytes(), "text/html"
    request = urllib.request.Request(url, headers={"Accept": ACCEPT})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.read(), answer.headers.get("Content-Type", "")


def page_files(body: bytes, content_type: str) -> list[IndexFile]:
    """The files of one project page of the simple API: PEP 691's JSON or PEP 503's HTML."""
    if "json" in content_type:
        raw = json.loads(body)
        return [
            IndexFile(f["filename"], bool(f.get("yanked")), f.get("requires-python") or None)
            for f in raw.get("files", [])
        ]
    parser = _Anchors()
    parser.feed(body.decode("utf-8", "replace"))
    return parser.files


def index_files(name: str, index_url: str) -> list[IndexFile]:
    """The files of ``name`` on one simple-API index (none when the index does not have the
    project)."""
    url = f"{index_url.rstrip('/')}/{canonicalize_name(name)}/"
    try:
        return page_files(*_read(url))
    except FileNotFoundError:
        return []
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return []
        raise


def link_files(location: str) -> list[IndexFile]:
    """The files a ``--find-links`` entry offers: a folder's files, or the links of an HTML page."""
    if "://" not in location or location.startswith("file:"):
        folder = (
            Path(urllib.request.url2pathname(urllib.parse.urlsplit(location).path))
            if "://" in location
            else Path(location)
        )
        if folder.is_dir():
            return [IndexFile(path.name) for path in sorted(folder.iterdir())]
        return [IndexFile(folder.name)] if folder.is_file() else []
    return page_files(*_read(location))


def releases_of(name: str, source: Source) -> list[Release]:
    """``name``'s releases from every index and find-links entry of ``source``, oldest first."""
    files = [f for link in source.find_links for f in link_files(link)]
    if not source.no_index:
        files += [f for url in source.index_urls for f in index_files(name, url)]
    return _releases(name, files)


def between(
    releases: list[Release], start: str, end: str, *, pre: bool = False, yanked: bool = False
) -> list[Release]:
    """The releases strictly between ``start`` and ``end``, in the order from ``start`` to
    ``end`` (either may be the newer); pre-releases (unless ``pre``, or an end is one) and yanked
    ones (unless ``yanked``) left out."""
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
