"""Parquet bytes per row: a real sweep of a few fixtures (PASS and FAIL, text and image-text-to-text) through
``model-support sweep``, then the size of its ``results`` and ``excluded`` files over their rows, and what of
each row is its repro script (the whole text in older files; its settings and the body's hash now).

    python bench/bench_row_bytes.py [LABEL] [--smoke]   # LABEL: a name for this measurement (default: the
                                                        # git commit); --smoke: the whole params/smoke.yaml

Writes bench/results/row_bytes.json (one entry per LABEL, so a before and an after sit side by side).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import REPO, RESULTS, write_results

#: A PASS and a FAIL of each kind the smoke sweep has, text and image-text-to-text.
FIXTURES = ("tiny-llama", "tiny-gpt2", "tiny-qwen2", "tiny-llava", "fail-missing-weights", "fail-short-positions")


def measure(smoke: bool) -> dict:
    import pyarrow.parquet as pq
    import yaml

    with tempfile.TemporaryDirectory(prefix="row-bytes-") as tmp:
        definition = Path(tmp) / "rows.yaml"
        if smoke:
            raw = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
            raw["models"] = [
                str(REPO / m) if isinstance(m, str) else {**m, "id": str(REPO / m["id"])} for m in raw["models"]
            ]
            raw["name"] = "rows"
        else:
            models = [str(REPO / "data" / "models" / name) for name in FIXTURES]
            raw = {"name": "rows", "probe": {"device": "cpu", "reference": "cpu"}, "workers": 1, "models": models}
        definition.write_text(yaml.safe_dump(raw))
        data = Path(tmp) / "data"
        command = [sys.executable, "-m", "model_support.cli", "sweep", str(definition), "--data-dir", str(data)]
        subprocess.run(command, check=True, cwd=REPO, capture_output=True, timeout=1800)
        files = sorted(data.glob("*/sweep=*/*.parquet"))
        rows = sum(pq.read_metadata(f).num_rows for f in files)
        size = sum(f.stat().st_size for f in files)
        table = pq.read_table(files[0])
        columns = set(table.column_names)
        script_chars = sum(len(s or "") for s in table.column("repro_script").to_pylist())
        settings_chars = (
            sum(len(s or "") for s in table.column("repro_settings").to_pylist()) if "repro_settings" in columns else 0
        )
        bodies = sorted((data / "repro").glob("*.py")) if (data / "repro").is_dir() else []
        return {
            "fixtures": "params/smoke.yaml" if smoke else list(FIXTURES),
            "rows": rows,
            "parquet_bytes": size,
            "bytes_per_row": round(size / rows),
            "repro_script_chars_per_row": round(script_chars / table.num_rows),
            "repro_settings_chars_per_row": round(settings_chars / table.num_rows),
            "repro_bodies": len(bodies),
            "repro_body_bytes": sum(b.stat().st_size for b in bodies),
        }


def main() -> None:
    smoke = "--smoke" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--smoke"]
    label = args[0] if args else None
    if label is None:
        label = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
        label = label.stdout.strip() or "unknown"
    path = RESULTS / "row_bytes.json"
    previous = json.loads(path.read_text()).get("runs", {}) if path.exists() else {}
    found = measure(smoke)
    print(json.dumps(found, indent=1))
    write_results("row_bytes", {"runs": {**previous, label: found}})


if __name__ == "__main__":
    main()
