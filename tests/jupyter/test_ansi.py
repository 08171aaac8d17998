"""ANSI colours to HTML for rank output in the widget."""

from __future__ import annotations

import pytest

from jupyter_ext.ansi import ansi_to_html, strip_ansi


@pytest.mark.parametrize(
    ("text", "html"),
    [
        ("plain <b>&", "plain &lt;b&gt;&amp;"),
        ("\x1b[31mred\x1b[0m after", '<span style="color:#c33">red</span> after'),
        (
            "\x1b[1;92mbold\x1b[22m bright",
            '<span style="color:#5d5;font-weight:bold">bold</span>'
            '<span style="color:#5d5"> bright</span>',
        ),
        ("\x1b[38;5;196mx", '<span style="color:#ff0000">x</span>'),
        ("\x1b[48;2;1;2;3my", '<span style="background:#010203">y</span>'),
        ("\x1b[4mu\x1b[24mv", '<span style="text-decoration:underline">u</span>v'),
        ("\x1b[2K\x1b[1Aerased\x1b[?25l", "erased"),
        ("\x1b[31m\x1b[mreset", "reset"),
    ],
)
def test_ansi_to_html(text: str, html: str) -> None:
    assert ansi_to_html(text) == html


def test_strip_ansi() -> None:
    assert strip_ansi("\x1b[1;31mbad\x1b[0m\x07 news\x1b[K") == "bad news"
