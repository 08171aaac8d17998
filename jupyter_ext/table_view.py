"""The runs table of ``fn.map`` / ``sweep`` as HTML and as text: pure functions of a
:class:`TableState`, so the live table and the record it leaves draw the same columns.

Columns: trial, one per parameter (by the function's own names), status, queued (from the call
to the ranks' start), run time, the key metric (last value and its course), result or error,
the trial's MLflow run. Values are rounded for reading; the record keeps each trial's own run
record (ranks, last lines) under the table, folded.
"""

from __future__ import annotations

import html
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .formatting import seconds
from .html_view import badge
from .sparkline import best_index, sparkline_svg

_TABLE = "table-layout:auto;margin:0;border-collapse:collapse;font-size:12px;line-height:1.5"
"""Set here, not left to JupyterLab's rendered-HTML style (fixed layout, centred)."""
_CELL = "text-align:left;padding:2px 12px 2px 0;vertical-align:top;white-space:nowrap"
_NUM = ";text-align:right;font-variant-numeric:tabular-nums"
_WIDE = ";max-width:26em;overflow:hidden;text-overflow:ellipsis"
_HEAD = "text-align:left;padding:2px 12px 2px 0;border-bottom:1px solid #8884;white-space:nowrap"
_MUTED = "color:#6e7781"
_BEST = "#1a7f37"
_OUTCOME_CHARS = 80
_PARAM_CHARS = 24
STATUS_WORDS = {"timed_out": "timed out"}
_ORDER = [
    "queued",
    "starting",
    "running",
    "cancelling",
    "succeeded",
    "failed",
    "timed out",
    "cancelled",
    "unfinished",
]
"""Statuses in the summary, in lifecycle order."""
HEAD_TITLES = {
    "queued": "From the call until the ranks started: the queue for devices, the launcher, "
    "the MLflow run",
    "run time": "From the ranks' start to the run's end",
    "result / error": "Rank 0's result, or why the trial did not succeed",
}


@dataclass(frozen=True)
class TrialLine:
    """One trial as the table shows it."""

    trial: int
    params: dict[str, str]
    status: str
    """A ``RunStatus`` value, ``starting``, ``cancelling``, or ``unfinished`` (the kernel shut
    down first)."""
    finished: bool
    queued: float | None
    ran: float | None
    metric: float | None = None
    """The key metric's last value."""
    history: tuple[float, ...] = ()
    outcome: str = ""
    """The result (rounded), the error, or (running) the progress."""
    link: str = ""


@dataclass(frozen=True)
class TableState:
    name: str
    lines: tuple[TrialLine, ...]
    metric: str = ""
    """The key metric's name (empty before any trial logged one)."""
    parent_link: str = ""
    details: dict[int, str] = field(default_factory=dict)
    """Per trial, its run record (static HTML), shown folded under the record's table."""

    @property
    def ended(self) -> bool:
        return all(line.finished for line in self.lines)

    @property
    def best(self) -> int | None:
        """The index of the best trial by the key metric."""
        if not self.metric:
            return None
        return best_index([line.metric for line in self.lines], self.metric)

    def param_names(self) -> list[str]:
        return list(dict.fromkeys(name for line in self.lines for name in line.params))

    def columns(self) -> list[str]:
        metric = [self.metric] if self.metric else []
        link = ["MLflow"] if any(line.link for line in self.lines) else []
        return [
            "trial",
            *self.param_names(),
            "status",
            "queued",
            "run time",
            *metric,
            "result / error",
            *link,
        ]


# -- values ---------------------------------------------------------------------------------


def short_number(value: float) -> str:
    """Four significant digits; integers as they are."""
    if isinstance(value, int):  # bool too
        return str(value)
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4g}"


def short_value(value: Any, limit: int = _OUTCOME_CHARS) -> str:
    """A result as a reader wants it: numbers rounded, containers by their first items."""
    text = _short(value)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _short(value: Any) -> str:
    if isinstance(value, (bool, int, float)):
        return short_number(value)
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", None) == 0:
        return _short(item())  # a numpy or torch scalar
    if getattr(value, "shape", None) is not None:
        from serverless_gpu.common.describe import describe_value

        return describe_value(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_short(v) for v in value[:4]) + (", \u2026" if len(value) > 4 else "")
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, dict):
        pairs = [f"{k}: {_short(v)}" for k, v in list(value.items())[:4]]
        return "{" + ", ".join(pairs) + (", \u2026" if len(value) > 4 else "") + "}"
    return repr(value)


def short_param(text: str) -> str:
    """A parameter as recorded (its repr): a float rounded, long text cut."""
    try:
        number = float(text)
    except ValueError:
        number = None
    if number is not None and any(c in text for c in ".eE") and math.isfinite(number):
        return short_number(number)
    return text if len(text) <= _PARAM_CHARS else text[: _PARAM_CHARS - 1] + "\u2026"


def status_word(status: str) -> str:
    return STATUS_WORDS.get(status, status)


def summary_text(state: TableState) -> str:
    """``6 trials: 4 succeeded, 1 failed, 1 running``."""
    counts = Counter(status_word(line.status) for line in state.lines)
    ordered = sorted(counts, key=lambda word: _ORDER.index(word) if word in _ORDER else 99)
    parts = ", ".join(f"{counts[word]} {word}" for word in ordered)
    total = len(state.lines)
    return f"{total} trial{'s' if total != 1 else ''}: {parts}" if parts else "no trials yet"


# -- cells ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    text: str
    """Plain text (the text form, and what the HTML shows when ``html`` is empty)."""
    sort: str
    """The key the live table sorts this column by (numbers compare as numbers)."""
    html: str = ""
    numeric: bool = False
    title: str = ""
    wide: bool = False
    """Text that may be long (an error): cut at the cell's width, whole in its tooltip."""


def cells(state: TableState, index: int) -> list[Cell]:
    line = state.lines[index]
    best = state.best == index
    row = [Cell(str(line.trial) + (" \u2605" if best else ""), str(line.trial), numeric=True)]
    for name in state.param_names():
        raw = line.params.get(name, "")
        shown = short_param(raw)
        row.append(Cell(shown, raw, numeric=_is_number(raw), title=raw if shown != raw else ""))
    word = status_word(line.status)
    row.append(Cell(word, word, badge(word, line.status)))
    row.append(_seconds(line.queued))
    row.append(_seconds(line.ran))
    if state.metric:
        row.append(_metric_cell(state, line, best))
    row.append(Cell(line.outcome, line.outcome, _outcome_html(line), title=line.outcome, wide=True))
    if "MLflow" in state.columns():
        row.append(_link_cell(line.link))
    return row


def _seconds(value: float | None) -> Cell:
    return Cell(seconds(value), "" if value is None else f"{value:.3f}", numeric=True)


def _metric_cell(state: TableState, line: TrialLine, best: bool) -> Cell:
    if line.metric is None:
        return Cell("", "", numeric=True)
    text = short_number(line.metric)
    color = _BEST if best else "#1f6feb"
    label = f"{state.metric} over {len(line.history)} points, last {text}"
    spark = sparkline_svg(line.history, color=color, label=label)
    mark = (
        f' <span class="sgpu-best" title="best {html.escape(state.metric)}" '
        f'style="color:{_BEST}">\u2605 best</span>'
        if best
        else ""
    )
    shown = f"{spark} {html.escape(text)}{mark}"
    return Cell(text + (" (best)" if best else ""), repr(line.metric), shown, numeric=True)


def _outcome_html(line: TrialLine) -> str:
    text = html.escape(line.outcome)
    if line.status in ("failed", "timed_out"):
        return f'<span style="color:#cf222e">{text}</span>'
    if not line.finished:
        return f'<span style="{_MUTED}">{text}</span>'
    return f"<code>{text}</code>" if text else ""


def _link_cell(link: str) -> Cell:
    if not link:
        return Cell("", "")
    anchor = (
        f'<a href="{html.escape(link)}" target="_blank" rel="noopener" '
        f'style="color:#1f6feb;text-decoration:underline">run &#8599;</a>'
    )
    return Cell(link, link, anchor)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# -- HTML -----------------------------------------------------------------------------------


def table_html(state: TableState, *, live: bool = False, open_trial: int | None = None) -> str:
    """The table; ``live`` adds sort buttons on the headers and each row's details and Cancel
    buttons (the live widget's script acts on them)."""
    heads = [_head(i, name, live) for i, name in enumerate(state.columns())]
    if live:
        heads.append(f'<th style="{_HEAD}"><span class="sgpu-sr">actions</span></th>')
    rows = []
    for index, line in enumerate(state.lines):
        tds = [_td(cell) for cell in cells(state, index)]
        if live:
            tds.append(_actions(line, open_trial))
        best = ' data-best="true"' if state.best == index else ""
        rows.append(
            f'<tr class="sgpu-trial-row" data-trial="{line.trial}" '
            f'data-status="{html.escape(line.status)}"{best}>{"".join(tds)}</tr>'
        )
    return (
        f'<table class="sgpu-runs" style="{_TABLE}"><thead><tr>{"".join(heads)}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _head(index: int, name: str, live: bool) -> str:
    text = html.escape(name)
    title = html.escape(HEAD_TITLES.get(name, ""))
    if live:
        text = (
            f'<button class="sgpu-sort" data-col="{index}" aria-label="sort by {text}" '
            f'style="all:unset;cursor:pointer;font-weight:bold">{text}</button>'
        )
    titled = f' title="{title}"' if title else ""
    return f'<th data-col="{index}" style="{_HEAD}"{titled}>{text}</th>'


def _td(cell: Cell) -> str:
    style = _CELL + (_NUM if cell.numeric else "") + (_WIDE if cell.wide else "")
    title = f' title="{html.escape(cell.title)}"' if cell.title else ""
    body = cell.html or html.escape(cell.text)
    return f'<td data-sort="{html.escape(cell.sort)}" style="{style}"{title}>{body}</td>'


def _actions(line: TrialLine, open_trial: int | None) -> str:
    shown = "hide" if open_trial == line.trial else "details"
    disabled = " disabled" if line.finished or line.status == "cancelling" else ""
    cancel = "Cancelling\u2026" if line.status == "cancelling" else "Cancel"
    return (
        f'<td style="{_CELL}"><button class="sgpu-details" data-action="details" '
        f'data-trial="{line.trial}" aria-expanded="{str(open_trial == line.trial).lower()}">'
        f'{shown}</button> <button class="sgpu-cancel-trial" data-action="cancel" '
        f'data-trial="{line.trial}" title="Stop trial {line.trial}"{disabled}>{cancel}</button>'
        "</td>"
    )


def heading_html(state: TableState) -> str:
    """Name, counts and the parent MLflow run (a sweep's own run, or the run active when the
    trials started)."""
    parent = (
        f' &middot; <a class="sgpu-parent-run" href="{html.escape(state.parent_link)}" '
        'target="_blank" rel="noopener" style="color:#1f6feb;text-decoration:underline">'
        "parent MLflow run &#8599;</a>"
        if state.parent_link
        else ""
    )
    return (
        f'<span class="sgpu-table-summary"><b>{html.escape(state.name)}</b> &middot; '
        f"{html.escape(summary_text(state))}{parent}</span>"
    )


def record_html(state: TableState) -> str:
    """The ended table as static HTML: heading, table, each trial's run record folded."""
    folded = "".join(
        f'<details class="sgpu-trial-record" data-trial="{line.trial}"><summary>trial '
        f"{line.trial} &middot; {html.escape(_params_text(line))} &middot; "
        f"{html.escape(status_word(line.status))}</summary>{state.details[line.trial]}</details>"
        for line in state.lines
        if state.details.get(line.trial)
    )
    return (
        '<div class="sgpu-table-record" style="line-height:1.6">'
        f'<div>{heading_html(state)}</div><div style="overflow-x:auto">{table_html(state)}</div>'
        f"{folded}</div>"
    )


def _params_text(line: TrialLine) -> str:
    return ", ".join(f"{k}={short_param(v)}" for k, v in line.params.items())


# -- text -----------------------------------------------------------------------------------


def table_text(state: TableState) -> str:
    """Heading and an aligned plain-text table (text-only clients, nbconvert, GitHub)."""
    heading = f"{state.name}: {summary_text(state)}"
    if state.parent_link:
        heading += f" | parent MLflow run: {state.parent_link}"
    rows = [state.columns()] + [
        [cell.text for cell in cells(state, i)] for i in range(len(state.lines))
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    return "\n".join([heading, *lines])
