// The report's tables, in the page with no network and no library (inlined once by offline.html.j2, last in
// the page, as the explorer inlines explorer.js):
// - A folded text (a message, a traceback) opens in a row of its own under its row, across the whole table:
//   read at the table's width, never squeezed into its column nor pushed out of view.
// - A table with class ms-sortable sorts by a column when its heading is clicked (again: the other way) and
//   keeps the rows whose text holds every word typed in its filter box (id: the table's id + "-filter"; the
//   count of rows shown in id + "-count"), as the explorer's search does (a lowercase substring test over rows
//   already in the page, debounced). A cell's data-sort (a number) is what it sorts by, else its text; empty
//   cells go last either way.
"use strict";
(function () {
  function unfold(details) {
    const td = details.parentElement, tr = td.parentElement, pre = details.querySelector(":scope > pre");
    if (!pre || details.msUnfolded) return;
    const table = tr.closest("table"), head = table.tHead ? table.tHead.rows[0].cells[td.cellIndex] : null;
    const row = document.createElement("tr"), cell = document.createElement("td"), label = document.createElement("div");
    row.className = "ms-unfolded";
    cell.colSpan = tr.cells.length;
    label.className = "ms-unfolded-of";
    label.textContent = (head ? head.textContent + " of " : "") + tr.cells[0].textContent;
    cell.append(label, pre);
    row.append(cell);
    let after = tr;
    while (after.nextElementSibling && after.nextElementSibling.classList.contains("ms-unfolded")) {
      after = after.nextElementSibling;
    }
    after.after(row);
    details.msUnfolded = row;
  }
  function refold(details) {
    const row = details.msUnfolded;
    if (!row) return;
    details.append(row.querySelector("pre"));
    row.remove();
    details.msUnfolded = null;
  }
  document.addEventListener("toggle", (event) => {
    const details = event.target;
    if (!(details instanceof HTMLDetailsElement) || !details.parentElement) return;
    if (details.parentElement.tagName !== "TD" || !details.closest("table.ms-table")) return;
    if (details.open) unfold(details); else refold(details);
  }, true);
  const closeAll = (table) => {
    for (const d of table.querySelectorAll("details[open]")) { d.open = false; refold(d); }
  };

  function sortable(table) {
    const body = table.tBodies[0], rows = [...body.rows];
    const filter = document.getElementById(table.id + "-filter"), count = document.getElementById(table.id + "-count");
    const texts = new Map(rows.map((tr) => [tr, tr.textContent.toLowerCase()]));
    const key = (tr, k) => {
      const td = tr.cells[k];
      if (!td) return null;
      if (td.dataset.sort !== undefined && td.dataset.sort !== "") return Number(td.dataset.sort);
      const text = td.textContent.trim();
      return text === "" ? null : text.toLowerCase();
    };
    function sortBy(th) {
      const k = th.cellIndex, up = th.getAttribute("aria-sort") !== "ascending";
      closeAll(table);
      for (const other of table.tHead.rows[0].cells) other.removeAttribute("aria-sort");
      th.setAttribute("aria-sort", up ? "ascending" : "descending");
      const sorted = rows.slice().sort((a, b) => {
        const x = key(a, k), y = key(b, k);
        if (x === null || y === null) return (x === null) - (y === null);
        const order = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
        return up ? order : -order;
      });
      body.append(...sorted);
    }
    function apply() {
      const words = filter ? filter.value.trim().toLowerCase().split(/\s+/).filter(Boolean) : [];
      closeAll(table);
      let shown = 0;
      for (const tr of rows) {
        const keep = words.every((w) => texts.get(tr).includes(w));
        tr.hidden = !keep;
        shown += keep;
      }
      if (count) count.textContent = shown + " of " + rows.length + " " + (count.dataset.unit || "rows") + " shown";
    }
    for (const th of table.tHead.rows[0].cells) {
      th.classList.add("ms-sort");
      th.title = (th.title ? th.title + ". " : "") + "Click to sort (again: the other way)";
      th.addEventListener("click", () => sortBy(th));
    }
    let timer = null;
    if (filter) filter.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(apply, 60); });
    apply();
  }
  for (const table of document.querySelectorAll("table.ms-sortable")) sortable(table);
})();
