"""Benchmark the analysis side on a synthetic history of 100 sweeps x 10,000 models (1M rows).

Measures, each step in its own subprocess so that its peak RSS (ru_maxrss) is its own:
  (a) loading all sweeps and building every report table   target < 3 s, < 1.5 GB
  (b) rendering the whole report (papermill + nbconvert + explorer)   target < 30 s
  (c) the explorer page: its size (target < 10 MB), build time, and in Chromium the time from
      typing a name fragment to #match-count changing
  (d) the same aggregations in pandas, as a reference point
Prints a table and writes bench/results/analysis.json. Runs in a few minutes:

    .venv/bin/python bench/bench_analysis.py [--data DIR] [--sweeps 100] [--models 10000] [--reps 5]

``--data DIR`` keeps (and reuses) the synthetic history there; by default it goes to a temporary
folder that is removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results" / "analysis.json"
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

CHROMIUM = Path("/usr/bin/chromium")
TARGETS = {"tables_s": 3.0, "tables_rss_mb": 1500.0, "render_s": 30.0, "explorer_mb": 10.0}


def _maxrss_mb(who=resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024  # Linux: kilobytes


def _spread(times: list[float]) -> dict:
    return {
        "median_s": round(statistics.median(times), 4),
        "min_s": round(min(times), 4),
        "max_s": round(max(times), 4),
        "runs": [round(t, 4) for t in times],
    }


# --------------------------------------------------------------------------------------------
# steps, each run in a child process: python bench_analysis.py --step NAME --data DIR


def step_tables(data: Path, reps: int) -> dict:
    import polars as pl

    from model_support import analysis

    sweeps = analysis.sweep_index(data)
    sweep_id, baseline = sweeps["sweep_id"][-1], sweeps["sweep_id"][-2]
    times = []
    for _ in range(reps):  # report_tables reads everything itself: sweep.json files and Parquet
        start = time.perf_counter()
        tables = analysis.report_tables(data, sweep_id, baseline)
        times.append(time.perf_counter() - start)
    rows = sum(tables["history"]["models"]) + sum(tables["history"]["excluded"])
    return {
        **_spread(times),
        "rows": int(rows),
        "tables": len(tables),
        "peak_rss_mb": round(_maxrss_mb(), 1),
        "polars": pl.__version__,
        "threads": pl.thread_pool_size(),
    }


def step_render(data: Path, reps: int) -> dict:
    from model_support import analysis
    from model_support.render import report

    sweeps = analysis.sweep_index(data)
    sweep_id = sweeps["sweep_id"][-1]
    times, parts = [], []
    for _ in range(reps):
        start = time.perf_counter()
        path = report.render_report(data, sweep_id)
        times.append(time.perf_counter() - start)
        parts.append(path.stat().st_size)
    return {
        **_spread(times),
        "html_bytes": parts[-1],
        "peak_rss_mb": round(_maxrss_mb(), 1),
        "peak_rss_kernel_mb": round(_maxrss_mb(resource.RUSAGE_CHILDREN), 1),
    }


def step_explorer(data: Path, reps: int) -> dict:
    from model_support.render import explorer

    times = []
    for _ in range(reps):
        start = time.perf_counter()
        page = explorer.build_explorer(data)
        times.append(time.perf_counter() - start)
    return {**_spread(times), "bytes": page.stat().st_size, "peak_rss_mb": round(_maxrss_mb(), 1)}


def step_browser(data: Path, reps: int) -> dict:
    if not CHROMIUM.exists():
        return {"skipped": f"{CHROMIUM} is absent"}
    from playwright.sync_api import sync_playwright

    page_path = data / "reports" / "index.html"
    fragments = ["llama", "org-12", "qwen2-7b", "gemma3-1b-it", "zzz-no-match", "org-3/mistral"]
    searches = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.route(
            "**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort()
        )
        start = time.perf_counter()
        page.goto(page_path.as_uri())
        page.wait_for_selector("#results tbody tr")
        load_s = time.perf_counter() - start
        for _ in range(reps):
            for fragment in fragments:
                page.locator("#search").fill("")
                page.wait_for_timeout(120)  # let the debounced update of the reset settle
                before = page.locator("#match-count").inner_text()
                start = page.evaluate("performance.now()")
                page.locator("#search").fill(fragment)
                page.wait_for_function(
                    "(b) => document.querySelector('#match-count').textContent !== b", arg=before
                )
                searches.append((page.evaluate("performance.now()") - start) / 1000)
        # The filter + render work alone, without the debounce or Playwright's round trips.
        direct = page.evaluate(
            """(fragments) => {
            const out = [];
            for (const f of fragments) {
                document.querySelector('#search').value = f;
                const t = performance.now(); update(); out.push(performance.now() - t);
            }
            return out;
        }""",
            fragments * reps,
        )
        browser.close()
    return {
        "page_load_s": round(load_s, 3),
        "search": _spread(searches),
        "update": _spread([d / 1000 for d in direct]),
        "note": "search: from setting the search text to #match-count changing, 60 ms debounce and "
        "Playwright polling included; update: the page's filter + render of the rows alone",
    }


def step_pandas(data: Path, reps: int) -> dict:
    import pandas as pd
    import pyarrow.dataset as ds

    columns = [
        "sweep_id",
        "model_id",
        "model_type",
        "status",
        "failure_signature",
        "failure_stage",
        "load_s",
        "first_token_s",
        "decode_tokens_per_s",
        "peak_host_mem_mb",
        "peak_device_mem_mb",
        "tokens_in",
        "tokens_out",
        "reference_match",
        "versions",
    ]
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        files = sorted(str(p) for p in (data / "results").glob("sweep=*/*.parquet"))
        table = ds.dataset(files, format="parquet").to_table(columns=columns).flatten()
        df = table.to_pandas()
        # synthetic ids sort by time within a name; close enough here
        ids = sorted(df["sweep_id"].unique())
        sweep_id, baseline = ids[-1], ids[-2]
        cur = df[df["sweep_id"] == sweep_id]
        cur["status"].value_counts()
        cur.groupby("model_type")["status"].apply(lambda s: (s == "PASS").mean())
        fails = cur[cur["status"] != "PASS"]
        fails.groupby("failure_signature").agg(
            count=("model_id", "size"),
            stage=("failure_stage", "first"),
            examples=("model_id", lambda s: list(sorted(s)[:3])),
        )
        cur[["load_s", "first_token_s", "decode_tokens_per_s"]].quantile([0.5, 0.9, 1.0])
        cur[["peak_host_mem_mb", "peak_device_mem_mb", "tokens_in", "tokens_out"]].describe()
        cur["reference_match"].value_counts(dropna=False)
        base = df[df["sweep_id"] == baseline][["model_id", "status"]]
        merged = base.merge(
            cur[["model_id", "status"]], on="model_id", how="outer", suffixes=("_before", "_after")
        )
        (merged["status_before"].eq("PASS") & merged["status_after"].ne("PASS")).sum()
        df.assign(passed=df["status"].eq("PASS")).groupby("sweep_id")["passed"].mean()
        for c in ("versions.torch", "versions.torch_tpu", "versions.transformers"):
            df.assign(passed=df["status"].eq("PASS")).groupby(c, dropna=False)["passed"].agg(
                ["mean", "size"]
            )
        times.append(time.perf_counter() - start)
    return {**_spread(times), "peak_rss_mb": round(_maxrss_mb(), 1), "pandas": pd.__version__}


STEPS = {
    "tables": step_tables,
    "render": step_render,
    "explorer": step_explorer,
    "browser": step_browser,
    "pandas": step_pandas,
}


def _child(step: str, data: Path, reps: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--step", step, "--data", str(data), "--reps", str(reps)],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    if out.returncode != 0:
        raise SystemExit(f"step {step} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", type=Path, help="where the synthetic history lives (kept); default: a temp dir"
    )
    parser.add_argument("--sweeps", type=int, default=100)
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--step", choices=sorted(STEPS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        print(json.dumps(STEPS[args.step](args.data, args.reps)))
        return

    temp = None
    if args.data is None:
        temp = Path(tempfile.mkdtemp(prefix="bench-analysis-"))
        data = temp / "data"
    else:
        data = args.data.resolve()
    try:
        results = {"sweeps": args.sweeps, "models": args.models}
        if not (data / "results").exists():
            from fixtures import synthetic

            start = time.perf_counter()
            synthetic.write_synthetic_history(data, args.sweeps, args.models)
            results["generate_s"] = round(time.perf_counter() - start, 2)
        results["parquet_mb"] = round(
            sum(p.stat().st_size for p in data.rglob("*.parquet")) / 1e6, 1
        )
        results["tables"] = _child("tables", data, args.reps)
        results["render"] = _child("render", data, 2)
        results["explorer"] = _child("explorer", data, 3)
        results["browser"] = _child("browser", data, 3)
        results["pandas"] = _child("pandas", data, 3)
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
    results["machine"] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }
    results["targets"] = TARGETS
    results["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")

    t, r, e, b, p = (results[k] for k in ("tables", "render", "explorer", "browser", "pandas"))
    mb = e["bytes"] / 1e6
    lines = [
        (
            "history",
            f"{args.sweeps} sweeps x {args.models} models, {t['rows']:,} rows, "
            f"{results['parquet_mb']} MB Parquet",
            "",
        ),
        (
            "(a) load + all report tables",
            f"median {t['median_s']:.2f} s (min {t['min_s']:.2f}, max {t['max_s']:.2f}), "
            f"peak RSS {t['peak_rss_mb']:.0f} MiB",
            "< 3 s, < 1500 MiB",
        ),
        (
            "(b) render report",
            f"median {r['median_s']:.1f} s (min {r['min_s']:.1f}, max {r['max_s']:.1f}), "
            f"HTML {r['html_bytes'] / 1e6:.1f} MB",
            "< 30 s",
        ),
        (
            "(c) explorer page",
            f"{mb:.2f} MB, built in {e['median_s']:.2f} s (peak RSS {e['peak_rss_mb']:.0f} MB)",
            "< 10 MB",
        ),
    ]
    if "search" in b:
        lines.append(
            (
                "(c) search in Chromium",
                f"median {1000 * b['search']['median_s']:.0f} ms "
                f"(max {1000 * b['search']['max_s']:.0f} ms) typed to count shown; filter+render "
                f"{1000 * b['update']['median_s']:.1f} ms; page load {b['page_load_s']:.2f} s",
                "fast",
            )
        )
    else:
        lines.append(("(c) search in Chromium", b.get("skipped", "?"), ""))
    lines.append(
        (
            "(d) pandas, same aggregations",
            f"median {p['median_s']:.2f} s, peak RSS {p['peak_rss_mb']:.0f} MB",
            "reference",
        )
    )
    width = max(len(a) for a, _, _ in lines)
    for name, value, target in lines:
        print(f"{name.ljust(width)}  {value}" + (f"   [target {target}]" if target else ""))
    print(f"wrote {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
