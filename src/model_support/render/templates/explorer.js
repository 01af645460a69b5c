// The explorer page's behaviour: search, filters, detail panel. Data: the #explorer-data JSON.
"use strict";
const D = JSON.parse(document.getElementById("explorer-data").textContent);
const MAX_ROWS = 300;
const $ = (sel) => document.querySelector(sel);
const esc = (s) => String(s == null ? "" : s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const M = D.models, S = D.sweeps, O = D.outcomes, E = D.envs;
const lower = M.map((m) => m[0].toLowerCase());
// What a bisect named as the release that changed entry i's run in sweep s (bisect.json), or "".
const CHANGED_BY = new Map((D.changed_by || []).map(([i, s, said]) => [i + ":" + s, said]));
const changedBy = (i, s) => CHANGED_BY.get(i + ":" + s) || "";
// Each timed entry's speed (explorer_speed): [entry, first sweep, codes], from its first timed sweep to its last,
// 6 characters a timed sweep: tokens/s (median of the repeats), their spread ((max - min) / median, %) and TPOT
// (ms), two characters each (3 significant figures); one character (SP.gap) for a sweep in between not timed.
const SP = D.speed || {alphabet: "", gap: "!", low: 0, entries: []};
const SPEED = new Map(SP.entries.map(([i, first, codes]) => [i, [first, codes]]));
const DIGIT = new Map([...SP.alphabet].map((c, k) => [c, k]));
function speedNumber(codes, at) {
  const n = DIGIT.get(codes[at]) * SP.alphabet.length + DIGIT.get(codes[at + 1]);
  if (n < 2) return n === 0 ? null : 0;
  const e = Math.floor((n - 2) / 900) + SP.low, mantissa = 100 + ((n - 2) % 900);
  return e >= 2 ? mantissa * 10 ** (e - 2) : mantissa / 10 ** (2 - e);
}
// Entry i's [tokens/s, spread %, TPOT ms] in sweep s (spread or TPOT may be null), or null: that run was not timed.
function speedOf(i, s) {
  const sp = SPEED.get(i);
  if (!sp || s < sp[0]) return null;
  const codes = sp[1];
  let at = 0;
  for (let t = sp[0]; t < s && at < codes.length; t++) at += codes[at] === SP.gap ? 1 : 6;
  if (at >= codes.length || codes[at] === SP.gap) return null;
  const tps = speedNumber(codes, at);
  return tps == null ? null : [tps, speedNumber(codes, at + 2), speedNumber(codes, at + 4)];
}
// A history row's speed cell: tokens/s and its repeats' spread, TPOT below; "not timed" for a PASS without, "" otherwise.
function speedCell(sp, pass) {
  if (!sp) return '<td class="speed">' + (pass ? '<span class="untimed">not timed</span>' : "") + "</td>";
  const [tps, spread, tpot] = sp;
  const spreadText = spread == null ? "" : Number(spread.toPrecision(2)) + "%";
  const title = tps + " tokens/s, the median of the repeats" +
    (spreadText ? "; their spread (max - min) / median " + spreadText : "") +
    (tpot == null ? "" : "; TPOT " + tpot + " ms per output token after the first");
  return '<td class="speed" title="' + esc(title) + '"><b class="tps">' + tps + "</b>" +
    (spreadText ? ' <span class="spread">' + esc(spreadText) + "</span>" : "") +
    (tpot == null ? "" : '<br><span class="tpot">' + tpot + " ms</span>") + "</td>";
}
// A model's tokens/s across its timed sweeps on the device of its latest timed run, oldest first, as a tiny line
// (no chart library), or "": figures from another device (another clock, another machine) are not on its line.
function sparkline(i, sweeps) {
  const deviceOf = (s) => envRow(env(M[i], s))[0] || S[s][2];
  const timed = sweeps.filter((s) => speedOf(i, s));
  const device = timed.length ? deviceOf(timed[timed.length - 1]) : null;
  const points = timed.filter((s) => deviceOf(s) === device).map((s) => [s, speedOf(i, s)[0]]);
  if (points.length < 2) return "";
  const W = 160, H = 28, P = 3, lo = Math.min(...points.map((p) => p[1])), hi = Math.max(...points.map((p) => p[1]));
  const x = (k) => P + (k * (W - 2 * P)) / (points.length - 1);
  const y = (v) => (hi === lo ? H / 2 : H - P - ((v - lo) * (H - 2 * P)) / (hi - lo));
  const xy = points.map((p, k) => x(k).toFixed(1) + "," + y(p[1]).toFixed(1));
  const dots = points.map((p, k) => '<circle cx="' + x(k).toFixed(1) + '" cy="' + y(p[1]).toFixed(1) + '" r="2"><title>' +
    esc((S[p[0]][5] || S[p[0]][0]) + ": " + p[1] + " tokens/s") + "</title></circle>").join("");
  return '<p class="speed-line">tokens/s across ' + points.length + " timed sweeps on " + esc(device) + " (" + lo + " to " + hi + ") " +
    '<svg class="spark" width="' + W + '" height="' + H + '" viewBox="0 0 ' + W + " " + H + '" role="img">' +
    '<polyline fill="none" stroke="#1565c0" stroke-width="1.5" points="' + xy.join(" ") + '"/>' + dots + "</svg></p>";
}
// An entry (one model and variant): [id, type, runs, env exceptions, error_type, message, traceback, repro,
// notebook, versions, started, variant (index into D.variants), reference signature, reference note, the
// published notebook's and log's addresses (push --logs), check note (why a PASS's check says what it says),
// task (index into D.tasks: what the latest run probed, else the Hub's pipeline_tag; -1 unknown),
// hub facts (only when the Hub told anything: [task, downloads, likes, trending_score, library, license, gated,
// hub_num_params, created_at, base_model, listed_by], strings as indices into D.texts)].
// runs: [first sweep, n sweeps, outcome] triples; env exceptions: [sweep, env] pairs (else the sweep's env).
// An outcome: [verdict, signature, attribution (whose failure; null for a pass or when not attributed), devices used
// (a result's null reads as 1; null for a run listed without a row), parallelism ("none", "tp", "ep"), a PASS's
// check (one of D.checks; null for anything else), the step where it diverges from the reference (or null), the
// operators its stack lacks of its census (joined; null for none or no census: docs/ops.md)].
const NO_ENV = ["", null, null, null];
// Outcomes of a sweep that listed the model without a row: not probed (pending) or not tested.
const UNPROBED = new Set(O.map((o, i) => (D.unprobed.includes(o[0]) ? i : -1)).filter((i) => i >= 0));
const slug = (status) => "st-" + String(status).replace(/[^A-Za-z0-9]+/g, "-");
const VARIANTS = D.variants, MULTI = VARIANTS.length > 1;
const variantOf = (m) => VARIANTS[m[11]] || D.default_variant;
// Whose failure an outcome is: stack / model / both, "unknown" for a failure without one, "" otherwise.
const FAILS = new Set(D.verdicts.filter((v) => v !== "PASS" && !D.pseudo.includes(v)));
const whose = (o) => (FAILS.has(o[0]) ? o[2] || "unknown" : "");
// The entries of each model (one per variant), in variant order.
const entriesOf = new Map();
M.forEach((m, i) => { if (!entriesOf.has(m[0])) entriesOf.set(m[0], []); entriesOf.get(m[0]).push(i); });
if (!MULTI) document.body.classList.add("one-variant");
// The devices an outcome needed (null reads as 1), its parallelism when it had one, and both as the list shows them.
const devicesOf = (o) => o[3] || 1;
const parallelOf = (o) => (o[4] && o[4] !== "none" ? o[4] : "");
const devicesText = (o) => (o[3] == null ? "" : o[3] + (parallelOf(o) ? " " + parallelOf(o) : ""));
const MULTI_DEVICE = O.some((o) => devicesOf(o) > 1 || parallelOf(o));
if (!MULTI_DEVICE) document.body.classList.add("one-device");
// The operators an outcome's stack lacks (the census against its coverage): a column only when some run lacks one.
const lacksOf = (o) => o[7] || "";
const lacksText = (o) => (o[7] ? o[7].split(", ").length + ": " + o[7].split(", ")[0] : "");
if (!O.some((o) => o[7])) document.body.classList.add("no-ops");
function env(m, s) {
  const x = m[3];
  for (let k = 0; k < x.length; k += 2) if (x[k] === s) return x[k + 1];
  return S[s][4];
}
const envRow = (e) => E[e] || NO_ENV;
// The model's [sweep, outcome, env] in sweep index s, or its latest run when s < 0 (its latest sweep with a
// verdict or an exclusion; else its latest sweep: not probed / not tested); null if absent.
function entry(m, s) {
  const h = m[2];
  if (s < 0) {
    let k = h.length - 3;
    for (let j = k; j >= 0; j -= 3) if (!UNPROBED.has(h[j + 2])) { k = j; break; }
    s = h[k] + h[k + 1] - 1;
    return [s, h[k + 2], env(m, s)];
  }
  for (let k = 0; k < h.length; k += 3) {
    if (s >= h[k] && s < h[k] + h[k + 1]) return [s, h[k + 2], env(m, s)];
  }
  return null;
}
// The sweeps the model was run in (a verdict or an exclusion).
function runs(m) { let n = 0; const h = m[2]; for (let k = 1; k < h.length; k += 3) if (!UNPROBED.has(h[k + 1])) n += h[k]; return n; }
const taskOf = (m) => m[17];
const hubOf = (m) => m[18] || null;
// Each sweep as the list shows it: name and time (the full id on hover, and in the detail panel).
const sweepCell = (s) => '<td class="sweep" title="' + esc(S[s][0]) + '">' + esc(S[s][5] || S[s][0]) + "</td>";
// Cells that truncate with "…" carry their whole text as a tooltip.
const cell = (cls, value) => '<td class="' + cls + '" title="' + esc(value) + '">' + esc(value) + "</td>";
if (!M.some(hubOf)) document.body.classList.add("no-hub");
// An environment's torch / device backend (its adapter's packages) / transformers versions, as one cell and as its tooltip.
const stackText = (e) => e.slice(1).map((v) => v || "–").join(" / ");
const stackTitle = (e) => ["torch", "backend", "transformers"].map((k, j) => k + " " + (e[j + 1] || "none")).join(", ");
// What a PASS's check says ("" for anything else), suspect or not, and as the list shows it ("diverges at step 3").
const SUSPECT = new Set(D.suspect_checks);
const checkOf = (o) => o[5] || "";
const checkText = (o) => (o[5] ? o[5] + (o[6] != null && SUSPECT.has(o[5]) ? " at step " + o[6] : "") : "");
const hubText = (i) => (i == null || i < 0 ? null : D.texts[i]);
const pendingOf = new Map();
for (const [i, s, problem, at] of D.pending) {
  if (!pendingOf.has(i)) pendingOf.set(i, []);
  pendingOf.get(i).push([s, problem, at]);
}
const fmt = (n) => (n == null ? "" : Number(n).toLocaleString("en-US"));
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
fill("#attribution-filter", D.attributions.map((a) => [a, a]));
fill("#check-filter", [["suspect", "suspect passes"], ...D.checks.map((c) => [c, c])]);
fill("#variant-filter", VARIANTS.map((v, k) => [String(k), v]));
fill("#devices-filter", [...new Set(O.map(devicesOf))].sort((a, b) => a - b)
  .map((n) => [String(n), "needs " + n + (n === 1 ? " device" : " devices")]));
fill("#signature-filter", uniq(O.filter((o) => !D.pseudo.includes(o[0])).map((o) => o[1])).map((s) => [s, s.length > 90 ? s.slice(0, 90) + "…" : s]));
const taskCounts = D.tasks.map(() => 0);
for (const m of M) if (taskOf(m) >= 0) taskCounts[taskOf(m)]++;
fill("#task-filter", D.tasks.map((t, k) => [String(k), t + " (" + taskCounts[k] + ")"]));
for (const [name, ids] of Object.entries(D.views)) {
  const o = document.querySelector('#view option[value="' + name + '"]');
  if (o) o.textContent += " (" + ids.length + ")";
}
fill("#device-filter", uniq(E.map((e) => e[0])).map((v) => [v, v]));
fill("#sweep-filter", S.map((s, i) => [String(i), s[0]]).reverse());
fill("#torch-filter", uniq(E.map((e) => e[1])).map((v) => [v, "torch " + v]));
fill("#torch_tpu-filter", uniq(E.map((e) => e[2])).map((v) => [v, v]));
fill("#transformers-filter", uniq(E.map((e) => e[3])).map((v) => [v, "transformers " + v]));

let shown = [];
function current() {
  return {
    q: $("#search").value.trim().toLowerCase(),
    verdict: $("#verdict-filter").value, sig: $("#signature-filter").value, attr: $("#attribution-filter").value,
    check: $("#check-filter").value,
    variant: $("#variant-filter").value === "" ? -1 : Number($("#variant-filter").value),
    devices: $("#devices-filter").value === "" ? 0 : Number($("#devices-filter").value),
    device: $("#device-filter").value, sweep: $("#sweep-filter").value === "" ? -1 : Number($("#sweep-filter").value),
    torch: $("#torch-filter").value, tpu: $("#torch_tpu-filter").value, tf: $("#transformers-filter").value,
    view: $("#view").value, task: $("#task-filter").value === "" ? null : Number($("#task-filter").value),
  };
}
// The view's column of Hub numbers: trending score in the trending view, downloads elsewhere.
const metricOf = (view) => (view === "trending" ? 3 : 1);
function update() {
  const f = current();
  const rows = [];
  let count = 0;
  const order = D.views[f.view] || null;
  const n = order ? order.length : M.length;
  const metric = metricOf(f.view);
  $("#metric-head").textContent = metric === 3 ? "trending" : "downloads";
  for (let k = 0; k < n; k++) {
    const i = order ? order[k] : k;
    if (f.q && lower[i].indexOf(f.q) < 0) continue;
    if (f.variant >= 0 && M[i][11] !== f.variant) continue;
    if (f.task !== null && taskOf(M[i]) !== f.task) continue;
    const en = entry(M[i], f.sweep);
    if (!en) continue;
    const o = O[en[1]], e = envRow(en[2]);
    if (f.verdict && o[0] !== f.verdict) continue;
    if (f.sig && o[1] !== f.sig) continue;
    if (f.attr && whose(o) !== f.attr) continue;
    if (f.check && (f.check === "suspect" ? !SUSPECT.has(checkOf(o)) : checkOf(o) !== f.check)) continue;
    if (f.devices && devicesOf(o) !== f.devices) continue;
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
    const m = M[i], o = O[en[1]], e = envRow(en[2]), hub = hubOf(m);
    const cb = changedBy(i, en[0]);  // a bisect named the release that changed this run
    const sig = (cb ? "changed by " + cb + ": " : "") + (o[1] || (UNPROBED.has(en[1]) ? D.verdict_help[o[0]] : ""));
    const w = whose(o);
    html.push('<tr data-i="' + i + '">' + cell("model", m[0]) + cell("col-variant variant", variantOf(m)) +
      cell("col-minor type", D.types[m[1]]) + '<td class="st ' + slug(o[0]) + '">' + esc(o[0]) +
      '</td><td class="whose' + (w ? " w-" + w : "") + '" title="' + esc(D.attribution_help[w] || "") + '">' + esc(w) +
      '</td><td class="col-minor check' + (SUSPECT.has(checkOf(o)) ? " suspect" : "") + '" title="' +
      esc((D.check_help[checkOf(o)] || "") + (checkText(o) ? " (" + checkText(o) + ")" : "")) + '">' + esc(checkText(o)) +
      '</td><td class="col-devices col-minor devices">' + esc(devicesText(o)) + "</td>" +
      '<td class="col-ops col-minor lacks" title="' + esc(lacksOf(o) ? "lacks " + lacksOf(o) : "") + '">' +
      esc(lacksText(o)) + "</td>" + cell("sig", sig) + sweepCell(en[0]) +
      cell("col-minor device", e[0] || S[en[0]][2]) +
      '<td class="col-minor stack" title="' + esc(stackTitle(e)) + '">' + esc(stackText(e)) +
      '</td><td class="col-minor num">' + runs(m) + "</td>" +
      cell("col-minor task", taskOf(m) >= 0 ? D.tasks[taskOf(m)] : "") +
      '<td class="col-hub col-minor num metric">' + esc(hub ? fmt(hub[metric]) : "") + "</td></tr>");
  }
  $("#results tbody").innerHTML = html.join("");
  const what = MULTI && f.variant < 0 ? (count === 1 ? " run matches" : " runs match") + " (model x variant)"
    : (count === 1 ? " model matches" : " models match");
  $("#match-count").textContent = count + what;
  $("#more").textContent = count > MAX_ROWS ? "Showing the first " + MAX_ROWS + " of " + count + "; refine the search." : "";
  refreshDetail();
}
// After a filter changes, the open panel follows the list: the same row again (in the sweep now chosen), or
// closed when the list no longer shows it; never a run the list does not show beside it.
function refreshDetail() {
  const panel = $("#detail");
  if (panel.hidden || panel.dataset.i === undefined) return;
  const i = Number(panel.dataset.i);
  const tr = document.querySelector('#results tbody tr[data-i="' + i + '"]');
  if (!tr) {
    panel.hidden = true;
    delete panel.dataset.i;
    document.body.classList.remove("detail-open");
    return;
  }
  tr.classList.add("selected");
  detail(i);
}
// What the Hub says about the model (latest known), as definition-list items.
function hubItems(m, i) {
  const hub = hubOf(m);
  const items = [];
  const selected = (D.views.selected || []).includes(i);
  const listed = [selected ? "selected" : null, hub ? hubText(hub[10]) : null].filter((x) => x);
  if (listed.length) items.push(["listed", listed.join(", ")]);
  if (!hub) return items;
  const facts = [
    ["task (Hub)", hub[0] >= 0 ? D.tasks[hub[0]] : null], ["downloads", fmt(hub[1])], ["likes", fmt(hub[2])],
    ["trending score", fmt(hub[3])], ["library", hubText(hub[4])], ["license", hubText(hub[5])],
    ["gated", hubText(hub[6])], ["parameters (Hub)", fmt(hub[7])], ["created", hub[8]], ["base model", hubText(hub[9])],
  ];
  for (const [k, v] of facts) if (v != null && v !== "") items.push([k, v]);
  return items;
}
// The sweeps after the model's latest run (or all, when it never ran) that listed it without a row.
function unprobedEntries(m, i, after) {
  const out = [], h = m[2], pend = pendingOf.get(i) || [];
  for (let k = h.length - 3; k >= 0; k -= 3) {
    if (!UNPROBED.has(h[k + 2])) continue;
    for (let s = h[k] + h[k + 1] - 1; s >= h[k]; s--) {
      if (s <= after) continue;
      const p = pend.find((x) => x[0] === s);
      out.push([s, O[h[k + 2]], p ? p[1] : null, p ? p[2] : null]);
    }
  }
  return out;
}
// The open detail panel shows the run the list shows: in the chosen sweep (else the latest run). Error texts are
// the latest run's only, and say so when the chosen sweep is another.
function detail(i) {
  const m = M[i];
  const last = entry(m, -1);
  const chosen = current().sweep;
  const picked = chosen >= 0 ? entry(m, chosen) : null;
  const run = picked || last;
  const other = run[0] !== last[0];
  const sweep = S[last[0]][0];
  const o = O[run[1]];
  const ran = !UNPROBED.has(run[1]);
  const versions = m[9] >= 0 ? JSON.parse(D.versions[m[9]]) : {};
  const errorType = text(m[4], m, sweep), message = text(m[5], m, sweep), tb = text(m[6], m, sweep);
  const repro = text(m[7], m, sweep), nb = text(m[8], m, sweep);
  const nbUrl = text(m[14], m, sweep), logUrl = text(m[15], m, sweep);
  const report = S[run[0]][3];
  const h = [];
  h.push('<h2 data-i="' + i + '">' + esc(m[0]) + "</h2>");
  h.push('<dl><dt>' + (other ? "run in sweep" : ran ? "latest run" : "latest") + '</dt><dd class="run">' +
    esc(S[run[0]][0]) + ' <span class="st ' + slug(o[0]) + '">' + esc(o[0]) + "</span></dd>");
  if (other) {
    const lo = O[last[1]];
    h.push('<dt>latest run</dt><dd class="latest">' + esc(sweep) + ' <span class="st ' + slug(lo[0]) + '">' +
      esc(lo[0]) + "</span></dd>");
  }
  if (MULTI) h.push('<dt>variant</dt><dd class="variant">' + esc(variantOf(m)) + "</dd>");
  if (ran) {
    h.push("<dt>model type</dt><dd>" + esc(D.types[m[1]]) + "</dd>");
    if (taskOf(m) >= 0) h.push('<dt>task</dt><dd class="task">' + esc(D.tasks[taskOf(m)]) + "</dd>");
    if (o[1]) h.push("<dt>" + (o[0] === "excluded" ? "reason" : "signature") + "</dt><dd>" + esc(o[1]) + "</dd>");
    const w = whose(o);
    if (w) {
      h.push('<dt>whose failure</dt><dd class="attribution"><b>' + esc(w) + "</b>: " + esc(D.attribution_help[w]) +
        "</dd>");
    }
    if (o[3] != null) {
      h.push('<dt>devices</dt><dd class="devices">' + esc(o[3]) + '</dd><dt>parallelism</dt><dd class="parallelism">' +
        esc(o[4] || "none") + "</dd>");
    }
    if (o[5]) {
      const note = other ? null : text(m[16], m, sweep);  // the latest run's note
      h.push('<dt>check</dt><dd class="check' + (SUSPECT.has(o[5]) ? " suspect" : "") + '"><b>' + esc(checkText(o)) +
        "</b>: " + esc(D.check_help[o[5]]) + (note ? '<br><span class="check-note">' + esc(note) + "</span>" : "") +
        "</dd>");
    }
    const refSig = m[12] >= 0 && !other ? D.texts[m[12]] : null, refNote = other ? null : text(m[13], m, sweep);
    if (refSig) h.push('<dt>reference signature</dt><dd class="reference-signature">' + esc(refSig) + "</dd>");
    if (refNote) h.push('<dt>reference note</dt><dd class="reference-note">' + esc(refNote) + "</dd>");
    if (changedBy(i, run[0])) h.push('<dt>changed by</dt><dd class="changed-by">' + esc(changedBy(i, run[0])) + "</dd>");
    if (other) {  // the chosen sweep's stack; the start time and every version are kept for the latest run only
      const he = envRow(run[2]);
      h.push("<dt>stack</dt><dd>" + esc((he[0] || S[run[0]][2]) + ": " + stackTitle(he)) + "</dd>");
    } else {
      h.push("<dt>started</dt><dd>" + esc(m[10]) + "</dd>");
      h.push("<dt>versions</dt><dd>" + esc(Object.entries(versions).map(([k, v]) => k + " " + v).join(", ")) + "</dd>");
    }
  }
  for (const [k, v] of hubItems(m, i)) h.push("<dt>" + esc(k) + "</dt><dd>" + esc(v) + "</dd>");
  const links = [];
  if (nb) links.push('<a class="notebook" href="' + esc(nb) + '">executed notebook' + (other ? " (latest run)" : "") + "</a>");
  if (nbUrl) links.push('<a class="notebook-url" href="' + esc(nbUrl) + '">notebook on the Hub</a>');
  if (logUrl) links.push('<a class="log-url" href="' + esc(logUrl) + '">log on the Hub</a>');
  if (report) links.push('<a class="report" href="' + esc(report) + '">sweep report</a>');
  if (links.length) h.push("<dt>open</dt><dd>" + links.join(" · ") + "</dd>");
  h.push("</dl>");
  const waiting = unprobedEntries(m, i, !UNPROBED.has(last[1]) ? last[0] : -1);
  if (waiting.length) {
    h.push('<div class="unprobed">');
    for (const [s, uo, problem, at] of waiting) {
      h.push("<h3>" + esc(S[s][0]) + ': <span class="st ' + slug(uo[0]) + '">' + esc(uo[0]) + "</span></h3><dl>");
      if (uo[1]) h.push("<dt>last error</dt><dd class=\"reason\">" + esc(uo[1]) + "</dd>");
      if (problem) h.push("<dt>problem</dt><dd>" + esc(problem) + "</dd>");
      if (at) h.push("<dt>when</dt><dd>" + esc(at) + "</dd>");
      h.push("<dt>meaning</dt><dd>" + esc(D.verdict_help[uo[0]]) + "</dd>");
      h.push("<dt>to finish</dt><dd><code>model-support sweep --resume " + esc(S[s][0]) + "</code></dd></dl>");
    }
    h.push("</div>");
  }
  const siblings = entriesOf.get(m[0]) || [i];
  if (siblings.length > 1) {
    // The model's variants side by side, in the chosen sweep (else this run's sweep).
    const chosen = current().sweep;
    const s = chosen >= 0 ? chosen : last[0];
    h.push("<h3>Variants in " + esc(S[s][0]) + '</h3><table class="variants"><thead><tr><th>variant</th>' +
      "<th>verdict</th><th>whose</th><th>signature</th></tr></thead><tbody>");
    for (const j of siblings) {
      const en = entry(M[j], s);
      const vo = en ? O[en[1]] : null;
      h.push('<tr data-i="' + j + '"' + (j === i ? ' class="selected"' : "") + "><td>" + esc(variantOf(M[j])) +
        '</td><td class="st ' + (vo ? slug(vo[0]) : "") + '">' + esc(vo ? vo[0] : "—") + '</td><td class="whose">' +
        esc(vo ? whose(vo) : "") + '</td><td class="sig">' + esc(vo ? vo[1] : "") + "</td></tr>");
    }
    h.push("</tbody></table>");
  }
  h.push(supportCard(siblings, i));
  if (errorType || message) {
    h.push("<h3>Error" + (other ? " (of the latest run, " + esc(sweep) + ")" : "") + '</h3><pre class="error">' +
      esc((errorType ? errorType + ": " : "") + (message || "")) + "</pre>");
  }
  if (tb) h.push('<details><summary>traceback</summary><pre class="traceback">' + esc(tb) + "</pre></details>");
  if (repro) {
    h.push('<h3>Reproduce <button class="copy" type="button">Copy</button></h3><pre class="repro">' + esc(repro) + "</pre>");
  }
  const timed = SPEED.has(i);  // a speed column only for an entry with a timed run
  const hh = m[2];
  const ranIn = [];
  for (let k = 0; k < hh.length; k += 3) for (let s = hh[k]; s < hh[k] + hh[k + 1]; s++) ranIn.push(s);
  // A run's signature reads in a row of its own across the table, under its run: the panel is too narrow for
  // a column of it beside the others (it had none left at 1280 px).
  h.push('<h3>History' + (MULTI ? " (" + esc(variantOf(m)) + ")" : "") + "</h3>" + (timed ? sparkline(i, ranIn) : "") +
    '<table class="history"><thead><tr>' +
    '<th class="h-sweep">sweep</th><th class="h-verdict">verdict</th><th class="h-whose">whose</th>' +
    '<th class="h-check">check</th>' +
    (timed ? '<th class="h-speed" title="tokens/s: the median of the repeats, then their spread ((max - min) / median); ' +
      'below, TPOT: ms per output token after the first">tokens/s</th>' : "") +
    '<th class="h-stack" title="device, then torch / the device backend / transformers; the signature below">stack</th>' +
    "</tr></thead><tbody>");
  for (let k = hh.length - 3; k >= 0; k -= 3) {
    const ho = O[hh[k + 2]];
    for (let s = hh[k] + hh[k + 1] - 1; s >= hh[k]; s--) {
      const he = envRow(env(m, s));
      const rep = S[s][3], label = esc(S[s][5] || S[s][0]);
      const name = rep ? '<a href="' + esc(rep) + '">' + label + "</a>" : label;
      const sig = (changedBy(i, s) ? "changed by " + changedBy(i, s) + ": " : "") + (ho[1] || "");
      h.push("<tr" + (sig ? ' class="signed"' : "") + '><td class="sweep" title="' + esc(S[s][0]) + '">' + name +
        '</td><td class="st ' + slug(ho[0]) + '">' + esc(ho[0]) + '</td><td class="whose">' + esc(whose(ho)) + "</td>" +
        cell("check", checkText(ho)) + (timed ? speedCell(speedOf(i, s), ho[0] === "PASS") : "") +
        '<td class="stack" title="' + esc((he[0] || S[s][2]) + ": " + stackTitle(he)) + '">' +
        esc((he[0] || S[s][2]) + " " + stackText(he)) + "</td></tr>");
      if (sig) h.push('<tr class="h-signature"><td class="sig" colspan="' + (timed ? 6 : 5) + '">' + esc(sig) + "</td></tr>");
    }
  }
  h.push("</tbody></table>");
  h.push('<p class="note">Error texts are kept for the latest run only.</p>');
  const panel = $("#detail");
  panel.dataset.i = String(i);
  panel.innerHTML = h.join("");
  panel.hidden = false;
  document.body.classList.add("detail-open");
  const button = panel.querySelector("button.copy");
  if (button) button.addEventListener("click", () => copy(repro, button));
  for (const tr of panel.querySelectorAll("table.variants tbody tr, table.support tbody tr")) {
    tr.addEventListener("click", () => detail(Number(tr.dataset.i)));
  }
}
// The model's support card: per variant (mode, cache and, in a sweep of several stacks, the stack after "@") its
// latest verdict, when that was verified (the sweep's date), how many of the sweeps that ran it agree with that
// verdict, and the stack it ran on; the same as `model-support support MODEL` answers from the dataset.
function supportCard(siblings, i) {
  const h = ['<h3>Support</h3><table class="support"><thead><tr><th>variant</th><th>latest verdict</th>' +
    '<th>last verified</th><th>sweeps agreeing</th><th>stack</th></tr></thead><tbody>'];
  for (const j of siblings) {
    const mj = M[j], last = entry(mj, -1), lo = O[last[1]];
    let ran = 0, agree = 0;
    for (let k = 0; k < mj[2].length; k += 3) {
      if (UNPROBED.has(mj[2][k + 2])) continue;
      ran += mj[2][k + 1];
      if (O[mj[2][k + 2]][0] === lo[0]) agree += mj[2][k + 1];
    }
    const he = envRow(env(mj, last[0]));
    h.push('<tr data-i="' + j + '"' + (j === i ? ' class="selected"' : "") + "><td>" + esc(variantOf(mj)) +
      '</td><td class="st ' + slug(lo[0]) + '">' + esc(lo[0]) + '</td><td class="verified" title="' +
      esc(S[last[0]][0]) + '">' + esc(S[last[0]][1]) + '</td><td class="agree">' + agree + " of " + ran +
      '</td><td class="stack">' + esc((he[0] || S[last[0]][2]) + " " + stackText(he)) + "</td></tr>");
  }
  h.push("</tbody></table>");
  return h.join("");
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
for (const id of ["#view", "#task-filter", "#verdict-filter", "#attribution-filter", "#check-filter", "#variant-filter",
                  "#devices-filter", "#signature-filter", "#device-filter", "#sweep-filter", "#torch-filter",
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
