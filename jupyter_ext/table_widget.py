"""The runs table's front end: an anywidget whose script draws the rows ``table_view.py``
renders as HTML, sorts them by a column and sends the clicks (Cancel, a trial's details) back
to :class:`~jupyter_ext.run_table.RunTable`, which acts on them."""

from __future__ import annotations

import anywidget
import traitlets

_ESM = r"""
function render({ model, el }) {
  const bar = document.createElement("div");
  bar.className = "sgpu-table-bar";
  const heading = document.createElement("span");
  const all = document.createElement("button");
  all.className = "sgpu-cancel-all";
  all.title = "Stop every trial of this table that has not ended";
  bar.append(heading, all);
  const body = document.createElement("div");
  body.className = "sgpu-table-body";
  const live = document.createElement("div");
  live.className = "sgpu-sr";
  live.setAttribute("aria-live", "polite");
  el.append(bar, body, live);
  let column = null, direction = 1, drawnHead = null;

  const key = (row) => row.cells[column] ? row.cells[column].dataset.sort || "" : "";
  const compare = (a, b) => {
    const x = key(a), y = key(b), nx = parseFloat(x), ny = parseFloat(y);
    if (x === "" || y === "") return (x === "") - (y === "");
    if (!isNaN(nx) && !isNaN(ny)) return (nx - ny) * direction;
    return x.localeCompare(y) * direction;
  };
  const sort = () => {
    const tbody = body.querySelector("tbody");
    if (!tbody || column === null) return;
    [...tbody.rows].sort(compare).forEach((row) => tbody.append(row));
    body.querySelectorAll("th[data-col]").forEach((th) => {
      const on = Number(th.dataset.col) === column;
      th.setAttribute("aria-sort", on ? (direction > 0 ? "ascending" : "descending") : "none");
      const b = th.querySelector("button");
      if (b) b.dataset.arrow = on ? (direction > 0 ? "\u25b2" : "\u25bc") : "";
    });
  };
  // Patched cell by cell, not replaced: a button under the pointer stays the same element
  // while the clocks tick (a click needs its press and release on one element).
  const patch = (html) => {
    const next = document.createElement("template");
    next.innerHTML = html;
    const table = next.content.querySelector("table");
    const old = body.querySelector("table");
    const head = table ? table.tHead.innerHTML : "";
    if (!table || !old || head !== drawnHead) {
      drawnHead = head;  // as drawn, before sorting marks the headers
      body.replaceChildren(...next.content.childNodes);
      return;
    }
    const rows = new Map([...old.tBodies[0].rows].map((row) => [row.dataset.trial, row]));
    for (const row of [...table.tBodies[0].rows]) {
      const have = rows.get(row.dataset.trial);
      rows.delete(row.dataset.trial);
      if (!have || have.cells.length !== row.cells.length) {
        if (have) have.replaceWith(row); else old.tBodies[0].append(row);
        continue;
      }
      for (const name of row.getAttributeNames()) have.setAttribute(name, row.getAttribute(name));
      if (!row.hasAttribute("data-best")) have.removeAttribute("data-best");
      [...row.cells].forEach((cell, i) => {
        if (have.cells[i].outerHTML !== cell.outerHTML) have.cells[i].replaceWith(cell);
      });
    }
    rows.forEach((row) => row.remove());
  };
  const draw = () => {
    patch(model.get("html"));
    heading.innerHTML = model.get("heading");
    const ended = model.get("ended"), stopping = model.get("cancelling_all");
    all.disabled = ended || stopping;
    all.textContent = ended ? "All ended" : stopping ? "Cancelling all\u2026" : "Cancel all";
    live.textContent = model.get("announce");
    sort();
  };
  body.addEventListener("click", (event) => {
    const head = event.target.closest("button.sgpu-sort");
    if (head) {
      const col = Number(head.dataset.col);
      direction = column === col ? -direction : 1;
      column = col;
      sort();
      return;
    }
    const action = event.target.closest("button[data-action]");
    if (!action || action.disabled) return;
    if (action.dataset.action === "cancel") {
      action.disabled = true;
      action.textContent = "Cancelling\u2026";
    }
    model.send({ type: action.dataset.action, trial: Number(action.dataset.trial) });
  });
  all.addEventListener("click", () => {
    all.disabled = true;
    all.textContent = "Cancelling all\u2026";
    model.send({ type: "cancel_all" });
  });
  const names = ["change:html", "change:heading", "change:ended", "change:cancelling_all"];
  names.forEach((name) => model.on(name, draw));
  draw();
  return () => names.forEach((name) => model.off(name, draw));
}
export default { render };
"""

_CSS = """
.sgpu-table-bar { display: flex; justify-content: space-between; align-items: center;
  gap: 12px; margin: 2px 0 4px 0; font-size: 13px; }
.sgpu-table-body { overflow-x: auto; }
.sgpu-table-body button { font-size: 12px; padding: 0 6px; cursor: pointer; }
.sgpu-table-body button:focus-visible, .sgpu-table-bar button:focus-visible {
  outline: 2px solid var(--jp-brand-color1, #1f6feb); outline-offset: 1px; }
.sgpu-table-body button.sgpu-sort::after { content: attr(data-arrow); margin-left: 3px; }
.sgpu-table-body tbody tr:hover { background: var(--jp-layout-color2, #8881); }
.sgpu-sr { position: absolute; width: 1px; height: 1px; overflow: hidden;
  clip: rect(0 0 0 0); white-space: nowrap; }
"""


class TableWidget(anywidget.AnyWidget):
    """The live table: its HTML comes from ``table_view``; the script sorts and sends clicks."""

    _esm = _ESM
    _css = _CSS
    html = traitlets.Unicode("").tag(sync=True)
    heading = traitlets.Unicode("").tag(sync=True)
    ended = traitlets.Bool(False).tag(sync=True)
    """Every trial has ended: ``Cancel all`` is disarmed."""
    cancelling_all = traitlets.Bool(False).tag(sync=True)
    announce = traitlets.Unicode("").tag(sync=True)
    """What screen readers are told (an aria-live region): the counts, as they change."""
