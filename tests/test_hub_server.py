"""tests/hub_server.py against the real huggingface_hub 2.4.0 client (no network: everything is
local): downloads and their faults, then the write side (dataset repos, commits through Xet and LFS,
buckets).

Pointing the client at the server: huggingface_hub reads HF_ENDPOINT (and HF_HUB_OFFLINE) once, at
import, into `huggingface_hub.constants.ENDPOINT` (`constants.HF_HUB_OFFLINE`), so setting the
variable in a process that already imported it changes nothing. In-process, pass
`endpoint=server.url` to HfApi / hf_hub_download / snapshot_download (and monkeypatch
`constants.HF_HUB_OFFLINE` to False, since tests/conftest.py sets HF_HUB_OFFLINE=1); a subprocess
started with HF_ENDPOINT=server.url (and HF_HUB_OFFLINE=0) needs nothing else. Both are exercised
below.

What the client does with each fault (asserted below, huggingface_hub 2.4.0 + httpx2):
  - hf_hub_download: its HEAD (get_hf_file_metadata) is first tried without retries; on a
    408/429/5xx or a connection error, with nothing cached, it is retried once more through
    `http_backoff(max_retries=5, base_wait_time=1, max_wait_time=8)` (waits 1, 2, 4, 8, 8 s, or
    Retry-After + 1 s): 503 twice then OK succeeds by itself after ~1 s.
  - the body GET (`http_get`) retries only 408/429 (http_stream_backoff, Retry-After + 1 s); a 5xx
    on the GET raises HfHubHTTPError(status 503) at once and the caller must retry.
  - a body cut short raises httpx2.RemoteProtocolError inside http_get, which retries by itself
    after 1 s (up to 5 times in a row without progress) with `Range: bytes=<kept>-`, where <kept>
    counts only whole DOWNLOAD_CHUNK_SIZE (10 MiB) chunks: a smaller file is fetched again from 0
    without Range. If it never progresses, hf_hub_download raises httpx2.RemoteProtocolError, no
    blob is left.
  - connection refused: HfApi methods raise httpx2.ConnectError (not wrapped, no retry);
    hf_hub_download retries the HEAD 5 times (1+2+4+8+8 s) then raises LocalEntryNotFoundError
    whose __cause__ is httpx2.ConnectError.
  - HfApi.model_info does not retry (503 -> HfHubHTTPError); list_models / list_repo_tree paginate
    through http_backoff and so retry 429/5xx by themselves.
  - errors: unknown repo -> RepositoryNotFoundError (401 + X-Error-Code RepoNotFound; over http://
    the client needs the header, the bare-401 fallback only matches https URLs), unknown revision ->
    RevisionNotFoundError, unknown file -> RemoteEntryNotFoundError (an EntryNotFoundError), gated
    -> GatedRepoError (a RepositoryNotFoundError subclass).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import httpx2
import pytest
from huggingface_hub import HfApi, constants, hf_hub_download, hf_hub_url, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import get_hf_file_metadata
from huggingface_hub.hf_api import RepoFile, RepoFolder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hub_server import HubServer, closed_port, serve

TOKEN = "hf_hubServerTestToken"
FILES = {
    "config.json",
    "tokenizer.json",
    "model.safetensors",
    "model.gguf",
    "onnx/model.onnx",
    "pytorch_model.bin",
    "README.md",
}


def make_model(folder: Path, seed: int = 0) -> Path:
    """A tiny model folder: json files, a valid ~200 KB safetensors, gguf, onnx, a 400 KB .bin, a
    card."""
    rnd = __import__("random").Random(seed)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    (folder / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    header = {
        "w": {"dtype": "F32", "shape": [256, 200], "data_offsets": [0, 204800]},
        "b": {"dtype": "BF16", "shape": [100], "data_offsets": [204800, 205000]},
        "__metadata__": {"format": "pt"},
    }
    blob = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(
        struct.pack("<Q", len(blob)) + blob + rnd.randbytes(205000)
    )
    (folder / "model.gguf").write_bytes(b"GGUF" + rnd.randbytes(2000))
    (folder / "onnx").mkdir()
    (folder / "onnx" / "model.onnx").write_bytes(rnd.randbytes(1000))
    (folder / "pytorch_model.bin").write_bytes(rnd.randbytes(400_000))
    (folder / "README.md").write_text(
        "---\nlicense: apache-2.0\nbase_model: org/base\ntags:\n- tiny\n---\n# Tiny\n"
    )
    (folder / ".hidden").write_text("not served")
    return folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("repos") / "tiny")


@pytest.fixture
def hub(model_dir, tmp_path, monkeypatch):
    """A server with org/tiny (public), org/gated (gated), org/private; the client set to online."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    repos = {"org/tiny": model_dir, "org/gated": model_dir, "org/private": model_dir}
    with serve(
        repos,
        gated=["org/gated"],
        private=["org/private"],
        tokens=[TOKEN],
        metadata={"org/tiny": {"downloads": 42, "likes": 7}},
    ) as server:
        server.cache = str(tmp_path / "cache")
        yield server


def calls(server: HubServer, method: str, file: str) -> list[dict]:
    return [r for r in server.requests if r["method"] == method and r["file"] == file]


def download(server: HubServer, filename: str, repo: str = "org/tiny", **kw) -> str:
    return hf_hub_download(repo, filename, endpoint=server.url, cache_dir=server.cache, **kw)


def test_snapshot_download_and_cache(hub, model_dir):
    path = Path(
        snapshot_download(
            "org/tiny", allow_patterns=["*.json", "onnx/*"], endpoint=hub.url, cache_dir=hub.cache
        )
    )
    got = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()}
    assert got == {"config.json", "tokenizer.json", "onnx/model.onnx"}
    assert all((path / f).read_bytes() == (model_dir / f).read_bytes() for f in got)
    assert path.name == hub.sha("org/tiny")

    local = download(hub, "model.safetensors")
    assert Path(local).read_bytes() == (model_dir / "model.safetensors").read_bytes()
    assert len(calls(hub, "GET", "model.safetensors")) == 1
    # second call: a HEAD, no new GET of the body
    assert download(hub, "model.safetensors") == local
    assert len(calls(hub, "GET", "model.safetensors")) == 1
    assert len(calls(hub, "HEAD", "model.safetensors")) == 2


def test_resolve_headers_and_ranges(hub, model_dir):
    data = (model_dir / "model.safetensors").read_bytes()
    meta = get_hf_file_metadata(
        hf_hub_url("org/tiny", "model.safetensors", endpoint=hub.url), token=False
    )
    assert (meta.etag, meta.size, meta.commit_hash) == (
        hashlib.sha256(data).hexdigest(),
        len(data),
        hub.sha("org/tiny"),
    )
    url = f"{hub.url}/org/tiny/resolve/main/config.json"
    # no Accept-Encoding
    with urllib.request.urlopen(urllib.request.Request(url, method="HEAD")) as r:
        assert r.headers["ETag"].startswith('"') and "X-Linked-Etag" not in r.headers
        assert int(r.headers["Content-Length"]) == (model_dir / "config.json").stat().st_size
    request = urllib.request.Request(
        url.replace("config.json", "model.safetensors"), headers={"Range": "bytes=10-19"}
    )
    with urllib.request.urlopen(request) as r:
        assert (r.status, r.headers["Content-Range"], r.read()) == (
            206,
            f"bytes 10-19/{len(data)}",
            data[10:20],
        )
        assert (
            r.headers["X-Linked-Size"] == str(len(data)) and r.headers["Accept-Ranges"] == "bytes"
        )


def test_model_info_tree_and_list(hub, model_dir, tmp_path):
    api = HfApi(endpoint=hub.url, token=False)
    info = api.model_info("org/tiny", files_metadata=True)
    assert info.sha == hub.sha("org/tiny") and len(info.sha) == 40
    siblings = {s.rfilename: s for s in info.siblings}
    assert set(siblings) == FILES
    st = (model_dir / "model.safetensors").read_bytes()
    assert siblings["model.safetensors"].size == len(st)
    assert siblings["model.safetensors"].lfs.sha256 == hashlib.sha256(st).hexdigest()
    assert siblings["config.json"].lfs is None and siblings["onnx/model.onnx"].lfs is not None
    cfg = (model_dir / "config.json").read_bytes()
    assert (
        siblings["config.json"].blob_id == hashlib.sha1(b"blob %d\0" % len(cfg) + cfg).hexdigest()
    )
    assert (
        info.safetensors.parameters == {"F32": 51200, "BF16": 100}
        and info.safetensors.total == 51300
    )
    assert (info.pipeline_tag, info.downloads, info.likes, info.gated) == (
        "text-generation",
        42,
        7,
        False,
    )
    assert info.card_data.license == "apache-2.0" and info.card_data.base_model == "org/base"
    assert "license:apache-2.0" in info.tags and "safetensors" in info.tags
    assert api.model_info("org/tiny", revision=info.sha).sha == info.sha
    (tmp_path / "rand").mkdir()
    # no valid header: no parameters
    (tmp_path / "rand" / "model.safetensors").write_bytes(os.urandom(20_000))
    hub.add_repo("org/rand", tmp_path / "rand")
    assert api.model_info("org/rand").safetensors is None
    slim = api.model_info("org/tiny", expand=["downloads", "likes"])
    assert (slim.downloads, slim.likes, slim.siblings, slim.pipeline_tag) == (42, 7, None, None)

    tree = list(api.list_repo_tree("org/tiny", recursive=True))
    files = {f.path: f.size for f in tree if isinstance(f, RepoFile)}
    assert files == {f: (model_dir / f).stat().st_size for f in FILES}
    assert [f.path for f in tree if isinstance(f, RepoFolder)] == ["onnx"]
    assert {f.path for f in api.list_repo_tree("org/tiny")} == FILES - {"onnx/model.onnx"} | {
        "onnx"
    }
    assert [f.path for f in api.list_repo_tree("org/tiny", path_in_repo="onnx")] == [
        "onnx/model.onnx"
    ]
    hub.page_size = 3  # cursor pagination through Link headers
    before = len(hub.requests)
    assert {f.path for f in api.list_repo_tree("org/tiny", recursive=True)} == set(files) | {"onnx"}
    assert len(hub.requests) - before == 3


def test_list_models(model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    small = tmp_path / "small"
    small.mkdir()
    (small / "config.json").write_text("{}")
    meta = {
        "org/a": {"downloads": 10, "likes": 5},
        "org/b": {"downloads": 30, "likes": 1},
        "org/c": {"downloads": 20, "likes": 9},
        "org/cls": {"downloads": 1000, "pipeline_tag": "text-classification"},
    }
    with serve({k: small for k in meta}, metadata=meta) as server:
        api = HfApi(endpoint=server.url, token=False)
        top = list(api.list_models(pipeline_tag="text-generation", sort="downloads", limit=2))
        assert [(m.id, m.downloads) for m in top] == [("org/b", 30), ("org/c", 20)]
        assert [m.id for m in api.list_models(filter="text-generation", sort="likes")] == [
            "org/c",
            "org/a",
            "org/b",
        ]
        assert [m.id for m in api.list_models(search="cl")] == ["org/cls"]
        full = next(iter(api.list_models(search="org/a", full=True)))
        assert full.sha and [s.rfilename for s in full.siblings] == ["config.json"]


def test_errors(hub):
    api = HfApi(endpoint=hub.url, token=False)
    for call in (
        lambda: download(hub, "config.json", repo="org/nope"),
        lambda: api.model_info("org/nope"),
        lambda: download(hub, "config.json", repo="org/private", token=False),
    ):
        with pytest.raises(RepositoryNotFoundError) as err:
            call()
        assert type(err.value) is RepositoryNotFoundError and err.value.response.status_code == 401
    with pytest.raises(RevisionNotFoundError):
        download(hub, "config.json", revision="v9")
    with pytest.raises(RevisionNotFoundError):
        api.model_info("org/tiny", revision="v9")
    with pytest.raises(EntryNotFoundError) as err:
        download(hub, "missing.txt")
    assert err.value.response.status_code == 404
    assert api.model_info("org/private", token=TOKEN).private is True
    assert download(hub, "config.json", repo="org/private", token=TOKEN)
    assert api.whoami(token=TOKEN)["name"] == "hub-server-user"


def test_gated(hub, model_dir):
    api = HfApi(endpoint=hub.url, token=False)
    assert api.model_info("org/gated").gated == "manual"  # model info stays public
    for token in (False, "hf_notAccepted"):
        with pytest.raises(GatedRepoError) as err:
            download(hub, "config.json", repo="org/gated", token=token)
        assert err.value.response.status_code == 401
        assert "Access to model org/gated is restricted" in str(err.value)
    assert (
        Path(download(hub, "config.json", repo="org/gated", token=TOKEN)).read_bytes()
        == (model_dir / "config.json").read_bytes()
    )
    hub.faults.gate("org/tiny")
    with pytest.raises(GatedRepoError):
        download(hub, "config.json", token=False)
    hub.faults.clear()
    assert download(hub, "config.json", token=False)


def test_503_is_retried_on_head_not_on_get(hub):
    hub.faults.fail(503, times=2, path="config.json")
    start = time.monotonic()
    # HEAD 503 (no retry), then HEAD with backoff: 503, 1 s, 200
    assert download(hub, "config.json")
    assert time.monotonic() - start >= 1
    assert [r["status"] for r in calls(hub, "HEAD", "config.json")] == [503, 503, 200]

    hub.faults.fail(503, times=1, path="tokenizer.json", method="GET")
    with pytest.raises(HfHubHTTPError) as err:
        download(hub, "tokenizer.json")
    assert err.value.response.status_code == 503 and type(err.value) is HfHubHTTPError
    assert download(hub, "tokenizer.json")  # the caller's own retry succeeds

    api = HfApi(endpoint=hub.url, token=False)
    hub.faults.fail(503, times=1)
    with pytest.raises(HfHubHTTPError):  # model_info: no retry
        api.model_info("org/tiny")
    hub.faults.fail(503, times=1)
    # retried (http_backoff); private hidden
    assert [m.id for m in api.list_models()] == ["org/gated", "org/tiny"]


def test_429_retry_after(hub):
    hub.faults.fail(429, times=1, retry_after=1, path="config.json")  # on the HEAD: re-HEAD at once
    assert download(hub, "config.json")
    assert [r["status"] for r in calls(hub, "HEAD", "config.json")] == [429, 200]
    hub.faults.fail(429, times=1, retry_after=1, path="tokenizer.json", method="GET")
    start = time.monotonic()
    assert download(hub, "tokenizer.json")  # on the GET: http_get waits Retry-After + 1 s
    assert time.monotonic() - start >= 2
    assert [r["status"] for r in calls(hub, "GET", "tokenizer.json")] == [429, 200]


def test_cut_body_is_retried_and_resumed_with_range(hub, model_dir, tmp_path, monkeypatch):
    data = (model_dir / "pytorch_model.bin").read_bytes()
    hub.faults.cut(after_bytes=1000, times=1, path="pytorch_model.bin")
    assert Path(download(hub, "pytorch_model.bin")).read_bytes() == data
    # http_get keeps only whole 10 MiB chunks: restarts at 0
    gets = calls(hub, "GET", "pytorch_model.bin")
    assert [(g["status"], g["bytes"], g["headers"].get("Range")) for g in gets] == [
        (200, 1000, None),
        (200, len(data), None),
    ]
    big = tmp_path / "big"
    big.mkdir()
    chunk = constants.DOWNLOAD_CHUNK_SIZE  # 10 MiB
    (big / "big.bin").write_bytes(os.urandom(chunk + 300_000))
    hub.add_repo("org/big", big)
    hub.faults.cut(after_bytes=chunk + 1000, times=1, path="big.bin")
    local = hf_hub_download("org/big", "big.bin", endpoint=hub.url, cache_dir=hub.cache)
    assert Path(local).read_bytes() == (big / "big.bin").read_bytes()
    gets = calls(hub, "GET", "big.bin")  # resumed from the last whole chunk with a Range request
    assert [(g["status"], g["bytes"], g["headers"].get("Range")) for g in gets] == [
        (200, chunk + 1000, None),
        (206, 300_000, f"bytes={chunk}-"),
    ]

    sleeps = []
    monkeypatch.setattr(time, "sleep", sleeps.append)  # http_get pauses 1 s between resumes
    hub.faults.cut(after_bytes=0, times=None, path="model.gguf")
    with pytest.raises(httpx2.RemoteProtocolError):
        download(hub, "model.gguf")
    assert sleeps == [1] * 5 and len(calls(hub, "GET", "model.gguf")) == 6
    blobs = Path(hub.cache) / "models--org--tiny" / "blobs"
    gguf_sha = hashlib.sha256((model_dir / "model.gguf").read_bytes()).hexdigest()
    assert not (blobs / gguf_sha).exists() and not list(blobs.glob("*.incomplete"))
    hub.faults.clear()
    assert Path(download(hub, "model.gguf")).read_bytes() == (model_dir / "model.gguf").read_bytes()


def test_throttle(hub):
    hub.faults.throttle(200_000, path="pytorch_model.bin")
    start = time.monotonic()
    download(hub, "pytorch_model.bin")
    assert 1.5 <= time.monotonic() - start < 10


def test_connection_refused(hub, monkeypatch):
    dead = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(httpx2.ConnectError):
        HfApi(endpoint=dead, token=False).model_info("org/tiny")
    sleeps = []
    monkeypatch.setattr(time, "sleep", sleeps.append)
    with pytest.raises(LocalEntryNotFoundError) as err:
        hf_hub_download("org/tiny", "config.json", endpoint=dead, cache_dir=hub.cache)
    assert isinstance(err.value.__cause__, httpx2.ConnectError) and sleeps == [1, 2, 4, 8, 8]

    api = HfApi(endpoint=hub.url, token=False)
    assert api.model_info("org/tiny").sha  # leaves a pooled keep-alive connection
    hub.faults.refuse_connections(True)
    with pytest.raises(httpx2.ConnectError):
        api.model_info("org/tiny")
    hub.faults.refuse_connections(False)
    assert api.model_info("org/tiny").sha


def test_cli_control_endpoint_and_hf_endpoint_env(model_dir, tmp_path, monkeypatch):
    """A server in another process (the CLI), faults set over HTTP, a client configured by
    HF_ENDPOINT."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    proc = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("hub_server.py")),
            "--port",
            "0",
            "--repo",
            f"org/tiny={model_dir}",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = proc.stdout.readline().strip()
        rules = json.dumps(
            [{"kind": "fail", "status": 503, "times": 1, "repo": "org/tiny"}]
        ).encode()
        with urllib.request.urlopen(
            urllib.request.Request(f"{url}/_control/faults", data=rules)
        ) as r:
            assert json.load(r)[0]["status"] == 503
        api = HfApi(endpoint=url, token=False)
        with pytest.raises(HfHubHTTPError) as err:
            api.model_info("org/tiny")
        assert err.value.response.status_code == 503
        assert api.model_info("org/tiny").id == "org/tiny"
        with urllib.request.urlopen(f"{url}/_control/requests") as r:
            assert [x["status"] for x in json.load(r)] == [503, 200]

        # too late for this process: read at import (put back after the test)
        monkeypatch.setenv("HF_ENDPOINT", url)
        assert constants.ENDPOINT != url
        code = (
            "from huggingface_hub import hf_hub_download as d; print(open(d('org/tiny', "
            "'config.json')).read())"
        )
        env = {
            **os.environ,
            "HF_ENDPOINT": url,
            "HF_HUB_OFFLINE": "0",
            "HF_HUB_CACHE": str(tmp_path / "c"),
        }
        out = subprocess.run(
            [sys.executable, "-c", code],
            check=False,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.stdout.strip() == (model_dir / "config.json").read_text(), out.stderr
        with urllib.request.urlopen(
            urllib.request.Request(f"{url}/_control/faults", method="DELETE")
        ) as r:
            assert json.load(r) == []
    finally:
        proc.terminate()
        proc.wait(10)


# --------------------------------------------------------------------------------------------
# the write side (hub_writes): dataset repos, commits through Xet and LFS, buckets

WRITE_TOKEN = "hf_hubServerWriteToken"


@pytest.fixture
def writable(hub):
    hub.write_tokens.add(WRITE_TOKEN)
    return hub


@pytest.mark.parametrize("xet", [True, False])
def test_upload_folder_to_a_dataset_and_read_it_back(writable, tmp_path, monkeypatch, xet):
    """upload_folder through Xet (hf_xet writing into the server's local CAS) or through the LFS
    batch API; HfFileSystem and get_paths_info then read the same bytes, and a second upload is a
    no-op."""
    from huggingface_hub import HfFileSystem

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", not xet)
    folder = tmp_path / "ds"
    (folder / "data").mkdir(parents=True)
    (folder / "README.md").write_text("---\nconfigs: []\n---\n# ds\n")
    # an LFS file (by extension and size)
    (folder / "data" / "a.parquet").write_bytes(os.urandom(30_000))
    (folder / "data" / "b.json").write_text('{"b": 1}')  # a regular one
    api = HfApi(endpoint=writable.url, token=WRITE_TOKEN)
    api.create_repo("org/ds", repo_type="dataset")
    commit = api.upload_folder(
        folder_path=str(folder), repo_id="org/ds", repo_type="dataset", commit_message="one"
    )
    repo = writable.repo("org/ds", "dataset")
    assert commit.oid == repo["sha"] and [c["title"] for c in repo["commits"]] == ["one"]
    routes = {r["route"] for r in writable.requests}
    assert ("xet_token" in routes) == xet and ("lfs_put" in routes) == (not xet)
    assert (
        repo["files"]["data/a.parquet"]["sha256"] and repo["files"]["data/b.json"]["sha256"] is None
    )
    fs = HfFileSystem(endpoint=writable.url, token=WRITE_TOKEN)
    assert (
        fs.read_bytes("datasets/org/ds/data/a.parquet")
        == (folder / "data" / "a.parquet").read_bytes()
    )
    assert sorted(fs.ls("datasets/org/ds/data", detail=False)) == [
        "datasets/org/ds/data/a.parquet",
        "datasets/org/ds/data/b.json",
    ]
    infos = api.get_paths_info("org/ds", ["data/b.json", "data", "missing"], repo_type="dataset")
    assert [(type(i).__name__, i.path) for i in infos] == [
        ("RepoFile", "data/b.json"),
        ("RepoFolder", "data"),
    ]
    api.upload_folder(
        folder_path=str(folder), repo_id="org/ds", repo_type="dataset", commit_message="two"
    )
    assert len(repo["commits"]) == 1  # nothing changed: the client skipped the commit


def test_writes_need_a_write_token_and_a_commit_is_all_or_nothing(writable):
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    with pytest.raises(HfHubHTTPError) as err:
        HfApi(endpoint=writable.url, token=False).create_repo("org/ds", repo_type="dataset")
    assert err.value.response.status_code == 401
    with pytest.raises(HfHubHTTPError) as err:
        # a read token
        HfApi(endpoint=writable.url, token=TOKEN).create_repo("org/ds", repo_type="dataset")
    assert (
        err.value.response.status_code == 403 and writable._repos.get(("dataset", "org/ds")) is None
    )
    api = HfApi(endpoint=writable.url, token=WRITE_TOKEN)
    api.create_repo("org/ds", repo_type="dataset", private=True)
    api.create_commit(
        "org/ds", [CommitOperationAdd("a.txt", b"a")], commit_message="a", repo_type="dataset"
    )
    repo = writable.repo("org/ds", "dataset")
    before = (repo["sha"], dict(repo["files"]))
    add, delete = CommitOperationAdd("b.txt", b"b"), CommitOperationDelete("missing.txt")
    with pytest.raises(EntryNotFoundError):  # one bad operation refuses the whole commit
        api.create_commit("org/ds", [add, delete], commit_message="b", repo_type="dataset")
    assert (repo["sha"], dict(repo["files"])) == before
    with pytest.raises(HfHubHTTPError) as err:  # made on a head that is no longer the head
        api.create_commit(
            "org/ds",
            [CommitOperationAdd("b.txt", b"b")],
            commit_message="b",
            repo_type="dataset",
            parent_commit="0" * 40,
        )
    assert err.value.response.status_code == 412 and (repo["sha"], dict(repo["files"])) == before


def test_a_bucket_round_trip_through_xet(writable, tmp_path):
    api = HfApi(endpoint=writable.url, token=WRITE_TOKEN)
    assert api.create_bucket("org/logs").bucket_id == "org/logs"
    assert api.create_bucket("org/logs", exist_ok=True).bucket_id == "org/logs"
    (tmp_path / "a.log").write_text("a log\n" * 100)
    api.batch_bucket_files(
        "org/logs", add=[(str(tmp_path / "a.log"), "s1/logs/a.log"), (b"{}", "s1/sweep.json")]
    )
    tree = {f.path: f for f in api.list_bucket_tree("org/logs", prefix="s1", recursive=True)}
    assert set(tree) == {"s1/logs/a.log", "s1/sweep.json"} and tree["s1/logs/a.log"].size == 600
    import hf_xet

    assert tree["s1/logs/a.log"].xet_hash == hf_xet.hash_files([str(tmp_path / "a.log")])[0].hash
    api.download_bucket_files("org/logs", files=[("s1/logs/a.log", str(tmp_path / "back.log"))])
    assert (tmp_path / "back.log").read_text() == "a log\n" * 100
    assert api.bucket_info("org/logs").total_files == 2
    with pytest.raises(HfHubHTTPError) as err:
        HfApi(endpoint=writable.url, token=TOKEN).batch_bucket_files(
            "org/logs", delete=["s1/sweep.json"]
        )
    assert (
        err.value.response.status_code == 403
        and "s1/sweep.json" in writable.buckets["org/logs"]["files"]
    )
