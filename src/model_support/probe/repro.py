"""The standalone script that reproduces a probe: a header with its settings, and a body shared by
every row.

A repro script is ``header(SETTINGS) + body()``. The body is the source of ``hub_fetch``, the
probe's stages (``probe_failures``, ``probe_vision``, ``probe_backend``, ``probe_compile``,
``probe_core``), ``agreement`` and ``reproduce`` (the very code the probe ran: its download, its
stages, its reference check, and the script's program), their imports of each other dropped (one
namespace), then ``sys.exit(main(SETTINGS, sys.argv))``; so ``python repro.py`` needs only torch and
transformers (plus the device's backend package), no papermill and no install of this project, and
reaches the same verdict and tokens. The header is a docstring and ``SETTINGS``: the probe's
settings (``SETTING_NAMES``) as it ran them.

The body is the same for every probe of one version of this code, so a record keeps only its
``repro_settings`` and the body's ``repro_sha256``; the store keeps each body once,
``repro/<sha256>.py`` (beside a sweep's records, and beside the Parquet data and on the Hub).
``script_of`` puts a row's script together again (older rows carry the whole text in
``repro_script``); ``script_for`` finds a sweep's row first (``model-support repro SWEEP MODEL``).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import pprint
import re
import shlex
from pathlib import Path

from ..errors import UserError
from ..record import store
from ..record.schema import Record
from . import (
    agreement,
    hub_fetch,
    model_ids,
    probe_backend,
    probe_compile,
    probe_core,
    probe_failures,
    probe_params,
    probe_vision,
    reproduce,
)

#: The modules whose source is the body, in order (each may import the earlier ones by name, nothing
#: else).
BODY_MODULES = (
    hub_fetch,
    probe_failures,
    probe_vision,
    probe_backend,
    probe_compile,
    probe_core,
    agreement,
    reproduce,
)
#: What a repro script's SETTINGS hold beyond the probe's settings: how the probe's device adapter
#: resolved them (the compile backend; for a sharded run its ``DistributedConfig``, the process
#: group's backend and each rank's environment) and the backend's own configuration as the probe ran
#: (``device_config``: the variables its adapter declares and shows; the script sets them before it
#: loads the backend).
RESOLVED_NAMES = (
    "compile_backend",
    "distributed",
    "distributed_backend",
    "rank_env",
    "device_config",
)
#: The settings a repro script carries: the model, every probe setting (``probe_params.SETTINGS``;
#: ``device`` the resolved device type) and the resolved ones.
SETTING_NAMES = ("model_id", *probe_params.SETTINGS, *RESOLVED_NAMES)

HEADER = '''#!/usr/bin/env python
"""Reproduce the model-support probe of {model_id!r} on {device!r}{sweep}.

Run with plain python: it loads the model in {dtype} (task {task}), builds the prompt ({chat}),
greedily generates {max_new_tokens} tokens, says its verdict in words and prints one JSON line with the
verdict and the token ids, and, after a PASS with the CPU reference on, numerics: the reference's logits,
teacher-forced on these tokens, against the device's (match / ties / diverges).
Exit status: 0 on PASS; 1 on a FAIL (the failure's traceback on stderr); 2 with one sentence, no verdict,
where this stack cannot run it (the device or its backend not here, a mode it lacks).
The backend's settings as the probe ran them are set before the backend loads, each said on stdout
(SETTINGS' device_config{config}). To run on this environment's stack as found instead (its own
settings, e.g. to check a fix), add --stack-as-found (or set MODEL_SUPPORT_REPRO_KEEP_CONFIG=1).
Needs torch and transformers; an accelerator torch does not ship (device 'tpu', any PrivateUse1 backend)
also needs the package that provides it (loaded through torch's device-backend entry point) and that
backend's own environment (a TPU VM for 'tpu'); an image-text-to-text model also Pillow (its image is drawn
by probe_image_rgb() below, the same bytes as the probe's: their sha256 is said below and in image_sha256).
A model probed from a local folder (a model id 'local:<name>') needs that folder:
    python repro.py /path/to/<name> [--stack-as-found]
"""

SETTINGS = {settings}
'''

#: The body's first lines (``store.REPRO_BODY_MARK`` first: where the store finds a script's body).
BODY_START = (
    store.REPRO_BODY_MARK
    + """ (model-support's hub_fetch, probe_failures, probe_vision, probe_backend, probe_compile, probe_core, agreement,
# reproduce), as it ran. ----
# The image-text-to-text probe image, drawn by probe_image_rgb(): RGB bytes of sha256 {image_sha256}.
import os
import sys

# `import torch` would autoload every installed out-of-tree backend; load_backend loads the one needed. Set, not
# defaulted: a parent that imported torch with torch_tpu installed hands down "1" (its loader writes it back).
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
from transformers.utils import logging as hf_logging  # noqa: E402  (after the autoload switch)

hf_logging.disable_progress_bar()  # transformers' "Loading weights" bars would bury what the script prints
"""
)
BODY_END = """

if __name__ == "__main__":
    sys.exit(main(SETTINGS, sys.argv))
"""
#: ``from .hub_fetch import x`` / ``from .probe_core import (\n x,\n)``: names the body already has.
_SIBLING_IMPORT = re.compile(
    r"^from \.(?:"
    + "|".join(m.__name__.rsplit(".", 1)[1] for m in BODY_MODULES)
    + r") import (?:\([^)]*\)|[^\n]*)\n",
    re.MULTILINE,
)


def _source(module) -> str:
    text = inspect.getsource(module)
    if text.startswith("from __future__") or "\nfrom __future__" in text:
        raise ValueError(
            f"{module.__name__} cannot be pasted into a script's middle: it has a __future__ import"
        )
    return _SIBLING_IMPORT.sub("", text)


@functools.cache
def body() -> tuple[str, str]:
    """(the body of every repro script of this code, its sha256)."""
    start = BODY_START.format(image_sha256=probe_vision.probe_image_sha256())
    text = start + "\n\n".join(_source(module) for module in BODY_MODULES) + BODY_END
    return text, hashlib.sha256(text.encode()).hexdigest()


def repro_settings(settings: dict) -> dict:
    """A repro script's SETTINGS from the probe's ``settings`` (``SETTING_NAMES``; device the
    resolved type, compile_backend the device adapter's; what the probe did not resolve is null)."""
    return {name: settings.get(name) for name in SETTING_NAMES}


def header(settings: dict, sweep_id: str | None = None) -> str:
    """The script's first part: what it reproduces, in words, and its SETTINGS."""
    return HEADER.format(
        model_id=settings.get("model_id"),
        device=settings.get("device"),
        sweep=f" (sweep {sweep_id})" if sweep_id else "",
        dtype=settings.get("dtype"),
        task=settings.get("task"),
        chat="through the chat template when the tokenizer has one"
        if settings.get("chat_template") != "none"
        else "raw",
        max_new_tokens=settings.get("max_new_tokens"),
        config=f": {', '.join(sorted(settings['device_config']))}"
        if settings.get("device_config")
        else ": none",
        settings=pprint.pformat(settings, sort_dicts=False),
    )


def repro_script(settings: dict, sweep_id: str | None = None) -> str:
    """The whole script for one probe; ``settings`` holds SETTING_NAMES (device is the resolved
    type, compile_backend the device adapter's)."""
    return header(repro_settings(settings), sweep_id) + "\n" + body()[0]


def set_repro(record: Record, settings: dict) -> None:
    """A probe's repro fields: its ``repro_settings`` (JSON) and the body's ``repro_sha256``, and
    the whole script in ``repro_script`` until the store keeps the body once
    (``store.split_repro``)."""
    chosen = repro_settings(settings)
    text, sha = body()
    record["repro_settings"] = json.dumps(chosen)
    record["repro_sha256"] = sha
    record["repro_script"] = header(chosen, record["sweep_id"]) + "\n" + text


def script_of(record: dict, bodies: Path | None = None) -> str | None:
    """A row's standalone script: the whole text an older row carries, else its header (from
    ``repro_settings``) and its body, ``<bodies>/<repro_sha256>.py`` (a sweep's ``repro/`` folder
    or the data folder's), or this code's own body when the hash is its. None for a row without
    one (nothing ran)."""
    if record.get("repro_script"):
        return record["repro_script"]
    sha, raw = record.get("repro_sha256"), record.get("repro_settings")
    if not sha or not raw:
        return None
    text, own = body()
    if sha != own:
        stored = store.repro_body(Path(bodies or "."), sha, str(record.get("model_id")))
        if stored is None:
            raise UserError(
                f"The repro body {sha[:12]} of {record.get('model_id')} is not in {bodies}: it "
                "comes with the data (repro/<sha256>.py); copy that folder with the Parquet "
                "files."
            )
        text = stored
    return header(json.loads(raw), record.get("sweep_id")) + "\n" + text


def script_of_or_none(record: dict, bodies: Path | None = None) -> str | None:
    """``script_of``, or None where the row's body is not there (a page shows what it has)."""
    try:
        return script_of(record, bodies)
    except UserError:
        return None


#: The data folder the command line reads when given none (``--data-dir``'s default): a command
#: leaves it out.
DEFAULT_DATA_DIR = Path("data")


def command(
    sweep_id: str, model_id: str, variant: str | None = None, data_dir: Path | str | None = None
) -> str:
    """The command that reproduces one row, (``model_id``, ``variant``) of a sweep:
    ``model-support repro`` writes its standalone script (``script_for``), python runs it.
    ``--data-dir`` where ``data_dir`` is not the default; a model probed from a local folder
    takes that folder (a placeholder, ``/path/to/<name>``, the script's header says so)."""
    words = ["model-support", "repro", sweep_id, model_id]
    words += ["--variant", variant] if variant else []
    words += (
        ["--data-dir", str(data_dir)]
        if data_dir is not None and Path(data_dir) != DEFAULT_DATA_DIR
        else []
    )
    run = ["python", "run.py"]
    if model_id.startswith(model_ids.LOCAL_PREFIX):
        run.append(f"/path/to/{model_ids.display_name(model_id)}")
    return f"{shlex.join(words)} > run.py && {shlex.join(run)}"


def _script_from_rows(data_dir: Path, sweep_id: str, model_id: str, variant: str | None) -> str:
    """``script_for`` in a dataset pulled without its ``sweeps/`` folder (what exports and
    support cards print their command for): the row of the ``results`` config and the data
    folder's ``repro/`` bodies."""
    import polars as pl

    from ..record.schema import DEFAULT_VARIANT

    rows = (
        store.scan(data_dir, "results")
        .filter(pl.col("sweep_id") == sweep_id, pl.col("model_id") == model_id)
        # older rows: the default variant
        .with_columns(pl.col("variant").fill_null(DEFAULT_VARIANT))
        .collect()
    )
    if variant is not None:
        rows = rows.filter(pl.col("variant") == variant)
    if rows.height == 0:
        known = (
            "a sweep of its results"
            if store.scan(data_dir, "results")
            .filter(pl.col("sweep_id") == sweep_id)
            .head(1)
            .collect()
            .height
            else "no sweep of it"
        )
        raise UserError(
            f"Sweep {sweep_id} has no row of {model_id}{f' in {variant}' if variant else ''} "
            f"in {data_dir} ({known})."
        )
    if rows.height > 1:
        ran = ", ".join(sorted(str(v) for v in rows["variant"]))
        raise UserError(
            f"{model_id} ran in {rows.height} variants in sweep {sweep_id}: give --variant, "
            f"one of {ran}."
        )
    script = script_of(rows.row(0, named=True), store.repro_dir(data_dir))
    if script is None:
        raise UserError(
            f"The row of {model_id} in sweep {sweep_id} has no repro script (nothing ran)."
        )
    return script


def script_for(data_dir: Path, sweep_id: str, model_id: str, variant: str | None = None) -> str:
    """The standalone script of ``model_id`` (its record's id) in ``variant`` (default: the
    sweep's default variant, else the one variant the model ran in; several: one sentence naming
    them) of a sweep in ``data_dir``; one sentence when the sweep has no such row or it has no
    script."""
    if not (store.sweep_dir(data_dir, sweep_id) / "sweep.json").exists():
        return _script_from_rows(Path(data_dir), sweep_id, model_id, variant)
    path = store.find_record(data_dir, sweep_id, model_id, variant)
    # no default variant here (its settings were not the defaults): its own
    if path is None and variant is None:
        store.read_sweep(data_dir, sweep_id)
        ran = sorted(
            {
                str(r.get("variant"))
                for r in store.read_records(data_dir, sweep_id)
                if r["model_id"] == model_id
            }
        )
        if len(ran) > 1:
            raise UserError(
                f"{model_id} ran in {len(ran)} variants in sweep {sweep_id}: give --variant, "
                f"one of {', '.join(ran)}."
            )
        path = store.find_record(data_dir, sweep_id, model_id, ran[0]) if ran else None
    if path is None:
        # an unknown sweep: its own sentence, with the known ones
        store.read_sweep(data_dir, sweep_id)
        raise UserError(
            f"Sweep {sweep_id} has no record of "
            f"{model_id}{f' in {variant}' if variant else ''} yet."
        )
    record = json.loads(path.read_text())
    # its script would run the stack's own kernels, not the host's: another answer
    if store.is_what_if(record):
        raise UserError(
            f"{model_id} ran in sweep {sweep_id} as a what-if run "
            f"(host_ops={record.get('host_ops')!r}: operators on the host), which its "
            "standalone script does not do; run the probe notebook with -p host_ops "
            f"{record.get('host_ops')!r} to reproduce it."
        )
    script = script_of(record, store.repro_dir(data_dir, sweep_id))
    if script is None:
        why = record.get("exclusion_reason") or record.get("error_message") or "nothing ran"
        raise UserError(f"{model_id} has no repro script in sweep {sweep_id}: {why}")
    return script
