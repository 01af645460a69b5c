"""The explorer: one self-contained HTML page to search every model ever probed.

``build_explorer(data_dir)`` writes ``data/reports/index.html``: the page's JavaScript (vanilla,
no framework, no CDN) and its data (compact JSON) are inline, so it opens from disk with no
network. One row per model (its latest run, or its run in the chosen sweep), a search box that
filters by model-name fragment as you type, filters by verdict, failure signature, device, sweep
and stack versions, and a detail panel per model: its history across sweeps, the latest error,
traceback and repro script (with a Copy button), and links to its executed notebook and to the
sweep's report.

Size: 100 sweeps x 10,000 models must stay well under 10 MB, so the data is stored compactly:
- a model's history is run-length encoded: ``[first_sweep, n_sweeps, outcome]`` per run of
  consecutive sweeps with the same outcome (verdict + signature, an index into a lookup table);
  the environment (device and torch / torch_tpu / transformers versions) is stored once per
  sweep, plus ``[sweep, env]`` for the rare row whose environment differs from its sweep's;
- error texts, tracebacks, repro scripts and notebook paths are kept for the latest run only, and
  de-duplicated through one string table after the model id and sweep id in them are replaced by
  placeholders (the page puts them back).
Excluded models are listed too, with the pseudo-verdict ``excluded`` and the reason as signature.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl

from . import report_data, schema, store

EXCLUDED = "excluded"
#: Placeholders for the model id and the sweep id inside de-duplicated texts.
MODEL_MARK = "\x01"
SWEEP_MARK = "\x02"
VERSION_KEYS = report_data.VERSION_COMPONENTS


def _encoded_rows(data_dir: Path, sweeps: pl.DataFrame):
    """Every (model, sweep) row of both configs as integers, ready for run-length encoding.

    Returns (rows, models, outcomes, envs): rows has m (model key), s (sweep position), o
    (outcome index) and e (environment index), sorted by model then sweep, one row per model and
    sweep (results win over excluded); models maps m to model_id; outcomes and envs are the
    lookup tables. Strings are hashed to integer keys first: sorting a million rows that carry
    strings costs seconds, sorting integers a few milliseconds.
    """
    light = ["model_id", "sweep_id", "status", "failure_signature", "device_type", "exclusion_reason", "versions"]
    results = store.scan(data_dir, "results").select(light).with_columns(pl.lit(0, dtype=pl.Int8).alias("c"))
    excluded = (
        store.scan(data_dir, "excluded")
        .select(light)
        .with_columns(
            pl.lit(EXCLUDED).alias("status"),
            pl.col("exclusion_reason").fill_null("(no reason given)").alias("failure_signature"),
            pl.lit(1, dtype=pl.Int8).alias("c"),
        )
    )
    order = sweeps.lazy().with_row_index("s").select("sweep_id", pl.col("s").cast(pl.Int32))
    outcome_cols = ["status", "failure_signature"]
    env_cols = ["device_type", *VERSION_KEYS]
    wide = (
        pl.concat([results, excluded])
        .with_columns([pl.col("versions").struct.field(k).alias(k) for k in VERSION_KEYS])
        .join(order, on="sweep_id", how="inner")
        .with_columns(
            pl.col("model_id").hash(seed=0).alias("m"),
            pl.struct(outcome_cols).hash(seed=0).alias("ok"),
            pl.struct(env_cols).hash(seed=0).alias("ek"),
        )
    ).collect()
    models = wide.select("m", "model_id").unique("m")
    outcomes = (
        wide.select("ok", *outcome_cols).unique("ok").sort(outcome_cols, nulls_last=False)
        .with_row_index("o").with_columns(pl.col("o").cast(pl.Int32))
    )
    envs = (
        wide.select("ek", *env_cols).unique("ek").sort(env_cols, nulls_last=True)
        .with_row_index("e").with_columns(pl.col("e").cast(pl.Int32))
    )
    rows = (
        wide.lazy()
        .select("m", "s", "c", "ok", "ek")
        .join(outcomes.lazy().select("ok", "o"), on="ok", how="left")
        .join(envs.lazy().select("ek", "e"), on="ek", how="left")
        .sort("m", "s", "c")
        .filter(((pl.col("m") != pl.col("m").shift(1)) | (pl.col("s") != pl.col("s").shift(1))).fill_null(True))
        .select("m", "s", "o", "e")
        .collect()
    )
    return rows, models, outcomes.drop("ok"), envs.drop("ek")


def _relative_href(path: str | None, data_dir: Path, reports: Path) -> str | None:
    """A link from ``data/reports`` to ``path`` when it lies under ``data_dir``; else None."""
    if not path:
        return None
    root = str(data_dir)
    if path.startswith(root + "/") and "/." not in path and "//" not in path:  # the common case, fast
        return "../" + path[len(root) + 1:]
    candidates = [path] if os.path.isabs(path) else [os.path.join(data_dir, path), os.path.abspath(path)]
    for candidate in candidates:
        full = os.path.normpath(candidate)
        if full == root or full.startswith(root + os.sep):
            return Path(os.path.relpath(full, reports)).as_posix()
    return None


class _Strings:
    """A string table: each distinct text is stored once and referred to by index."""

    def __init__(self):
        self.items: list[str] = []
        self.index: dict[str, int] = {}

    def add(self, text: str | None) -> int:
        if text is None:
            return -1
        found = self.index.get(text)
        if found is None:
            found = self.index[text] = len(self.items)
            self.items.append(text)
        return found


def _template(text: str | None, model_id: str, sweep_id: str) -> str | None:
    if text is None:
        return None
    return text.replace(model_id, MODEL_MARK).replace(sweep_id, SWEEP_MARK)


def explorer_data(data_dir: Path | str) -> dict:
    """The page's data (see the module docstring for the encoding)."""
    data_dir = Path(data_dir).resolve()
    reports = data_dir / "reports"
    sweeps = report_data.sweep_index(data_dir)
    rows, model_names, outcomes, envs = _encoded_rows(data_dir, sweeps)
    # Each sweep's usual environment; a row that differs from it is stored as an exception.
    sweep_env = (
        rows.group_by("s", "e").len()
        .sort(["s", "len", "e"], descending=[False, True, False])
        .group_by("s", maintain_order=True)
        .agg(pl.col("e").first().alias("e_sweep"))
    )
    rows = rows.join(sweep_env, on="s", how="left")
    # Runs of consecutive sweeps with the same outcome.
    new_run = (
        (pl.col("s") != pl.col("s").shift(1) + 1)
        | (pl.col("o") != pl.col("o").shift(1))
        | (pl.col("m") != pl.col("m").shift(1))
    ).fill_null(True)
    runs = (
        rows.with_columns(run=new_run.cum_sum())
        .group_by("run", maintain_order=True)
        .agg(pl.col("m").first(), *[pl.col(c).first().cast(pl.Int64) for c in ("s", "o")],
             pl.len().cast(pl.Int64).alias("n"))
    )
    explode = dict(keep_nulls=False, empty_as_null=False)
    hist = (
        runs.group_by("m", maintain_order=True)
        .agg(pl.concat_list("s", "n", "o").list.explode(**explode).alias("h"), pl.col("s").last().alias("_s"),
             pl.col("n").last().alias("_n"))
        .join(model_names, on="m", how="left")
    )
    odd = (
        rows.filter(pl.col("e") != pl.col("e_sweep"))
        .group_by("m", maintain_order=True)
        .agg(pl.concat_list(pl.col("s").cast(pl.Int64), pl.col("e").cast(pl.Int64)).list.explode(**explode).alias("x"))
    )
    hist = (
        hist.join(odd, on="m", how="left", maintain_order="left")
        .with_columns((pl.col("_s") + pl.col("_n") - 1).alias("s"))
        .join(sweeps.with_row_index("s").select(pl.col("s").cast(pl.Int64), "sweep_id"), on="s", how="left")
        .sort("model_id")
    )

    # Heavy texts, for each model's latest row only (reading only the sweeps that hold one).
    heavy_cols = ["model_id", "sweep_id", "model_type", "error_type", "error_message", "traceback", "repro_script",
                  "notebook_path", "versions", "started_at"]
    keys = hist.select("model_id", "sweep_id")
    wanted = keys["sweep_id"].unique().to_list()
    heavy = pl.concat(
        [
            store.scan(data_dir, config)
            .select(*heavy_cols, pl.lit(c).alias("_config"))
            .filter(pl.col("sweep_id").is_in(wanted))
            .join(keys.lazy(), on=["model_id", "sweep_id"], how="semi")
            for c, config in enumerate(store.CONFIGS)
        ]
    )
    heavy = (
        heavy.sort("model_id", "_config")
        .unique("model_id", keep="first", maintain_order=True)
        .collect()
    )
    details = {r["model_id"]: r for r in heavy.iter_rows(named=True)}

    texts = _Strings()
    types = _Strings()
    versions = _Strings()
    models = []
    for model_id, h, x, sweep_id in hist.select("model_id", "h", "x", "sweep_id").iter_rows():
        d = details.get(model_id, {})
        full_versions = json.dumps({k: v for k, v in (d.get("versions") or {}).items() if v is not None}, sort_keys=True)
        models.append(
            [
                model_id,
                types.add(d.get("model_type")),
                h,
                x or [],
                texts.add(d.get("error_type")),
                texts.add(_template(d.get("error_message"), model_id, sweep_id)),
                texts.add(_template(d.get("traceback"), model_id, sweep_id)),
                texts.add(_template(d.get("repro_script"), model_id, sweep_id)),
                texts.add(_template(_relative_href(d.get("notebook_path"), data_dir, reports), model_id, sweep_id)),
                versions.add(full_versions),
                d.get("started_at"),
            ]
        )
    default_env = dict(sweep_env.iter_rows())
    sweep_rows = []
    for s, r in enumerate(sweeps.iter_rows(named=True)):
        report = reports / f"{r['sweep_id']}.html"
        sweep_rows.append(
            [
                r["sweep_id"],
                r["created_at"].strftime("%Y-%m-%d %H:%M") if r["created_at"] else "",
                r["device_type"] or "",
                report.name if report.exists() else None,
                default_env.get(s, -1),
            ]
        )
    return {
        "sweeps": sweep_rows,
        "outcomes": outcomes.select("status", "failure_signature").rows(),
        "envs": envs.select("device_type", *VERSION_KEYS).rows(),
        "types": types.items,
        "texts": texts.items,
        "versions": versions.items,
        "verdicts": [*schema.VERDICTS, EXCLUDED],
        "verdict_help": {**schema.VERDICT_HELP, EXCLUDED: "left out on purpose; never counted as a failure"},
        "models": models,
    }


def build_explorer(data_dir: Path | str) -> Path:
    """Write ``data/reports/index.html`` (atomically) and return its path."""
    from .report import write_page

    data_dir = Path(data_dir).resolve()
    data = explorer_data(data_dir)
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False).replace("</", "<\\/")
    page = PAGE.replace("/*DATA*/null", payload, 1)
    out = data_dir / "reports" / "index.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_page(out, page)
    return out


PAGE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Model support explorer</title>
<style>
  body { font: 13px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #222; }
  header { padding: 10px 16px; background: #263238; color: #fff; }
  header h1 { font-size: 17px; margin: 0 0 8px; }
  .controls { display: flex; flex-wrap: wrap; gap: 8px; align-items: center; }
  .controls input, .controls select { font: inherit; padding: 3px 5px; max-width: 260px; }
  #search { width: 260px; }
  #match-count { margin-left: 8px; color: #cfd8dc; }
  main { display: flex; gap: 12px; padding: 10px 16px; align-items: flex-start; }
  #list { flex: 1 1 55%; overflow-x: auto; }
  table { border-collapse: collapse; width: 100%; }
  th, td { border-bottom: 1px solid #e0e0e0; padding: 3px 6px; text-align: left; vertical-align: top; }
  th { background: #f5f5f5; position: sticky; top: 0; }
  #results tbody tr { cursor: pointer; }
  #results tbody tr:hover { background: #e3f2fd; }
  #results tbody tr.selected { background: #bbdefb; }
  #results td:first-child { white-space: nowrap; }
  td.sig { max-width: 420px; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; color: #555; }
  .st { font-weight: 600; white-space: nowrap; }
  .st-PASS { color: #2e7d32; } .st-FAIL\(load\) { color: #ef6c00; } .st-FAIL\(gen\) { color: #c62828; }
  .st-FAIL\(other\) { color: #6a1b9a; } .st-excluded { color: #757575; }
  #detail { flex: 1 1 45%; border: 1px solid #ddd; padding: 10px 12px; position: sticky; top: 8px;
            max-height: calc(100vh - 30px); overflow: auto; background: #fafafa; }
  #detail h2 { font-size: 15px; margin: 0 0 6px; word-break: break-all; }
  #detail pre { background: #fff; border: 1px solid #e0e0e0; padding: 6px; white-space: pre-wrap; font-size: 11.5px; }
  #detail .error { color: #b71c1c; }
  #detail dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 10px; margin: 0 0 8px; }
  #detail dt { font-weight: 600; }
  #detail dd { margin: 0; word-break: break-all; }
  .note { color: #666; font-size: 12px; }
  button.copy { font: inherit; font-size: 12px; }
</style>
</head>
<body>
<header>
  <h1>Model support explorer</h1>
  <div class="controls">
    <input id="search" type="search" placeholder="model name fragment" autocomplete="off" autofocus>
    <select id="verdict-filter" title="verdict"><option value="">all verdicts</option></select>
    <select id="signature-filter" title="failure signature"><option value="">all signatures</option></select>
    <select id="device-filter" title="device"><option value="">all devices</option></select>
    <select id="sweep-filter" title="sweep (default: each model's latest run)"><option value="">latest run</option></select>
    <select id="torch-filter" title="torch"><option value="">all torch</option></select>
    <select id="torch_tpu-filter" title="torch_tpu"><option value="">all torch_tpu</option></select>
    <select id="transformers-filter" title="transformers"><option value="">all transformers</option></select>
    <span id="match-count"></span>
  </div>
</header>
<main>
  <div id="list">
    <table id="results">
      <thead><tr><th>model</th><th>type</th><th>verdict</th><th>failure signature</th><th>sweep</th>
      <th>device</th><th>torch</th><th>torch_tpu</th><th>transformers</th><th>runs</th></tr></thead>
      <tbody></tbody>
    </table>
    <p id="more" class="note"></p>
  </div>
  <aside id="detail" hidden></aside>
</main>
<script>
"use strict";
const D = /*DATA*/null;
const MAX_ROWS = 300;
const $ = (sel) => document.querySelector(sel);
const esc = (s) => String(s == null ? "" : s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const M = D.models, S = D.sweeps, O = D.outcomes, E = D.envs;
const lower = M.map((m) => m[0].toLowerCase());
// A model: [id, type, runs, env exceptions, error_type, message, traceback, repro, notebook, versions, started].
// runs: [first sweep, n sweeps, outcome] triples; env exceptions: [sweep, env] pairs (else the sweep's env).
function env(m, s) {
  const x = m[3];
  for (let k = 0; k < x.length; k += 2) if (x[k] === s) return x[k + 1];
  return S[s][4];
}
// The model's [sweep, outcome, env] in sweep index s, or in its latest sweep when s < 0; null if absent.
function entry(m, s) {
  const h = m[2];
  if (s < 0) { const k = h.length - 3; s = h[k] + h[k + 1] - 1; return [s, h[k + 2], env(m, s)]; }
  for (let k = 0; k < h.length; k += 3) {
    if (s >= h[k] && s < h[k] + h[k + 1]) return [s, h[k + 2], env(m, s)];
  }
  return null;
}
function runs(m) { let n = 0; const h = m[2]; for (let k = 1; k < h.length; k += 3) n += h[k]; return n; }
function text(i, m, sweep) {
  if (i < 0) return null;
  return D.texts[i].split("\x01").join(m[0]).split("\x02").join(sweep);
}
function fill(id, values) {
  const sel = $(id);
  for (const [value, label] of values) {
    const o = document.createElement("option"); o.value = value; o.textContent = label; sel.appendChild(o);
  }
}
const uniq = (xs) => [...new Set(xs.filter((x) => x != null))].sort();
fill("#verdict-filter", D.verdicts.map((v) => [v, v]));
fill("#signature-filter", uniq(O.filter((o) => o[0] !== "excluded").map((o) => o[1])).map((s) => [s, s.length > 90 ? s.slice(0, 90) + "…" : s]));
fill("#device-filter", uniq(E.map((e) => e[0])).map((v) => [v, v]));
fill("#sweep-filter", S.map((s, i) => [String(i), s[0]]).reverse());
fill("#torch-filter", uniq(E.map((e) => e[1])).map((v) => [v, "torch " + v]));
fill("#torch_tpu-filter", uniq(E.map((e) => e[2])).map((v) => [v, "torch_tpu " + v]));
fill("#transformers-filter", uniq(E.map((e) => e[3])).map((v) => [v, "transformers " + v]));

let shown = [];
function current() {
  return {
    q: $("#search").value.trim().toLowerCase(),
    verdict: $("#verdict-filter").value, sig: $("#signature-filter").value,
    device: $("#device-filter").value, sweep: $("#sweep-filter").value === "" ? -1 : Number($("#sweep-filter").value),
    torch: $("#torch-filter").value, tpu: $("#torch_tpu-filter").value, tf: $("#transformers-filter").value,
  };
}
function update() {
  const f = current();
  const rows = [];
  let count = 0;
  for (let i = 0; i < M.length; i++) {
    if (f.q && lower[i].indexOf(f.q) < 0) continue;
    const en = entry(M[i], f.sweep);
    if (!en) continue;
    const o = O[en[1]], e = E[en[2]];
    if (f.verdict && o[0] !== f.verdict) continue;
    if (f.sig && o[1] !== f.sig) continue;
    if (f.device && e[0] !== f.device) continue;
    if (f.torch && e[1] !== f.torch) continue;
    if (f.tpu && e[2] !== f.tpu) continue;
    if (f.tf && e[3] !== f.tf) continue;
    count++;
    if (rows.length < MAX_ROWS) rows.push([i, en]);
  }
  shown = rows;
  const html = [];
  for (const [i, en] of rows) {
    const m = M[i], o = O[en[1]], e = E[en[2]];
    html.push('<tr data-i="' + i + '"><td>' + esc(m[0]) + "</td><td>" + esc(D.types[m[1]]) +
      '</td><td class="st st-' + esc(o[0]) + '">' + esc(o[0]) + '</td><td class="sig" title="' + esc(o[1]) + '">' +
      esc(o[1]) + "</td><td>" + esc(S[en[0]][0]) + "</td><td>" + esc(e[0]) + "</td><td>" + esc(e[1]) +
      "</td><td>" + esc(e[2]) + "</td><td>" + esc(e[3]) + "</td><td>" + runs(m) + "</td></tr>");
  }
  $("#results tbody").innerHTML = html.join("");
  $("#match-count").textContent = count + (count === 1 ? " model matches" : " models match");
  $("#more").textContent = count > MAX_ROWS ? "Showing the first " + MAX_ROWS + " of " + count + "; refine the search." : "";
}
function detail(i) {
  const m = M[i];
  const last = entry(m, -1);
  const sweep = S[last[0]][0];
  const o = O[last[1]];
  const versions = m[9] >= 0 ? JSON.parse(D.versions[m[9]]) : {};
  const errorType = text(m[4], m, sweep), message = text(m[5], m, sweep), tb = text(m[6], m, sweep);
  const repro = text(m[7], m, sweep), nb = text(m[8], m, sweep);
  const report = S[last[0]][3];
  const h = [];
  h.push("<h2>" + esc(m[0]) + "</h2>");
  h.push("<dl><dt>latest</dt><dd>" + esc(sweep) + ' <span class="st st-' + esc(o[0]) + '">' + esc(o[0]) + "</span></dd>");
  h.push("<dt>model type</dt><dd>" + esc(D.types[m[1]]) + "</dd>");
  if (o[1]) h.push("<dt>" + (o[0] === "excluded" ? "reason" : "signature") + "</dt><dd>" + esc(o[1]) + "</dd>");
  h.push("<dt>started</dt><dd>" + esc(m[10]) + "</dd>");
  h.push("<dt>versions</dt><dd>" + esc(Object.entries(versions).map(([k, v]) => k + " " + v).join(", ")) + "</dd>");
  const links = [];
  if (nb) links.push('<a class="notebook" href="' + esc(nb) + '">executed notebook</a>');
  if (report) links.push('<a class="report" href="' + esc(report) + '">sweep report</a>');
  if (links.length) h.push("<dt>open</dt><dd>" + links.join(" · ") + "</dd>");
  h.push("</dl>");
  if (errorType || message) {
    h.push('<h3>Error</h3><pre class="error">' + esc((errorType ? errorType + ": " : "") + (message || "")) + "</pre>");
  }
  if (tb) h.push('<details><summary>traceback</summary><pre class="traceback">' + esc(tb) + "</pre></details>");
  if (repro) {
    h.push('<h3>Reproduce <button class="copy" type="button">Copy</button></h3><pre class="repro">' + esc(repro) + "</pre>");
  }
  h.push('<h3>History</h3><table class="history"><thead><tr><th>sweep</th><th>verdict</th><th>signature</th>' +
    "<th>device</th><th>torch</th><th>torch_tpu</th><th>transformers</th></tr></thead><tbody>");
  const hh = m[2];
  for (let k = hh.length - 3; k >= 0; k -= 3) {
    const ho = O[hh[k + 2]];
    for (let s = hh[k] + hh[k + 1] - 1; s >= hh[k]; s--) {
      const he = E[env(m, s)] || [];
      const rep = S[s][3];
      const name = rep ? '<a href="' + esc(rep) + '">' + esc(S[s][0]) + "</a>" : esc(S[s][0]);
      h.push("<tr><td>" + name + '</td><td class="st st-' + esc(ho[0]) + '">' + esc(ho[0]) + '</td><td class="sig">' +
        esc(ho[1]) + "</td><td>" + esc(he[0]) + "</td><td>" + esc(he[1]) + "</td><td>" + esc(he[2]) + "</td><td>" +
        esc(he[3]) + "</td></tr>");
    }
  }
  h.push("</tbody></table>");
  h.push('<p class="note">Error texts are kept for the latest run only.</p>');
  const panel = $("#detail");
  panel.innerHTML = h.join("");
  panel.hidden = false;
  const button = panel.querySelector("button.copy");
  if (button) button.addEventListener("click", () => copy(repro, button));
}
function copy(textToCopy, button) {
  const done = () => { button.textContent = "Copied"; setTimeout(() => { button.textContent = "Copy"; }, 1500); };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(textToCopy).then(done, () => fallback(textToCopy, done));
  } else {
    fallback(textToCopy, done);
  }
}
function fallback(textToCopy, done) {
  const area = document.createElement("textarea");
  area.value = textToCopy; document.body.appendChild(area); area.select();
  try { document.execCommand("copy"); done(); } finally { area.remove(); }
}
let timer = null;
$("#search").addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(update, 60); });
for (const id of ["#verdict-filter", "#signature-filter", "#device-filter", "#sweep-filter", "#torch-filter",
                  "#torch_tpu-filter", "#transformers-filter"]) {
  $(id).addEventListener("change", update);
}
$("#results tbody").addEventListener("click", (event) => {
  const tr = event.target.closest("tr");
  if (!tr) return;
  for (const row of document.querySelectorAll("#results tbody tr.selected")) row.classList.remove("selected");
  tr.classList.add("selected");
  detail(Number(tr.dataset.i));
});
update();
</script>
</body>
</html>
"""
