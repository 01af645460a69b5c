"""hub_fetch and hub against the local Hub stand-in (tests/hub_server.py): what is downloaded,
how each failure of the environment is classified and retried, model facts, model lists and the
cache budget.

Nothing here reaches the network: every request goes to a HubServer on 127.0.0.1 (``endpoint=``),
and huggingface_hub's offline switch, set by conftest.py, is turned off per test."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from huggingface_hub import constants, scan_cache_dir

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hub_server import closed_port, serve  # noqa: E402

from helpers import wait_until_blocked  # noqa: E402
from model_support.probe import hub, hub_fetch  # noqa: E402
from model_support.probe.hub_fetch import EnvironmentProblem, NoAccess, NoLoadableWeights, NotOnHub  # noqa: E402
from model_support.probe.records import FACT_FIELDS  # noqa: E402
from model_support.record import schema  # noqa: E402
from model_support.sweep import budget as sweep_budget  # noqa: E402  (the cache budget, the Hub lists)

REPO = Path(__file__).resolve().parents[1]
TOKEN = "hf_" + "HubFetchTestToken" + "x" * 16
FAST = {"backoff_s": 0.01, "max_backoff_s": 2.0}
FULL_PLAN = [
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
]
RETRY_LINE = re.compile(r"^retry \d+/\d+ in \d+\.\d s: .+$")


def _safetensors(path: Path, rows: int, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    tensors = {"w": torch.randn(rows, 256, generator=gen), "b": torch.zeros(rows)}
    save_file(tensors, str(path), metadata={"format": "pt"})


def _common(folder: Path, card: str = "") -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    (folder / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    (folder / "README.md").write_text(card or "# model\n")
    return folder


@pytest.fixture(scope="module")
def repos(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("repos")
    full = _common(
        root / "full",
        "---\nlicense: apache-2.0\nbase_model:\n- org/base\n- org/other\n---\n# full\n",
    )
    for name in ("generation_config.json", "tokenizer_config.json", "special_tokens_map.json"):
        (full / name).write_text(json.dumps({"file": name}))
    (full / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    _safetensors(full / "model.safetensors", 200, 0)  # ~205 KB
    (full / "model.gguf").write_bytes(b"GGUF" + os.urandom(3000))
    (full / "onnx").mkdir()
    (full / "onnx" / "model.onnx").write_bytes(os.urandom(2000))
    (full / "original").mkdir()
    (full / "original" / "consolidated.pth").write_bytes(os.urandom(30_000))
    (full / "flax_model.msgpack").write_bytes(os.urandom(20_000))
    (full / "pytorch_model.bin").write_bytes(os.urandom(60_000))
    (full / "modeling_custom.py").write_text("X = 1\n")
    (full / "sub").mkdir()
    (full / "sub" / "helper.py").write_text("Y = 2\n")

    sharded = _common(root / "sharded")
    shards = {"model-00001-of-00002.safetensors": 100, "model-00002-of-00002.safetensors": 120}
    for i, (name, rows) in enumerate(shards.items()):
        _safetensors(sharded / name, rows, i + 1)
    weight_map = {
        "w1": "model-00001-of-00002.safetensors",
        "w2": "model-00002-of-00002.safetensors",
    }
    (sharded / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    _safetensors(sharded / "consolidated.safetensors", 50, 9)  # a Mistral-style copy: never fetched

    bin_only = _common(root / "bin")
    # equal contents: one blob, one download
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        (bin_only / name).write_text("{}")
    (bin_only / "pytorch_model.bin").write_bytes(os.urandom(50_000))
    gguf = _common(root / "gguf")
    (gguf / "model-q4.gguf").write_bytes(b"GGUF" + os.urandom(5000))
    return {
        "org/full": full,
        "org/sharded": sharded,
        "org/bin": bin_only,
        "org/gguf": gguf,
        "org/gated": full,
        "org/private": bin_only,
    }


METADATA = {
    "org/full": {
        "downloads": 300,
        "likes": 5,
        "trendingScore": 9,
        "createdAt": "2024-05-06T07:08:09.000Z",
    },
    "org/sharded": {"downloads": 200, "likes": 50, "trendingScore": 1},
    "org/bin": {
        "downloads": 100,
        "likes": 7,
        "trendingScore": 30,
        "pipeline_tag": "text-generation",
    },
    "org/gguf": {
        "downloads": 400,
        "likes": 1,
        "trendingScore": 0,
        "pipeline_tag": "text2text-generation",
    },
}


@pytest.fixture
def server(repos, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for var in ("HF_HUB_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    # no stored token
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(REPO / "nonexistent" / "token"))
    monkeypatch.setattr(
        constants, "HF_STORED_TOKENS_PATH", str(REPO / "nonexistent" / "stored_tokens")
    )
    with serve(
        repos, gated=["org/gated"], private=["org/private"], tokens=[TOKEN], metadata=METADATA
    ) as srv:
        yield srv


def fetch(server, model_id, cache, **kw):
    kw = {"endpoint": server.url, "cache_dir": cache, "log": lambda line: None, **FAST, **kw}
    return hub_fetch.fetch(model_id, **kw)


def downloaded(server, repo=None) -> list[str]:
    """Files served with a body (the server logs a request just after answering it: let the log
    settle)."""
    count = -1
    while count != len(server.requests):
        count = len(server.requests)
        time.sleep(0.1)
    return sorted(
        r["file"]
        for r in server.requests
        if r["method"] == "GET"
        and r["file"]
        and r["status"] in (200, 206)
        and repo in (None, r["repo"])
    )


# -- planning
# ---------------------------------------------------------------------------------------------
def test_plan_files_shapes():
    common = {
        "config.json": 1,
        "tokenizer.json": 2,
        "README.md": 3,
        ".gitattributes": 4,
        "LICENSE": 5,
    }
    listing = {
        **common,
        "model.safetensors": 10,
        "pytorch_model.bin": 10,
        "model.gguf": 1,
        "onnx/model.onnx": 1,
        "original/consolidated.pth": 1,
        "consolidated.00.pth": 1,
        "flax_model.msgpack": 1,
        "tf_model.h5": 1,
        "merges.txt": 1,
        "vocab.json": 1,
        "tokenizer.model": 1,
        "chat_template.json": 1,
        "qwen.tiktoken": 1,
        "additional_chat_templates/tool.jinja": 1,
        "modeling_x.py": 1,
        "sub/y.py": 1,
        "spiece.model": 1,
    }
    plan = hub_fetch.plan_files(listing)
    assert plan == [
        "additional_chat_templates/tool.jinja",
        "chat_template.json",
        "config.json",
        "merges.txt",
        "model.safetensors",
        "qwen.tiktoken",
        "spiece.model",
        "tokenizer.json",
        "tokenizer.model",
        "vocab.json",
    ]
    assert hub_fetch.plan_files(listing, trust_remote_code=True) == sorted(plan + ["modeling_x.py"])
    sharded = {
        **common,
        "model.safetensors.index.json": 1,
        "model-00001-of-00002.safetensors": 5,
        "model-00002-of-00002.safetensors": 6,
        "consolidated.safetensors": 11,
        "pytorch_model.bin": 9,
    }
    assert hub_fetch.plan_files(sharded) == [
        "config.json",
        "model.safetensors.index.json",
        "tokenizer.json",
    ]
    assert hub_fetch.estimate_shards(sharded, ["model.safetensors.index.json"]) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    index = json.dumps(
        {
            "weight_map": {
                "a": "s1.safetensors",
                "b": "s2.safetensors",
                "c": "s1.safetensors",
                "d": "nested/s3.safetensors",
            }
        }
    )
    assert hub_fetch.shards_from_index(index) == ["s1.safetensors", "s2.safetensors"]
    bin_plan = hub_fetch.plan_files({**common, "pytorch_model.bin": 9})
    assert bin_plan == ["config.json", "pytorch_model.bin", "tokenizer.json"]
    assert "pytorch_model.bin.index.json" in hub_fetch.plan_files(
        {**common, "pytorch_model.bin.index.json": 1}
    )
    assert hub_fetch.repo_size(sharded, ["config.json", "model-00002-of-00002.safetensors"]) == 7

    with pytest.raises(
        NoLoadableWeights,
        match=r"^the repo has no weights transformers can load: only \.gguf files$",
    ):
        hub_fetch.plan_files({**common, "model-q4_k_m.gguf": 1})
    with pytest.raises(NoLoadableWeights, match=r"only \.gguf / onnx files$"):
        hub_fetch.plan_files({**common, "m.gguf": 1, "onnx/model.onnx": 1})
    with pytest.raises(
        NoLoadableWeights, match=r"only \.gguf / \.safetensors files, none named model.safetensors"
    ):
        hub_fetch.plan_files(
            {**common, "m.gguf": 1, "sub/model.safetensors": 1, "consolidated.safetensors": 1}
        )
    with pytest.raises(NoLoadableWeights, match="no weight files at all"):
        hub_fetch.plan_files(common)  # the config alone is not a model
    with pytest.raises(NoLoadableWeights, match=r"only \.h5 / \.msgpack files"):
        hub_fetch.plan_files({**common, "tf_model.h5": 1, "flax_model.msgpack": 1})


def test_is_local(tmp_path):
    assert (
        hub_fetch.is_local(str(tmp_path))
        and hub_fetch.is_local("./x")
        and hub_fetch.is_local("~/m")
    )
    assert hub_fetch.is_local("/does/not/exist")
    assert not hub_fetch.is_local("gpt2") and not hub_fetch.is_local("org/name")


def test_a_hub_id_stays_a_hub_id_beside_a_folder_of_its_name(tmp_path, monkeypatch):
    (tmp_path / "org" / "name").mkdir(parents=True)
    (tmp_path / "gpt2").mkdir()
    monkeypatch.chdir(tmp_path)
    assert not hub_fetch.is_local("org/name") and not hub_fetch.is_local("gpt2")
    assert hub_fetch.is_local("./org/name") and hub_fetch.is_local("./gpt2")


# -- fetch
# ----------------------------------------------------------------------------------------------------
def test_fetch_downloads_exactly_the_plan(server, repos, tmp_path):
    cache = tmp_path / "cache"
    out = fetch(server, "org/full", cache)
    assert out["files"] == FULL_PLAN
    assert out["revision_sha"] == server.sha("org/full")
    # one GET each, no decoy, no .py without trust_remote_code
    assert downloaded(server) == FULL_PLAN
    snapshot = Path(out["path"])
    assert snapshot == cache / "models--org--full" / "snapshots" / out["revision_sha"]
    for name in FULL_PLAN:
        assert (snapshot / name).read_bytes() == (repos["org/full"] / name).read_bytes()
    assert sorted(p.name for p in snapshot.iterdir()) == FULL_PLAN
    assert out["download_bytes"] == sum((repos["org/full"] / n).stat().st_size for n in FULL_PLAN)
    assert out["retries"] == [] and out["download_s"] > 0
    assert (cache / "models--org--full" / "refs" / "main").read_text() == out["revision_sha"]

    before = len(server.requests)
    again = fetch(server, "org/full", cache, revision="main")
    assert (
        again["download_bytes"] == 0
        and again["files"] == FULL_PLAN
        and again["path"] == out["path"]
    )
    assert [r["path"] for r in server.requests[before:]] == ["/api/models/org/full/revision/main"]

    custom = fetch(server, "org/full", cache, trust_remote_code=True)
    assert custom["files"] == sorted(FULL_PLAN + ["modeling_custom.py"])
    assert custom["download_bytes"] == (repos["org/full"] / "modeling_custom.py").stat().st_size


def test_fetch_sharded_and_bin_only(server, repos, tmp_path):
    out = fetch(server, "org/sharded", tmp_path / "c", revision=server.sha("org/sharded"))
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert out["files"] == sorted(
        ["config.json", "model.safetensors.index.json", "tokenizer.json", *shards]
    )
    assert downloaded(server) == out["files"]  # consolidated.safetensors, README.md: never
    for name in shards:
        assert (Path(out["path"]) / name).read_bytes() == (repos["org/sharded"] / name).read_bytes()
    assert out["download_bytes"] == sum(
        (repos["org/sharded"] / n).stat().st_size for n in out["files"]
    )
    served = sum(r["bytes"] for r in server.requests if r["method"] == "GET" and r["file"])
    assert served == out["download_bytes"]
    before = len(server.requests)
    out = fetch(server, "org/bin", tmp_path / "c")
    assert out["files"] == [
        "config.json",
        "pytorch_model.bin",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    downloaded(server)
    served = sum(r["bytes"] for r in server.requests[before:] if r["method"] == "GET" and r["file"])
    assert (
        out["download_bytes"]
        == served
        == (repos["org/bin"] / "pytorch_model.bin").stat().st_size
        + 2
        + sum((repos["org/bin"] / n).stat().st_size for n in ("config.json", "tokenizer.json"))
    )


def test_fetch_gguf_only_is_a_model_failure(server, tmp_path):
    with pytest.raises(NoLoadableWeights, match=r"only \.gguf files"):
        fetch(server, "org/gguf", tmp_path / "c")
    assert downloaded(server) == []


def test_local_folder_is_not_fetched(server, repos):
    out = hub_fetch.fetch(str(repos["org/bin"]), endpoint=server.url)
    assert (
        out["path"] == str(repos["org/bin"])
        and out["download_bytes"] == 0
        and server.requests == []
    )


def test_access_and_existence(server, tmp_path):
    with pytest.raises(
        NoAccess,
        match=r"^no access: gated repo \(accept its licence on the Hub, then set HF_TOKEN\)",
    ):
        fetch(server, "org/gated", tmp_path / "c")
    assert fetch(server, "org/gated", tmp_path / "c", token=TOKEN)["files"] == FULL_PLAN
    with pytest.raises(NoAccess, match=r"^no access: private or missing token \(set HF_TOKEN\)"):
        fetch(server, "org/private", tmp_path / "c")
    assert fetch(server, "org/private", tmp_path / "c", token=TOKEN)["revision_sha"] == server.sha(
        "org/private"
    )
    wrong = "hf_" + "WrongToken" * 3
    with pytest.raises(NoAccess, match="token was refused") as refused:
        fetch(server, "org/private", tmp_path / "c", token=wrong)
    assert wrong not in str(refused.value)
    with pytest.raises(NotOnHub, match=r"^model 'org/nope' does not exist on the Hub\.$"):
        fetch(server, "org/nope", tmp_path / "c", token=TOKEN)
    # anonymous: the Hub answers 401
    with pytest.raises(NoAccess, match="or model 'org/nope' does not exist"):
        fetch(server, "org/nope", tmp_path / "c")
    with pytest.raises(
        NotOnHub, match=r"^revision 'v9' of model 'org/full' does not exist on the Hub\.$"
    ):
        fetch(server, "org/full", tmp_path / "c", revision="v9")


def test_connection_refused_is_network_after_all_attempts(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    lines = []
    with pytest.raises(EnvironmentProblem, match="could not be reached.*after 4 attempts") as err:
        hub_fetch.fetch(
            "org/full",
            endpoint=f"http://127.0.0.1:{closed_port()}",
            cache_dir=tmp_path,
            attempts=4,
            backoff_s=0.01,
            log=lines.append,
        )
    assert err.value.kind == "network"
    assert len(lines) == 3 and all(
        RETRY_LINE.match(line) and "ConnectError" in line for line in lines
    )
    assert lines[0].startswith("retry 2/4 in 0.0 s:")


def test_offline_mode_is_an_environment_problem(monkeypatch, tmp_path):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(EnvironmentProblem, match="offline mode"):
        hub_fetch.fetch(
            "org/full", endpoint=f"http://127.0.0.1:{closed_port()}", cache_dir=tmp_path, **FAST
        )


def test_503_twice_then_ok(server, tmp_path):
    # the first two requests: model info (the library never retries)
    server.faults.fail(503, times=2, repo="org/full")
    lines = []
    out = fetch(server, "org/full", tmp_path / "c", log=lines.append, token=TOKEN)
    assert out["files"] == FULL_PLAN and out["retries"] == lines
    assert lines == [
        "retry 2/5 in 0.0 s: 503 Service Unavailable",
        "retry 3/5 in 0.0 s: 503 Service Unavailable",
    ]
    assert not any(TOKEN in line for line in lines)


def test_tokens_never_reach_messages_or_logs():
    lines = []
    retrier = hub_fetch.Retrier("org/x", "", TOKEN, 2, 0.0, 0.0, lines.append)

    def boom():
        raise ConnectionError(f"proxy said: bad header Authorization: Bearer {TOKEN}")

    with pytest.raises(EnvironmentProblem) as err:
        retrier.call(boom, "model info")
    assert (
        lines and TOKEN not in lines[0] and TOKEN not in str(err.value) and "***" in str(err.value)
    )


def test_503_on_a_file(server, repos, tmp_path):
    # GET 503: huggingface_hub does not retry it, fetch does; HEAD 503: the library retries it by
    # itself
    server.faults.fail(503, times=2, repo="org/full", path="model.safetensors", method="GET")
    server.faults.fail(503, times=1, repo="org/full", path="config.json", method="HEAD")
    out = fetch(server, "org/full", tmp_path / "c")
    assert len(out["retries"]) == 2 and all(
        line.endswith("503 Service Unavailable") for line in out["retries"]
    )
    assert out["files"] == FULL_PLAN and out["retries"][0].startswith("retry 2/5 in 0.0 s: ")
    got = (Path(out["path"]) / "model.safetensors").read_bytes()
    assert got == (repos["org/full"] / "model.safetensors").read_bytes()
    server.faults.fail(503, times=None, repo="org/bin", path="pytorch_model.bin", method="GET")
    with pytest.raises(
        EnvironmentProblem, match=r"503 Service Unavailable after 3 attempts \(pytorch_model.bin\)"
    ):
        fetch(server, "org/bin", tmp_path / "c", attempts=3)


def test_429_honours_retry_after(server, tmp_path):
    server.faults.fail(429, times=1, repo="org/bin", retry_after=1)
    t0 = time.monotonic()
    out = fetch(server, "org/bin", tmp_path / "c")
    assert time.monotonic() - t0 >= 0.95
    assert out["retries"] == ["retry 2/5 in 1.0 s: 429 Too Many Requests"]
    server.faults.fail(429, times=1, repo="org/full", retry_after=3600)
    out = fetch(server, "org/full", tmp_path / "c", max_backoff_s=0.2)  # waits are capped
    assert out["retries"] == ["retry 2/5 in 0.2 s: 429 Too Many Requests"]


def test_cut_body(server, repos, tmp_path, monkeypatch):
    sleeps, real_sleep = [], time.sleep

    def sleep(seconds):  # huggingface_hub pauses 1 s before resuming: recorded, not waited
        if seconds >= 0.5:
            sleeps.append(seconds)
        else:
            real_sleep(seconds)  # file-lock polling and the like

    monkeypatch.setattr(time, "sleep", sleep)
    server.faults.cut(50_000, times=1, repo="org/full", path="model.safetensors")
    out = fetch(server, "org/full", tmp_path / "c")
    data = (Path(out["path"]) / "model.safetensors").read_bytes()
    assert data == (repos["org/full"] / "model.safetensors").read_bytes()
    assert out["retries"] == [] and sleeps == [1]  # resumed by the library, nothing added here
    server.faults.cut(1000, times=None, repo="org/bin", path="pytorch_model.bin")
    with pytest.raises(EnvironmentProblem, match="RemoteProtocolError") as err:
        fetch(server, "org/bin", tmp_path / "c")
    assert err.value.kind == "network" and err.value.__cause__ is not None
    assert sleeps[1:] == [1] * 5  # the library's own resume attempts; fetch does not multiply them
    assert not list((tmp_path / "c" / "models--org--bin" / "blobs").glob("*.incomplete"))


def test_disk_full_is_an_environment_problem(server, tmp_path):
    script = (
        "import json, resource, sys\nfrom model_support.probe import "
        "hub_fetch\nresource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))\ntry:\n    "
        "hub_fetch.fetch('org/full', endpoint=sys.argv[1], cache_dir=sys.argv[2], "
        "backoff_s=0.01, log=print)\n    print(json.dumps({'ok': True}))\nexcept "
        "hub_fetch.EnvironmentProblem as e:\n    "
        "print(json.dumps({'kind': e.kind, 'message': str(e)}))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "0", "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, "-c", script, server.url, str(tmp_path / "c")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["kind"] == "disk", proc.stdout + proc.stderr
    assert "the disk is full" in result["message"] and "model.safetensors" in result["message"]
    problem = hub_fetch.classify(OSError(28, "No space left on device"), "org/x")[0]
    assert problem.kind == "disk" and "disk is full" in str(problem)


# -- facts and lists
# ----------------------------------------------------------------------------------------
def test_model_facts(server, repos, tmp_path):
    facts = hub.model_facts("org/full", endpoint=server.url, **FAST)
    assert facts["revision_sha"] == server.sha("org/full")
    assert (
        facts["files"]["model.safetensors"]
        == (repos["org/full"] / "model.safetensors").stat().st_size
    )
    assert facts["planned_files"] == FULL_PLAN
    assert facts["planned_bytes"] == fetch(server, "org/full", tmp_path / "c")["download_bytes"]
    assert {k: facts[k] for k in FACT_FIELDS if k in facts} == {
        "revision_sha": server.sha("org/full"),
        "pipeline_tag": "text-generation",
        "library_name": "transformers",
        "downloads": 300,
        "likes": 5,
        "trending_score": 9,
        "gated": "false",
        "license": "apache-2.0",
        "created_at": "2024-05-06T07:08:09+00:00",
        "base_model": "org/base, org/other",
        "hub_num_params": 200 * 256 + 200,
    }
    assert set(FACT_FIELDS) - set(facts) == {"download_s", "download_bytes"}
    sharded = hub.model_facts("org/sharded", endpoint=server.url, **FAST)
    assert (
        sharded["planned_bytes"] == fetch(server, "org/sharded", tmp_path / "c")["download_bytes"]
    )
    assert sharded["license"] is None and sharded["base_model"] is None
    assert hub.model_facts("org/gated", endpoint=server.url)["gated"] == "manual"
    gguf = hub.model_facts("org/gguf", endpoint=server.url)
    assert gguf["planned_bytes"] is None and "only .gguf files" in gguf["plan_error"]
    with pytest.raises(NotOnHub):
        hub.model_facts("org/nope", endpoint=server.url, token=TOKEN)
    # the facts are what the record's declaration says they are: one Arrow row of them converts
    row = schema.to_table(
        [schema.empty_record(**{k: facts[k] for k in FACT_FIELDS if k in facts})]
    ).to_pylist()[0]
    assert {k: row[k] for k in FACT_FIELDS if k in facts} == {
        k: facts[k] for k in FACT_FIELDS if k in facts
    }


def test_list_models_order(server):
    by = {
        s: sweep_budget.list_models("text-generation", sort=s, limit=10, endpoint=server.url)
        for s in sweep_budget.SORTS
    }
    assert [m["model_id"] for m in by["downloads"]][:3] == ["org/full", "org/sharded", "org/bin"]
    assert "org/gguf" not in [m["model_id"] for m in by["downloads"]]  # another task
    assert [m["model_id"] for m in by["likes"]][:3] == ["org/sharded", "org/bin", "org/full"]
    assert [m["model_id"] for m in by["trending"]][:2] == ["org/bin", "org/full"]
    first = by["downloads"][0]
    assert first["downloads"] == 300 and first["license"] == "apache-2.0"
    assert (
        first["created_at"].startswith("2024-05-06") and first["hub_num_params"] == 200 * 256 + 200
    )
    assert sweep_budget.list_models(limit=2, endpoint=server.url)[1]["model_id"] == "org/sharded"
    with pytest.raises(ValueError):
        sweep_budget.list_models(sort="newest", endpoint=server.url)


def test_list_models_unreachable(monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(EnvironmentProblem, match="offline mode"):
        sweep_budget.list_models(endpoint=f"http://127.0.0.1:{closed_port()}")


# -- the cache budget
# -------------------------------------------------------------------------------------
def test_cache_budget_keeps_what_was_there(server, repos, tmp_path):
    cache = tmp_path / "c"
    # the user's model: same sha as org/full
    before = fetch(server, "org/gated", cache, token=TOKEN)
    fetch(server, "org/bin", cache)
    budget = sweep_budget.CacheBudget(cache, max_gb=0.001, keep=False)  # 1 MB
    assert budget.preexisting == {
        ("org/gated", before["revision_sha"]),
        ("org/bin", server.sha("org/bin")),
    }
    assert budget.used_bytes() == 0
    size = hub.model_facts("org/full", endpoint=server.url)["planned_bytes"]
    assert budget.reserve("org/full", size)
    out = fetch(server, "org/full", cache)
    assert 0 < budget.used_bytes() <= 1_000_000
    assert budget.release("org/full", out["revision_sha"]) > 0
    assert budget.release("org/bin", server.sha("org/bin")) == 0  # there before the sweep: kept
    left = {
        (r.repo_id, rev.commit_hash) for r in scan_cache_dir(cache).repos for rev in r.revisions
    }
    assert left == budget.preexisting
    assert sorted(p.name for p in Path(before["path"]).iterdir()) == FULL_PLAN
    assert budget.used_bytes() == 0


def test_cache_budget_refuses_and_waits(tmp_path):
    budget = sweep_budget.CacheBudget(tmp_path / "c", max_gb=12, keep=False)
    assert (
        budget.too_large_reason(16_100_000_000)
        == "too large for the cache budget: 16.1 GB > 12 GB."
    )
    assert not budget.reserve("big/model", 16_100_000_000) and not budget.fits(16_100_000_000)
    free = sweep_budget.CacheBudget(tmp_path / "d", max_gb=None)
    assert free.too_large_reason(10**18).startswith("too large for the free disk: ")
    assert budget.reserve("a/one", 7_000_000_000) and not budget.fits(7_000_000_000)
    assert not budget.reserve("b/two", 7_000_000_000, timeout_s=0.1)
    got = []
    waiter = threading.Thread(
        target=lambda: got.append(budget.reserve("b/two", 7_000_000_000, timeout_s=10))
    )
    waiter.start()
    # in the condition's wait, not merely not started yet
    wait_until_blocked(waiter, "wait", within="reserve")
    assert got == []  # still waiting for a/one
    budget.release("a/one")
    waiter.join(5)
    assert got == [True]


def test_cache_budget_keep(server, tmp_path):
    cache = tmp_path / "c"
    budget = sweep_budget.CacheBudget(cache, max_gb=0.0003, keep=True)  # 300 KB
    size = hub.model_facts("org/full", endpoint=server.url)["planned_bytes"]
    assert budget.reserve("org/full", size)
    out = fetch(server, "org/full", cache)
    budget.release("org/full", out["revision_sha"])
    assert Path(out["path"], "model.safetensors").exists() and budget.used_bytes() >= size
    assert budget.too_large_reason(200_000).startswith(
        "too large for what is left of the cache budget: 200 KB > "
    )


def test_cache_budget_never_exceeded_over_six_cycles(server, tmp_path):
    cache = tmp_path / "c"
    models = ["org/full", "org/sharded", "org/bin"] * 2
    sizes = {m: hub.model_facts(m, endpoint=server.url)["planned_bytes"] for m in set(models)}
    budget = sweep_budget.CacheBudget(cache, max_gb=max(sizes.values()) * 1.5 / 1e9, keep=False)
    peaks, stop, errors = [], threading.Event(), []

    def watch():
        while not stop.is_set():
            peaks.append(budget.used_bytes())
            time.sleep(0.005)

    def worker(queue):
        try:
            for model in queue:
                assert budget.reserve(model, sizes[model], timeout_s=30)
                out = fetch(server, model, cache)
                # each cycle downloads anew: release deleted it
                assert out["download_bytes"] == sizes[model]
                budget.release(model, out["revision_sha"])
        except Exception as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    watcher = threading.Thread(target=watch)
    watcher.start()
    workers = [threading.Thread(target=worker, args=(models[i::2],)) for i in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    stop.set()
    watcher.join()
    assert errors == [] and len(peaks) > 10
    assert max(peaks) <= budget.max_bytes and max(peaks) > 0
    assert budget.used_bytes() == 0 and scan_cache_dir(cache).repos == frozenset()


def test_the_librarys_retry_lines_go_to_the_model_whose_threads_wrote_them():
    """Each fetch notes huggingface_hub's warnings from its own download threads only: fetch 1's
    log gets none of fetch 12's lines (their pools name threads ``hub-fetch-1_0`` and
    ``hub-fetch-12_0``)."""
    import logging
    from concurrent.futures import ThreadPoolExecutor

    logger = logging.getLogger("huggingface_hub")
    lines: list[str] = []
    handler = hub_fetch._LibraryLog("hub-fetch-1", lines.append, ())
    logger.addHandler(handler)
    try:
        for prefix in ("hub-fetch-1", "hub-fetch-12", "hub-fetch-10"):
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix=prefix) as pool:
                pool.submit(logger.warning, "Retrying in 1s [%s]", prefix).result()
    finally:
        logger.removeHandler(handler)
    assert lines == ["huggingface_hub: Retrying in 1s [hub-fetch-1]"]


def test_a_resumed_sweep_downloads_a_model_at_the_commit_it_already_probed(server, tmp_path):
    """One sweep, one commit of a model: its tasks carry the commit the Hub resolved when the
    sweep was created, and once a variant was probed the commit that variant was downloaded at;
    the download asks the Hub for that commit, not for where the branch points now."""
    from model_support.record import store
    from model_support.record.sweep_meta import ModelEntry, SweepMeta
    from model_support.sweep import runner

    sha = server.sha("org/full")
    meta = SweepMeta(
        sweep_id="s",
        name="s",
        created_at="2026-12-01T00:00:00+00:00",
        probe={"device": "cpu"},
        models=[ModelEntry("org/full", hub={"revision_sha": "f" * 40})],
        matrix={"max_new_tokens": [4, 8]},
    )
    meta.write(store.sweep_dir(tmp_path, "s"))
    assert [t["revision_sha"] for t in runner.tasks_to_run(tmp_path, meta)] == ["f" * 40] * 2
    first = runner.build_tasks(meta)[0]
    record = schema.empty_record(
        sweep_id="s", model_id="org/full", variant=first["variant"], status="PASS", revision_sha=sha
    )
    store.store_result(tmp_path, "s", record, None, "log\n")
    [task] = runner.tasks_to_run(tmp_path, meta)
    assert task["revision_sha"] == sha and task["variant"] != first["variant"]

    code = (
        "import json, sys; from model_support.sweep.worker.download import download\ngot = "
        "download(json.loads(sys.argv[1])); print(json.dumps([got.kind, "
        "got.fields.get('revision_sha')]))"
    )
    env = {
        **os.environ,
        "HF_ENDPOINT": server.url,
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_CACHE": str(tmp_path / "hf"),
    }
    run = subprocess.run(
        [sys.executable, "-c", code, json.dumps(task)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert json.loads(run.stdout.strip().splitlines()[-1]) == ["ready", sha], run.stderr[-2000:]
    asked = [r["path"] for r in server.requests if r["route"] == "info"]
    assert asked and all(path.endswith(f"/revision/{sha}") for path in asked)


def test_an_offline_hub_id_not_in_the_cache_is_named_in_one_sentence(monkeypatch, tmp_path):
    """Offline (HF_HUB_OFFLINE=1, as the suite runs), a Hub id the cache lacks: the sentence the
    probe prints names it and says why; a model the cache holds is not said to be missing."""
    from model_support.probe.model_ids import unavailable

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    endpoint = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(EnvironmentProblem) as err:
        hub_fetch.fetch("org/nosuch", cache_dir=tmp_path, endpoint=endpoint, **FAST)
    said = str(unavailable("org/nosuch", err.value))
    assert (
        "model 'org/nosuch' is not in the local Hugging Face cache (HF_HUB_CACHE) and offline "
        "mode is on" in said
    )
    assert said.endswith(".") and ". " not in said, said  # one sentence
    # a sweep's look-up
    with pytest.raises(EnvironmentProblem, match="model 'org/nosuch' is not in the local"):
        hub.model_facts("org/nosuch", endpoint=endpoint, attempts=1, log=lambda _: None)
    sha = "a" * 40
    (tmp_path / "models--org--cached" / "snapshots" / sha).mkdir(parents=True)
    (tmp_path / "models--org--cached" / "snapshots" / sha / "config.json").write_text("{}")
    (tmp_path / "models--org--cached" / "refs").mkdir()
    (tmp_path / "models--org--cached" / "refs" / "main").write_text(sha)
    with pytest.raises(EnvironmentProblem, match="offline mode") as err:
        hub_fetch.fetch("org/cached", cache_dir=tmp_path, endpoint=endpoint, **FAST)
    assert "not in the local" not in str(err.value)
