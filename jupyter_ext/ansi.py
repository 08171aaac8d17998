"""ANSI SGR colour codes to HTML spans, for rank output shown in a widget.

Only colours and text attributes are kept; cursor movement and erase sequences (tqdm's
multi-bar positioning) are dropped because the renderer already rewrites progress lines.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, replace
from typing import Any

_CSI = re.compile(r"\x1b\[([0-9;?]*)([@-~])")
_OTHER_ESCAPE = re.compile(r"\x1b[@-Z\\-_]|[\x00-\x08\x0b-\x1f\x7f]")
_BASIC = ("#000", "#c33", "#3a3", "#b80", "#36c", "#a3a", "#2aa", "#ccc")
_BRIGHT = ("#666", "#f55", "#5d5", "#ee5", "#59f", "#f7f", "#5ee", "#fff")
_CUBE = (0, 95, 135, 175, 215, 255)


@dataclass(frozen=True)
class _Style:
    fg: str | None = None
    bg: str | None = None
    bold: bool = False
    dim: bool = False
    italic: bool = False
    underline: bool = False

    def css(self) -> str:
        parts = [f"color:{self.fg}" if self.fg else "", f"background:{self.bg}" if self.bg else ""]
        parts += ["font-weight:bold" if self.bold else "", "opacity:.7" if self.dim else ""]
        parts += ["font-style:italic" if self.italic else ""]
        parts += ["text-decoration:underline" if self.underline else ""]
        return ";".join(p for p in parts if p)


_PLAIN = _Style()
_ATTRIBUTES: dict[int, dict[str, Any]] = {
    1: {"bold": True},
    2: {"dim": True},
    3: {"italic": True},
    4: {"underline": True},
    22: {"bold": False, "dim": False},
    23: {"italic": False},
    24: {"underline": False},
    39: {"fg": None},
    49: {"bg": None},
}


def ansi_to_html(text: str) -> str:
    """Escape ``text`` for HTML and turn its SGR sequences into ``<span style=...>``."""
    out: list[str] = []
    style = _PLAIN
    pos = 0
    for match in _CSI.finditer(text):
        out.append(_styled(text[pos : match.start()], style))
        pos = match.end()
        if match.group(2) == "m":
            style = _apply(style, match.group(1))
    out.append(_styled(text[pos:], style))
    return "".join(out)


def strip_ansi(text: str) -> str:
    return _OTHER_ESCAPE.sub("", _CSI.sub("", text))


def _styled(chunk: str, style: _Style) -> str:
    chunk = html.escape(_OTHER_ESCAPE.sub("", chunk), quote=False)
    if not chunk or style == _PLAIN:
        return chunk
    return f'<span style="{style.css()}">{chunk}</span>'


def _apply(style: _Style, params: str) -> _Style:
    codes = [int(p) if p.isdigit() else 0 for p in params.split(";")] if params else [0]
    i = 0
    while i < len(codes):
        code = codes[i]
        if code in (38, 48):
            color, i = _extended_color(codes, i + 1)
            style = _with(style, "fg" if code == 38 else "bg", color)
            continue
        style = _apply_one(style, code)
        i += 1
    return style


def _apply_one(style: _Style, code: int) -> _Style:
    if code == 0:
        return _PLAIN
    if code in _ATTRIBUTES:
        return replace(style, **_ATTRIBUTES[code])
    for base, palette, field in ((30, _BASIC, "fg"), (40, _BASIC, "bg")):
        if base <= code < base + 8:
            return _with(style, field, palette[code - base])
    for base, palette, field in ((90, _BRIGHT, "fg"), (100, _BRIGHT, "bg")):
        if base <= code < base + 8:
            return _with(style, field, palette[code - base])
    return style


def _with(style: _Style, field: str, value: str | None) -> _Style:
    changes: dict[str, Any] = {field: value}
    return replace(style, **changes)


def _extended_color(codes: list[int], i: int) -> tuple[str | None, int]:
    """``5;N`` (256-colour palette) or ``2;R;G;B`` (true colour) after a 38/48 code."""
    if i < len(codes) and codes[i] == 5 and i + 1 < len(codes):
        return _palette256(codes[i + 1]), i + 2
    if i < len(codes) and codes[i] == 2 and i + 3 < len(codes):
        r, g, b = (max(0, min(255, c)) for c in codes[i + 1 : i + 4])
        return f"#{r:02x}{g:02x}{b:02x}", i + 4
    return None, len(codes)


def _palette256(n: int) -> str | None:
    if 0 <= n < 8:
        return _BASIC[n]
    if 8 <= n < 16:
        return _BRIGHT[n - 8]
    if 16 <= n < 232:
        n -= 16
        r, g, b = (_CUBE[(n // 36) % 6], _CUBE[(n // 6) % 6], _CUBE[n % 6])
        return f"#{r:02x}{g:02x}{b:02x}"
    if 232 <= n < 256:
        level = 8 + 10 * (n - 232)
        return f"#{level:02x}{level:02x}{level:02x}"
    return None
