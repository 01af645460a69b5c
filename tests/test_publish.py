"""Publishing against the local Hub (tests/hub_server.py): push, read back with `datasets`, push
again after a new sweep (only it goes up), move a sweep to `excluded`, publish the raw logs into the
repo or a bucket, and each failure (no token, a read token, no network, a commit cut off) as one
sentence that changes nothing on the server.

The sweeps here are written through the store as a sweep writes them (records, executed notebooks,
logs, sweep.json, compaction) without running the probes; `test_sweep.py` pushes a real sweep. The
client is the real huggingface_hub: dataset files go up through Xet (hf_xet, into the server's local
CAS) unless HF_HUB_DISABLE_XET, then through the LFS batch API.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import nbformat
import pyarrow.parquet as pq
import pytest
from huggingface_hub import HfApi, constants

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hub_server import serve  # noqa: E402

from helpers import FAKE_TOKEN  # noqa: E402
from model_support import publish  # noqa: E402
from model_support.errors import UserError  # noqa: E402
from model_support.fileio import STOP_AT_WRITE, atomic_write_json  # noqa: E402
from model_support.record import schema, store  # noqa: E402
from model_support.record.sweep_meta import ModelEntry, SweepMeta  # noqa: E402

REPO_ID = "org/sweeps"
WRITE = "hf_" + "PublishWriteToken" + "w" * 16
READ = "hf_" + "PublishReadToken" + "r" * 16
PLANTED = "hf_" + "PlantedInAProbeLog" + "p" * 16  # an hf_ token a probe printed
# a token of no known shape, known only from the environment
PLAIN_SECRET = "plain-secret-value-123"
CLI = [sys.executable, "-m", "model_support.cli"]
REPO_ROOT = Path(__file__).resolve().parents[1]


def write_sweep(
    data: Path, sweep_id: str, statuses: dict[str, str], excluded: dict | None = None, **meta
) -> str:
    """A sweep as the runner leaves it: sweep.json, per model an executed notebook, a log and its
    record (one local model, loaded from a folder of this machine), then compaction."""
    local = data.parent / "models" / "tiny-local"
    models = [
        ModelEntry(m) if not m.startswith("local:") else ModelEntry(m, str(local)) for m in statuses
    ]
    SweepMeta(
        sweep_id=sweep_id,
        name=sweep_id.split("-")[0],
        created_at=meta.pop("created_at", "2026-12-01T00:00:00+00:00"),
        probe={"device": "cpu"},
        models=models,
        excluded=excluded or {},
        versions={"torch": "2.13.0", "transformers": "5.0.0"},
        **meta,
    ).write(store.sweep_dir(data, sweep_id))
    for i, (model_id, status) in enumerate(statuses.items()):
        record = schema.empty_record(
            sweep_id=sweep_id,
            model_id=model_id,
            status=status,
            variant=schema.DEFAULT_VARIANT,
            tokens_in=5 + i,
            tokens_out=8,
            device_type="cpu",
            versions={"torch": "2.13.0", "transformers": "5.0.0"},
            notebook_path=store.notebook_relpath(sweep_id, model_id),
        )
        notebook = nbformat.v4.new_notebook()
        cell = nbformat.v4.new_code_cell(f"probe({model_id!r})")
        source = local if model_id.startswith("local:") else model_id
        cell.outputs = [nbformat.v4.new_output("stream", text=f"{status}: loading {source}\n")]
        notebook.cells = [cell]
        store.store_result(
            data, sweep_id, record, nbformat.writes(notebook).encode(), f"{model_id}: {status}\n"
        )
    store.compact(data, sweep_id)
    return sweep_id


def two_sweeps(data: Path) -> list[str]:
    return [
        write_sweep(
            data,
            "nightly-20261201T020000Z-aaaa",
            {"org/a": "PASS", "org/b": "FAIL(gen)", "local:tiny-local": "PASS"},
            excluded={"org/c": "not a text-generation model"},
        ),
        write_sweep(
            data,
            "nightly-20261202T020000Z-bbbb",
            {"org/a": "PASS", "org/b": "PASS"},
            created_at="2026-12-02T00:00:00+00:00",
        ),
    ]


def third_sweep(data: Path) -> str:
    return write_sweep(
        data,
        "nightly-20261203T020000Z-cccc",
        {"org/a": "FAIL(load)", "org/d": "PASS"},
        created_at="2026-12-03T00:00:00+00:00",
    )


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """The local Hub with a write and a read token; the client online, pushing with the write token,
    retrying fast (3 attempts, 10 ms apart)."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", WRITE)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no stored login counts
    monkeypatch.setenv("MODEL_SUPPORT_HUB_ATTEMPTS", "3")
    monkeypatch.setenv("MODEL_SUPPORT_HUB_BACKOFF_S", "0.01")
    with serve({}, tokens=[READ], write_tokens=[WRITE]) as server:
        yield server


def push(hub, data: Path, **kw) -> publish.PushResult:
    return publish.push(data, REPO_ID, endpoint=hub.url, log=lambda line: None, **kw)


def fetch(url: str) -> bytes:
    """A published address, read as a reader of the (private) repo would: with a token."""
    with urllib.request.urlopen(
        urllib.request.Request(url, headers={"Authorization": f"Bearer {READ}"})
    ) as answer:
        return answer.read()


def local_files(data: Path) -> dict[str, bytes]:
    return {u.path: u.source.read_bytes() for u in publish.files.dataset_files(data)}


def repo_files(hub, repo_id: str = REPO_ID) -> dict[str, bytes]:
    return {
        path: f["abs"].read_bytes() for path, f in hub.repo(repo_id, "dataset")["files"].items()
    }


def uploaded(hub) -> list[bytes]:
    """Everything the server was sent: every stored file, every request body, and the files a commit
    carried inline (base64 in its ndjson)."""
    out = [p.read_bytes() for p in hub.storage.every_file()]
    for request in hub.requests:
        body = request.get("body") or b""
        out.append(body)
        if request["route"] == "commit":
            for line in body.splitlines():
                value = json.loads(line)["value"]
                if "content" in value:
                    out.append(base64.b64decode(value["content"]))
    return out


def load_back(
    hub, tmp_path: Path, configs: tuple = ("results", "excluded")
) -> dict[str, list[dict]]:
    """The ``configs`` as `datasets.load_dataset(REPO_ID, config)` reads them through HF_ENDPOINT
    (a fresh process: huggingface_hub and datasets read the endpoint at import)."""
    code = (
        "import datasets, json, sys\nout = {c: datasets.load_dataset(sys.argv[1], c, "
        f"split='train').to_list() for c in {configs!r}}}\nprint(json.dumps(out, "
        "default=str))\n"
    )
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.url,
        "HF_HUB_OFFLINE": "0",
        "HF_DATASETS_CACHE": str(tmp_path / "datasets-cache"),
        "HF_HUB_CACHE": str(tmp_path / "hub-cache"),
    }
    run = subprocess.run(
        [sys.executable, "-c", code, REPO_ID], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def local_rows(data: Path, config: str) -> list[dict]:
    rows = [
        r
        for path in sorted((data / config).glob("sweep=*/*.parquet"))
        for r in pq.read_table(path).to_pylist()
    ]
    return json.loads(json.dumps(rows, default=str))


def by_key(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (r["sweep_id"], r["model_id"]))


def test_push_two_sweeps_read_back_then_a_third_goes_up_alone(hub, tmp_path):
    data = tmp_path / "data"
    a, b = two_sweeps(data)
    first = push(hub, data)
    assert (first.added, first.updated, first.commit_url is not None) == ([a, b], [], True)
    repo = hub.repo(REPO_ID, "dataset")
    assert repo["private"] is True  # --private is the default
    assert [c["title"] for c in repo["commits"]] == [f"model-support: add sweeps {a}, {b}"]
    back = load_back(hub, tmp_path)
    assert by_key(back["results"]) == by_key(local_rows(data, "results"))
    assert by_key(back["excluded"]) == by_key(local_rows(data, "excluded"))
    assert [r["model_id"] for r in back["excluded"]] == ["org/c"]

    again = push(hub, data)  # nothing new: no commit
    assert again.commit_url is None and len(repo["commits"]) == 1

    c = third_sweep(data)
    third = push(hub, data)
    assert (third.added, third.updated) == ([c], [])
    commit = repo["commits"][-1]
    assert commit["title"] == f"model-support: add sweep {c}"
    assert sorted(commit["added"]) == ["README.md", f"results/sweep={c}/part-0.parquet"]
    assert commit["deleted"] == []
    files = repo_files(hub)
    # every Parquet file, byte for byte
    assert {p: files[p] for p in local_files(data)} == local_files(data)


def test_the_card_says_what_a_row_is_the_sweeps_and_how_to_load_them(hub, tmp_path):
    data = tmp_path / "data"
    a, b = two_sweeps(data)
    (data / "reports").mkdir()
    (data / "reports" / f"{b}.html").write_text(
        "<html><body>report of the latest sweep</body></html>"
    )
    result = push(hub, data)
    assert result.report == b
    card = repo_files(hub)["README.md"].decode()
    head, body = card.split("\n---\n", 1)
    assert "config_name: results" in head and "config_name: excluded" in head
    for verdict in schema.VERDICTS:
        assert f"| `{verdict}` |" in body
    assert f"| `{a}` | 2026-12-01 00:00 | cpu | 3 | 2 | 66.7% | 1 | 2.13.0 |" in body
    assert f"| `{b}` | 2026-12-02 00:00 | cpu | 2 | 2 | 100.0% | 0 | 2.13.0 |" in body
    assert "- torch: 2.13.0" in body and "- transformers: 5.0.0" in body
    for field in schema.DECLARATION:  # every column documented, the perf phase's among them
        assert f"| `{field.name}` | `{field.type}` | {field.group} | {field.since} |" in body, (
            field.name
        )
    assert "| `tpot_s` | `double` | perf | 16 | seconds per output token after the first" in body
    kl = next(line for line in body.splitlines() if line.startswith("| `reference_max_kl` |"))
    # a | in a field's words is escaped: one row, five cells
    assert len(re.findall(r"(?<!\\)\|", kl)) == 6, kl
    assert f'load_dataset("{REPO_ID}", "results", split="train")' in body
    assert f'load_dataset("{REPO_ID}", "excluded", split="train")' in body
    report_url = f"{hub.url}/datasets/{REPO_ID}/resolve/main/reports/{b}.html"
    assert f"[reports/{b}.html]({report_url})" in body
    # the link opens the report
    assert fetch(report_url) == (data / "reports" / f"{b}.html").read_bytes()
    assert "are not published" in body  # no --logs


def test_the_repro_bodies_go_up_beside_the_rows_once_and_the_card_says_where(hub, tmp_path):
    """A row names its repro script's body (``repro_sha256``); the push sends
    ``repro/<sha256>.py`` with the rows."""
    from model_support.probe import repro

    data = tmp_path / "data"
    a, _ = two_sweeps(data)
    text, sha = repro.body()
    (store.repro_dir(data, a) / f"{sha}.py").parent.mkdir(parents=True)
    (store.repro_dir(data, a) / f"{sha}.py").write_text(text)
    store.compact(data, a)  # compaction copies the sweep's bodies beside the Parquet files
    push(hub, data)
    files = repo_files(hub)
    assert files[f"repro/{sha}.py"] == text.encode()
    assert "repro/<repro_sha256>.py" in files["README.md"].decode()
    again = push(hub, data)
    assert (again.files, again.deleted) == (0, 0)


def test_a_sweep_moved_to_excluded_moves_on_the_hub_in_one_commit(hub, tmp_path):
    data = tmp_path / "data"
    a, _ = two_sweeps(data)
    push(hub, data)
    store.set_exclusion(data, a, "broken libtpu build")
    moved = push(hub, data)
    assert (moved.added, moved.updated, moved.deleted) == ([], [a], 1)
    commit = hub.repo(REPO_ID, "dataset")["commits"][-1]
    assert commit["title"] == f"model-support: update sweep {a}"
    assert commit["deleted"] == [f"results/sweep={a}/part-0.parquet"]
    datasets_files = {p for p in repo_files(hub) if p.endswith(".parquet")}
    assert datasets_files == set(local_files(data))
    store.set_exclusion(data, a, None)  # and back
    assert push(hub, data).updated == [a]
    assert {p for p in repo_files(hub) if p.endswith(".parquet")} == set(local_files(data))


def test_sweeps_pushed_from_elsewhere_are_kept_and_named(hub, tmp_path):
    elsewhere, here = tmp_path / "elsewhere" / "data", tmp_path / "here" / "data"
    theirs = third_sweep(elsewhere)
    push(hub, elsewhere)
    mine, _ = two_sweeps(here)
    push(hub, here)
    files = repo_files(hub)
    assert (
        f"results/sweep={theirs}/part-0.parquet" in files
        and f"results/sweep={mine}/part-0.parquet" in files
    )
    assert (
        f"Also in this repo, pushed from another data folder: `{theirs}`."
        in files["README.md"].decode()
    )


def test_logs_in_the_repo_with_links_that_resolve_and_no_secret(hub, tmp_path, monkeypatch):
    data = tmp_path / "data"
    a, b = two_sweeps(data)
    # a probe printed both tokens (an older version kept them)
    log = store.sweep_dir(data, a) / "logs" / "org__b.log"
    log.write_text(f"FAIL(gen)\nAuthorization: Bearer {PLANTED}\nsecret={PLAIN_SECRET}\n")
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", PLAIN_SECRET)
    result = push(hub, data, logs=True)
    assert result.logs == [a, b]
    assert hub.repo(REPO_ID, "dataset")["commits"][-1]["title"] == (
        f"model-support: add sweeps {a}, {b}; logs of sweeps {a}, {b}"
    )
    files = repo_files(hub)
    assert f"logs/{a}/sweep.json" in files and f"logs/{b}/notebooks/org__a.ipynb" in files
    rows = local_rows(data, "results")
    assert rows and all(r["notebook_url"] and r["log_url"] for r in rows)
    machine_path = str(data.parent / "models" / "tiny-local")
    for row in rows:  # each published row opens its notebook and its log: the local files, redacted
        folder, name = store.sweep_dir(data, row["sweep_id"]), Path(row["notebook_path"]).stem
        for key, local in (
            ("notebook_url", f"notebooks/{name}.ipynb"),
            ("log_url", f"logs/{name}.log"),
        ):
            body = fetch(row[key]).decode()
            expected = (folder / local).read_text().replace(machine_path, "local:tiny-local")
            assert body == expected.replace(PLANTED, "***").replace(PLAIN_SECRET, "***"), row[key]
    assert (
        files[f"logs/{a}/logs/org__b.log"].decode()
        == "FAIL(gen)\nAuthorization: Bearer ***\nsecret=***\n"
    )
    for blob in uploaded(hub):
        for secret in (PLANTED, PLAIN_SECRET, WRITE, machine_path):
            assert secret.encode() not in blob, secret
    sweep_json = json.loads(files[f"logs/{a}/sweep.json"])
    assert {m["model_id"]: m["source"] for m in sweep_json["models"]}[
        "local:tiny-local"
    ] == "local:tiny-local"
    card = files["README.md"].decode()
    assert f"[logs/{a}/]({hub.url}/datasets/{REPO_ID}/tree/main/logs/{a}/)" in card

    c = third_sweep(data)
    # without --logs: the published sweeps' logs stay in step, the new one has none
    later = push(hub, data)
    assert (later.added, later.logs) == ([c], [])
    assert all(r["log_url"] is None for r in local_rows(data, "results") if r["sweep_id"] == c)


@pytest.mark.browser
def test_the_explorer_links_the_published_notebook_and_log(browser, hub, tmp_path):
    from helpers import offline_page
    from model_support.render import explorer

    data = tmp_path / "data"
    _, b = two_sweeps(data)
    push(hub, data, logs=True)
    row = next(
        r for r in local_rows(data, "results") if r["sweep_id"] == b and r["model_id"] == "org/a"
    )
    page, attempted, errors = offline_page(browser)
    page.goto(explorer.build_explorer(data).as_uri())
    page.locator("#search").fill("org/a")
    page.wait_for_function("document.querySelector('#match-count').textContent.startsWith('1 ')")
    page.locator("#results tbody tr").first.click()
    links = page.locator("#detail")
    assert links.locator("a.notebook-url").get_attribute("href") == row["notebook_url"]
    assert links.locator("a.log-url").get_attribute("href") == row["log_url"]
    assert attempted == [] and errors == []  # nothing was fetched: the links are only links
    page.close()


def test_logs_in_a_bucket(hub, tmp_path):
    data = tmp_path / "data"
    a, b = two_sweeps(data)
    result = push(hub, data, logs_bucket="org/sweep-logs")
    assert result.logs == [a, b] and result.bucket_files == (1 + 3 + 3) + (1 + 2 + 2)
    bucket = hub.buckets["org/sweep-logs"]
    assert f"{a}/sweep.json" in bucket["files"] and not any(
        p.startswith("logs/") for p in repo_files(hub)
    )
    rows = local_rows(data, "results")
    assert all(r["log_url"].startswith(f"{hub.url}/buckets/org/sweep-logs/resolve/") for r in rows)
    api = HfApi(endpoint=hub.url, token=WRITE)
    row = next(r for r in rows if r["sweep_id"] == b)
    remote = row["log_url"].split("/resolve/", 1)[1]
    # through Xet
    api.download_bucket_files("org/sweep-logs", files=[(remote, str(tmp_path / "back.log"))])
    assert (tmp_path / "back.log").read_text() == (
        store.sweep_dir(data, b) / "logs" / Path(remote).name
    ).read_text()
    assert fetch(row["log_url"]) == (tmp_path / "back.log").read_bytes()
    again = push(hub, data)  # the bucket has every file (same Xet hashes), the repo every row
    assert (again.bucket_files, again.commit_url) == (0, None)


def test_a_refused_bucket_upload_is_one_sentence_and_the_dataset_is_as_it_was(hub, tmp_path):
    data = tmp_path / "data"
    a, b = two_sweeps(data)
    hub.faults.fail(422, times=1, route="bucket_batch")
    with pytest.raises(publish.PushError) as error:
        push(hub, data, logs_bucket="org/sweep-logs")
    assert str(error.value).startswith(
        "Could not push to the Hub bucket 'org/sweep-logs': the Hub answered 422 "
    )
    assert "; the logs it already received stay there, the dataset is as it was: push again" in str(
        error.value
    )
    assert (
        hub.repo(REPO_ID, "dataset")["commits"] == []
        and hub.buckets["org/sweep-logs"]["files"] == {}
    )
    assert all(store.published_logs(data, s) is None for s in (a, b))
    assert all(r["log_url"] is None for r in local_rows(data, "results"))
    assert push(hub, data, logs_bucket="org/sweep-logs").logs == [a, b]


def test_lfs_upload_when_xet_is_off(hub, tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    data = tmp_path / "data"
    two_sweeps(data)
    push(hub, data)
    assert any(r["route"] == "lfs_batch" for r in hub.requests) and any(
        r["route"] == "lfs_put" for r in hub.requests
    )
    assert not any(r["route"] == "xet_token" for r in hub.requests)
    files = repo_files(hub)
    assert {p: files[p] for p in local_files(data)} == local_files(data)


def test_a_commit_cut_off_leaves_the_repo_as_it_was_and_a_rerun_finishes(hub, tmp_path):
    data = tmp_path / "data"
    a, b = two_sweeps(data)
    push(hub, data)
    c = third_sweep(data)
    repo = hub.repo(REPO_ID, "dataset")
    before = (repo["sha"], dict(repo["files"]), len(repo["commits"]))
    hub.faults.fail(503, times=3, route="commit")
    with pytest.raises(publish.PushError) as error:
        push(hub, data, logs=True)
    assert str(error.value) == (
        f"Could not push to the Hub dataset {REPO_ID!r}: the Hub answered 503 Service "
        "Unavailable after 3 attempts (commit); nothing changed there: push again once the "
        "Hub can be reached (this needs network access)."
    )
    assert (repo["sha"], dict(repo["files"]), len(repo["commits"])) == before
    # the data folder is as it was too
    assert all(store.published_logs(data, s) is None for s in (a, b, c))
    assert all(r["log_url"] is None for r in local_rows(data, "results"))
    done = push(hub, data, logs=True)
    assert (done.added, done.logs) == ([c], [a, b, c]) and len(repo["commits"]) == 2


def test_no_token_a_read_token_and_no_network_are_one_sentence_each(hub, tmp_path, monkeypatch):
    data = tmp_path / "data"
    two_sweeps(data)
    where = f"the Hub dataset {REPO_ID!r}"
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(
        publish.PushError,
        match=r"^No write access to .*: set HF_TOKEN to a write token \(no token is set\)\.$",
    ):
        push(hub, data)
    assert hub.requests == []
    monkeypatch.setenv("HF_TOKEN", READ)
    with pytest.raises(publish.PushError) as error:
        push(hub, data)
    assert (
        str(error.value)
        == f"No write access to {where}: set HF_TOKEN to a write token (the token may not write "
        "there)."
    )
    assert hub._repos == {} and hub.storage.every_file() == []

    monkeypatch.setenv("HF_TOKEN", WRITE)
    push(hub, data)
    repo = hub.repo(REPO_ID, "dataset")
    third_sweep(data)
    before = (repo["sha"], len(repo["commits"]), len(hub.storage.every_file()))
    # the repo exists: refused at its first write, before any upload
    monkeypatch.setenv("HF_TOKEN", READ)
    with pytest.raises(publish.PushError, match=r"^No write access to "):
        push(hub, data)
    assert (repo["sha"], len(repo["commits"]), len(hub.storage.every_file())) == before

    monkeypatch.setenv("HF_TOKEN", WRITE)
    hub.faults.refuse_connections(True)
    with pytest.raises(publish.PushError) as error:
        push(hub, data)
    assert str(error.value).startswith(
        f"Could not push to {where}: the Hub could not be reached (ConnectError"
    )
    assert "after 3 attempts (create the repo); nothing changed there" in str(error.value)
    hub.faults.refuse_connections(False)
    assert (repo["sha"], len(repo["commits"])) == before[:2]


def test_bad_input_is_one_sentence_before_anything_runs(hub, tmp_path):
    data = tmp_path / "data"
    with pytest.raises(publish.PushError, match=r"holds no dataset yet; run a sweep first"):
        push(hub, data)
    two_sweeps(data)
    with pytest.raises(
        publish.PushError,
        match=r"^'sweeps' is not a Hub dataset repo id: give it as <namespace>/<name>",
    ):
        publish.push(data, "sweeps", endpoint=hub.url)
    with pytest.raises(publish.PushError, match=r"^'a/b/c' is not a Hub bucket id"):
        push(hub, data, logs_bucket="a/b/c")
    assert hub.requests == []


def test_cli_push_says_what_it_did_and_refuses_a_read_token_in_one_sentence(hub, tmp_path):
    data = tmp_path / "data"
    a, b = two_sweeps(data)
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_TOKEN": READ}
    command = [*CLI, "push", REPO_ID, "--data-dir", str(data), "--public"]
    refused = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        f"Error: No write access to the Hub dataset {REPO_ID!r}: set HF_TOKEN to a write token "
        "(the token may not write there)."
    )
    ran = subprocess.run(
        command, capture_output=True, text=True, env={**env, "HF_TOKEN": WRITE}, timeout=300
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert f"added:    {a}, {b}" in ran.stdout and "files:    4 uploaded, 0 deleted" in ran.stdout
    assert hub.repo(REPO_ID, "dataset")["private"] is False


def test_a_real_sweep_publishes_its_logs_and_no_token(smoke_sweep, hub, tmp_path):
    """The smoke sweep ran its probes with a fake HF_TOKEN in their environment: pushed with its
    logs, every row links its executed notebook and log, and the token is in nothing the Hub
    received."""
    data = tmp_path / "data"
    shutil.copytree(smoke_sweep["data_dir"], data)  # the session's sweep stays as it is
    result = push(hub, data, logs=True)
    assert result.added == [smoke_sweep["sweep_id"]] and result.logs == [smoke_sweep["sweep_id"]]
    rows = local_rows(data, "results")
    assert {r["model_id"] for r in rows} == {
        r["model_id"] for r in smoke_sweep["records"] if not r["exclusion_reason"]
    }
    for row in rows:
        assert fetch(row["log_url"]).decode().strip(), row["model_id"]
        if row["notebook_url"]:
            assert json.loads(fetch(row["notebook_url"]))["cells"], row["model_id"]
    # a killed kernel may leave none
    assert sum(r["notebook_url"] is not None for r in rows) >= len(rows) - 2
    for blob in uploaded(hub):
        assert FAKE_TOKEN.encode() not in blob
        # the fixtures' folder names this machine
        assert str(REPO_ROOT / "data" / "models").encode() not in blob


def test_the_ops_config_is_pushed_with_the_others_and_loads_from_the_hub(hub, tmp_path):
    """A sweep whose records carry an operator census: compaction writes its ``ops`` config
    (docs/ops.md), the push uploads it, the card declares it, and ``datasets`` loads it back from
    the Hub."""
    data = tmp_path / "data"
    sweep_id = "ops-20261204T020000Z-dddd"
    write_sweep(data, sweep_id, {"org/a": "PASS", "org/b": "FAIL(gen)"})
    for record in store.read_records(data, sweep_id):
        missing = ["aten::rsqrt"] if record["status"] != "PASS" else []
        census = {
            "ops": ["aten::mm", "aten::rsqrt"][: 2 if missing else 1],
            "ops_stages": ["generate", "generate"][: 2 if missing else 1],
            "ops_calls": [4, 2][: 2 if missing else 1],
            "ops_source": "reference" if missing else "run",
            "ops_missing": missing,
            "ops_fallback": [],
            "ops_unknown": [],
        }
        store.store_result(data, sweep_id, {**record, **census}, None, "log\n")
    store.compact(data, sweep_id)
    assert f"ops/sweep={sweep_id}/part-0.parquet" in local_files(data)
    push(hub, data)
    files = repo_files(hub)
    assert f"ops/sweep={sweep_id}/part-0.parquet" in files
    assert b"config_name: ops" in files["README.md"]
    rows = {r["op"]: r for r in load_back(hub, tmp_path, ("ops",))["ops"]}
    assert (rows["aten::mm"]["status"], rows["aten::mm"]["models"]) == (
        "implemented",
        ["org/a", "org/b"],
    )
    assert (rows["aten::rsqrt"]["status"], rows["aten::rsqrt"]["calls"]) == ("missing", 2)


def test_push_refuses_a_data_folder_with_a_change_half_done(hub, tmp_path):
    data = tmp_path / "data"
    a, _ = two_sweeps(data)
    atomic_write_json(
        store.sweep_dir(data, a) / store.CHANGE, {"change": "exclude", "sidecars": {}}
    )
    with pytest.raises(
        UserError, match=f"has a change half-done in sweep.s. {a}; refused to publish it"
    ):
        push(hub, data)
    assert not hub.requests  # refused before it asked the Hub anything


def test_a_push_killed_after_it_recorded_where_the_logs_go_leaves_no_row_pointing_at_them(
    hub, tmp_path
):
    """SIGKILLed at each write point until one stops it with ``published.json`` written (rows
    pointing at logs the Hub never got): the next command undoes that, no row names a log."""
    data = tmp_path / "data"
    sweeps = two_sweeps(data)
    code = (
        "import sys; from model_support.publish.push import push\n"
        f"push(sys.argv[1], {REPO_ID!r}, endpoint={hub.url!r}, logs=True, log=lambda line: None)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "0", "HF_TOKEN": WRITE}
    for point in range(1, 8):
        copy = tmp_path / f"stop{point}"
        shutil.copytree(data, copy)
        rc = subprocess.run(
            [sys.executable, "-c", code, copy], env={**env, STOP_AT_WRITE: str(point)}
        ).returncode
        assert rc == -9, f"the push ended by itself ({rc}) before any stop left its logs recorded"
        if any(store.published_logs(copy, s) for s in sweeps):
            break
    said = store.finish_interrupted(copy)
    assert any("interrupted push" in line and "was undone" in line for line in said), said
    assert all(store.published_logs(copy, s) is None for s in sweeps)
    assert all(
        r["log_url"] is None and r["notebook_url"] is None for r in local_rows(copy, "results")
    )
