"""What the sweep's driver hands a worker for one (model, variant): a ``ProbeTask``.

It crosses process boundaries as it is (JSON into the probe process's ``task.json``, pickled into a
Ray task), so it is a plain dict with declared keys. The driver builds it from ``sweep.json``
(``runner.build_tasks``); the worker may add what it learned before the probe (``snapshot``,
``facts``).
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class ProbeTask(TypedDict):
    sweep_id: str
    model_id: str  #: the record's (portable) id
    source: str  #: where to load from: a Hub id or a local folder
    params: dict[str, Any]  #: the probe notebook's settings (``probe_params`` names)
    variant: str
    timeout_s: float
    notebook_path: str  #: where the driver keeps the executed notebook, relative to the data folder
    # : machine paths -> the portable id, replaced in everything kept
    scrub: NotRequired[dict[str, str]]
    # : the Hub's metadata from the model list (``schema.HUB_FIELDS``)
    hub: NotRequired[dict[str, Any]]
    planned_bytes: NotRequired[int | None]  #: the download's size, from the Hub's file list
    #: the commit to download (``runner.tasks_to_run``: the one the sweep already probed, else the
    #: one the Hub resolved when the sweep was created), so that one sweep never mixes commits of a
    #: model; None: ask the Hub
    revision_sha: NotRequired[str | None]
    cache_dir: NotRequired[str]
    keep_cache: NotRequired[bool]
    snapshot: NotRequired[str]  #: the local folder the files were downloaded to, ahead of the probe
    facts: NotRequired[dict[str, Any]]  #: the Hub's facts for the record (``records.FACT_FIELDS``)
    # : a host-checks process: the device phase's state file (``worker.host_checks``)
    checks_state: NotRequired[str]
