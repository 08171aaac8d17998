"""What the run widget says to screen readers, and its style sheet for JupyterLab's themes.

:class:`LiveStatus` is an ``aria-live`` region (visually hidden) whose text the widget changes
when the run's status changes (started, cancelling, stacks taken, ended), so a screen reader
announces it. Its style sheet, loaded once per page with the first run widget, gives the
widget a visible focus ring and, in a dark theme, ``[rank N]`` colours from the theme's own
variables (the inline colours are for light backgrounds: records in nbviewer and GitHub).
"""

from __future__ import annotations

import anywidget
import traitlets

_ESM = r"""
function render({ model, el }) {
  const region = document.createElement("div");
  region.className = "sgpu-live";
  region.setAttribute("role", "status");
  region.setAttribute("aria-live", "polite");
  el.append(region);
  const draw = () => { region.textContent = model.get("text"); };
  model.on("change:text", draw);
  draw();
  return () => model.off("change:text", draw);
}
export default { render };
"""

_DARK_RANK_COLORS = (
    "--jp-content-link-color",
    "--jp-mirror-editor-operator-color",
    "--jp-success-color1",
    "--jp-warn-color1",
    "--jp-mirror-editor-string-color",
    "--jp-info-color1",
    "--jp-ui-font-color1",
)
"""One theme variable per ``sgpu-rank-N`` class (``html_view._RANK_COLORS`` has as many)."""

_FOCUSABLE = ("button", "a", "summary", "input", ".lm-TabBar-tab")

_CSS = (
    ".sgpu-live { position: absolute; width: 1px; height: 1px; overflow: hidden;"
    " clip-path: inset(50%); white-space: nowrap; }\n"
    + ",\n".join(
        f".sgpu-{part} {what}:focus-visible" for part in ("run", "record") for what in _FOCUSABLE
    )
    + " { outline: 2px solid var(--jp-brand-color1, #1f6feb) !important;"
    " outline-offset: 2px !important; }\n"
    + "".join(
        f'[data-jp-theme-light="false"] .sgpu-rank-{i} {{ color: var({var}) !important; }}\n'
        for i, var in enumerate(_DARK_RANK_COLORS)
    )
)


class LiveStatus(anywidget.AnyWidget):
    """A polite live region: each new ``text`` is announced once."""

    _esm = _ESM
    _css = _CSS
    text = traitlets.Unicode("").tag(sync=True)

    def say(self, text: str) -> None:
        if text != self.text:
            self.text = text
