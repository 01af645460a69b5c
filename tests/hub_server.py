"""A local, offline Hugging Face Hub: local folders served as model repos, dataset repos and buckets
that the real client can push to, with fault injection on demand.

It speaks the HTTP protocol of the Hub as the installed huggingface_hub 2.4.0 client uses it, so
`hf_hub_download`, `snapshot_download`, `HfApi.model_info/dataset_info/repo_info/list_repo_tree/
get_paths_info/list_models/whoami`, `create_repo`, `create_commit` / `upload_folder` (through Xet or
LFS), the bucket API (`create_bucket`, `batch_bucket_files`, `list_bucket_tree`,
`download_bucket_files`), `HfFileSystem` and `datasets.load_dataset` run unmodified against it (pass
`endpoint=server.url`, or set HF_ENDPOINT before huggingface_hub is imported, e.g. in a subprocess).
Written because olah 0.5.4 (a Hub mirror) was checked and does not serve local repos offline.
Standard library only, plus hf_xet for the uploads that go through Xet (see `hub_writes`, which
holds the write side).

Read endpoints: GET /api/{models,datasets}/{repo}[/revision/{rev}] (repo info; `blobs=true` adds
size/blobId/lfs to siblings; `expand=` keeps only the named fields); GET
/api/{type}s/{repo}/tree/{rev}[/{path}] (`recursive`, `expand`, cursor pages in a Link header); POST
/api/{type}s/{repo}/paths-info/{rev}; HEAD|GET /[datasets/]{repo}/resolve/{rev}/{file} (also /blob/,
the Hub's page of a file, served here as the file itself; quoted ETag = git blob sha1, or sha256 for
LFS files; X-Repo-Commit; X-Linked-Etag/X-Linked-Size for LFS; Content-Length; Accept-Ranges;
`Range: bytes=a-b` -> 206 + Content-Range, 416 if unsatisfiable); GET /api/models (filter,
pipeline_tag, author, search, gated, sort descending, limit, expand, full, cardData; Link pages);
GET /api/whoami-v2; POST|DELETE|GET /_control/faults and GET /_control/requests (fault control from
another process). Write endpoints: see `hub_writes`. Errors carry the Hub's
X-Error-Code/X-Error-Message headers and {"error": ...} body: unknown repo, or private one without
an accepted token -> 401 RepoNotFound (404 with a token); other revision than "main" or the commit
sha -> 404 RevisionNotFound; unknown file -> 404 EntryNotFound; file of a gated repo without an
accepted token -> 401 GatedRepo (model info and tree stay public, as on the Hub). A token in neither
`server.tokens` (read) nor `server.write_tokens` counts as anonymous (the real Hub answers 401 to
any bad token). LFS files are served in place (the Hub redirects them to its CDN; the client reads
the same headers either way), and files uploaded through Xet are served as plain bytes: no Xet
headers are sent for repo files, so the client downloads over plain HTTP. Every request is logged in
`server.requests` (writes with their body).

CLI: python tests/hub_server.py --port 0 --repo org/name=/path [--gated org/name] [--token T]
     [--write-token T] [--throttle BYTES_PER_S]   prints the URL on its first line, serves until
     killed.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import hashlib
import json
import math
import re
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hub_writes import Storage, WriteRoutes, git_sha1  # noqa: E402

LFS_EXTENSIONS = (".safetensors", ".bin", ".gguf", ".onnx", ".pt", ".h5", ".msgpack", ".parquet")
LFS_MIN_SIZE = 10 * 1024
DATE = "2024-01-01T00:00:00.000Z"
_REPO = r"(?P<repo>[^/]+(?:/[^/]+)?)"
_TYPE = r"(?P<type>models|datasets)"
_BUCKET = r"(?P<repo>[^/]+/[^/]+)"
_REV = r"(?P<rev>[^/]+)"
#: (route, methods, path): the first route whose path matches and that takes the method answers.
ROUTES = [
    ("info", "GET", rf"^/api/{_TYPE}/{_REPO}(?:/revision/{_REV})?$"),
    ("tree", "GET", rf"^/api/{_TYPE}/{_REPO}/tree/{_REV}(?:/(?P<path>.+))?$"),
    ("paths_info", "POST", rf"^/api/{_TYPE}/{_REPO}/paths-info/{_REV}$"),
    ("preupload", "POST", rf"^/api/{_TYPE}/{_REPO}/preupload/{_REV}$"),
    ("commit", "POST", rf"^/api/{_TYPE}/{_REPO}/commit/{_REV}$"),
    ("xet_token", "GET", rf"^/api/{_TYPE}/{_REPO}/xet-(?P<kind>read|write)-token/{_REV}$"),
    ("xet_token", "GET", rf"^/api/(?P<type>buckets)/{_BUCKET}/xet-(?P<kind>read|write)-token$"),
    ("create_repo", "POST", r"^/api/repos/create$"),
    ("validate_yaml", "POST", r"^/api/validate-yaml$"),
    ("bucket_batch", "POST", rf"^/api/buckets/{_BUCKET}/batch$"),
    ("bucket_tree", "GET", rf"^/api/buckets/{_BUCKET}/tree(?:/(?P<path>.+))?$"),
    ("bucket_paths_info", "POST", rf"^/api/buckets/{_BUCKET}/paths-info$"),
    ("create_bucket", "POST", rf"^/api/buckets/{_BUCKET}$"),
    ("bucket_info", "GET", rf"^/api/buckets/{_BUCKET}$"),
    ("bucket_resolve", "GET HEAD", rf"^/buckets/{_BUCKET}/resolve/(?P<path>.+)$"),
    ("lfs_batch", "POST", rf"^/(?:(?P<type>datasets)/)?{_REPO}\.git/info/lfs/objects/batch$"),
    ("lfs_put", "PUT", r"^/_lfs/(?P<oid>[0-9a-f]{64})$"),
    (
        "resolve",
        "GET HEAD",
        rf"^/(?:(?P<type>datasets)/)?{_REPO}/(?:resolve|blob)/{_REV}/(?P<path>.+)$",
    ),
]


def closed_port() -> int:
    """A free TCP port on 127.0.0.1 that nothing listens on (connecting to it is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _card(readme: Path) -> dict:
    """A model card's YAML front matter: `key: value` lines and `- item` lists (enough for
    cardData)."""
    text, data, key = readme.read_text(errors="replace") if readme.is_file() else "", {}, None
    for line in text.split("\n---", 1)[0].splitlines()[1:] if text.startswith("---") else []:
        if line.lstrip().startswith("- ") and key:
            data[key] = [
                *(data[key] if isinstance(data[key], list) else []),
                line.strip()[2:].strip("'\""),
            ]
        elif ":" in line and not line.startswith((" ", "#")):
            key, _, value = (part.strip() for part in line.partition(":"))
            data[key] = value.strip("'\"") or None
    return data


def _safetensors(paths: list[Path]) -> dict | None:
    """Parameter counts per dtype from safetensors headers, as the Hub's `safetensors` field
    gives them."""
    counts: dict[str, int] = {}
    for path in paths:
        with (
            contextlib.suppress(OSError, ValueError, KeyError, TypeError, struct.error),
            open(path, "rb") as f,
        ):
            # header size; random bytes give nonsense: skip those
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n)) if n <= min(path.stat().st_size, 1 << 27) else {}
            for t in (t for name, t in header.items() if name != "__metadata__"):
                counts[t["dtype"]] = counts.get(t["dtype"], 0) + math.prod(t["shape"])
    return {"parameters": counts, "total": sum(counts.values())} if counts else None


class Faults:
    """Fault rules the server applies per request; thread-safe. A rule targets a repo id (None =
    all), a glob on the file path in the repo (None = every request, API ones included) and a
    method (None = all)."""

    def __init__(self, server: HubServer | None = None):
        self._server, self._lock, self.rules = server, threading.Lock(), []

    def _add(self, kind: str, **rule) -> dict:
        rule = {
            "kind": kind,
            "repo": None,
            "path": None,
            "method": None,
            "route": None,
            "times": None,
            **rule,
        }
        with self._lock:
            self.rules.append(rule)
        return rule

    def fail(
        self,
        status: int,
        times: int = 1,
        repo=None,
        path=None,
        retry_after: float | None = None,
        method=None,
        route=None,
    ):
        """The next `times` matching requests answer `status` (with Retry-After when given);
        `route` names one of ROUTES (e.g. "commit", "preupload") for requests that carry no file
        path."""
        return self._add("fail", **{k: v for k, v in locals().items() if k != "self"})

    def throttle(self, bytes_per_s: int, repo=None, path=None):
        """File bodies are sent in small chunks paced to `bytes_per_s`."""
        return self._add("throttle", **{k: v for k, v in locals().items() if k != "self"})

    def cut(self, after_bytes: int, times: int | None = None, repo=None, path=None):
        """File bodies announce their full Content-Length, but the connection closes after
        `after_bytes`."""
        return self._add("cut", **{k: v for k, v in locals().items() if k != "self"})

    def gate(self, repo_id: str):
        """Gate a repo (as add_repo(gated=True), but clear() lifts it)."""
        return self._add("gate", repo=repo_id)

    def refuse_connections(self, on: bool = True) -> None:
        """While on, the server stops listening (its port stays bound): connections are refused."""
        self._server._set_refusing(on)

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def add_rules(self, rules: list[dict]) -> None:
        """Rules as dicts, e.g. {"kind": "fail", "status": 503, "times": 2, "path": "*.json"}
        (kinds: fail, throttle, cut, gate; other keys as the methods' parameters)."""
        for rule in rules:
            self._add(**rule)

    def snapshot(self) -> list[dict]:
        with self._lock:
            return [dict(r) for r in self.rules]

    def take(
        self, kind: str, method: str, repo: str | None, path: str | None, route: str | None = None
    ) -> dict | None:
        """The first live rule of `kind` matching the request, one of its `times` used up."""
        with self._lock:
            for r in self.rules:
                if (
                    r["kind"] == kind
                    and r["times"] != 0
                    and r["repo"] in (None, repo)
                    and r["method"] in (None, method)
                    and r.get("route") in (None, route)
                    and (
                        r["path"] is None or (path is not None and fnmatch.fnmatch(path, r["path"]))
                    )
                ):
                    r["times"] = None if r["times"] is None else r["times"] - 1
                    return dict(r)
        return None


class HubServer:
    """Local folders served as Hub repos: `with HubServer({"org/name": folder}) as s: ... s.url`.
    Repos are keyed by (type, id); what clients push is kept in `storage` (a temporary folder,
    removed on stop)."""

    # entries per tree / list page (the Hub's cap); lower it to exercise pagination
    page_size = 1000
    lfs_min_size, lfs_extensions = LFS_MIN_SIZE, LFS_EXTENSIONS

    def __init__(self, repos: dict | None = None, host: str = "127.0.0.1", port: int = 0):
        self.host, self.port, self.tokens, self.write_tokens, self.requests = (
            host,
            port,
            set(),
            set(),
            [],
        )
        self.faults = Faults(self)
        self._repos: dict[tuple[str, str], dict] = {}
        self.buckets: dict[str, dict] = {}
        self.storage = Storage(tempfile.mkdtemp(prefix="hub-server-"))
        self._httpd: ThreadingHTTPServer | None = None
        self._conns, self._lock, self._refusing, self._write_lock = (
            set(),
            threading.Lock(),
            False,
            threading.Lock(),
        )
        for repo_id, folder in (repos or {}).items():
            self.add_repo(repo_id, folder)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def file_entry(
        self, rel: str, path: Path, lfs: bool | None = None, sha256: str | None = None
    ) -> dict:
        """A file of a repo, kept at `path`: LFS when `lfs` (None: by size and extension, as a
        repo's .gitattributes would), hashed in a stream then; its blob id is the git sha1 of it
        or of its pointer."""
        size = path.stat().st_size
        f = {"path": rel, "abs": path, "size": size, "sha256": None}
        if lfs is None:
            lfs = size >= self.lfs_min_size or rel.endswith(self.lfs_extensions)
        if lfs:
            if sha256 is None:
                with open(path, "rb") as fh:
                    sha256 = hashlib.file_digest(fh, "sha256").hexdigest()
            pointer = (
                f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n"
            )
            f.update(sha256=sha256, blob_id=git_sha1(pointer.encode()), pointer_size=len(pointer))
        else:
            f["blob_id"] = git_sha1(path.read_bytes())
        return f

    def add_repo(
        self,
        repo_id: str,
        folder,
        *,
        gated: bool = False,
        private: bool = False,
        metadata: dict | None = None,
        repo_type: str = "model",
    ) -> str:
        """Serve `folder` (None: an empty repo) as repo `repo_id`; returns its commit sha
        (deterministic in names and contents)."""
        files = {}
        for p in sorted(Path(folder).rglob("*")) if folder is not None else ():
            rel = p.relative_to(folder).as_posix()
            if p.is_file() and not any(part.startswith(".") for part in rel.split("/")):
                files[rel] = self.file_entry(rel, p)
        repo = {
            "id": repo_id,
            "type": repo_type,
            "private": private,
            "gated": "manual" if gated else False,
            "metadata": dict(metadata or {}),
            "commits": [],
        }
        self.set_files(repo, files)
        self._repos[(repo_type, repo_id)] = repo
        return repo["sha"]

    def set_files(self, repo: dict, files: dict) -> None:
        """A repo's new file list, and what derives from it: its commit sha, parameter counts and
        card."""
        readme = files.get("README.md")
        repo.update(
            files=files,
            sha=hashlib.sha1(
                "".join(f"{k}\0{v['blob_id']}\n" for k, v in sorted(files.items())).encode()
            ).hexdigest(),
            safetensors=_safetensors(
                [f["abs"] for k, f in files.items() if k.endswith(".safetensors")]
            ),
            card=_card(readme["abs"]) if readme else {},
        )

    def repo(self, repo_id: str, repo_type: str = "model") -> dict:
        """A repo's state: files ({path: {size, sha256, blob_id, abs}}), sha, commits ([{oid,
        title, added, deleted}]), private."""
        return self._repos[(repo_type, repo_id)]

    def sha(self, repo_id: str, repo_type: str = "model") -> str:
        """The commit sha that revision "main" of `repo_id` resolves to."""
        return self._repos[(repo_type, repo_id)]["sha"]

    def start(self) -> HubServer:
        self._httpd = ThreadingHTTPServer(
            (self.host, self.port), type("Handler", (_Handler,), {"hub": self})
        )
        self.port = self._httpd.server_address[1]
        self._serve()
        return self

    def _serve(self) -> None:
        threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def _set_refusing(self, on: bool) -> None:
        with self._lock:
            if on == self._refusing or self._httpd is None:
                return
            self._refusing = on
            # a bound socket that does not listen: the port stays ours, connections are refused
            if on:
                self._httpd.shutdown()
                self._httpd.socket.close()
                self._httpd.socket = socket.socket()
                self._httpd.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                self._httpd.socket.bind((self.host, self.port))
                for conn in list(self._conns):  # and drop the kept-alive connections
                    with contextlib.suppress(OSError):
                        conn.shutdown(socket.SHUT_RDWR)
            else:
                self._httpd.socket.listen(self._httpd.request_queue_size)
                self._serve()

    def stop(self) -> None:
        if self._httpd is not None:
            self._set_refusing(True)
            self._httpd.server_close()
            self._httpd = None
        shutil.rmtree(self.storage.root, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _gated(self, repo: dict) -> str | bool:
        gated = repo["metadata"].get("gated", repo["gated"])
        return gated or ("manual" if self.faults.take("gate", "", repo["id"], None) else False)

    def model_info(self, repo: dict, blobs: bool = False) -> dict:
        """The JSON of GET /api/models/{repo} (`blobs`: with file sizes, blob ids and LFS info)."""
        meta, card, files = dict(repo["metadata"]), dict(repo["card"]), repo["files"]
        card.update(meta.pop("cardData", None) or {})
        pipeline = meta.get("pipeline_tag", card.get("pipeline_tag", "text-generation"))
        library = meta.get("library_name", card.get("library_name", "transformers"))
        bases = card.get("base_model") or []
        tags = [
            library,
            *(
                x
                for x in ("safetensors", "gguf", "onnx")
                if any(f.endswith("." + x) for f in files)
            ),
            pipeline,
            *(t for t in card.get("tags") or [] if isinstance(t, str)),
            *([f"license:{card['license']}"] if card.get("license") else []),
            *(f"base_model:{b}" for b in ([bases] if isinstance(bases, str) else bases)),
            "region:us",
        ]
        info = {
            "_id": repo["sha"][:24],
            "id": repo["id"],
            "modelId": repo["id"],
            "author": repo["id"].split("/")[0],
            "sha": repo["sha"],
            "private": repo["private"],
            "gated": self._gated(repo),
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "trendingScore": 0,
            "tags": list(dict.fromkeys(tags)),
            "pipeline_tag": pipeline,
            "library_name": library,
            "createdAt": DATE,
            "lastModified": DATE,
            "cardData": card,
            "siblings": _siblings(files, blobs),
            "spaces": [],
            "usedStorage": sum(f["size"] for f in files.values()),
        }
        info.update({"safetensors": repo["safetensors"]} if repo["safetensors"] else {}, **meta)
        return info

    def repo_info(self, repo: dict, blobs: bool = False) -> dict:
        """The JSON of GET /api/{type}s/{repo}: a model's (above), or a dataset's."""
        if repo["type"] == "model":
            return self.model_info(repo, blobs)
        files = repo["files"]
        return {
            "_id": repo["sha"][:24],
            "id": repo["id"],
            "author": repo["id"].split("/")[0],
            "sha": repo["sha"],
            "private": repo["private"],
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "createdAt": DATE,
            "lastModified": DATE,
            "cardData": dict(repo["card"]),
            "siblings": _siblings(files, blobs),
            "usedStorage": sum(f["size"] for f in files.values()),
        }


def _siblings(files: dict, blobs: bool) -> list[dict]:
    """A repo info's siblings (`blobs`: with sizes, blob ids and LFS info)."""
    siblings = [{"rfilename": f["path"]} for f in files.values()]
    for sib, f in zip(siblings, files.values()) if blobs else ():
        sib.update(size=f["size"], blobId=f["blob_id"])
        if f["sha256"]:
            sib["lfs"] = {
                "sha256": f["sha256"],
                "size": f["size"],
                "pointerSize": f["pointer_size"],
            }
    return siblings


class _Handler(WriteRoutes, BaseHTTPRequestHandler):
    protocol_version, server_version, hub = "HTTP/1.1", "hub-server/1", None

    def log_message(self, *args) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.hub._conns.add(self.connection)

    def finish(self) -> None:
        self.hub._conns.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def do_GET(self) -> None:  # also HEAD, POST, DELETE
        self._dispatch(self.command)

    do_HEAD = do_POST = do_DELETE = do_PUT = do_GET

    def _send(
        self, status: int, body: bytes = b"", headers: dict | None = None, length: int | None = None
    ) -> None:
        self.send_response(status)
        for key, value in {
            "Content-Type": "application/json; charset=utf-8",
            **(headers or {}),
        }.items():
            self.send_header(key, str(value))
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.log["status"] = status
        self.end_headers()
        if self.command != "HEAD" and body:
            self.log["bytes"] += len(body)
            self.wfile.write(body)

    def _json(self, obj, headers: dict | None = None, status: int = 200) -> None:
        self._send(status, json.dumps(obj).encode(), headers)

    def _error(
        self, status: int, message: str, code: str | None = None, headers: dict | None = None
    ) -> None:
        self._json(
            {"error": message},
            {
                "X-Error-Message": message,
                **({"X-Error-Code": code} if code else {}),
                **(headers or {}),
            },
            status,
        )

    def _repo(
        self, repo_type: str, repo_id: str, rev: str | None, download: bool = False
    ) -> dict | None:
        """The repo, or None after answering the Hub's error."""
        repo = self.hub._repos.get((repo_type, repo_id))
        if repo is None or (repo["private"] and not self.authed):
            return self._error(404 if self.authed else 401, "Repository not found", "RepoNotFound")
        if rev not in (None, "main", repo["sha"]):
            return self._error(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        if download and self.hub._gated(repo) and not self.authed:
            return self._error(
                401,
                f"Access to model {repo_id} is restricted. You must have access to it and be "
                "authenticated to access it. Please log in.",
                "GatedRepo",
            )
        return repo

    def _read_body(self) -> bytes:
        """The request's body, sized by Content-Length or sent in chunks."""
        if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        parts = []
        while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
            parts.append(self.rfile.read(size))
            self.rfile.readline()
        while self.rfile.readline().strip():  # trailers, up to the blank line
            pass
        return b"".join(parts)

    def _dispatch(self, method: str) -> None:
        hub, url = self.hub, urlsplit(self.path)
        self.query = parse_qs(url.query, keep_blank_values=True)
        auth = self.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else None
        self.can_write = token in hub.write_tokens
        self.authed = self.can_write or token in hub.tokens
        self.body = self._read_body()
        self.log = {
            "method": method,
            "path": url.path,
            "query": url.query,
            "status": None,
            "bytes": 0,
            "headers": dict(self.headers.items()),
            "time": time.time(),
            "repo": None,
            "file": None,
            "route": None,
            "fault": None,
            "duration": None,
            **({"body": self.body} if method in ("POST", "PUT") else {}),
        }
        if url.path.startswith("/_control/"):
            return self._control(method, url.path, self.body)
        hub.requests.append(self.log)  # logged before answering, filled in as the answer goes out
        try:
            route, groups = self._route(method, url.path)
            repo_id, path = groups.get("repo"), groups.get("path")
            self.log.update(
                repo=repo_id,
                file=path if route in ("resolve", "bucket_resolve", "tree") else None,
                route=route,
            )
            if fault := hub.faults.take("fail", method, repo_id, self.log["file"], route):
                self.log["fault"] = "fail"
                retry = (
                    {}
                    if fault.get("retry_after") is None
                    else {"Retry-After": math.ceil(fault["retry_after"])}
                )
                return self._error(
                    fault["status"], f"Injected fault: HTTP {fault['status']}", None, retry
                )
            if (method, url.path) == ("GET", "/api/models"):
                return self._list_models()
            if (method, url.path) == ("GET", "/api/whoami-v2"):
                return self._whoami()
            if route is None:
                return self._error(404, "Sorry, we can't find the page you are looking for.")
            if route in ("info", "tree", "paths_info", "resolve"):
                if repo := self._repo(
                    groups["type"], repo_id, groups.get("rev"), download=route == "resolve"
                ):
                    getattr(self, "_" + route)(repo, path)
                return None
            getattr(self, "_" + route)(groups)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            self.log["duration"] = time.time() - self.log["time"]

    def _route(self, method: str, path: str) -> tuple[str | None, dict]:
        """The route answering `method` on `path`, and its parts (unquoted; a repo type in the
        singular)."""
        for name, methods, rx in ROUTES:
            if method in methods.split() and (m := re.match(rx, path)):
                groups = {k: unquote(v) for k, v in m.groupdict().items() if v}
                groups["type"] = {
                    "models": "model",
                    "datasets": "dataset",
                    "buckets": "bucket",
                }.get(groups.get("type"), "model")
                return name, groups
        return None, {}

    def _whoami(self) -> None:
        if not self.authed:
            return self._error(401, "Invalid credentials in Authorization header")
        role = "write" if self.can_write else "read"
        token = {"type": "access_token", "accessToken": {"displayName": "hub-server", "role": role}}
        self._json(
            {"type": "user", "id": "0" * 24, "name": "hub-server-user", "orgs": [], "auth": token}
        )

    def _control(self, method: str, path: str, body: bytes) -> None:
        if (path, method) == ("/_control/requests", "GET"):
            return self._json(self.hub.requests)
        if path != "/_control/faults" or method not in ("GET", "POST", "DELETE"):
            return self._error(404, "Unknown control endpoint")
        if method == "POST":
            rules = json.loads(body or b"[]")
            self.hub.faults.add_rules(rules if isinstance(rules, list) else [rules])
        elif method == "DELETE":
            self.hub.faults.clear()
        self._json(self.hub.faults.snapshot())

    def _flag(self, name: str) -> bool:
        return self.query.get(name, [""])[-1].lower() in ("true", "1")

    def _page(self, items: list, size: int) -> None:
        start, headers = int(self.query.get("cursor", ["0"])[-1] or 0), {}
        if start + size < len(items):
            query = urlencode({**self.query, "cursor": [start + size]}, doseq=True)
            headers["Link"] = f'<{self.hub.url}{urlsplit(self.path).path}?{query}>; rel="next"'
        self._json(items[start : start + size], headers)

    def _info(self, repo: dict, _path: None) -> None:
        info = self.hub.repo_info(repo, blobs=self._flag("blobs"))
        expand = self.query.get("expand")
        self._json(
            {k: v for k, v in info.items() if k in ("_id", "id", *expand)} if expand else info
        )

    @staticmethod
    def _dirs(repo: dict) -> set[str]:
        return {
            "/".join(p.split("/")[:i]) for p in repo["files"] for i in range(1, p.count("/") + 1)
        }

    def _entry(self, repo: dict, name: str, dirs: set[str], expand: bool) -> dict:
        """A tree / paths-info entry: a folder, or a file with its blob id (and LFS info)."""
        if name in dirs:
            oid = hashlib.sha1(f"tree {repo['sha']} {name}".encode()).hexdigest()
            entry = {"type": "directory", "oid": oid, "size": 0, "path": name}
        else:
            f = repo["files"][name]
            entry = {"type": "file", "oid": f["blob_id"], "size": f["size"], "path": name}
            if f["sha256"]:
                entry["lfs"] = {
                    "oid": f["sha256"],
                    "size": f["size"],
                    "pointerSize": f["pointer_size"],
                }
        if expand:
            entry["lastCommit"] = {"id": repo["sha"], "title": "Upload folder", "date": DATE}
        return entry

    def _tree(self, repo: dict, path: str | None) -> None:
        prefix = path.strip("/") + "/" if path and path.strip("/") else ""
        dirs = self._dirs(repo)
        if prefix and prefix[:-1] not in dirs:
            return self._error(
                404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": repo["sha"]}
            )
        recursive, expand = self._flag("recursive"), self._flag("expand")
        entries = [
            self._entry(repo, name, dirs, expand)
            for name in sorted(dirs | set(repo["files"]))
            if name.startswith(prefix) and (recursive or "/" not in name[len(prefix) :])
        ]
        self._page(entries, min(self.hub.page_size, 50) if expand else self.hub.page_size)

    def _paths_info(self, repo: dict, _path: None) -> None:
        """POST paths-info: the entries of the named paths that exist (form-encoded, as the
        client sends it)."""
        form = parse_qs(self.body.decode(), keep_blank_values=True)
        if self.headers.get("Content-Type", "").startswith("application/json"):
            form = {
                k: v if isinstance(v, list) else [str(v)]
                for k, v in json.loads(self.body or b"{}").items()
            }
        dirs, expand = self._dirs(repo), form.get("expand", [""])[-1].lower() in ("true", "1")
        paths = [p.strip("/") for p in form.get("paths", [])]
        self._json(
            [self._entry(repo, p, dirs, expand) for p in paths if p in dirs or p in repo["files"]]
        )

    def _resolve(self, repo: dict, path: str) -> None:
        f, sha = repo["files"].get(path), repo["sha"]
        if f is None:
            return self._error(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": sha})
        etag = f'"{f["sha256"] or f["blob_id"]}"'
        headers = {
            "Content-Type": "application/octet-stream",
            "ETag": etag,
            "X-Repo-Commit": sha,
            **({"X-Linked-Etag": etag, "X-Linked-Size": f["size"]} if f["sha256"] else {}),
        }
        self._send_file(f["abs"], f["size"], headers, repo["id"], path)

    def _send_file(
        self,
        source: Path,
        size: int,
        headers: dict,
        repo_id: str | None = None,
        path: str | None = None,
    ):
        """A file's bytes (HEAD: its headers only), honouring `Range` and the cut and throttle
        faults."""
        headers = {"Accept-Ranges": "bytes", **headers}
        start, end, status, spec = 0, size - 1, 200, self.headers.get("Range", "")
        if spec.startswith("bytes=") and "," not in spec:
            a, _, b = spec[6:].partition("-")
            try:
                start, end = (
                    (size - int(b), size - 1)
                    if not a
                    else (int(a), min(int(b), size - 1) if b else size - 1)
                )
            except ValueError:
                start = size
            if not 0 <= start <= end < size:
                return self._error(
                    416,
                    "Requested Range Not Satisfiable",
                    None,
                    {"Content-Range": f"bytes */{size}"},
                )
            status, headers["Content-Range"] = 206, f"bytes {start}-{end}/{size}"
        get, faults = self.command == "GET", self.hub.faults
        cut = faults.take("cut", "GET", repo_id, path) if get else None
        throttle = faults.take("throttle", "GET", repo_id, path) if get else None
        self.log["fault"] = "cut" if cut else "throttle" if throttle else None
        self._send(status, headers=headers, length=end - start + 1)
        if not get:
            return None
        rate, remaining, t0 = (
            throttle and throttle["bytes_per_s"],
            end - start + 1,
            time.monotonic(),
        )
        chunk = max(1024, min(64 * 1024, rate // 20)) if rate else 1 << 20
        with open(source, "rb") as fh:
            fh.seek(start)
            while (
                remaining > 0
                and (
                    n := min(
                        chunk, remaining, cut["after_bytes"] - self.log["bytes"] if cut else chunk
                    )
                )
                > 0
            ):
                data = fh.read(n)
                self.log["bytes"] += len(data)
                remaining -= len(data)
                self.wfile.write(data)
                if rate and (delay := self.log["bytes"] / rate - (time.monotonic() - t0)) > 0:
                    time.sleep(delay)
        if remaining > 0:  # cut: close the connection, body incomplete
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_WR)
        return None

    def _list_models(self) -> None:
        q, hub = self.query, self.hub
        wanted, search = (
            q.get("filter", []) + q.get("pipeline_tag", []),
            q.get("search", [""])[-1].lower(),
        )
        infos = sorted(
            (
                hub.model_info(r)
                for r in hub._repos.values()
                if r["type"] == "model" and (self.authed or not r["private"])
            ),
            key=lambda i: i["id"],
        )
        infos = [
            i
            for i in infos
            if all(w in i["tags"] or w in (i["pipeline_tag"], i["library_name"]) for w in wanted)
            and search in i["id"].lower()
            and i["author"] == q.get("author", [i["author"]])[-1]
            and ("gated" not in q or bool(i["gated"]) == self._flag("gated"))
        ]
        if sort := q.get("sort", [""])[-1]:
            infos.sort(key=lambda i: i.get(sort) or 0, reverse=True)
        fields = [
            "_id",
            "id",
            "likes",
            "trendingScore",
            "private",
            "downloads",
            "tags",
            "pipeline_tag",
            "library_name",
            "createdAt",
            "modelId",
        ]
        if q.get("expand"):
            fields = ["_id", "id", *q["expand"]]
        elif self._flag("full") and infos:
            fields = list(infos[0])
        fields += ["cardData"] if self._flag("cardData") else []
        limit = int(q.get("limit", ["0"])[-1] or 0)
        self._page(
            [{k: i[k] for k in fields if k in i} for i in infos],
            min(limit or hub.page_size, hub.page_size),
        )


@contextlib.contextmanager
def serve(
    repos: dict,
    *,
    gated=(),
    private=(),
    tokens=(),
    write_tokens=(),
    metadata: dict | None = None,
    **kw,
):
    """A started HubServer for `repos` ({repo_id: folder}); `gated`, `private`: repo ids;
    `tokens`: accepted read tokens, `write_tokens`: accepted tokens that may also write;
    `metadata`: {repo_id: model info fields}; `kw`: host, port. Stopped on exit."""
    server = HubServer(None, **kw)
    for repo_id, folder in repos.items():
        server.add_repo(
            repo_id,
            folder,
            gated=repo_id in gated,
            private=repo_id in private,
            metadata=(metadata or {}).get(repo_id),
        )
    server.tokens.update(tokens)
    server.write_tokens.update(write_tokens)
    with server:
        yield server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Serve local folders as Hugging Face Hub model repos."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--repo", action="append", default=[], metavar="ORG/NAME=FOLDER")
    parser.add_argument("--gated", action="append", default=[], metavar="ORG/NAME")
    parser.add_argument(
        "--token", action="append", default=[], help="a token accepted for gated/private repos"
    )
    parser.add_argument(
        "--write-token", action="append", default=[], help="a token that may also push"
    )
    parser.add_argument("--throttle", type=int, default=None, metavar="BYTES_PER_S")
    args = parser.parse_args(argv)
    with serve(
        dict(spec.split("=", 1) for spec in args.repo),
        gated=args.gated,
        tokens=args.token,
        write_tokens=args.write_token,
        host=args.host,
        port=args.port,
    ) as server:
        if args.throttle:
            server.faults.throttle(args.throttle)
        print(server.url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
