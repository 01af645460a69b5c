// The explorer page's behaviour: search, filters, detail panel. Data: the #explorer-data JSON.
"use strict";
const D = JSON.parse(document.getElementById("explorer-data").textContent);
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
