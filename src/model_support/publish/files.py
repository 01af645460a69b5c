"""What a push puts on the Hub, file by file, and how a file is known to be there already.

A push compares each file it would upload with the repo's listing (or the bucket's) and uploads only
what differs: the card, the Parquet files, the report and logs in a dataset repo by their git blob
id or LFS sha256 (hashed from disk in one streaming pass), a bucket's files by their Xet hash.

Raw logs (``--logs``): each sweep's ``sweep.json``, executed notebooks (``notebooks/*.ipynb``) and
logs (``logs/*.log``) go under ``logs/<sweep_id>/`` in the dataset repo, or under ``<sweep_id>/`` in
a bucket. The sweep redacted them when it stored them; they are redacted again on their way out
(``model_support.redact``: the ``hf_...`` token shape and the token variables of this process, the
push's own token included) and local model folders' paths become their portable ids
(``local:<folder>``), as in the records, into a staging folder from which they are uploaded.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from ..probe.model_ids import machine_paths
from ..record import store
from ..redact import redact

#: The files of a sweep folder that ``--logs`` publishes, relative to it.
LOG_GLOBS = ("sweep.json", "notebooks/*.ipynb", "logs/*.log")


@dataclass(frozen=True)
class Upload:
    """One file to publish: its path in the repo (or bucket), where its bytes are, the sweep it
    belongs to (None for the card) and its kind: card, results, excluded, report or logs."""

    path: str
    source: Path
    sweep_id: str | None
    kind: str

    @cached_property
    def digests(self) -> tuple[str, str]:
        """(sha256, git blob sha1) of the file, in one pass: an LFS file is known by the first, a
        regular one by the second."""
        size = self.source.stat().st_size
        sha256, sha1 = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)
        with open(self.source, "rb") as handle:
            while block := handle.read(1 << 20):
                sha256.update(block)
                sha1.update(block)
        return sha256.hexdigest(), sha1.hexdigest()

    def same_as(self, remote) -> bool:
        """True when the repo's file (a ``RepoFile``, or None) holds exactly these bytes."""
        if remote is None:
            return False
        sha256, sha1 = self.digests
        return remote.lfs.sha256 == sha256 if remote.lfs else remote.blob_id == sha1


def dataset_files(data_dir: Path) -> list[Upload]:
    """Each sweep's Parquet file of each config, as the card's ``configs`` globs find them."""
    files = []
    for config in store.DATASET_CONFIGS:
        for path in sorted((Path(data_dir) / config).glob("sweep=*/*.parquet")):
            sweep_id = path.parent.name.removeprefix("sweep=")
            files.append(Upload(path.relative_to(data_dir).as_posix(), path, sweep_id, config))
    return files


def repro_files(data_dir: Path) -> list[Upload]:
    """The repro scripts' bodies, ``repro/<sha256>.py``, each once for every sweep (a row names
    its body by ``repro_sha256``): uploaded beside the Parquet files, never deleted (rows of
    other sweeps may name them)."""
    folder = store.repro_dir(data_dir)
    return [
        Upload(f"{store.REPRO}/{path.name}", path, None, "repro")
        for path in sorted(folder.glob("*.py"))
    ]


def dataset_sweep(path_in_repo: str) -> str | None:
    """The sweep a repo's ``results/`` or ``excluded/`` Parquet file belongs to, else None."""
    parts = path_in_repo.split("/")
    if (
        len(parts) == 3
        and parts[0] in store.DATASET_CONFIGS
        and parts[1].startswith("sweep=")
        and parts[2].endswith(".parquet")
    ):
        return parts[1].removeprefix("sweep=")
    return None


def log_destination(endpoint: str, repo_id: str, bucket: str | None, sweep_id: str) -> dict:
    """Where a sweep's logs go (``store.published_logs``' shape): under ``logs/<sweep_id>/`` in
    the dataset repo, linked to the Hub's file view; or under ``<sweep_id>/`` in the bucket,
    linked to its file."""
    endpoint = endpoint.rstrip("/")
    if bucket:
        return {
            "repo": repo_id,
            "bucket": bucket,
            "prefix": f"{sweep_id}/",
            "url": f"{endpoint}/buckets/{bucket}/resolve/{sweep_id}/",
        }
    url = f"{endpoint}/datasets/{repo_id}/blob/main/logs/{sweep_id}/"
    return {"repo": repo_id, "bucket": None, "prefix": f"logs/{sweep_id}/", "url": url}


def public_sweep_json(text: str) -> str:
    """A sweep.json as it is published: a local model's ``source`` (a folder on this machine) is
    its portable id, and the cache folder is left out."""
    raw = json.loads(text)
    for entry in raw.get("models") or []:
        if isinstance(entry, dict) and entry.get("source") and machine_paths(entry["source"]):
            entry["source"] = entry.get("model_id") or ""
    if isinstance(raw.get("cache"), dict):
        raw["cache"].pop("dir", None)
    return json.dumps(raw, indent=1, default=str) + "\n"


def stage_logs(
    data_dir: Path, sweep_id: str, prefix: str, stage: Path, secrets: tuple[str, ...] = ()
) -> list[Upload]:
    """The sweep's ``LOG_GLOBS`` files, redacted into ``stage`` (see the module docstring), as
    uploads to ``prefix`` + their path in the sweep folder. ``secrets``: more strings that must
    not leave (a token given to the push directly rather than through the environment)."""
    folder = store.sweep_dir(data_dir, sweep_id)
    meta = store.read_sweep(data_dir, sweep_id)
    replace = {
        old: new for entry in meta.models for old, new in machine_paths(entry.source).items()
    }
    replace.update({secret: "***" for secret in secrets if secret})
    uploads = []
    for pattern in LOG_GLOBS:
        for path in sorted(folder.glob(pattern)):
            rel = path.relative_to(folder).as_posix()
            text = path.read_bytes().decode("utf-8", "surrogateescape")
            if rel == "sweep.json":
                text = public_sweep_json(text)
            out = stage / prefix / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(redact(text, replace).encode("utf-8", "surrogateescape"))
            uploads.append(Upload(prefix + rel, out, sweep_id, "logs"))
    return uploads
