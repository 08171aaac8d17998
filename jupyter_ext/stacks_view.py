"""The widget's hang doctor: each rank's stacks, one line per rank, a verdict, the hang warning.

Stacks name the user's code as IPython does (``Cell In[7], line 16``, not ipykernel's temporary
file or ``<%%distributed In[7]>``); threads that run only library code (tqdm's monitor, a data
loader's workers) are folded under the main thread. A verdict is given where the stacks or the
collectives' flight recorder show it: a rank that never entered the collective the others wait
in. What the Stacks button found is kept in the run's view, so the record shows it too.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from serverless_gpu.caller.hangs import warning_text
from serverless_gpu.doctor import flight
from serverless_gpu.doctor.stack_text import Frame, is_user_file, main_thread_frames
from serverless_gpu.wire.events import RanksSilent
from serverless_gpu.wire.runpaths import RunPaths

from .runstate import StacksTaken

Labeler = Callable[[str], "str | None"]
"""A code file's name as IPython shows it (``Cell In[3]``), or None (``tracebacks.py``'s)."""

_PRE = "margin:0;white-space:pre;overflow-x:auto;font-size:12px;line-height:1.35"
_MUTED = "color:var(--jp-ui-font-color2,#6e7781)"
_FRAME = re.compile(r'^(?P<indent> *)File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
_COLLECTIVES_FILE = "distributed_c10d.py"
_BLANK_LINE = "\n\n"
_WAITING = ("scheduled", "started")
"""Flight-recorder states of a collective that has not completed."""


def no_label(_filename: str) -> str | None:
    return None


def take(texts: dict[int, str], world_size: int, paths: RunPaths, label: Labeler) -> StacksTaken:
    """What one click of Stacks found, in words: a line per rank and a verdict."""
    answered: dict[int, str | None] = {r: texts.get(r) for r in range(world_size)}
    collectives = {r: flight.newest(paths, r) for r in range(world_size)}
    lines = {r: rank_line(answered[r], label, collectives[r]) for r in answered}
    return StacksTaken(time.time(), answered, lines, verdict(answered, collectives, label))


def rank_line(text: str | None, label: Labeler, collective: dict[str, Any] | None = None) -> str:
    """``in all_reduce ← Cell In[7], line 16`` (and the flight recorder's last collective)."""
    if text is None:
        return "did not answer (it has ended, or has not started its function)"
    frames = main_thread_frames(text)
    if not frames:
        return "no Python frame of the main thread"
    line = f"in {frames[0].func}"
    user = next((f for f in frames if is_user_file(f.file)), None)
    if user is not None:
        line += f" \u2190 {location(user, label)}"
    if collective is not None:
        line += f"; last collective: {_collective(collective)}"
    return line


def location(frame: Frame, label: Labeler) -> str:
    file = frame.file
    name = label(file) or (file if file.startswith("<") else Path(file).name)
    return f"{name}, line {frame.line}"


def _collective(entry: dict[str, Any]) -> str:
    name = entry.get("profiling_name") or "collective"
    return f"{name} #{flight.sequence(entry)} ({entry.get('state', '')})"


def verdict(
    texts: dict[int, str | None], collectives: dict[int, dict[str, Any] | None], label: Labeler
) -> str:
    """The flight recorder's word when it has one, else the stacks'; empty when neither
    shows which rank the others wait for."""
    return _from_flight_recorder(texts, collectives) or _from_stacks(texts, label)


def _from_flight_recorder(
    texts: dict[int, str | None], collectives: dict[int, dict[str, Any] | None]
) -> str:
    """The newest collective a rank waits in, and the ranks whose newest is an older one.

    Only ranks that answered count (one that ended has no say); gloo leaves its entries
    ``scheduled``, so ranks level with the newest are never named.
    """
    answered = {r: e for r, e in collectives.items() if texts.get(r) is not None}
    waiting = {r: e for r, e in answered.items() if e is not None and e.get("state") in _WAITING}
    if not waiting:
        return ""
    rank, entry = max(waiting.items(), key=lambda item: (flight.sequence(item[1]) or 0, -item[0]))
    seq = flight.sequence(entry) or 0
    behind = [r for r, e in answered.items() if e is None or (flight.sequence(e) or 0) < seq]
    if not behind:
        return ""
    name = entry.get("profiling_name") or "collective"
    return (
        f"{_ranks(behind)} never entered the collective that rank {rank} waits in ({name} #{seq})"
    )


def _from_stacks(texts: dict[int, str | None], label: Labeler) -> str:
    inside = {r: c for r, t in texts.items() if t is not None and (c := _in_collective(t))}
    outside = [r for r, t in texts.items() if t is not None and r not in inside]
    if not inside or not outside:
        return ""
    rank = min(inside)
    first = texts[outside[0]]
    where = rank_line(first, label) if first is not None else ""
    return (
        f"{_ranks(outside)} never entered the collective that rank {rank} waits in "
        f"({inside[rank]}); rank {outside[0]} is {where}"
    )


def _in_collective(text: str) -> str:
    """The torch.distributed call the main thread is in (``all_reduce``), or empty."""
    for frame in main_thread_frames(text):
        if frame.file.endswith(_COLLECTIVES_FILE):
            return frame.func
    return ""


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def relabel(text: str, label: Labeler) -> str:
    """faulthandler's frame lines with cells named as IPython names them."""
    out = []
    for line in text.splitlines():
        m = _FRAME.match(line)
        name = label(m["file"]) if m else None
        out.append(f"{m['indent']}{name}, line {m['line']} in {m['func']}" if m and name else line)
    return "\n".join(out)


def split_threads(text: str) -> tuple[list[str], list[str]]:
    """The thread blocks to show (the main thread, any running user code) and those to fold
    (threads with library frames only: tqdm's monitor, a data loader's workers)."""
    shown: list[str] = []
    folded: list[str] = []
    for block in (b for b in text.split("\n\n") if b.strip()):
        first = block.lstrip().splitlines()[0]
        files = [m["file"] for line in block.splitlines() if (m := _FRAME.match(line.strip()))]
        main = first.startswith(("Main thread", "Current thread"))
        library = files and not any(is_user_file(f) for f in files)
        (folded if library and not main else shown).append(block.rstrip("\n"))
    return shown, folded


def _thread_name(block: str) -> str:
    """A library thread by its innermost frame outside ``threading.py`` (``tqdm/_monitor.py``)."""
    for line in block.splitlines():
        m = _FRAME.match(line.strip())
        if m and not m["file"].endswith("threading.py"):
            return f"{m['func']} ({Path(m['file']).parent.name}/{Path(m['file']).name})"
    return block.splitlines()[0]


def stacks_html(rank: int, found: StacksTaken, label: Labeler) -> str:
    """One rank's stacks in its tab: the main thread first, library threads folded."""
    at = time.strftime("%H:%M:%S", time.localtime(found.taken))
    text = found.texts.get(rank)
    if text is None:
        return (
            f'<div class="sgpu-stacks" data-rank="{rank}" style="{_MUTED}">stacks at {at}: '
            f"rank {rank} {html.escape(found.lines.get(rank, 'did not answer'))}</div>"
        )
    shown, folded = split_threads(text)
    body = html.escape(relabel(_BLANK_LINE.join(shown), label))
    fold = ""
    if folded:
        names = ", ".join(sorted({_thread_name(b) for b in folded}))
        fold = (
            f'<details class="sgpu-library-threads"><summary style="{_MUTED}">{len(folded)} '
            f"library thread{'s' if len(folded) != 1 else ''}: {html.escape(names)}</summary>"
            f'<pre style="{_PRE}">{html.escape(_BLANK_LINE.join(folded))}</pre></details>'
        )
    return (
        f'<details class="sgpu-stacks" data-rank="{rank}" open style="margin-bottom:6px">'
        f"<summary>stacks at {at} &middot; rank {rank} "
        f"<code>{html.escape(found.lines.get(rank, ''))}</code></summary>"
        f'<pre style="{_PRE}">{body}</pre>{fold}</details>'
    )


def summary_html(found: StacksTaken) -> str:
    """One line per rank and the verdict: the all-ranks view's and the record's."""
    at = time.strftime("%H:%M:%S", time.localtime(found.taken))
    rows = "".join(
        f'<div class="sgpu-stack-line" data-rank="{r}">rank {r} &middot; {html.escape(line)}</div>'
        for r, line in sorted(found.lines.items())
    )
    verdict_html = (
        f'<div class="sgpu-verdict"><b>&#9654; {html.escape(found.verdict)}</b></div>'
        if found.verdict
        else ""
    )
    return (
        f'<div class="sgpu-stacks-summary" style="font-size:12px;line-height:1.6;'
        f'margin:2px 0 6px 0"><span style="{_MUTED}">stacks at {at}</span>'
        f"{verdict_html}{rows}</div>"
    )


def busy_html() -> str:
    return (
        '<div class="sgpu-stacks-summary sgpu-busy" aria-busy="true" style="font-size:12px;'
        f"{_MUTED}\">taking every rank's stacks&hellip;</div>"
    )


def silent_html(event: RanksSilent) -> str:
    """The hang warning under the header; empty once the ranks show life again."""
    if not event.ranks:
        return ""
    return hang_html(f"{html.escape(warning_text(event))}: click <b>Stacks</b>.", escaped=True)


def hang_html(text: str, *, escaped: bool = False) -> str:
    """A hang warning box (dark text on yellow, readable in light and dark themes)."""
    body = text if escaped else html.escape(text)
    return (
        '<div class="sgpu-hang" role="alert" style="background:#fff8c5;color:#1f2328;'
        'border:1px solid #d4a72c;border-radius:4px;padding:2px 8px;margin:2px 0">&#9888; '
        f"{body}</div>"
    )
