// Interactivity for the report: filtering the test table and sorting tables.
// Reads only the DOM (no data is embedded in this script), so nothing here needs escaping.
(function () {
  "use strict";

  function cellValue(row, index) {
    const cell = row.cells[index];
    if (!cell) return "";
    const raw = cell.getAttribute("data-value");
    if (raw !== null && raw !== "" && !Number.isNaN(Number(raw))) return Number(raw);
    return cell.textContent.trim().toLowerCase();
  }

  function makeSortable(table) {
    const headers = table.tHead ? Array.from(table.tHead.rows[0].cells) : [];
    headers.forEach(function (header, index) {
      header.addEventListener("click", function () {
        const ascending = header.getAttribute("aria-sort") !== "ascending";
        headers.forEach(function (other) { other.removeAttribute("aria-sort"); });
        header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
        const body = table.tBodies[0];
        const rows = Array.from(body.rows);
        rows.sort(function (left, right) {
          const a = cellValue(left, index);
          const b = cellValue(right, index);
          const order = typeof a === "number" && typeof b === "number" ? a - b : String(a).localeCompare(String(b));
          return ascending ? order : -order;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  }

  function setUpFilter() {
    const table = document.getElementById("all-tests");
    const panel = document.querySelector(".filters");
    if (!table || !panel) return;
    panel.hidden = false;
    const search = document.getElementById("test-filter");
    const toggles = Array.from(panel.querySelectorAll("input[data-outcome]"));
    const counter = document.getElementById("test-filter-count");
    const rows = Array.from(table.tBodies[0].rows);
    function apply() {
      const needle = search.value.trim().toLowerCase();
      const shown = new Set(toggles.filter(function (t) { return t.checked; })
        .map(function (t) { return t.getAttribute("data-outcome"); }));
      let visible = 0;
      rows.forEach(function (row) {
        const match = shown.has(row.getAttribute("data-outcome")) &&
          (needle === "" || row.textContent.toLowerCase().indexOf(needle) !== -1);
        row.hidden = !match;
        if (match) visible += 1;
      });
      counter.textContent = visible + " of " + rows.length + " shown";
    }
    search.addEventListener("input", apply);
    toggles.forEach(function (toggle) { toggle.addEventListener("change", apply); });
    apply();
  }

  // Matrix cells: one list of tests open at a time; Escape or the close button shuts it.
  function setUpMatrix() {
    const cells = Array.from(document.querySelectorAll("details.cell-details"));
    cells.forEach(function (cell) {
      const close = cell.querySelector(".cell-close");
      close.hidden = false;
      close.addEventListener("click", function () { cell.open = false; });
      cell.querySelector("summary").addEventListener("click", function () {
        if (cell.open) return;  // the click closes it; opening one closes the others
        cells.forEach(function (other) { if (other !== cell) other.open = false; });
      });
    });
    document.addEventListener("keydown", function (event) {
      if (event.key === "Escape") cells.forEach(function (cell) { cell.open = false; });
    });
  }

  document.querySelectorAll("table.sortable").forEach(makeSortable);
  setUpFilter();
  setUpMatrix();
  document.documentElement.setAttribute("data-report-ready", "1");
})();
