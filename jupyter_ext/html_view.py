"""HTML fragments of the run widget: header, one rank's output, final summary.

Pure functions of a :class:`RunView`, so the widget only decides *when* to redraw.
"""

from __future__ import annotations

import html

from .ansi import ansi_to_html
from .formatting import final_line, hardware_label, seconds, summary_rows
from .runstate import RankView, RunView

STATE_COLORS = {
    "starting": "#888",
    "running": "#1f6feb",
    "done": "#1a7f37",
    "failed": "#cf222e",
    "killed": "#bc4c00",
    "succeeded": "#1a7f37",
    "cancelled": "#bc4c00",
    "timed_out": "#cf222e",
}
LINK_TITLES = {"mlflow": "MLflow run"}
_OUTPUT_HEIGHT = "22em"


def badge(text: str, state: str) -> str:
    color = STATE_COLORS.get(state, "#888")
    return (
        f'<span style="background:{color};color:#fff;border-radius:3px;padding:0 5px;'
        f'margin-right:4px;font-size:90%">{html.escape(text)}</span>'
    )


def header_html(view: RunView, now: float | None = None, note: str = "") -> str:
    status = "cancelling" if note == "cancelling" else view.status
    links = " ".join(
        f'<a href="{html.escape(url)}" target="_blank" rel="noopener" '
        f'style="color:#1f6feb;text-decoration:underline">'
        f"{html.escape(LINK_TITLES.get(name, name))} &#8599;</a>"
        for name, url in view.links.items()
    )
    ranks = "".join(badge(f"rank {r.rank}: {r.state}", r.state) for r in view.ranks)
    parts = [
        f"<b>{html.escape(view.name)}</b>",
        html.escape(hardware_label(view)),
        badge(status.replace("_", " "), view.status),
        f'<span class="sgpu-elapsed">{seconds(view.elapsed(now))}</span>',
    ]
    if links:
        parts.append(links)
    logs = html.escape(str(view.run_dir / "logs"))
    return (
        '<div class="sgpu-header" style="line-height:1.8">'
        + " &middot; ".join(parts)
        + f"<br>{ranks}"
        + f'<br><span style="color:#777;font-size:85%">full logs: <code>{logs}</code>'
        + "</span></div>"
    )


def rank_output_html(view: RunView, rank: RankView) -> str:
    """The rank's last lines, newest at the bottom, scrolled to the end (column-reverse)."""
    body: list[str] = []
    if rank.dropped:
        path = html.escape(str(view.log_path(rank.rank)))
        body.append(
            f'<span style="color:#777">... {rank.dropped:,} earlier lines are in {path}</span>\n'
        )
    body.extend(ansi_to_html(text) + "\n" for _stream, text in rank.lines)
    body.extend(ansi_to_html(text) + "\n" for text in rank.provisional.values())
    if not rank.lines and not rank.provisional:
        body.append(f'<span style="color:#777">(no output yet from rank {rank.rank})</span>')
    return (
        f'<div class="sgpu-rank-output" data-rank="{rank.rank}" style="max-height:{_OUTPUT_HEIGHT};'
        'overflow:auto;display:flex;flex-direction:column-reverse">'
        '<pre style="margin:0;white-space:pre-wrap;word-break:break-all;font-size:12px;'
        f'line-height:1.35">{"".join(body)}</pre></div>'
    )


def summary_html(view: RunView) -> str:
    cell = '<td style="text-align:left;padding:1px 14px 1px 0">'
    rows = "".join(
        f"<tr>{cell}rank {rank}</td>{cell}{badge(state, state)}</td>{cell}{duration}</td>"
        f"{cell}<code>{html.escape(outcome)}</code></td></tr>"
        for rank, state, duration, outcome in summary_rows(view)
    )
    head = "".join(
        f'<th style="text-align:left;padding:1px 14px 1px 0">{title}</th>'
        for title in ("rank", "status", "time", "result / error")
    )
    return (
        f'<div class="sgpu-summary"><b>{html.escape(view.name)}</b>: '
        f"{html.escape(final_line(view))}"
        f'<table style="margin-top:4px;border-collapse:collapse"><tr>{head}</tr>{rows}</table>'
        "</div>"
    )


def tab_title(rank: RankView) -> str:
    return f"rank {rank.rank} \u00b7 {rank.state}"
