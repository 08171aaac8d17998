"""A scrolling pane of output lines that follows the tail, and opens the full log in one click.

The scroll position belongs to the browser, so following is decided there: the pane keeps the
newest line in view while the user is at the bottom; scrolling up stops following (new lines are
then held back, so the text being read stays put) until the user scrolls back down or ticks
"follow". The kernel only sends the lines (bounded HTML) when they change. "open full log" asks
the kernel for the rank's log file and shows it in a new browser tab: in the notebook's theme,
scrolled to its end, and re-read every few seconds while the run goes on (following the end
while the reader is there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anywidget
import traitlets

from .ansi import strip_ansi

MAX_LOG_BYTES = 32 << 20
"""The most of a log file sent to the browser (its end); larger logs say where the rest is."""

_ESM = r"""
function render({ model, el }) {
  const bar = document.createElement("div");
  bar.className = "sgpu-pane-bar";
  const label = document.createElement("label");
  const follow = document.createElement("input");
  follow.type = "checkbox";
  follow.checked = true;
  follow.className = "sgpu-follow";
  label.append(follow, " follow");
  bar.append(label);
  const waiting = [];
  if (model.get("log_path")) {
    const open = document.createElement("button");
    open.className = "sgpu-open-log";
    open.textContent = "open full log";
    open.title = model.get("log_path");
    open.addEventListener("click", () => {
      // Opened inside the click, so that popup blockers allow it; filled when the log arrives.
      waiting.push(window.open("", "_blank"));
      model.send({ type: "open_log" });
    });
    bar.append(open);
  }
  const out = document.createElement("div");
  out.className = "sgpu-rank-output";
  out.dataset.rank = model.get("rank");
  const pre = document.createElement("pre");
  out.append(pre);
  el.append(bar, out);

  let following = true;
  let pinned = 0;  // where toEnd last put the view
  const atEnd = () => out.scrollHeight - out.scrollTop - out.clientHeight < 8;
  const toEnd = () => { out.scrollTop = out.scrollHeight; pinned = out.scrollTop; };
  // Scrolled up since the view was last put at the end. Read before each draw: the scroll
  // event comes only with the next rendered frame, and a browser that renders none for a
  // while (headless, a busy tab) would otherwise have every draw pull the reader back down.
  const scrolledAway = () => out.clientHeight > 0 && !atEnd() && out.scrollTop < pinned - 8;
  const draw = () => { pre.innerHTML = model.get("html"); toEnd(); };
  const setFollowing = (value) => {
    following = value;
    follow.checked = value;
    out.dataset.following = String(value);
    if (value) draw();
  };
  out.addEventListener("scroll", () => {
    if (out.clientHeight === 0) return;  // a hidden tab: no user scrolled it
    if (atEnd() !== following) setFollowing(atEnd());
  });
  follow.addEventListener("change", () => setFollowing(follow.checked));
  const onHtml = () => {
    if (following && scrolledAway()) setFollowing(false);
    else if (following) draw();
  };
  model.on("change:html", onHtml);
  const opened = [];
  const escape = (s) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  const logPage = (text) => {
    // The notebook's own theme: the log reads as the pane does, in a light or a dark theme.
    const css = getComputedStyle(el);
    const v = (name, fallback) => css.getPropertyValue(name).trim() || fallback;
    return `<!doctype html><html><head><meta charset="utf-8"><title>` +
      `${escape(model.get("log_path"))}</title><style>html, body { margin: 0; ` +
      `background: ${v("--jp-layout-color0", "#fff")}; ` +
      `color: ${v("--jp-content-font-color1", "#000")}; color-scheme: light dark; }` +
      ` pre { margin: 0; padding: 8px 12px; white-space: pre-wrap; word-break: break-all;` +
      ` font: 12px/1.4 ${v("--jp-code-font-family", "monospace")}; }</style></head>` +
      `<body><pre id="sgpu-log">${escape(text)}</pre></body></html>`;
  };
  const toTail = (win) => {
    // The page is the opener's origin (a blob: URL made here): scrolled from here, no script.
    let tries = 0;
    const timer = setInterval(() => {
      tries += 1;
      try {
        if (win.closed || tries > 100) { clearInterval(timer); return; }
        if (!win.document.getElementById("sgpu-log")) return;
        win.scrollTo(0, win.document.documentElement.scrollHeight);
        clearInterval(timer);
      } catch (e) { clearInterval(timer); }
    }, 50);
  };
  const refresh = (win, text) => {
    try {
      const pre = win.document.getElementById("sgpu-log");
      if (!pre || pre.textContent === text) return;
      const doc = win.document.documentElement;
      const atEnd = doc.scrollHeight - win.scrollY - win.innerHeight < 8;
      pre.textContent = text;
      if (atEnd) win.scrollTo(0, doc.scrollHeight);
    } catch (e) { /* the reader closed it or went elsewhere */ }
  };
  const poll = setInterval(() => {
    const live = opened.filter((w) => !w.closed);
    opened.splice(0, opened.length, ...live);
    if (live.length) model.send({ type: "open_log", follow: true });
  }, 2000);
  const onMessage = (msg) => {
    if (msg.type !== "log") return;
    if (msg.follow) { opened.forEach((w) => refresh(w, msg.text)); return; }
    const page = new Blob([logPage(msg.text)], { type: "text/html;charset=utf-8" });
    const url = URL.createObjectURL(page);
    let win = waiting.shift();
    if (win && !win.closed) win.location.href = url;
    else win = window.open(url, "_blank");
    if (win) { opened.push(win); toTail(win); }
  };
  model.on("msg:custom", onMessage);
  // A tab shown again, or the pane laid out for the first time: back to the newest line.
  const resized = new ResizeObserver(() => { if (following && !scrolledAway()) toEnd(); });
  resized.observe(out);
  setFollowing(true);
  return () => {
    clearInterval(poll);
    resized.disconnect();
    model.off("change:html", onHtml);
    model.off("msg:custom", onMessage);
  };
}
export default { render };
"""

_CSS = """
.sgpu-pane-bar { display: flex; gap: 14px; justify-content: flex-end; align-items: center;
  font-size: 12px; color: #57606a; margin: 2px 0; }
.sgpu-pane-bar input { margin: 0 3px 0 0; vertical-align: middle; }
.sgpu-pane-bar button { font-size: 12px; padding: 0 6px; cursor: pointer; }
.sgpu-rank-output { max-height: 22em; overflow-y: auto; overflow-x: hidden; }
.sgpu-rank-output pre { margin: 0; overflow: visible; white-space: pre-wrap;
  word-break: break-all; font-size: 12px; line-height: 1.35; background: none; }
"""


class LogPane(anywidget.AnyWidget):
    """Lines of one rank (or of all ranks); ``log`` reads the full log for "open full log"."""

    _esm = _ESM
    _css = _CSS
    html = traitlets.Unicode("").tag(sync=True)
    rank = traitlets.Unicode("").tag(sync=True)
    log_path = traitlets.Unicode("").tag(sync=True)
    """Shown on the "open full log" button; no button when empty."""

    def __init__(self, rank: str, html: str, log_path: Path | None = None, **kwargs: Any) -> None:
        super().__init__(rank=rank, html=html, log_path=str(log_path or ""), **kwargs)
        self._log_path = log_path
        self.on_msg(self._on_message)

    def _on_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if isinstance(content, dict) and content.get("type") == "open_log" and self._log_path:
            follow = bool(content.get("follow"))
            self.send({"type": "log", "text": read_log(self._log_path), "follow": follow})


def read_log(path: Path, limit: int = MAX_LOG_BYTES) -> str:
    """The log as a reader wants it: colours removed, a progress bar as its last state."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            f.seek(max(0, size - limit))
            data = f.read(limit).decode("utf-8", errors="replace")
    except OSError as exc:
        return f"cannot read {path}: {exc}"
    lines = [strip_ansi(_last_redraw(line)) for line in data.split("\n")]
    head = f"[first {size - limit:,} bytes omitted: {path}]\n" if size > limit else ""
    return head + "\n".join(lines)


def _last_redraw(line: str) -> str:
    """A line rewritten with ``\\r`` (a progress bar) reads as its last non-empty state."""
    parts = [part for part in line.split("\r") if part.strip()]
    return parts[-1] if parts else ""
