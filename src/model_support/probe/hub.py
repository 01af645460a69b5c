"""Facts about a model on the Hub before downloading it: its revision, files, planned download size
and card metadata (the record's Hub fields).

Why it exists: a sweep over many multi-GB models must know a model's size and metadata before
fetching it. Every Hub failure is classified by ``hub_fetch`` (EnvironmentProblem, NoAccess,
NotOnHub), so the harness's environment never becomes a model's verdict. The Hub's ranked model
lists and the cache budget are the sweep's (``sweep/budget.py``).
"""

from __future__ import annotations

import huggingface_hub

from model_support.probe import hub_fetch


def _card_value(card, key):
    return (
        None
        if card is None
        else card.get(key)
        if hasattr(card, "get")
        else getattr(card, key, None)
    )


def metadata(info) -> dict:
    """The Hub metadata record fields of a ``ModelInfo`` (from model_info or list_models);
    missing -> None."""
    tags = list(getattr(info, "tags", None) or [])
    card = getattr(info, "card_data", None)
    license_ = _card_value(card, "license") or next(
        (t[8:] for t in tags if t.startswith("license:")), None
    )
    base = (
        _card_value(card, "base_model")
        or [t.split(":", 1)[1] for t in tags if t.startswith("base_model:") and t.count(":") == 1]
        or None
    )
    gated = getattr(info, "gated", None)
    created = getattr(info, "created_at", None)
    safetensors = getattr(info, "safetensors", None)
    return {
        "pipeline_tag": getattr(info, "pipeline_tag", None),
        "library_name": getattr(info, "library_name", None),
        "downloads": getattr(info, "downloads", None),
        "likes": getattr(info, "likes", None),
        "trending_score": getattr(info, "trending_score", None),
        "gated": None if gated is None else str(gated).lower(),  # "manual", "auto" or "false"
        "license": ", ".join(map(str, license_)) if isinstance(license_, list) else license_,
        "created_at": created.isoformat()
        if created is not None and hasattr(created, "isoformat")
        else created,
        "base_model": ", ".join(map(str, base)) if isinstance(base, list) else base,
        "hub_num_params": getattr(safetensors, "total", None),
    }


def model_facts(
    model_id,
    revision="",
    token=None,
    *,
    endpoint=None,
    trust_remote_code=False,
    attempts=5,
    backoff_s=1.0,
    max_backoff_s=60.0,
    log=print,
) -> dict:
    """One ``model_info(files_metadata=True)`` call, retried like ``hub_fetch.fetch``:
    {"revision_sha", "files" {name: size}, "planned_files", "planned_bytes", "plan_error", +
    ``metadata``}. For a sharded checkpoint the shards are estimated from their standard names
    (``fetch`` reads the index itself). A repo without loadable weights still has facts:
    planned_bytes None, plan_error the NoLoadableWeights sentence."""
    retrier = hub_fetch.Retrier(model_id, revision, token, attempts, backoff_s, max_backoff_s, log)
    api = huggingface_hub.HfApi(endpoint=endpoint, token=token)
    info = retrier.call(
        lambda: api.model_info(model_id, revision=revision or None, files_metadata=True),
        "model info",
    )
    files = {s.rfilename: s.size for s in info.siblings or []}
    facts = {
        "revision_sha": info.sha,
        "files": files,
        "planned_files": None,
        "planned_bytes": None,
        "plan_error": None,
    }
    try:
        plan = hub_fetch.plan_files(files, trust_remote_code)
        plan = sorted(set(plan) | set(hub_fetch.estimate_shards(files, plan)))
        facts.update(
            planned_files=plan,
            planned_bytes=hub_fetch.repo_size(files, plan, hub_fetch.blob_ids(info)),
        )
    except hub_fetch.NoLoadableWeights as exc:
        facts["plan_error"] = str(exc)
    facts.update(metadata(info))
    return facts
