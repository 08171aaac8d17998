"""HTML fragments of the run widget and of the record a finished run leaves in the notebook.

Pure functions of a :class:`RunView`, so the widget only decides *when* to redraw. The record is
plain HTML (no widget, no script): what a restarted kernel, nbviewer and GitHub show.
"""

from __future__ import annotations

import html

from serverless_gpu.tracking import store
from serverless_gpu.wire.events import RunStatus

from . import progress, stacks_view
from .ansi import ansi_to_html, strip_ansi
from .formatting import (
    final_line,
    hardware_label,
    logs_command,
    rank_counts,
    rank_label,
    rank_status,
    seconds,
    status_words,
    stopped_at,
    summary_rows,
)
from .metrics import data_wait_text, key_metric, metrics_text
from .runstate import RankShown, RankView, RunView

_GREY, _BLUE, _GREEN, _RED, _ORANGE = "#6e7781", "#1f6feb", "#1a7f37", "#cf222e", "#bc4c00"
RANK_COLORS = {
    RankShown.STARTING: _GREY,
    RankShown.RUNNING: _BLUE,
    RankShown.DONE: _GREEN,
    RankShown.FAILED: _RED,
    RankShown.STOPPED: _ORANGE,
    RankShown.CANCELLED: _ORANGE,
}
STATE_COLORS = {
    **{state.value: color for state, color in RANK_COLORS.items()},
    RunStatus.SUCCEEDED.value: _GREEN,
    RunStatus.TIMED_OUT.value: _RED,
}
"""Badge colours by the word on the badge: a rank's state or the run's status."""
LINK_TITLES = {"mlflow": "MLflow run"}
RECORD_TAIL = 20
"""Last lines per rank kept in the record (the full logs stay on disk)."""
_RANK_COLORS = ("#0969da", "#8250df", "#1a7f37", "#bc4c00", "#bf3989", "#0a7b83", "#6e7781")
"""``[rank N]`` colours where no JupyterLab theme is loaded (nbviewer, GitHub); in JupyterLab
the widget's style sheet (``log_pane._CSS``) takes them from the theme's variables."""
_LINK = "var(--jp-content-link-color,#1f6feb)"
_DIM = "color:var(--jp-ui-font-color2,#6e7781)"
_MUTED = f"{_DIM};font-size:85%"
_PRE = "margin:0;white-space:pre-wrap;word-break:break-all;font-size:12px;line-height:1.35"


def badge(text: str, state: str) -> str:
    color = STATE_COLORS.get(state, _GREY)
    return (
        f'<span style="background:{color};color:#fff;border-radius:3px;padding:0 5px;'
        f'margin-right:4px;font-size:90%">{html.escape(text)}</span>'
    )


def _links(view: RunView, pending: dict[str, str] | None = None) -> str:
    """Each link; one named in ``pending`` is that text instead, not a link that cannot open."""
    return " ".join(_link(name, url, (pending or {}).get(name)) for name, url in view.links.items())


def _link(name: str, url: str, pending: str | None) -> str:
    title, key = html.escape(LINK_TITLES.get(name, name)), html.escape(name)
    if pending:
        return (
            f'<span class="sgpu-link-pending" data-link="{key}" style="{_MUTED}">'
            f"{title}: {html.escape(pending)}</span>"
        )
    return (
        f'<a class="sgpu-link" data-link="{key}" href="{html.escape(url)}" target="_blank" '
        f'rel="noopener" style="color:{_LINK};text-decoration:underline">{title} &#8599;</a>'
    )


def mlflow_hint_html(view: RunView) -> str:
    """How to open the run when no UI serves its store (a saved notebook, a later kernel)."""
    uri, run_id = view.metadata.get("mlflow_tracking_uri"), view.metadata.get("mlflow_run_id")
    if "mlflow" not in view.links or not uri or not run_id or store.is_http(str(uri)):
        return ""
    ours, theirs = store.serve_commands(str(uri), str(run_id))
    return (
        f'<div class="sgpu-mlflow-hint" style="{_MUTED}">If the MLflow link does not open, '
        f"no UI serves the store now: run <code>{html.escape(ours)}</code> in a terminal (it "
        f"prints the run's page; <code>{html.escape(theirs)}</code> works too, open to every "
        f"local user), or <code>serverless_gpu.tracking.ui()</code> in the notebook.</div>"
    )


def header_html(
    view: RunView, now: float | None = None, note: str = "", pending: dict[str, str] | None = None
) -> str:
    """Name, hardware, status, clock and links (``pending``: those not openable yet, with what
    they wait for); rank counts and progress; the log folder."""
    status = "cancelling" if note == "cancelling" else status_words(view)
    parts = [
        f"<b>{html.escape(view.name)}</b>",
        html.escape(hardware_label(view)),
        badge(status, view.status.value),
        f'<span class="sgpu-elapsed">{seconds(view.elapsed(now))}</span>',
    ]
    if view.links:
        parts.append(_links(view, pending))
    second = [html.escape(rank_counts(view))]
    metrics = metrics_text(view.metrics)
    if metrics:
        second.append(f'<span class="sgpu-metrics">{html.escape(metrics)}</span>{sparkline(view)}')
    waiting = data_wait_text(view.metrics)
    if waiting:
        second.append(f'<span class="sgpu-data-wait">{html.escape(waiting)}</span>')
    progress = view.progress_line()
    if progress and not view.done:
        second.append(f'<span class="sgpu-progress">progress: {html.escape(progress)}</span>')
    logs = html.escape(logs_command(view))
    return (
        '<div class="sgpu-header" style="line-height:1.7">'
        + " &middot; ".join(parts)
        + f"<br>{' &middot; '.join(second)}"
        + f'<br><span style="{_MUTED}">full logs: <code>{logs}</code></span></div>'
    )


def rank_lines_html(view: RunView, rank: RankView) -> str:
    """The rank's last lines (colours kept), oldest first, with a note about older ones."""
    body: list[str] = []
    if rank.dropped:
        path = html.escape(str(view.log_path(rank.rank)))
        body.append(f'<span style="{_DIM}">... {rank.dropped:,} earlier lines: {path}</span>\n')
    body.extend(ansi_to_html(text) + "\n" for _stream, text in rank.lines)
    body.extend(ansi_to_html(text) + "\n" for text in rank.provisional.values())
    if not rank.lines and not rank.provisional:
        body.append(f'<span style="{_DIM}">(no output yet from rank {rank.rank})</span>')
    return "".join(body)


def _prefix(rank: int) -> str:
    index = rank % len(_RANK_COLORS)
    return (
        f'<span class="sgpu-rank-label sgpu-rank-{index}" style="color:{_RANK_COLORS[index]}">'
        f"[rank {rank}]</span> "
    )


def merged_lines_html(view: RunView) -> str:
    """Every rank's lines in arrival order, each prefixed ``[rank N]``; then each rank's line
    being rewritten (a progress bar), so a rank that only draws a bar shows it too."""
    drawing = [(r.rank, text) for r in view.ranks for text in r.provisional.values()]
    if not view.merged and not drawing:
        return f'<span style="{_DIM}">(no output yet)</span>'
    lines = [*view.merged, *drawing]
    return "".join(_prefix(rank) + ansi_to_html(text) + "\n" for rank, text in lines)


def rank_status_html(view: RunView) -> str:
    """One line per rank: its state and its last line, progress or outcome."""
    rows = []
    for rank in view.ranks:
        text = rank_status(rank).split(" \u00b7 ", 2)
        shown = text[2] if len(text) > 2 else ""
        rows.append(
            f'<div class="sgpu-rank-status" data-rank="{rank.rank}" style="white-space:nowrap;'
            f'overflow:hidden;text-overflow:ellipsis">{_prefix(rank.rank)}'
            f"{_node(rank)}{badge(str(rank.state), str(rank.state))}{_code(shown)}</div>"
        )
    return f'<div style="font-size:12px;line-height:1.7">{"".join(rows)}</div>'


def _node(rank: RankView) -> str:
    return f'<span style="{_MUTED}">{html.escape(rank.node)}</span> ' if rank.node else ""


def tab_title(rank: RankView) -> str:
    return f"rank {rank_label(rank)} \u00b7 {rank.state}"


SPARK_WIDTH, SPARK_HEIGHT = 120, 16


def sparkline(view: RunView) -> str:
    """The key metric over the run as a small inline SVG (empty before two values came)."""
    values = list(view.metric_history)
    key = key_metric(view.metrics)
    if len(values) < 2 or key is None:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    step = SPARK_WIDTH / (len(values) - 1)
    points = " ".join(
        f"{i * step:.1f},{SPARK_HEIGHT - 1 - (v - low) / span * (SPARK_HEIGHT - 2):.1f}"
        for i, v in enumerate(values)
    )
    label = f"{key} over the run: from {values[0]:.4g} to {values[-1]:.4g}"
    return (
        f' <svg class="sgpu-sparkline" role="img" aria-label="{html.escape(label)}" '
        f'width="{SPARK_WIDTH}" height="{SPARK_HEIGHT}" viewBox="0 0 {SPARK_WIDTH} {SPARK_HEIGHT}" '
        'style="vertical-align:middle"><title>'
        f"{html.escape(label)}</title><polyline "
        'style="fill:none;stroke:var(--jp-brand-color1,#1f6feb);stroke-width:1.5" '
        f'points="{points}"/></svg>'
    )


def record_html(
    view: RunView,
    tail: int = RECORD_TAIL,
    label: stacks_view.Labeler = stacks_view.no_label,
    pending: dict[str, str] | None = None,
) -> str:
    """The finished run as static HTML: header, per-rank table, how far the ranks got, the
    hang warning and stacks taken during the run, each rank's last lines. How to serve the
    MLflow store only where ``pending`` says its link cannot open (a link that works needs no
    help, and a shared notebook should not carry the store's local path)."""
    cell = '<td style="text-align:left;padding:1px 12px 1px 0;vertical-align:top">'
    head = "".join(
        f'<th style="text-align:left;padding:1px 12px 1px 0">{title}</th>'
        for title in ("rank", "status", "time", "result / error", "last line")
    )
    rows = "".join(
        f"<tr>{cell}{html.escape(rank)}</td>{cell}{badge(state, state)}</td>{cell}{duration}</td>"
        f"{cell}{_code(outcome)}</td>{cell}{_code(_last(r))}</td></tr>"
        for r, (rank, state, duration, outcome) in zip(view.ranks, summary_rows(view), strict=True)
    )
    links = f" &middot; {_links(view, pending)}" if view.links else ""
    # A saved notebook carries no local path: the command finds the logs by the run's id.
    logs = html.escape(logs_command(view))
    return (
        '<div class="sgpu-record" style="line-height:1.6">'
        f"<b>{html.escape(view.name)}</b> &middot; {html.escape(hardware_label(view))} &middot; "
        f"{badge(view.status.value.replace('_', ' '), view.status.value)}{links}{_metrics(view)}"
        f'<div class="sgpu-summary">{html.escape(final_line(view))}</div>'
        f"{_stopped_progress(view)}"
        f'<table style="border-collapse:collapse;font-size:90%"><tr>{head}</tr>{rows}</table>'
        + _doctor(view, label)
        + "".join(_rank_tail(view, rank, tail) for rank in view.ranks)
        + f'<div style="{_MUTED}">full logs: <code>{logs}</code></div>'
        + (mlflow_hint_html(view) if "mlflow" in (pending or {}) else "")
        + "</div>"
    )


def folded_record_html(line: str, record: str) -> str:
    """A record that reads as one line (a quick session cell): the full record one click away."""
    return (
        f'<details class="sgpu-record sgpu-record-folded"><summary style="{_MUTED}">'
        f"{html.escape(line)}</summary>{record}</details>"
    )


def _metrics(view: RunView) -> str:
    text = metrics_text(view.metrics)
    return f' &middot; <span class="sgpu-metrics">{html.escape(text)}</span>' if text else ""


def _code(text: str) -> str:
    return f"<code>{html.escape(text)}</code>" if text else ""


def _last(rank: RankView) -> str:
    return strip_ansi(rank.last_line() or rank.bar).strip()[:160]


def _stopped_progress(view: RunView) -> str:
    """How far the progress bars got, for a run that did not run to its end."""
    if view.status is RunStatus.SUCCEEDED:
        return ""
    positions = [(r.rank, p) for r in view.ranks if (p := r.last_progress()) is not None]
    line = progress.merged_line(positions)
    if not line:
        return ""
    return f'<div class="sgpu-record-progress">progress when it ended: {html.escape(line)}</div>'


def _doctor(view: RunView, label: stacks_view.Labeler) -> str:
    """The hang warning given during the run and the stacks taken with the Stacks button."""
    parts = []
    if view.waited:
        parts.append(stacks_view.hang_html(f"before the ranks started: {view.waited}"))
    if view.hang_warning:
        parts.append(stacks_view.hang_html(f"during the run: {view.hang_warning}"))
    found = view.stacks
    if found is not None:
        each = "".join(stacks_view.stacks_html(r, found, label) for r in sorted(found.texts))
        parts.append(stacks_view.summary_html(found))
        parts.append(
            '<details class="sgpu-record-stacks"><summary>every rank\'s stacks</summary>'
            f"{each}</details>"
        )
    return "".join(parts)


def _tail_lines(view: RunView, rank: RankView, tail: int) -> list[str]:
    """The rank's last lines, its progress bar as it was when it stopped, and no traceback
    of the run's error (the notebook shows that right under the record)."""
    lines = [text for _stream, text in list(rank.lines)[-tail:]]
    if rank.bar and stopped_at(rank) and not any(rank.bar in text for text in lines):
        lines.append(rank.bar)
    if rank.rank == view.root_cause_rank and _TRACEBACK in lines:
        start = len(lines) - 1 - lines[::-1].index(_TRACEBACK)
        lines[start:] = ["(its traceback is shown under this record)"]
    return lines


_TRACEBACK = "Traceback (most recent call last):"


def _rank_tail(view: RunView, rank: RankView, tail: int) -> str:
    lines = _tail_lines(view, rank, tail)
    opened = " open" if rank.rank == (view.root_cause_rank or 0) else ""
    earlier = rank.line_count - min(len(rank.lines), tail)
    more = f", {earlier:,} earlier lines in the log" if earlier > 0 else ""
    body = "".join(ansi_to_html(text) + "\n" for text in lines) or "(no output)"
    return (
        f'<details class="sgpu-record-rank" data-rank="{rank.rank}"{opened}>'
        f"<summary>rank {html.escape(rank_label(rank))} &middot; {html.escape(str(rank.state))} "
        f"&middot; last {len(lines)} lines{more}</summary>"
        f'<pre style="{_PRE}">{body}</pre></details>'
    )
