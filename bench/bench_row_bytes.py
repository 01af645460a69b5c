"""Parquet bytes per row: a real sweep of a few fixtures (PASS and FAIL, text and image-text-to-text) through
``model-support sweep``, then the size of its Parquet files over their rows: the ``results`` config's (one row per
model: the goal, at most 4,096 bytes on the smoke sweep), ``results`` and ``excluded`` together (the record's
rows), and every config's (``ops`` has a row per operator); where those bytes go (each config, the files'
footers, the costliest columns) and what of each row is its repro script (the whole text in older files; its
settings and the body's hash now).

    python bench/bench_row_bytes.py [LABEL] [--smoke] [--keep DIR]   # LABEL: a name for this measurement
        # (default: the git commit); --smoke: the whole params/smoke.yaml; --keep DIR: keep the sweep's data there
    python bench/bench_row_bytes.py --files DIR                      # where the bytes of DIR's Parquet files go

Writes bench/results/row_bytes.json (one entry per LABEL, so a before and an after sit side by side).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from common import REPO, RESULTS, write_results

#: A PASS and a FAIL of each kind the smoke sweep has, text and image-text-to-text.
FIXTURES = (
    "tiny-llama",
    "tiny-gpt2",
    "tiny-qwen2",
    "tiny-llava",
    "fail-missing-weights",
    "fail-short-positions",
)
#: How many of the costliest columns a measurement names.
TOP_COLUMNS = 12


def sweep(smoke: bool, data: Path) -> None:
    """Run the sweep as a user types it, into ``data``."""
    import yaml

    definition = data.parent / "rows.yaml"
    if smoke:
        raw = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
        raw["models"] = [
            str(REPO / m) if isinstance(m, str) else {**m, "id": str(REPO / m["id"])}
            for m in raw["models"]
        ]
        raw["name"] = "rows"
    else:
        models = [str(REPO / "data" / "models" / name) for name in FIXTURES]
        raw = {
            "name": "rows",
            "probe": {"device": "cpu", "reference": "cpu"},
            "workers": 1,
            "models": models,
        }
    definition.write_text(yaml.safe_dump(raw))
    command = [
        sys.executable,
        "-m",
        "model_support.cli",
        "sweep",
        str(definition),
        "--data-dir",
        str(data),
    ]
    subprocess.run(command, check=True, cwd=REPO, capture_output=True, timeout=1800)


def where_bytes_go(data: Path) -> dict:
    """The Parquet files of a data folder: rows and bytes (all configs, as the goal counts them,
    and each config), the footers' bytes, the costliest columns (compressed bytes over every
    file) and the repro script's share."""
    import pyarrow.parquet as pq

    files = sorted(data.glob("*/sweep=*/*.parquet"))
    configs: dict[str, dict] = {}
    columns: Counter = Counter()
    footer = 0
    for path in files:
        meta = pq.read_metadata(path)
        size = path.stat().st_size
        entry = configs.setdefault(path.parent.parent.name, {"rows": 0, "bytes": 0})
        entry["rows"] += meta.num_rows
        entry["bytes"] += size
        footer += meta.serialized_size + 8  # the footer, its length and the closing magic
        for group in range(meta.num_row_groups):
            for j in range(meta.num_columns):
                chunk = meta.row_group(group).column(j)
                columns[chunk.path_in_schema.split(".")[0]] += chunk.total_compressed_size
    for entry in configs.values():
        entry["bytes_per_row"] = round(entry["bytes"] / max(entry["rows"], 1))
    rows = sum(c["rows"] for c in configs.values())
    size = sum(c["bytes"] for c in configs.values())
    records = [configs[c] for c in ("results", "excluded") if c in configs]
    table = pq.read_table(data / "results" if (data / "results").is_dir() else files[0])
    names = set(table.column_names)

    def chars(column: str) -> int:
        return (
            round(sum(len(s or "") for s in table.column(column).to_pylist()) / table.num_rows)
            if column in names
            else 0
        )

    bodies = sorted((data / "repro").glob("*.py")) if (data / "repro").is_dir() else []
    return {
        "rows": rows,
        "parquet_bytes": size,
        "bytes_per_row": round(size / rows),
        # the goal's rows: one per model (and variant) of the sweep, the configs ``load_dataset``
        # reads by default
        "results_bytes_per_row": configs.get("results", {}).get("bytes_per_row"),
        "record_bytes_per_row": round(
            sum(c["bytes"] for c in records) / max(sum(c["rows"] for c in records), 1)
        ),
        "configs": configs,
        "footer_bytes": footer,
        "column_bytes": sum(columns.values()),
        "top_columns": dict(columns.most_common(TOP_COLUMNS)),
        "repro_script_chars_per_row": chars("repro_script"),
        "repro_settings_chars_per_row": chars("repro_settings"),
        "repro_bodies": len(bodies),
        "repro_body_bytes": sum(b.stat().st_size for b in bodies),
    }


def measure(smoke: bool, keep: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="row-bytes-") as tmp:
        data = (keep or Path(tmp)) / "data"
        data.parent.mkdir(parents=True, exist_ok=True)
        sweep(smoke, data)
        return {
            "fixtures": "params/smoke.yaml" if smoke else list(FIXTURES),
            **where_bytes_go(data),
        }


def main() -> None:
    args = sys.argv[1:]
    if "--files" in args:
        print(json.dumps(where_bytes_go(Path(args[args.index("--files") + 1])), indent=1))
        return
    keep = None
    if "--keep" in args:
        at = args.index("--keep")
        keep = Path(args[at + 1]).resolve()
        del args[at : at + 2]
    smoke = "--smoke" in args
    args = [a for a in args if a != "--smoke"]
    label = args[0] if args else None
    if label is None:
        label = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
        )
        label = label.stdout.strip() or "unknown"
    path = RESULTS / "row_bytes.json"
    previous = json.loads(path.read_text()).get("runs", {}) if path.exists() else {}
    found = measure(smoke, keep)
    print(json.dumps(found, indent=1))
    write_results("row_bytes", {"runs": {**previous, label: found}})


if __name__ == "__main__":
    main()
