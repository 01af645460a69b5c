"""A local, offline Hugging Face Hub: local folders served as model repos, with fault injection on demand.

It speaks the HTTP protocol of the Hub as the installed huggingface_hub 2.4.0 client uses it, so
`hf_hub_download`, `snapshot_download`, `HfApi.model_info/repo_info/list_repo_tree/list_models/whoami`
run unmodified against it (pass `endpoint=server.url`, or set HF_ENDPOINT before huggingface_hub is
imported, e.g. in a subprocess). Written because olah 0.5.4 (a Hub mirror) was checked and does not
serve local repos offline. Standard library only.

Endpoints: GET /api/models/{repo}[/revision/{rev}] (model info; `blobs=true` adds size/blobId/lfs to
siblings; `expand=` keeps only the named fields); GET /api/models/{repo}/tree/{rev}[/{path}] (`recursive`,
`expand`, cursor pages in a Link header); HEAD|GET /{repo}/resolve/{rev}/{file} (quoted ETag = git blob
sha1, or sha256 for LFS files; X-Repo-Commit; X-Linked-Etag/X-Linked-Size for LFS; Content-Length;
Accept-Ranges; `Range: bytes=a-b` -> 206 + Content-Range, 416 if unsatisfiable); GET /api/models (filter,
pipeline_tag, author, search, gated, sort descending, limit, expand, full, cardData; Link pages);
GET /api/whoami-v2; POST|DELETE|GET /_control/faults and GET /_control/requests (fault control from
another process). Errors carry the Hub's X-Error-Code/X-Error-Message headers and {"error": ...} body:
unknown repo, or private one without an accepted token -> 401 RepoNotFound (404 with a token); other
revision than "main" or the commit sha -> 404 RevisionNotFound; unknown file -> 404 EntryNotFound; file of
a gated repo without an accepted token -> 401 GatedRepo (model info and tree stay public, as on the Hub).
A token not in `server.tokens` counts as anonymous (the real Hub answers 401 to any bad token). LFS files
are served in place (the Hub redirects them to its CDN; the client reads the same headers either way). No
Xet headers are sent, so the client downloads over plain HTTP. Every request is logged in `server.requests`.

CLI: python tests/hub_server.py --port 0 --repo org/name=/path [--gated org/name] [--token T]
     [--throttle BYTES_PER_S]        prints the URL on its first line, serves until killed.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import hashlib
import json
import math
import re
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

LFS_EXTENSIONS = (".safetensors", ".bin", ".gguf", ".onnx", ".pt", ".h5", ".msgpack")
LFS_MIN_SIZE = 10 * 1024
DATE = "2024-01-01T00:00:00.000Z"
_REPO = r"(?P<repo>[^/]+(?:/[^/]+)?)"
ROUTES = [
    ("info", rf"^/api/models/{_REPO}(?:/revision/(?P<rev>[^/]+))?$"),
    ("tree", rf"^/api/models/{_REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.+))?$"),
    ("resolve", rf"^/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$"),
]


def closed_port() -> int:
    """A free TCP port on 127.0.0.1 that nothing listens on (connecting to it is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _card(readme: Path) -> dict:
    """A model card's YAML front matter: `key: value` lines and `- item` lists (enough for cardData)."""
    text, data, key = readme.read_text(errors="replace") if readme.is_file() else "", {}, None
    for line in text.split("\n---", 1)[0].splitlines()[1:] if text.startswith("---") else []:
        if line.lstrip().startswith("- ") and key:
            data[key] = [*(data[key] if isinstance(data[key], list) else []), line.strip()[2:].strip("'\"")]
        elif ":" in line and not line.startswith((" ", "#")):
            key, _, value = (part.strip() for part in line.partition(":"))
            data[key] = value.strip("'\"") or None
    return data


def _safetensors(paths: list[Path]) -> dict | None:
    """Parameter counts per dtype from safetensors headers, as the Hub's `safetensors` field gives them."""
    counts: dict[str, int] = {}
    for path in paths:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, struct.error), open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]  # header size; random bytes give nonsense: skip those
            header = json.loads(f.read(n)) if n <= min(path.stat().st_size, 1 << 27) else {}
            for t in (t for name, t in header.items() if name != "__metadata__"):
                counts[t["dtype"]] = counts.get(t["dtype"], 0) + math.prod(t["shape"])
    return {"parameters": counts, "total": sum(counts.values())} if counts else None


class Faults:
    """Fault rules the server applies per request; thread-safe. A rule targets a repo id (None = all), a
    glob on the file path in the repo (None = every request, API ones included) and a method (None = all)."""

    def __init__(self, server: HubServer | None = None):
        self._server, self._lock, self.rules = server, threading.Lock(), []

    def _add(self, kind: str, **rule) -> dict:
        rule = {"kind": kind, "repo": None, "path": None, "method": None, "times": None, **rule}
        with self._lock:
            self.rules.append(rule)
        return rule

    def fail(self, status: int, times: int = 1, repo=None, path=None, retry_after: float | None = None, method=None):
        """The next `times` matching requests answer `status` (with Retry-After when given)."""
        return self._add("fail", **{k: v for k, v in locals().items() if k != "self"})

    def throttle(self, bytes_per_s: int, repo=None, path=None):
        """File bodies are sent in small chunks paced to `bytes_per_s`."""
        return self._add("throttle", **{k: v for k, v in locals().items() if k != "self"})

    def cut(self, after_bytes: int, times: int | None = None, repo=None, path=None):
        """File bodies announce their full Content-Length, but the connection closes after `after_bytes`."""
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
        """Rules as dicts, e.g. {"kind": "fail", "status": 503, "times": 2, "path": "*.json"} (kinds: fail,
        throttle, cut, gate; other keys as the methods' parameters)."""
        for rule in rules:
            self._add(**rule)

    def snapshot(self) -> list[dict]:
        with self._lock:
            return [dict(r) for r in self.rules]

    def take(self, kind: str, method: str, repo: str | None, path: str | None) -> dict | None:
        """The first live rule of `kind` matching the request, one of its `times` used up."""
        with self._lock:
            for r in self.rules:
                if (
                    r["kind"] == kind
                    and r["times"] != 0
                    and r["repo"] in (None, repo)
                    and r["method"] in (None, method)
                    and (r["path"] is None or (path is not None and fnmatch.fnmatch(path, r["path"])))
                ):
                    r["times"] = None if r["times"] is None else r["times"] - 1
                    return dict(r)
        return None


class HubServer:
    """Local folders served as Hub model repos: `with HubServer({"org/name": folder}) as s: ... s.url`."""

    page_size = 1000  # entries per tree / list page (the Hub's cap); lower it to exercise pagination

    def __init__(self, repos: dict | None = None, host: str = "127.0.0.1", port: int = 0):
        self.host, self.port, self.tokens, self.requests = host, port, set(), []
        self.faults = Faults(self)
        self._repos: dict[str, dict] = {}
        self._httpd: ThreadingHTTPServer | None = None
        self._conns, self._lock, self._refusing = set(), threading.Lock(), False
        for repo_id, folder in (repos or {}).items():
            self.add_repo(repo_id, folder)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def add_repo(
        self, repo_id: str, folder, *, gated: bool = False, private: bool = False, metadata: dict | None = None
    ) -> str:
        """Serve `folder` as model repo `repo_id`; returns its commit sha (deterministic in names and contents)."""
        folder, files = Path(folder), {}
        for p in sorted(folder.rglob("*")):
            rel = p.relative_to(folder).as_posix()
            if p.is_file() and not any(part.startswith(".") for part in rel.split("/")):
                f = files[rel] = {"path": rel, "abs": p, "size": (size := p.stat().st_size), "sha256": None}
                if size >= LFS_MIN_SIZE or rel.endswith(LFS_EXTENSIONS):  # LFS: hashed in a stream, kept on disk
                    with open(p, "rb") as fh:
                        f["sha256"] = hashlib.file_digest(fh, "sha256").hexdigest()
                    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{f['sha256']}\nsize {size}\n"
                    f.update(blob_id=_git_sha1(pointer.encode()), pointer_size=len(pointer))
                else:
                    f["blob_id"] = _git_sha1(p.read_bytes())
        sha = hashlib.sha1("".join(f"{k}\0{v['blob_id']}\n" for k, v in files.items()).encode()).hexdigest()
        st = _safetensors([f["abs"] for k, f in files.items() if k.endswith(".safetensors")])
        self._repos[repo_id] = {
            "id": repo_id,
            "files": files,
            "sha": sha,
            "private": private,
            "safetensors": st,
            "gated": "manual" if gated else False,
            "metadata": dict(metadata or {}),
            "card": _card(folder / "README.md"),
        }
        return sha

    def sha(self, repo_id: str) -> str:
        """The commit sha that revision "main" of `repo_id` resolves to."""
        return self._repos[repo_id]["sha"]

    def start(self) -> HubServer:
        self._httpd = ThreadingHTTPServer((self.host, self.port), type("Handler", (_Handler,), {"hub": self}))
        self.port = self._httpd.server_address[1]
        self._serve()
        return self

    def _serve(self) -> None:
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def _set_refusing(self, on: bool) -> None:
        with self._lock:
            if on == self._refusing or self._httpd is None:
                return
            self._refusing = on
            if on:  # a bound socket that does not listen: the port stays ours, connections are refused
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
            *(x for x in ("safetensors", "gguf", "onnx") if any(f.endswith("." + x) for f in files)),
            pipeline,
            *(t for t in card.get("tags") or [] if isinstance(t, str)),
            *([f"license:{card['license']}"] if card.get("license") else []),
            *(f"base_model:{b}" for b in ([bases] if isinstance(bases, str) else bases)),
            "region:us",
        ]
        siblings = [{"rfilename": f["path"]} for f in files.values()]
        for sib, f in zip(siblings, files.values()) if blobs else ():
            sib.update(size=f["size"], blobId=f["blob_id"])
            if f["sha256"]:
                sib["lfs"] = {"sha256": f["sha256"], "size": f["size"], "pointerSize": f["pointer_size"]}
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
            "siblings": siblings,
            "spaces": [],
            "usedStorage": sum(f["size"] for f in files.values()),
        }
        info.update({"safetensors": repo["safetensors"]} if repo["safetensors"] else {}, **meta)
        return info


class _Handler(BaseHTTPRequestHandler):
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

    do_HEAD = do_POST = do_DELETE = do_GET

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, length: int | None = None) -> None:
        self.send_response(status)
        for key, value in {"Content-Type": "application/json; charset=utf-8", **(headers or {})}.items():
            self.send_header(key, str(value))
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.log["status"] = status
        self.end_headers()
        if self.command != "HEAD" and body:
            self.log["bytes"] += len(body)
            self.wfile.write(body)

    def _json(self, obj, headers: dict | None = None, status: int = 200) -> None:
        self._send(status, json.dumps(obj).encode(), headers)

    def _error(self, status: int, message: str, code: str | None = None, headers: dict | None = None) -> None:
        self._json(
            {"error": message},
            {"X-Error-Message": message, **({"X-Error-Code": code} if code else {}), **(headers or {})},
            status,
        )

    def _repo(self, repo_id: str, rev: str | None, download: bool = False) -> dict | None:
        """The repo, or None after answering the Hub's error."""
        repo = self.hub._repos.get(repo_id)
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

    def _dispatch(self, method: str) -> None:
        hub, url = self.hub, urlsplit(self.path)
        self.query = parse_qs(url.query, keep_blank_values=True)
        auth = self.headers.get("Authorization", "")
        self.authed = auth.startswith("Bearer ") and auth[7:] in hub.tokens
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
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
            "fault": None,
            "duration": None,
        }
        if url.path.startswith("/_control/"):
            return self._control(method, url.path, body)
        hub.requests.append(self.log)  # logged before answering, filled in as the answer goes out
        try:
            route, m = next(((name, m) for name, rx in ROUTES if (m := re.match(rx, url.path))), (None, None))
            groups = {k: unquote(v) for k, v in (m.groupdict() if m else {}).items() if v}
            repo_id, rev, path = groups.get("repo"), groups.get("rev"), groups.get("path")
            self.log.update(repo=repo_id, file=path if route != "info" else None)
            if fault := hub.faults.take("fail", method, repo_id, path):
                self.log["fault"] = "fail"
                retry = {} if fault.get("retry_after") is None else {"Retry-After": math.ceil(fault["retry_after"])}
                return self._error(fault["status"], f"Injected fault: HTTP {fault['status']}", None, retry)
            if (method, url.path) == ("GET", "/api/models"):
                return self._list_models()
            if (method, url.path) == ("GET", "/api/whoami-v2"):
                if not self.authed:
                    return self._error(401, "Invalid credentials in Authorization header")
                token = {"type": "access_token", "accessToken": {"displayName": "hub-server", "role": "read"}}
                return self._json(
                    {"type": "user", "id": "0" * 24, "name": "hub-server-user", "orgs": [], "auth": token}
                )
            handler = {
                ("info", "GET"): self._info,
                ("tree", "GET"): self._tree,
                ("resolve", "GET"): self._resolve,
                ("resolve", "HEAD"): self._resolve,
            }.get((route, method))
            if handler is None:
                return self._error(404, "Sorry, we can't find the page you are looking for.")
            if repo := self._repo(repo_id, rev, download=route == "resolve"):
                handler(repo, path)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            self.log["duration"] = time.time() - self.log["time"]

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
        info = self.hub.model_info(repo, blobs=self._flag("blobs"))
        expand = self.query.get("expand")
        self._json({k: v for k, v in info.items() if k in ("_id", "id", *expand)} if expand else info)

    def _tree(self, repo: dict, path: str | None) -> None:
        prefix = path.strip("/") + "/" if path and path.strip("/") else ""
        dirs = {"/".join(p.split("/")[:i]) for p in repo["files"] for i in range(1, p.count("/") + 1)}
        if prefix and prefix[:-1] not in dirs:
            return self._error(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": repo["sha"]})
        recursive, expand, entries = self._flag("recursive"), self._flag("expand"), []
        for name in sorted(dirs | set(repo["files"])):
            if not name.startswith(prefix) or (not recursive and "/" in name[len(prefix) :]):
                continue
            if name in dirs:
                oid = hashlib.sha1(f"tree {repo['sha']} {name}".encode()).hexdigest()
                entry = {"type": "directory", "oid": oid, "size": 0, "path": name}
            else:
                f = repo["files"][name]
                entry = {"type": "file", "oid": f["blob_id"], "size": f["size"], "path": name}
                if f["sha256"]:
                    entry["lfs"] = {"oid": f["sha256"], "size": f["size"], "pointerSize": f["pointer_size"]}
            if expand:
                entry["lastCommit"] = {"id": repo["sha"], "title": "Upload folder", "date": DATE}
            entries.append(entry)
        self._page(entries, min(self.hub.page_size, 50) if expand else self.hub.page_size)

    def _resolve(self, repo: dict, path: str) -> None:
        f, sha = repo["files"].get(path), repo["sha"]
        if f is None:
            return self._error(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": sha})
        size, etag = f["size"], f'"{f["sha256"] or f["blob_id"]}"'
        headers = {
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "bytes",
            "ETag": etag,
            "X-Repo-Commit": sha,
            **({"X-Linked-Etag": etag, "X-Linked-Size": size} if f["sha256"] else {}),
        }
        start, end, status, spec = 0, size - 1, 200, self.headers.get("Range", "")
        if spec.startswith("bytes=") and "," not in spec:
            a, _, b = spec[6:].partition("-")
            try:
                start, end = (size - int(b), size - 1) if not a else (int(a), min(int(b), size - 1) if b else size - 1)
            except ValueError:
                start = size
            if not 0 <= start <= end < size:
                return self._error(416, "Requested Range Not Satisfiable", None, {"Content-Range": f"bytes */{size}"})
            status, headers["Content-Range"] = 206, f"bytes {start}-{end}/{size}"
        get, faults = self.command == "GET", self.hub.faults
        cut = faults.take("cut", "GET", repo["id"], path) if get else None
        throttle = faults.take("throttle", "GET", repo["id"], path) if get else None
        self.log["fault"] = "cut" if cut else "throttle" if throttle else None
        self._send(status, headers=headers, length=end - start + 1)
        if not get:
            return
        rate, remaining, t0 = throttle and throttle["bytes_per_s"], end - start + 1, time.monotonic()
        chunk = max(1024, min(64 * 1024, rate // 20)) if rate else 1 << 20
        with open(f["abs"], "rb") as fh:
            fh.seek(start)
            while (
                remaining > 0
                and (n := min(chunk, remaining, cut["after_bytes"] - self.log["bytes"] if cut else chunk)) > 0
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

    def _list_models(self) -> None:
        q, hub = self.query, self.hub
        wanted, search = q.get("filter", []) + q.get("pipeline_tag", []), q.get("search", [""])[-1].lower()
        infos = sorted(
            (hub.model_info(r) for r in hub._repos.values() if self.authed or not r["private"]), key=lambda i: i["id"]
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
        self._page([{k: i[k] for k in fields if k in i} for i in infos], min(limit or hub.page_size, hub.page_size))


@contextlib.contextmanager
def serve(repos: dict, *, gated=(), private=(), tokens=(), metadata: dict | None = None, **kw):
    """A started HubServer for `repos` ({repo_id: folder}); `gated`, `private`: repo ids; `tokens`: accepted
    tokens; `metadata`: {repo_id: model info fields}; `kw`: host, port. Stopped on exit."""
    server = HubServer(None, **kw)
    for repo_id, folder in repos.items():
        server.add_repo(
            repo_id, folder, gated=repo_id in gated, private=repo_id in private, metadata=(metadata or {}).get(repo_id)
        )
    server.tokens.update(tokens)
    with server:
        yield server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve local folders as Hugging Face Hub model repos.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--repo", action="append", default=[], metavar="ORG/NAME=FOLDER")
    parser.add_argument("--gated", action="append", default=[], metavar="ORG/NAME")
    parser.add_argument("--token", action="append", default=[], help="a token accepted for gated/private repos")
    parser.add_argument("--throttle", type=int, default=None, metavar="BYTES_PER_S")
    args = parser.parse_args(argv)
    with serve(
        dict(spec.split("=", 1) for spec in args.repo),
        gated=args.gated,
        tokens=args.token,
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
