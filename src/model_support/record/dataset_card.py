"""The dataset card (``README.md`` of the data folder): what the dataset is, its configs and
every field."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..fileio import atomic_write_bytes
from . import schema
from .dataset_files import DATASET_CONFIGS
from .sweep_folders import data_folder_lock

if TYPE_CHECKING:  # polars is imported where it is used: the probe kernel writes records without it
    pass


DATASET_CARD = """---
{configs}license: other
tags:
- model-support
---
# Model-support sweeps

Which Hugging Face models load and generate on which accelerator stack, which fail, where and why.
One row per model per sweep; the columns are the probe's record fields (`model_support.record.schema`).

- `results`: every probed model: `status` is PASS, FAIL(load), FAIL(gen) or FAIL(other), with
  `failure_stage`, `failure_signature`, the error and traceback, tokens, timings, memory, the CPU
  reference check, the full version stack, and the standalone script that reproduces the probe: its
  `repro_settings` and `repro_sha256`, the name of its body in `repro/<sha256>.py` beside the Parquet
  files (`model-support repro SWEEP_ID MODEL`; older rows carry the whole script in `repro_script`).
- `excluded`: models excluded before running (with `exclusion_reason`) and whole sweeps excluded
  after the fact (a broken stack). Excluded rows are never counted as failures.
- `ops`: one row per operator per sweep, from the probes' operator census: `op`, `status` on the sweep's
  stack (implemented, CPU fallback, missing, unknown), `device_type`, `versions`, the `models` that call it,
  `probes`, `calls` and `calls_per_probe`: a stack's coverage over time is a query.
- `what_if`: what-if runs (`what_if` true), the `results` columns: the same models with the operators their
  device lacks or gets wrong run on the host's CPU kernels (`host_ops`, `host_ops_run`, `host_op_calls`), which
  prove a porting plan's step or a blamed operator by running. Never a verdict of the stack: no PASS here counts
  in `results`, the gate, the exports or the support card.

```python
from datasets import load_dataset
results = load_dataset("<this folder or repo>", "results", split="train")
ops = load_dataset("<this folder or repo>", "ops", split="train")
```

Sweeps in this folder: {sweeps}.

## Fields

Every column is nullable; files written before a field existed (its `since`, the record version)
read it as null, or as the value noted.

| field | type | group | since | what |
|---|---|---|---|---|
{fields}
"""


def field_table() -> str:
    """The dataset card's rows of fields, from the record's declaration (``schema.DECLARATION``)."""
    return "\n".join(
        f"| `{f.name}` | `{f.type}` | {f.group} | {f.since} | "
        + f.doc.replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
        + (f" (older files: `{f.older}`)" if f.older is not None else "")
        + " |"
        for f in schema.DECLARATION
    )


def card_configs(data_dir: Path) -> str:
    """The card's YAML ``configs:`` block, each config only once it has a file (a config whose
    glob matches nothing would make ``load_dataset`` fail for every config); written by
    huggingface_hub's card data, as the Hub reads it."""
    from huggingface_hub import DatasetCardData

    data_dir = Path(data_dir)
    present = [c for c in DATASET_CONFIGS if any((data_dir / c).glob("sweep=*/*.parquet"))]
    configs = [
        {
            "config_name": c,
            "data_files": [{"split": "train", "path": f"{c}/sweep=*/*.parquet"}],
            **({"default": True} if c == "results" else {}),
        }
        for c in present
    ]
    return DatasetCardData(configs=configs).to_yaml() + "\n"


def write_dataset_card(data_dir: Path) -> Path:
    """The local card: the configs (``card_configs``) and the sweeps in this folder.
    ``model-support push`` publishes a fuller one (``publish.card``)."""
    data_dir = Path(data_dir)
    sweeps = sorted(
        {
            p.parent.name.removeprefix("sweep=")
            for c in DATASET_CONFIGS
            for p in (data_dir / c).glob("sweep=*/*.parquet")
        }
    )
    card = (
        DATASET_CARD.replace("{configs}", card_configs(data_dir))
        .replace("{sweeps}", ", ".join(sweeps) or "none")
        .replace("{fields}", field_table())
    )
    path = data_dir / "README.md"
    with data_folder_lock(data_dir):
        atomic_write_bytes(path, card.encode())
    return path
