"""Push the dataset to a Hugging Face Hub dataset repo, with its card, the latest report and
(``--logs``) the raw logs behind its rows: only what the repo does not have yet, in one commit.

What a push does, in order:

1. checks what it was given (a dataset in the data folder, ``namespace/name`` ids, a token, online)
   before contacting the Hub: one sentence each;
2. creates the dataset repo (and the bucket, with ``--logs-bucket``) unless it exists;
3. with logs: records where each sweep's notebooks and logs go (``store.set_published_logs``, which
   compacts the sweep again so that each row gets its ``notebook_url`` and ``log_url``), stages the
   redacted files (``files.stage_logs``) and, for a bucket, uploads those the bucket lacks (by Xet
   hash);
4. lists the repo at its head commit, compares each file (card, Parquet files, the latest sweep's
   report, logs kept in the repo) with it, and commits what differs, with the deletion of a local
   sweep's Parquet file that moved to the other config (``exclude`` / ``include``), in one commit
   whose message names the sweeps, made on that head (``parent_commit``: a push racing another one
   fails rather than overwrite it).

A commit is atomic: a push that fails or is interrupted leaves the repo as it was, and the data
folder too (step 3's records are undone); a rerun uploads what is still missing. Logs a bucket
already received stay there and are not sent again. Sweeps the repo holds from another data folder
are left alone (the card names them). Once a sweep's logs are published, later pushes to the same
place keep them in step, with or without ``--logs``, so a published row's links resolve.

Each call to the Hub follows the download stage's retry policy (``hub_fetch.Retrier``: connection
errors, timeouts, 408/429/5xx retried with exponential backoff honouring Retry-After; 5 attempts
from 1 s, or ``$MODEL_SUPPORT_HUB_ATTEMPTS`` / ``$MODEL_SUPPORT_HUB_BACKOFF_S``); what it cannot fix
is one sentence (``PushError``): no write access (no token, a read token, a repo the token cannot
see), the Hub unreachable, the repo changed meanwhile.
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from ..probe.hub_fetch import EnvironmentProblem, NoAccess, NotOnHub, Retrier, retry_policy
from ..record import store
from ..record.sweep_meta import parse_sweep_id
from ..redact import redact
from . import card, files


class PushError(UserError):
    """Pushing failed or cannot start; the message says why in one sentence."""


@dataclass
class PushResult:
    """What a push did: the commit (None when the repo had everything), the sweeps it added or
    changed, the sweeps whose logs it uploaded, file counts, the sweep whose report the card
    links, and notes."""

    repo_id: str
    commit_url: str | None = None
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    files: int = 0
    deleted: int = 0
    bucket_files: int = 0
    report: str | None = None
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [
            f"pushed:   {self.commit_url}"
            if self.commit_url
            else f"nothing to push: {self.repo_id} already has every file of this data folder"
        ]
        for label, ids in (
            ("added", self.added),
            ("updated", self.updated),
            ("logs of", self.logs),
        ):
            if ids:
                lines.append(f"{label + ':':<9} {', '.join(ids)}")
        if self.commit_url:
            lines.append(f"files:    {self.files} uploaded, {self.deleted} deleted")
        if self.bucket_files:
            lines.append(f"bucket:   {self.bucket_files} log files uploaded")
        return "\n".join([*lines, *self.notes])


def push(
    data_dir: Path | str,
    repo_id: str,
    *,
    private: bool = True,
    logs: bool = False,
    logs_bucket: str | None = None,
    endpoint: str | None = None,
    token: str | None = None,
    log=print,
) -> PushResult:
    """Push the data folder's dataset to the Hub dataset repo ``repo_id`` (see the module
    docstring); ``logs`` also publishes the raw logs, into the repo or into the bucket
    ``logs_bucket`` (``namespace/name``); ``endpoint`` defaults to huggingface_hub's
    (``HF_ENDPOINT``)."""
    import huggingface_hub

    data_dir = Path(data_dir)
    if not files.dataset_files(data_dir):
        raise PushError(f"{data_dir} holds no dataset yet; run a sweep first (make sweep).")
    _check_id(repo_id, "a Hub dataset repo id")
    bucket = logs_bucket.removeprefix("hf://buckets/").strip("/") if logs_bucket else None
    if bucket:
        _check_id(bucket, "a Hub bucket id")
    logs = logs or bool(bucket)
    where = f"the Hub dataset {repo_id!r}"
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        raise PushError(
            f"Could not push to {where}: offline mode is on (HF_HUB_OFFLINE=1); nothing "
            "changed there: unset it, this needs network access to the Hub."
        )
    token = token or huggingface_hub.get_token()
    if not token:
        raise PushError(
            f"No write access to {where}: set HF_TOKEN to a write token (no token is set)."
        )
    endpoint = (endpoint or huggingface_hub.constants.ENDPOINT).rstrip("/")
    api = huggingface_hub.HfApi(endpoint=endpoint, token=token)
    policy = retry_policy()
    retrier = Retrier(repo_id, "", token, policy["attempts"], policy["backoff_s"], 60.0, log)
    with store.writing_all(data_dir), _sentences(where):  # no sweep changes while it is sent
        store.require_whole(data_dir)  # never a data folder with a change half-done
        retrier.call(lambda: _ensure_repo(api, repo_id, private), "create the repo")
        if bucket:
            with _sentences(f"the Hub bucket {bucket!r}"):
                retrier.call(
                    lambda: api.create_bucket(bucket, private=private, exist_ok=True),
                    "create the bucket",
                )
        destinations = _destinations(data_dir, repo_id, bucket, logs, endpoint)
        undo: dict[str, dict | None] = {}
        journals = contextlib.ExitStack()
        try:
            undo = _record_destinations(data_dir, destinations, journals)
            with tempfile.TemporaryDirectory(prefix=".push-", dir=data_dir) as folder:
                stage = Path(folder)
                staged = {
                    s: files.stage_logs(data_dir, s, d["prefix"], stage, (token,))
                    for s, d in destinations.items()
                }
                sent = _sync_buckets(api, retrier, staged, destinations)
                in_repo = [
                    u for s, ups in staged.items() if not destinations[s].get("bucket") for u in ups
                ]
                result = retrier.call(
                    lambda: _commit(
                        api, repo_id, data_dir, stage, in_repo, destinations, endpoint, token
                    ),
                    "commit",
                )
            journals.close()  # published: the rows' addresses stand
        except BaseException as exc:
            for sweep_id, previous in undo.items():
                store.set_published_logs(data_dir, sweep_id, previous)
            journals.close()  # undone here: the journals are spent
            # the Hub's errors arrive classified: this one is the data folder's
            if isinstance(exc, OSError):
                raise PushError(
                    f"Could not write under {data_dir} while preparing the push ({exc}); "
                    "nothing changed on the Hub: make room there, or push from a writable "
                    "copy of the data folder."
                ) from exc
            raise
    result.bucket_files = len(sent)
    result.logs = sorted(set(result.logs) | {u.sweep_id for u in sent})
    return result


def _ensure_repo(api, repo_id: str, private: bool) -> None:
    """Create the dataset repo unless the token sees it already. (Asked first: huggingface_hub
    2.4.0's ``create_repo(exist_ok=True)`` answers a repo that exists but that the token may not
    write with a ``RepoUrl`` built without the endpoint, which raises for any endpoint but the
    default one.)"""
    from huggingface_hub.errors import RepositoryNotFoundError

    try:
        api.repo_info(repo_id, repo_type="dataset")
    except RepositoryNotFoundError:
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)


def _check_id(repo_id: str, what: str) -> None:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
        valid = repo_id.count("/") == 1
    except HFValidationError:
        valid = False
    if not valid:
        raise PushError(
            f"{repo_id!r} is not {what}: give it as <namespace>/<name>, e.g. "
            "my-org/model-support-sweeps."
        )


@contextlib.contextmanager
def _sentences(where: str, unchanged: str = "nothing changed there"):
    """The classified Hub errors (``hub_fetch.Retrier`` raises them after its retries) as one
    sentence; ``unchanged`` says what the failure left as it was."""
    try:
        yield
    except (NoAccess, NotOnHub) as exc:
        status = getattr(getattr(exc.__cause__, "response", None), "status_code", None)
        why = {401: "the Hub refused the token", 403: "the token may not write there"}.get(
            status or 0, "the Hub does not show it to this token"
        )
        raise PushError(
            f"No write access to {where}: set HF_TOKEN to a write token ({why})."
        ) from exc
    except EnvironmentProblem as exc:
        if getattr(getattr(exc.__cause__, "response", None), "status_code", None) == 412:
            raise PushError(
                f"{where} changed while this push was preparing its commit (another push?); "
                f"{unchanged}: run the push again."
            ) from exc
        raise PushError(
            f"Could not push to {where}: {str(exc).rstrip('.')}; {unchanged}: push again once "
            "the Hub can be reached (this needs network access)."
        ) from exc


def _destinations(
    data_dir: Path, repo_id: str, bucket: str | None, logs: bool, endpoint: str
) -> dict[str, dict]:
    """{sweep: where its logs go in this push}: with ``logs``, every sweep of the dataset's, into
    the bucket or the repo; else the sweeps whose logs an earlier push published to this repo or
    to a bucket."""
    sweeps = {u.sweep_id for u in files.dataset_files(data_dir) if u.sweep_id} & set(
        store.list_sweeps(data_dir)
    )
    chosen = {}
    for sweep_id in sorted(sweeps):
        before = store.published_logs(data_dir, sweep_id)
        if logs:
            chosen[sweep_id] = files.log_destination(endpoint, repo_id, bucket, sweep_id)
        elif before and (before.get("bucket") or before.get("repo") == repo_id):
            chosen[sweep_id] = before
    return chosen


def _record_destinations(
    data_dir: Path, destinations: dict[str, dict], journals: contextlib.ExitStack
) -> dict[str, dict | None]:
    """Record each sweep's new destination (recompacting it); returns what to restore on failure.
    Each change is journaled with what it replaced (``store.change``, closed in ``journals`` once
    the push is done): a push killed before that leaves no row pointing at logs that were never
    published, the next command undoes it."""
    undo = {}
    try:
        for sweep_id, destination in destinations.items():
            before = store.published_logs(data_dir, sweep_id)
            if before != destination:
                undo[sweep_id] = before
                journals.enter_context(
                    store.change(data_dir, sweep_id, "push", {store.PUBLISHED: before})
                )
                store.set_published_logs(data_dir, sweep_id, destination)
    except BaseException:
        for sweep_id, previous in undo.items():
            store.set_published_logs(data_dir, sweep_id, previous)
        raise
    return undo


def _sync_buckets(
    api, retrier: Retrier, staged: dict[str, list], destinations: dict[str, dict]
) -> list:
    """Upload the staged logs each bucket lacks (compared by Xet hash); returns the uploads sent."""
    by_bucket: dict[str, list[files.Upload]] = {}
    for sweep_id, uploads in staged.items():
        if bucket := destinations[sweep_id].get("bucket"):
            by_bucket.setdefault(bucket, []).extend(uploads)
    sent = []
    for bucket, uploads in by_bucket.items():  # a bucket's batch is not atomic: say what stays
        with _sentences(
            f"the Hub bucket {bucket!r}",
            "the logs it already received stay there, the dataset is as it was",
        ):
            sent += retrier.call(
                lambda b=bucket, u=uploads: _bucket_once(api, b, u), "upload logs to the bucket"
            )
    return sent


def _bucket_once(api, bucket: str, uploads: list[files.Upload]) -> list[files.Upload]:
    from hf_xet import hash_files
    from huggingface_hub import BucketFile
    from huggingface_hub.errors import HfHubHTTPError

    remote = {}
    for prefix in sorted({u.path.split("/", 1)[0] for u in uploads}):
        try:
            for entry in api.list_bucket_tree(bucket, prefix=prefix, recursive=True):
                if isinstance(entry, BucketFile):
                    remote[entry.path] = entry.xet_hash
        # a folder the bucket does not have yet is empty, not an error
        except HfHubHTTPError as exc:
            if getattr(exc.response, "status_code", None) != 404:
                raise
    hashes = hash_files([str(u.source) for u in uploads]) if uploads else []
    missing = [u for u, h in zip(uploads, hashes) if remote.get(u.path) != h.hash]
    if missing:
        api.batch_bucket_files(bucket, add=[(str(u.source), u.path) for u in missing])
    return missing


def _commit(
    api,
    repo_id: str,
    data_dir: Path,
    stage: Path,
    log_uploads: list,
    destinations: dict,
    endpoint: str,
    token: str,
) -> PushResult:
    """One attempt: list the repo at its head, compare, commit what differs on that head (see the
    module docstring). Done again from the start when retried, so a retry never repeats a landed
    change."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete
    from huggingface_hub.hf_api import RepoFile

    head = api.dataset_info(repo_id).sha
    remote = {
        f.path: f
        for f in api.list_repo_tree(repo_id, repo_type="dataset", revision=head, recursive=True)
        if isinstance(f, RepoFile)
    }
    dataset = files.dataset_files(data_dir)
    local_sweeps = {u.sweep_id for u in dataset} | set(store.list_sweeps(data_dir))
    remote_sweeps = {sweep for p in remote if (sweep := files.dataset_sweep(p))}
    rows = card.sweep_rows(data_dir)
    latest = card.latest_with_results(rows)
    uploads = [
        *dataset,
        *files.repro_files(data_dir),
        *log_uploads,
        *_latest_report(data_dir, stage, latest, token),
    ]
    report, path = None, f"reports/{latest}.html"
    if latest and (path in remote or any(u.path == path for u in uploads)):
        url = f"{endpoint}/datasets/{repo_id}/resolve/main/{path}"
        report = {"path": path, "url": url, "label": parse_sweep_id(latest).label}
    text = card.render_card(
        data_dir,
        repo_id,
        rows,
        report=report,
        logs=dict(sorted(destinations.items())),
        other_sweeps=sorted(remote_sweeps - local_sweeps),
    )
    (stage / "README.md").write_text(text)
    uploads.insert(0, files.Upload("README.md", stage / "README.md", None, "card"))

    changed = [u for u in uploads if not u.same_as(remote.get(u.path))]
    paths = {u.path for u in uploads}
    deleted = sorted(p for p in remote if files.dataset_sweep(p) in local_sweeps and p not in paths)
    touched = sorted(
        {u.sweep_id for u in changed if u.kind in store.DATASET_CONFIGS and u.sweep_id}
        | {sweep for p in deleted if (sweep := files.dataset_sweep(p))}
    )
    result = PushResult(
        repo_id,
        added=[s for s in touched if s not in remote_sweeps],
        updated=[s for s in touched if s in remote_sweeps],
        logs=sorted({u.sweep_id for u in changed if u.kind == "logs" and u.sweep_id}),
        files=len(changed),
        deleted=len(deleted),
        report=latest if report else None,
    )
    if latest and not report:
        result.notes.append(
            f"no report of {latest} to publish: run `model-support report {latest}`, then push "
            "again"
        )
    if not changed and not deleted:
        return result
    title, description = _message(result, [u for u in changed if u.kind == "report"], deleted)
    operations: list[CommitOperationAdd | CommitOperationDelete] = [
        CommitOperationAdd(u.path, str(u.source)) for u in changed
    ]
    operations += [CommitOperationDelete(p) for p in deleted]
    commit = api.create_commit(
        repo_id,
        operations,
        commit_message=title,
        commit_description=description,
        repo_type="dataset",
        parent_commit=head,
    )
    result.commit_url = commit.commit_url
    return result


def _latest_report(
    data_dir: Path, stage: Path, latest: str | None, token: str
) -> list[files.Upload]:
    """The latest sweep's report, redacted into ``stage``, when it was rendered (the sweep
    renders it)."""
    html = data_dir / "reports" / f"{latest}.html"
    if not latest or not html.exists():
        return []
    staged = stage / "reports" / html.name
    staged.parent.mkdir(parents=True, exist_ok=True)
    staged.write_text(redact(html.read_text(), {token: "***"}))
    return [files.Upload(f"reports/{html.name}", staged, latest, "report")]


def _names(ids: list[str]) -> str:
    return (
        f"sweep {ids[0]}"
        if len(ids) == 1
        else f"sweeps {', '.join(ids)}"
        if len(ids) <= 3
        else f"{len(ids)} sweeps"
    )


def _message(result: PushResult, reports: list, deleted: list[str]) -> tuple[str, str]:
    """The commit's title (the sweeps named, or counted past three) and description (every sweep
    named)."""
    parts = [
        f"{verb} {_names(ids)}"
        for verb, ids in (
            ("add", result.added),
            ("update", result.updated),
            ("logs of", result.logs),
        )
        if ids
    ]
    parts += [f"report of {u.sweep_id}" for u in reports]
    title = "model-support: " + ("; ".join(parts) if parts else "update the dataset card")
    lines = [
        f"{label}: {', '.join(ids)}"
        for label, ids in (
            ("Added sweeps", result.added),
            ("Updated sweeps", result.updated),
            ("Logs of", result.logs),
        )
        if ids
    ]
    lines.append(
        f"{result.files} files uploaded, {len(deleted)} deleted"
        + (f": {', '.join(deleted)}" if deleted else "")
    )
    return title, "\n".join(lines)
