"""Download exactly what a probe needs from the Hugging Face Hub, and say why when it cannot.

A verdict describes the model on the stack; the harness's environment (network, disk, access rights,
a missing token) never becomes one. This module draws that line before any model code runs: every
failure to obtain the files becomes one of four exceptions, each with a one-sentence message:
``EnvironmentProblem`` (network or disk: retry the model later), ``NoAccess`` (gated, private,
token), ``NotOnHub`` (no such model or revision) and ``NoLoadableWeights`` (a real property of the
model: the repo has nothing transformers can load). It imports only the standard library and
huggingface_hub, because its source is pasted verbatim into the standalone reproduction scripts; for
the same reason it is one piece (a script carries one module's source), a little over the usual
module size.

Retries: what huggingface_hub (2.4) already does, and what this module adds.

- ``HfApi.model_info`` is one plain GET, never retried by the library: ``fetch`` retries it here
  (connection errors, timeouts, 408/429/5xx) with exponential backoff, honouring ``Retry-After``.
- ``hf_hub_download``, per file, HEAD then GET. The HEAD is tried once; on a network error or a
  408/429/5xx with no cached copy the library tries it again with its own backoff (``http_backoff``:
  5 retries, 1 s doubling to 8 s, ``Retry-After`` + 1 s) and finally raises
  ``LocalEntryNotFoundError`` from the last error. The GET retries 408/429 the same way, and on a
  connection error, a timeout or a body cut midway (``RemoteProtocolError``: incomplete read) it
  resumes with a ``Range`` request, 1 s apart, up to 5 times without progress (any received byte
  resets the count). It does not retry a 5xx on the GET, a reset connection (``ReadError``) or a
  body that ends short without an error (its "Consistency check failed" ``OSError``), and it deletes
  its partial file when it gives up.
- So ``fetch`` retries a file only for what the library did not already retry (5xx on the GET,
  read errors, short bodies), restarting that file; an error the library already retried with its
  own backoff is final at once, so a dead network costs one round of library retries, not five.
- Every retry here is logged as one line ("retry 2/5 in 4.0 s: 503 Service Unavailable"); waits
  double from ``backoff_s`` and are capped at ``max_backoff_s``, ``Retry-After`` included.
- Downloads with hf_xet (Xet-backed files on the real Hub) retry inside hf_xet; their errors are
  final.
"""

import email.utils
import errno
import itertools
import json
import logging
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import huggingface_hub
from huggingface_hub import constants as hf_constants
from huggingface_hub import errors as hf_errors


class EnvironmentProblem(Exception):
    """The harness's environment failed (network, disk), not the model."""

    def __init__(self, message, kind="network"):
        super().__init__(message)
        self.kind = kind


class NoAccess(Exception):
    """The model exists but these credentials cannot read it (gated, private, missing or refused
    token)."""


class NotOnHub(Exception):
    """The model, or its revision, does not exist on the Hub."""


class NoLoadableWeights(Exception):
    """A real model failure: the repo holds no weights transformers can load."""


CONFIG_FILES = {"config.json", "generation_config.json"}
TOKENIZER_FILES = {
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.model",
    "sentencepiece.bpe.model",
    "spm.model",
    "bpe.codes",
    "dict.txt",
    "entity_vocab.json",
    "normalizer.json",
    "chat_template.jinja",
    "chat_template.json",
}
#: An image-text-to-text model's processor: its own settings, the image processor's and the video
#: processor's.
PROCESSOR_FILES = {
    "processor_config.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
}
WEIGHT_CHOICES = (  # transformers' order of preference; the first present at top level wins
    ("model.safetensors", "model.safetensors.index.json"),
    ("pytorch_model.bin", "pytorch_model.bin.index.json"),
)
_TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{20,}")


def is_local(model_id):
    """True for a local folder (a path-looking string: starting with / . ~, or with more than one
    /); False for a Hub id ("name", "org/name") even where a folder of that name happens to be in
    the current directory: what a model id means must not depend on where the command was typed
    (write ``./name`` for such a folder)."""
    text = str(model_id)
    return text.startswith(("/", ".", "~")) or text.count("/") > 1


def plan_files(files, trust_remote_code=False):
    """The files the probe needs from a repo listing ``{name: size}``: config, generation config,
    tokenizer, chat template, processor (image-text-to-text), and the weights in the one format
    transformers loads (a single file, or an index whose shards ``shards_from_index`` names once
    it is downloaded); custom ``*.py`` only with trust_remote_code."""
    top = {name for name in files if "/" not in name}
    plan = top & (CONFIG_FILES | TOKENIZER_FILES | PROCESSOR_FILES)
    plan |= {n for n in top if n.endswith(".tiktoken")}
    plan |= {
        n for n in files if n.startswith("additional_chat_templates/") and n.endswith(".jinja")
    }
    if trust_remote_code:
        plan |= {n for n in top if n.endswith(".py")}
    for single, index in WEIGHT_CHOICES:
        if single in top or index in top:
            return sorted(plan | {single if single in top else index})
    raise NoLoadableWeights(
        f"the repo has no weights transformers can load: {_describe_weights(files)}"
    )


def shards_from_index(index_json_text):
    """The top-level shard files a ``*.index.json`` lists in its ``weight_map``, sorted."""
    return sorted(
        {s for s in json.loads(index_json_text).get("weight_map", {}).values() if "/" not in s}
    )


def estimate_shards(files, plan):
    """Shards of a planned index, guessed from the listing without downloading the index
    (save_pretrained's ``model-00001-of-00004.safetensors`` names; else every top-level file of
    that format): for sizes only."""
    shards = set()
    for index in (p for p in plan if p.endswith(".index.json")):
        stem, ext = index[: -len(".index.json")].rsplit(".", 1)
        pattern = re.compile(rf"{re.escape(stem)}-\d+-of-\d+\.{re.escape(ext)}")
        found = {n for n in files if pattern.fullmatch(n)}
        shards |= found or {
            n for n in files if "/" not in n and n.endswith("." + ext) and n != f"{stem}.{ext}"
        }
    return sorted(shards)


def repo_size(files, plan, blobs=None):
    """Bytes of the planned files (unknown sizes count as 0). With ``blobs`` ({name: blob id}),
    files with equal contents count once, as the cache stores and the client downloads them once."""
    seen, total = set(), 0
    for name in plan:
        key = (blobs or {}).get(name) or name
        if key not in seen:
            seen.add(key)
            total += files.get(name) or 0
    return total


_WEIGHT_KINDS = {
    ".gguf": (".gguf",),
    "onnx": (".onnx", ".onnx_data"),
    ".h5": (".h5",),
    ".msgpack": (".msgpack",),
    ".pth": (".pth", ".pt"),
    ".safetensors": (".safetensors",),
    ".bin": (".bin",),
}


def _describe_weights(files):
    kinds = [
        kind
        for kind, ends in _WEIGHT_KINDS.items()
        if any(n.endswith(ends) or (kind == "onnx" and n.startswith("onnx/")) for n in files)
    ]
    if not kinds:
        return "no weight files at all (" + (", ".join(sorted(files)[:8]) or "an empty repo") + ")"
    text = "only " + " / ".join(kinds) + " files"
    if {".safetensors", ".bin"} & set(kinds):
        text += ", none named model.safetensors or pytorch_model.bin (or their index) at top level"
    return text


def _scrub(text, secrets=()):
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return _TOKEN_RE.sub("***", text)


def _mro_names(exc):
    return {cls.__name__ for cls in type(exc).__mro__}


def _status(exc):
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _retry_after(exc):
    """Seconds from a ``Retry-After`` header (seconds or an HTTP date), else None."""
    value = (getattr(getattr(exc, "response", None), "headers", None) or {}).get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


def _http_label(exc):
    return f"{_status(exc)} {getattr(exc.response, 'reason_phrase', '') or ''}".strip()


def _short(exc):
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


_TRANSPORT = {
    "TransportError",
    "RequestException",
    "IncompleteRead",
    "ProtocolError",
    "ChunkedEncodingError",
}


def classify(exc, model_id, revision="", token_sent=False, cache_dir=None):
    """``(exception to raise, transient, Retry-After seconds, one-line label)`` for an error met
    while fetching; the exception is None when the error is none of the classified kinds (a bug:
    let it raise). ``cache_dir``: the Hugging Face cache the model would be loaded from offline
    (None: huggingface_hub's)."""
    names, short, mid = _mro_names(exc), _short(exc), repr(model_id)
    if isinstance(exc, (EnvironmentProblem, NoAccess, NotOnHub, NoLoadableWeights)):
        return exc, False, None, str(exc)
    if "OfflineModeIsEnabled" in names:
        problem = _offline_miss(model_id, revision, cache_dir) or EnvironmentProblem(
            "the Hub was not contacted: offline mode is on (HF_HUB_OFFLINE=1)."
        )
        return problem, False, None, short
    # the library's wrapper around its last HEAD error
    if isinstance(exc, hf_errors.LocalEntryNotFoundError):
        if (cause := exc.__cause__ or exc.__context__) is not None:
            return classify(cause, model_id, revision, token_sent)
        return (
            EnvironmentProblem(f"the Hub could not be reached for model {mid}."),
            False,
            None,
            short,
        )
    if isinstance(exc, hf_errors.GatedRepoError):
        return (
            NoAccess("no access: gated repo (accept its licence on the Hub, then set HF_TOKEN)."),
            False,
            None,
            short,
        )
    if isinstance(exc, hf_errors.RevisionNotFoundError):
        return (
            NotOnHub(f"revision {revision!r} of model {mid} does not exist on the Hub."),
            False,
            None,
            short,
        )
    if isinstance(exc, hf_errors.HFValidationError):
        return (
            NotOnHub(f"model {mid} does not exist on the Hub (not a valid model id)."),
            False,
            None,
            short,
        )
    if isinstance(exc, hf_errors.HfHubHTTPError) or ("HTTPStatusError" in names and _status(exc)):
        status, label = _status(exc), _http_label(exc)
        if isinstance(exc, hf_errors.RepositoryNotFoundError) and status == 404:
            return NotOnHub(f"model {mid} does not exist on the Hub."), False, None, label
        if isinstance(exc, hf_errors.RemoteEntryNotFoundError) or status == 404:
            rev = f"revision {revision!r} of " if revision else ""
            return (
                NotOnHub(f"a file of {rev}model {mid} does not exist on the Hub ({label})."),
                False,
                None,
                label,
            )
        if status == 401 and token_sent:
            message = (
                "no access: the token was refused or cannot see this private repo (check HF_TOKEN)."
            )
        elif status == 401:
            message = (
                f"no access: private or missing token (set HF_TOKEN), or model {mid} does not "
                "exist on the Hub (without a token the Hub answers both alike)."
            )
        elif status == 403:
            message = (
                f"no access: the Hub refused this token for model {mid} (403 Forbidden; check "
                "HF_TOKEN)."
            )
        else:
            transient = status in (408, 429) or (status or 0) >= 500
            return (
                EnvironmentProblem(f"the Hub answered {label}"),
                transient,
                _retry_after(exc),
                label,
            )
        return NoAccess(message), False, None, label
    if names & _TRANSPORT or isinstance(exc, (ConnectionError, TimeoutError)):
        return EnvironmentProblem(f"the Hub could not be reached ({short})"), True, None, short
    if isinstance(exc, OSError) and str(exc).startswith("Consistency check failed"):
        label = "download cut short (fewer bytes than the file's size)"
        return EnvironmentProblem(f"a download was cut midway ({label})"), True, None, label
    if "XetAuthenticationError" in names:
        problem = NoAccess(
            f"no access: the Xet storage refused the token for model {mid} (check HF_TOKEN)."
        )
        return problem, False, None, short
    if (
        isinstance(exc, hf_errors.XetDownloadError)
        or type(exc).__module__.split(".")[0] == "hf_xet"
    ):
        return EnvironmentProblem(f"the Xet download failed ({short})"), False, None, short
    if isinstance(exc, hf_errors.FileMetadataError):
        return (
            EnvironmentProblem(f"the endpoint does not answer like the Hub ({short})"),
            False,
            None,
            short,
        )
    if isinstance(exc, OSError):
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        what = "the disk is full" if full else "the Hugging Face cache could not be written"
        return EnvironmentProblem(f"{what} ({short})", kind="disk"), False, None, short
    return None, False, None, short


def _library_retried(exc):
    """True when huggingface_hub's own backoff already retried this download error (see the
    module docstring)."""
    if isinstance(exc, hf_errors.LocalEntryNotFoundError):
        return True
    if _status(exc) in (408, 429):
        return True
    return bool(_mro_names(exc) & {"ConnectError", "TimeoutException", "RemoteProtocolError"})


def _default_token():
    """The token huggingface_hub sends when given none (HF_TOKEN, the stored login), or None."""
    try:
        return huggingface_hub.get_token()
    except Exception:  # noqa: BLE001 - e.g. a failed OIDC exchange: the request itself will report it
        return None


class Retrier:
    """Runs calls with the retry policy above, logging each retry; shared by the download threads
    of a fetch."""

    def __init__(
        self, model_id, revision, token, attempts, backoff_s, max_backoff_s, log, cache_dir=None
    ):
        self.model_id, self.revision, self.cache_dir = model_id, revision, cache_dir
        self.attempts, self.backoff_s, self.max_backoff_s, self.log = (
            max(1, attempts),
            backoff_s,
            max_backoff_s,
            log,
        )
        sent = (
            token if isinstance(token, str) else (_default_token() if token is not False else None)
        )
        self.token_sent, self.secrets = (
            bool(sent),
            [s for s in (token if isinstance(token, str) else None, sent) if s],
        )
        self.lines, self.lock = [], threading.Lock()

    def call(self, fn, what, library_retries=False):
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except Exception as exc:  # noqa: BLE001 - classified below; unknown kinds re-raise as they are
                problem, transient, after, label = classify(
                    exc, self.model_id, self.revision, self.token_sent, self.cache_dir
                )
                if problem is None:
                    raise
                final = (
                    not transient
                    or attempt == self.attempts
                    or (library_retries and _library_retried(exc))
                )
                if final:
                    # say where, and how often it was tried
                    if isinstance(problem, EnvironmentProblem):
                        tries = f" after {attempt} attempts" if attempt > 1 else ""
                        text = _scrub(f"{str(problem).rstrip('.')}{tries} ({what}).", self.secrets)
                        problem = EnvironmentProblem(text, problem.kind)
                    raise problem from exc
                wait = self.backoff_s * 2 ** (attempt - 1) if after is None else after
                wait = min(self.max_backoff_s, wait)
                line = _scrub(
                    f"retry {attempt + 1}/{self.attempts} in {wait:.1f} s: {label}", self.secrets
                )
                with self.lock:
                    self.lines.append(line)
                self.log(line)
                time.sleep(wait)


_FETCHES = itertools.count()


class _LibraryLog(logging.Handler):
    """huggingface_hub's own retry warnings ("Retrying in 1s", "Trying to resume download..."),
    from this fetch's download threads only, into ``log``: the retries the library makes are
    noted like ours. The pool names its threads ``<prefix>_<n>``: the name up to its last ``_``
    is matched whole (a prefix match would give ``hub-fetch-1`` the lines of ``hub-fetch-12``,
    another model's)."""

    def __init__(self, prefix, log, secrets):
        super().__init__(logging.WARNING)
        self.prefix, self.log, self.secrets = prefix, log, secrets

    def emit(self, record):
        if (record.threadName or "").rpartition("_")[0] == self.prefix:
            self.log(
                _scrub(
                    "huggingface_hub: " + " ".join(record.getMessage().split())[:300], self.secrets
                )
            )


def blob_ids(info):
    """{file: the id its cache blob is named by} for a ModelInfo fetched with
    files_metadata=True."""
    return {s.rfilename: (s.lfs.sha256 if s.lfs else s.blob_id) for s in info.siblings or []}


def _cached(cache_dir, model_id, sha, name, blob):
    folder = Path(cache_dir) / ("models--" + model_id.replace("/", "--"))
    return (folder / "snapshots" / sha / name).exists() or bool(
        blob and (folder / "blobs" / blob).exists()
    )


def retry_policy():
    """attempts and backoff_s: 5 and 1.0 s, or ``$MODEL_SUPPORT_HUB_ATTEMPTS`` /
    ``$MODEL_SUPPORT_HUB_BACKOFF_S``."""
    return {
        "attempts": int(os.environ.get("MODEL_SUPPORT_HUB_ATTEMPTS", "5")),
        "backoff_s": float(os.environ.get("MODEL_SUPPORT_HUB_BACKOFF_S", "1.0")),
    }


def fetch(
    model_id,
    revision="",
    token=None,
    cache_dir=None,
    trust_remote_code=False,
    attempts=None,
    backoff_s=None,
    max_backoff_s=60.0,
    log=print,
    endpoint=None,
):
    """Download the planned files of ``model_id`` at ``revision`` into the huggingface_hub cache.

    Returns {"path", "revision_sha", "info" (the ModelInfo), "download_s", "download_bytes",
    "files", "retries"}; raises EnvironmentProblem, NoAccess, NotOnHub or NoLoadableWeights. A
    local folder is returned as is."""
    start = time.monotonic()
    if is_local(model_id):
        return _local_folder(model_id)
    cache_dir = str(cache_dir or hf_constants.HF_HUB_CACHE)
    if hf_constants.HF_HUB_OFFLINE and (missing := _offline_miss(model_id, revision, cache_dir)):
        raise missing  # said before any call, without the retrier's "(model info)"
    policy = retry_policy()
    attempts = policy["attempts"] if attempts is None else attempts
    backoff_s = policy["backoff_s"] if backoff_s is None else backoff_s
    retrier = Retrier(model_id, revision, token, attempts, backoff_s, max_backoff_s, log, cache_dir)
    api = huggingface_hub.HfApi(endpoint=endpoint, token=token)
    info = retrier.call(
        lambda: api.model_info(model_id, revision=revision or None, files_metadata=True),
        "model info",
    )
    sha = info.sha
    siblings = {s.rfilename: s for s in info.siblings or []}
    files = {name: s.size for name, s in siblings.items()}
    blob = blob_ids(info)
    cached = {name for name in files if _cached(cache_dir, model_id, sha, name, blob[name])}
    plan = plan_files(files, trust_remote_code)

    prefix = f"hub-fetch-{next(_FETCHES)}"
    library_log = _LibraryLog(prefix, log, retrier.secrets)

    def download(names):
        def one(name):
            def get():
                return huggingface_hub.hf_hub_download(
                    model_id,
                    name,
                    revision=sha,
                    cache_dir=cache_dir,
                    token=token,
                    endpoint=endpoint,
                )

            return retrier.call(get, name, library_retries=True)

        with ThreadPoolExecutor(
            max_workers=min(8, max(1, len(names))), thread_name_prefix=prefix
        ) as pool:
            futures = [pool.submit(one, name) for name in names]
        for future in futures:  # all finished; the first failure in plan order wins
            future.result()
        return {name: future.result() for name, future in zip(names, futures)}

    hf_logger = logging.getLogger("huggingface_hub")
    hf_logger.addHandler(library_log)
    try:
        paths = download(plan)
        plan = _with_shards(plan, paths, files, download)
    finally:
        hf_logger.removeHandler(library_log)
    folder = Path(cache_dir) / ("models--" + model_id.replace("/", "--"))
    # what snapshot_download does: an offline load by id then finds the revision
    if (revision or "main") != sha:
        try:
            ref = folder / "refs" / (revision or "main")
            ref.parent.mkdir(parents=True, exist_ok=True)
            ref.write_text(sha)
        except OSError:
            pass  # only a convenience; the snapshot path is what the probe gets
    snapshot = folder / "snapshots" / sha
    return {
        "path": str(snapshot),
        "revision_sha": sha,
        "info": info,
        "download_s": round(time.monotonic() - start, 3),
        "download_bytes": repo_size(files, [p for p in plan if p not in cached], blob),
        "files": plan,
        "retries": list(retrier.lines),
    }


def _offline_miss(model_id, revision, cache_dir=None):
    """Offline, for a model the cache (``cache_dir``, else huggingface_hub's) holds no config of
    at ``revision``: the EnvironmentProblem that says so, naming it. None when the cache has it
    (offline mode alone is then the problem), or for an invalid id (the lookup says so)."""
    try:
        found = huggingface_hub.try_to_load_from_cache(
            model_id, "config.json", cache_dir=cache_dir, revision=revision or None
        )
    except hf_errors.HFValidationError:
        return None
    if isinstance(found, str):
        return None
    return EnvironmentProblem(
        f"model {model_id!r} is not in the local Hugging Face cache (HF_HUB_CACHE) and offline "
        "mode is on (HF_HUB_OFFLINE=1)."
    )


def _local_folder(model_id):
    """``fetch``'s answer for a local folder: nothing downloaded."""
    path = os.path.abspath(os.path.expanduser(model_id))
    return {
        "path": path,
        "revision_sha": None,
        "download_s": 0.0,
        "download_bytes": 0,
        "files": sorted(os.listdir(path)) if os.path.isdir(path) else [],
        "retries": [],
    }


def _with_shards(plan, paths, files, download):
    """The plan plus the shards its index files list (downloaded here)."""
    for index in [p for p in plan if p.endswith(".index.json")]:
        try:
            listed = shards_from_index(Path(paths[index]).read_text())
        # a corrupt index is the model's own failure: the load will say so
        except (ValueError, AttributeError):
            listed = []
        shards = [s for s in listed if s in files and s not in plan]
        # a shard the index names but the repo lacks is left to fail the load, honestly
        download(shards)
        plan = sorted(set(plan) | set(shards))
    return plan
