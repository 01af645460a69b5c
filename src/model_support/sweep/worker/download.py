"""The download stage of one model in a sweep, before (and outside) its probe.

A verdict describes the model on the stack; the harness's environment never becomes one. So the
files a probe needs are fetched here (``hub_fetch.fetch``: exactly the planned files, retried with
backoff), and what the Hub answers is sorted before any probe runs:

- ``ready``: the local snapshot to load from, with ``revision_sha``, ``download_s``,
  ``download_bytes`` and the Hub's metadata (``hub.metadata``) for the record (a local folder is
  ready as it is, with no download fields);
- ``pending``: the network or the disk failed after the retries: no record, ``--resume`` retries it;
- ``excluded``: no access (gated, private, token) or no such model or revision: an excluded row
  with the reason;
- ``failed``: the repo has no weights transformers can load, a real answer about the model:
  ``FAIL(load)`` at stage ``download``.

``MODEL_SUPPORT_HUB_ATTEMPTS`` and ``MODEL_SUPPORT_HUB_BACKOFF_S`` tune the retries
(``hub_fetch.retry_policy``; the tests use a short backoff).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...probe import hub, hub_fetch
from ...record.schema import DOWNLOAD_FIELDS
from .task import ProbeTask


@dataclass
class Download:
    kind: str  # ready | pending | excluded | failed
    path: str | None = None
    fields: dict = field(default_factory=dict)
    reason: str | None = None
    error: BaseException | None = None
    problem: str | None = None  # pending: "network" or "disk"
    log: list[str] = field(default_factory=list)


def download(task: ProbeTask) -> Download:
    """Fetch what ``task``'s probe needs (see the module docstring); never raises for the Hub's
    answer."""
    source = task["source"]
    if hub_fetch.is_local(source):
        return Download("ready", path=source)
    lines: list[str] = []
    params = task["params"]
    try:
        got = hub_fetch.fetch(
            source,
            # the sweep's commit, once known
            revision=task.get("revision_sha") or params.get("revision") or "",
            cache_dir=task.get("cache_dir") or None,
            trust_remote_code=bool(params.get("trust_remote_code")),
            log=lines.append,
        )
    except hub_fetch.EnvironmentProblem as exc:
        return Download("pending", reason=str(exc), problem=exc.kind, log=lines)
    except (hub_fetch.NoAccess, hub_fetch.NotOnHub) as exc:
        return Download("excluded", reason=str(exc), log=lines)
    except hub_fetch.NoLoadableWeights as exc:
        return Download("failed", error=exc, log=lines)
    # the Hub's facts, as of now
    fields = {**hub.metadata(got["info"]), **{k: got[k] for k in DOWNLOAD_FIELDS}}
    return Download("ready", path=got["path"], fields=fields, log=lines)
