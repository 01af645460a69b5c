"""What pushing needs from the local Hub (``hub_server``): where uploaded bytes are kept, and the
write routes.

The installed huggingface_hub (2.4.0) uploads a dataset's large files through Xet whenever
``hf_xet`` is installed, and through the LFS batch API otherwise (``HF_HUB_DISABLE_XET=1``); a
bucket's files go through Xet only. Both are served here:

- LFS: ``POST /{datasets/}{repo}.git/info/lfs/objects/batch`` answers one ``upload`` action per
  object not yet stored, a ``PUT /_lfs/{sha256}`` stores it (its sha256 checked).
- Xet: the ``xet-write-token`` / ``xet-read-token`` routes hand out ``local://<storage>/cas`` as the
  CAS address, so hf_xet itself writes xorbs and shards into the server's folder (its own local CAS
  client, the one xet-core uses in its tests); the server reads the shards back (``shard_files``) to
  map a commit's sha256 to a Xet file, and has hf_xet rebuild the bytes, so every stored file is
  plain bytes on disk.

A commit (``POST /api/{type}s/{repo}/commit/{rev}``, ndjson: header, file, lfsFile, deletedFile,
deletedFolder) is applied whole or not at all: a missing LFS object, a deleted path that does not
exist or a ``parentCommit`` that is no longer the head refuses it and the repo stays as it was.
Writes need a token in ``server.write_tokens``: none is 401, a read token 403, as on the Hub.
Buckets: create, info, batch (addFile / deleteFile by Xet hash), tree, paths-info, resolve (HEAD
gives the Xet headers ``get_bucket_file_metadata`` reads; GET the bytes).
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import struct
import tempfile
import threading
import time
from pathlib import Path

_FLAG_VERIFICATION = 1 << 31
_FLAG_METADATA_EXT = 1 << 30
_ENTRY = 48  # every record of a Xet shard's file section is 48 bytes
_BOOKEND = b"\xff" * 32
DATE = "2024-01-01T00:00:00.000Z"


def _merkle_hex(raw: bytes) -> str:
    """A Xet hash as its text form: four little-endian u64 words, each printed as 16 hex digits."""
    return "".join(raw[i : i + 8][::-1].hex() for i in range(0, 32, 8))


def shard_files(data: bytes) -> list[tuple[str, int, str | None]]:
    """[(Xet file hash, size, sha256 or None)] of the files a Xet shard describes (xet-core's MDB
    shard format: a 48-byte header, then per file a header record [file hash, flags, n], n
    segment records [xorb hash, flags, bytes, chunk range], n verification records when flagged,
    one metadata record [sha256] when flagged (a dataset commit's files have one, a bucket's
    not), up to a bookend record of 0xff)."""
    files, pos = [], _ENTRY
    while pos + _ENTRY <= len(data) and data[pos : pos + 32] != _BOOKEND:
        file_hash = _merkle_hex(data[pos : pos + 32])
        flags, n = struct.unpack_from("<II", data, pos + 32)
        size = sum(struct.unpack_from("<I", data, pos + _ENTRY * (1 + k) + 36)[0] for k in range(n))
        pos += _ENTRY * (1 + n) + (_ENTRY * n if flags & _FLAG_VERIFICATION else 0)
        sha256 = None
        if flags & _FLAG_METADATA_EXT:
            sha256 = _merkle_hex(data[pos : pos + 32])
            pos += _ENTRY
        files.append((file_hash, size, sha256))
    return files


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Storage:
    """The bytes the server was given, content-addressed under ``root``: ``blobs/<sha256>``; the
    local Xet CAS under ``root/cas``."""

    def __init__(self, root: Path):
        self.root, self.blobs, self.cas = Path(root), Path(root) / "blobs", Path(root) / "cas"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.cas.mkdir(parents=True, exist_ok=True)
        self._lock, self._shards, self._session = threading.Lock(), set(), None
        self._xet: dict[str, int] = {}  # Xet file hash -> size
        self._sha256: dict[str, str] = {}  # sha256 -> Xet file hash

    @property
    def cas_url(self) -> str:
        return f"local://{self.cas}"

    def put(self, data: bytes) -> Path:
        path = self.blobs / hashlib.sha256(data).hexdigest()
        if not path.exists():
            tmp = path.with_suffix(f".{threading.get_ident()}.tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
        return path

    def _scan(self) -> None:
        """Read the shards hf_xet wrote since the last look: which Xet files (and sha256s) the
        CAS holds."""
        with self._lock:
            for shard in sorted((self.cas / "xet" / "xorbs" / "shards").glob("*.mdb")):
                if shard.name not in self._shards:
                    for file_hash, size, sha256 in shard_files(shard.read_bytes()):
                        self._xet[file_hash] = size
                        if sha256:
                            self._sha256[sha256] = file_hash
                    self._shards.add(shard.name)

    def lfs(self, sha256: str) -> Path | None:
        """The stored object with this sha256: sent by an LFS PUT, or uploaded through Xet (found
        in a shard)."""
        path = self.blobs / sha256
        if path.exists():
            return path
        self._scan()
        return self.xet(self._sha256[sha256]) if sha256 in self._sha256 else None

    def xet(self, xet_hash: str) -> Path | None:
        """The bytes of a Xet file, rebuilt once by hf_xet from the local CAS; None when the CAS
        lacks it."""
        path = self.blobs / f"xet-{xet_hash}"
        if path.exists():
            return path
        self._scan()
        if xet_hash not in self._xet:
            return None
        from hf_xet import XetFileInfo, XetSession

        # read from a copy: the uploading client keeps the CAS's own database locked
        with self._lock:
            self._session = self._session or XetSession()
            copy = Path(tempfile.mkdtemp(dir=self.root, prefix="cas-read-"))
            try:
                # its database too: it is needed
                shutil.copytree(self.cas / "xet" / "xorbs", copy / "xet" / "xorbs")
                expiry = int(time.time()) + 86400
                with self._session.new_file_download_group(
                    endpoint=f"local://{copy}", token="local", token_expiry_unix_secs=expiry
                ) as group:
                    group.start_download_file(
                        XetFileInfo(xet_hash, self._xet[xet_hash]), str(path.with_suffix(".tmp"))
                    )
                path.with_suffix(".tmp").replace(path)
            finally:
                shutil.rmtree(copy, ignore_errors=True)
        return path

    def every_file(self) -> list[Path]:
        """Every stored object (for tests that look through all that was uploaded)."""
        return sorted(
            p for p in self.blobs.iterdir() if p.is_file() and not p.name.endswith(".tmp")
        )


class WriteRoutes:
    """The handler's write routes (mixed into ``hub_server._Handler``): each answers like the
    Hub."""

    def _need_write(self, what: str) -> bool:
        """True when the request carries a write token; else answers 401 (no token) or 403 (read
        token)."""
        if self.can_write:
            return True
        if not self.authed:
            self._error(401, "Invalid credentials in Authorization header")
        else:
            self._error(
                403, f"You don't have the rights to write to {what}: this token is read-only."
            )
        return False

    def _create_repo(self, groups: dict) -> None:
        body = json.loads(self.body or b"{}")
        repo_type = body.get("type") or "model"
        repo_id = "/".join(x for x in (body.get("organization"), body["name"]) if x)
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        if not self._need_write(f"the namespace {repo_id.split('/')[0]}"):
            return
        url = f"{self.hub.url}/{prefix}{repo_id}"
        # the Hub's 409 carries the url: the client returns it
        if (repo_type, repo_id) in self.hub._repos:
            message = "You already created this repo"
            return self._json({"error": message, "url": url}, {"X-Error-Message": message}, 409)
        private = body.get("visibility") == "private" or bool(body.get("private"))
        self.hub.add_repo(repo_id, None, private=private, repo_type=repo_type)
        self._json({"url": url, "name": repo_id, "id": repo_id})

    def _validate_yaml(self, groups: dict) -> None:
        self._json({"errors": [], "warnings": []})

    def _preupload(self, groups: dict) -> None:
        repo = self._writable(groups)
        if repo is None:
            return
        answer = []
        for f in json.loads(self.body)["files"]:
            lfs = f["size"] >= self.hub.lfs_min_size or f["path"].endswith(self.hub.lfs_extensions)
            known = repo["files"].get(f["path"])
            oid = (known["sha256"] or known["blob_id"]) if known else None
            answer.append(
                {
                    "path": f["path"],
                    "uploadMode": "lfs" if lfs else "regular",
                    "shouldIgnore": False,
                    "oid": oid,
                }
            )
        self._json({"files": answer, "commitOid": repo["sha"]})

    def _writable(self, groups: dict) -> dict | None:
        """The repo a write route names, when this request may write to it (else answered)."""
        repo = self._repo(groups["type"], groups["repo"], groups.get("rev"))
        if repo is not None and self._need_write(repo["id"]):
            return repo
        return None

    def _xet_token(self, groups: dict) -> None:
        if groups["type"] == "bucket":
            bucket = self._bucket(groups["repo"])
            if bucket is None or (groups["kind"] == "write" and not self._need_write(bucket["id"])):
                return
        else:
            repo = self._repo(groups["type"], groups["repo"], groups.get("rev"))
            if repo is None or (groups["kind"] == "write" and not self._need_write(repo["id"])):
                return
        expiry = int(time.time()) + 3600
        cas = self.hub.storage.cas_url
        headers = {
            "X-Xet-Cas-Url": cas,
            "X-Xet-Access-Token": "local",
            "X-Xet-Token-Expiration": expiry,
        }
        self._json({"casUrl": cas, "accessToken": "local", "exp": expiry}, headers)

    def _lfs_batch(self, groups: dict) -> None:
        if self._writable(groups) is None:
            return
        objects = []
        for obj in json.loads(self.body)["objects"]:
            entry = {"oid": obj["oid"], "size": obj["size"]}
            if not (self.hub.storage.blobs / obj["oid"]).exists():
                entry["actions"] = {
                    "upload": {"href": f"{self.hub.url}/_lfs/{obj['oid']}", "header": {}}
                }
            objects.append(entry)
        self._json({"transfer": "basic", "objects": objects})

    def _lfs_put(self, groups: dict) -> None:
        if hashlib.sha256(self.body).hexdigest() != groups["oid"]:
            return self._error(400, "The uploaded content does not match its sha256.")
        self.hub.storage.put(self.body)
        self._send(200)

    def _commit(self, groups: dict) -> None:
        repo = self._writable(groups)
        if repo is None:
            return
        lines = [json.loads(line) for line in self.body.splitlines() if line.strip()]
        header = next((x["value"] for x in lines if x["key"] == "header"), {})
        with self.hub._write_lock:
            if header.get("parentCommit") not in (None, repo["sha"]):
                return self._error(
                    412, "A commit has happened since. Please refresh and try again."
                )
            files, added, deleted = dict(repo["files"]), [], []
            for item in (x for x in lines if x["key"] != "header"):
                key, value = item["key"], item["value"]
                path = value["path"].strip("/")
                if key == "file":
                    blob = self.hub.storage.put(base64.b64decode(value["content"]))
                    files[path] = self.hub.file_entry(path, blob, lfs=False)
                elif key == "lfsFile":
                    blob = self.hub.storage.lfs(value["oid"])
                    if blob is None:
                        return self._error(
                            422, f"LFS object {value['oid']} of {path} was never uploaded."
                        )
                    files[path] = self.hub.file_entry(path, blob, lfs=True, sha256=value["oid"])
                elif key == "deletedFile":
                    if files.pop(path, None) is None:
                        return self._error(
                            404, f"A file with this name doesn't exist: {path}", "EntryNotFound"
                        )
                elif key == "deletedFolder":
                    gone = [p for p in files if p.startswith(path + "/")]
                    if not gone:
                        return self._error(
                            404, f"A folder with this name doesn't exist: {path}", "EntryNotFound"
                        )
                    for p in gone:
                        del files[p]
                else:
                    return self._error(400, f"Unknown commit operation {key!r}.")
                (deleted if key.startswith("deleted") else added).append(path)
            self.hub.set_files(repo, files)
            repo["commits"].append(
                {
                    "oid": repo["sha"],
                    "title": header.get("summary", ""),
                    "added": added,
                    "deleted": deleted,
                }
            )
        prefix = "" if repo["type"] == "model" else f"{repo['type']}s/"
        url = f"{self.hub.url}/{prefix}{repo['id']}/commit/{repo['sha']}"
        self._json(
            {"success": True, "commitOid": repo["sha"], "commitUrl": url, "pullRequestUrl": None}
        )

    # --- buckets --------------------------------------------------------------------------------

    def _bucket(self, bucket_id: str) -> dict | None:
        bucket = self.hub.buckets.get(bucket_id)
        if bucket is None or (bucket["private"] and not self.authed):
            return self._error(404, f"Bucket {bucket_id} not found", "BucketNotFound")
        return bucket

    def _create_bucket(self, groups: dict) -> None:
        bucket_id = groups["repo"]
        if not self._need_write(f"the namespace {bucket_id.split('/')[0]}"):
            return
        url = f"{self.hub.url}/buckets/{bucket_id}"
        if bucket_id in self.hub.buckets:
            message = "You already created this bucket"
            return self._json({"error": message, "url": url}, {"X-Error-Message": message}, 409)
        body = json.loads(self.body or b"{}")
        self.hub.buckets[bucket_id] = {
            "id": bucket_id,
            "private": body.get("visibility") == "private",
            "files": {},
        }
        self._json({"url": url, "id": bucket_id})

    def _bucket_info(self, groups: dict) -> None:
        if bucket := self._bucket(groups["repo"]):
            files = bucket["files"].values()
            self._json(
                {
                    "id": bucket["id"],
                    "private": bucket["private"],
                    "createdAt": DATE,
                    "size": sum(f["size"] for f in files),
                    "totalFiles": len(files),
                }
            )

    def _bucket_batch(self, groups: dict) -> None:
        bucket = self._bucket(groups["repo"])
        if bucket is None or not self._need_write(bucket["id"]):
            return
        failed = []
        with self.hub._write_lock:
            for op in (json.loads(line) for line in self.body.splitlines() if line.strip()):
                path = op["path"].strip("/")
                if op["type"] == "deleteFile":
                    bucket["files"].pop(path, None)
                    continue
                blob = self.hub.storage.xet(op["xetHash"])
                if op["type"] != "addFile" or blob is None:
                    failed.append(
                        {"path": path, "error": "unknown operation or Xet file not in the CAS"}
                    )
                    continue
                size = blob.stat().st_size
                bucket["files"][path] = {
                    "path": path,
                    "size": size,
                    "xetHash": op["xetHash"],
                    "abs": blob,
                    "mtime": op.get("mtime"),
                }
        self._json({"failed": failed}, status=422 if failed else 200)

    def _bucket_entry(self, f: dict) -> dict:
        mtime = f["mtime"] and time.strftime(
            "%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(f["mtime"] / 1000)
        )
        return {
            "type": "file",
            "path": f["path"],
            "size": f["size"],
            "xetHash": f["xetHash"],
            "mtime": mtime,
            "uploadedAt": DATE,
        }

    def _bucket_tree(self, groups: dict) -> None:
        bucket = self._bucket(groups["repo"])
        if bucket is None:
            return
        prefix = (groups.get("path") or "").strip("/")
        recursive = self._flag("recursive")
        entries, dirs = [], set()
        for path in sorted(bucket["files"]):
            if prefix and not path.startswith(prefix + "/"):
                continue
            rest = path[len(prefix) + 1 :] if prefix else path
            if "/" in rest and not recursive:
                dirs.add((prefix + "/" if prefix else "") + rest.split("/")[0])
                continue
            entries.append(self._bucket_entry(bucket["files"][path]))
        entries += [{"type": "directory", "path": d, "uploadedAt": DATE} for d in sorted(dirs)]
        self._page(entries, self.hub.page_size)

    def _bucket_paths_info(self, groups: dict) -> None:
        if bucket := self._bucket(groups["repo"]):
            paths = json.loads(self.body or b"{}").get("paths", [])
            self._json(
                [self._bucket_entry(bucket["files"][p]) for p in paths if p in bucket["files"]]
            )

    def _bucket_resolve(self, groups: dict) -> None:
        bucket = self._bucket(groups["repo"])
        if bucket is None:
            return
        f = bucket["files"].get(groups["path"])
        if f is None:
            return self._error(404, "Entry not found", "EntryNotFound")
        refresh = f"{self.hub.url}/api/buckets/{bucket['id']}/xet-read-token"
        headers = {
            "X-Xet-Hash": f["xetHash"],
            "X-Xet-Refresh-Route": refresh,
            "ETag": f'"{f["xetHash"]}"',
        }
        self._send_file(
            f["abs"], f["size"], {"Content-Type": "application/octet-stream", **headers}
        )
