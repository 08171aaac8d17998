"""Words both renderers use: the header line, per-rank rows and the final summary."""

from __future__ import annotations

import time
from collections import Counter

from serverless_gpu.wire.events import RunStatus

from .ansi import strip_ansi
from .runstate import RankShown, RankView, RunView

_FINAL_WORDS = {
    RunStatus.SUCCEEDED: "succeeded",
    RunStatus.FAILED: "failed",
    RunStatus.CANCELLED: "was cancelled",
    RunStatus.TIMED_OUT: "timed out",
}


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def rank_counts(view: RunView) -> str:
    """``"1 running, 1 done"`` in lifecycle order."""
    counts = Counter(rank.state for rank in view.ranks)
    return ", ".join(f"{counts[s]} {s}" for s in RankShown if counts[s])


def hardware_label(view: RunView) -> str:
    nodes = len(view.nodes)
    where = f" on {nodes} Ray node{'s' if nodes != 1 else ''}" if nodes else ""
    return f"{view.world_size} x {view.hardware}{where}"


def rank_label(rank: RankView) -> str:
    """``2``, or ``2 on node 1 (10.0.0.7)`` for a rank on another machine."""
    return f"{rank.rank} on {rank.node}" if rank.node else str(rank.rank)


def status_words(view: RunView) -> str:
    """``starting (MLflow run)``, ``running``, ``timed out`` ..."""
    if view.status is RunStatus.STARTING:
        return f"starting ({view.phase})"
    return view.status.value.replace("_", " ")


def rank_status(rank: RankView) -> str:
    """One line about a rank for the all-ranks view: its outcome, progress bar or last line."""
    if rank.state in (RankShown.STARTING, RankShown.RUNNING):
        where = rank.progress()
        shown = str(where) if where is not None else strip_ansi(rank.last_line()).strip()
    else:
        shown = rank_outcome(rank)
    return f"rank {rank_label(rank)} \u00b7 {rank.state}" + (f" \u00b7 {shown}" if shown else "")


def header_text(view: RunView, now: float | None = None) -> str:
    words = _FINAL_WORDS.get(view.status, status_words(view))
    return (
        f"{view.name} on {hardware_label(view)}: {words} ({rank_counts(view)}), "
        f"{seconds(view.elapsed(now))}"
    )


def rank_outcome(rank: RankView) -> str:
    """What a rank ended with: its result's type, or why it failed or was stopped."""
    if rank.state is RankShown.DONE:
        return rank.result or rank.detail or "returned"
    return " \u00b7 ".join(filter(None, (rank.detail, stopped_at(rank))))


def stopped_at(rank: RankView) -> str:
    """``cancelled at 15 % · 90/600``: how far a rank's progress bar got before it was stopped
    (empty for a rank without a bar, or one that is still running or returned)."""
    bar = rank.last_progress()
    if bar is None or rank.state in (RankShown.STARTING, RankShown.RUNNING, RankShown.DONE):
        return ""
    return f"{rank.state} at {bar.percent} % \u00b7 {bar.count}"


def summary_rows(view: RunView, now: float | None = None) -> list[tuple[str, str, str, str]]:
    end = now or view.finished or time.time()
    return [
        (rank_label(r), str(r.state), seconds(r.duration(end)), rank_outcome(r)) for r in view.ranks
    ]


def final_line(view: RunView) -> str:
    words = _FINAL_WORDS.get(view.status, view.status.value)
    text = f"run {words} after {seconds(view.elapsed())}"
    return f"{text}: {view.message}" if view.message else text


def summary_text(view: RunView) -> str:
    """The final summary as an aligned plain-text table."""
    rows = [("rank", "status", "time", "result / error"), *summary_rows(view)]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [f"{view.name}: {final_line(view)}"]
    for row in rows:
        cells = [row[i].ljust(widths[i]) for i in range(3)]
        lines.append("  " + "  ".join([*cells, row[3]]).rstrip())
    lines.append(f"  logs: {logs_command(view)}")
    return "\n".join(lines)


def logs_command(view: RunView) -> str:
    """How to read the run's logs, by its id: the record says this, not a local path."""
    return f"serverless-gpu runs logs {view.run_id}"


def links_text(view: RunView) -> str:
    return " ".join(f"{name}: {url}" for name, url in view.links.items())


def snapshot_text(view: RunView, tail: int = 20) -> str:
    """Header, each rank's last ``tail`` lines and (once finished) the summary, as plain text."""
    lines = [header_text(view)]
    if view.links:
        lines.append(links_text(view))
    for rank in view.ranks:
        finished = [text for _stream, text in list(rank.lines)[-tail:]]
        shown = finished + list(rank.provisional.values())
        if rank.line_count > len(finished):
            earlier = rank.line_count - len(finished)
            lines.append(f"[rank {rank.rank}] ... ({earlier} earlier lines)")
        lines.extend(f"[rank {rank.rank}] {strip_ansi(text)}" for text in shown)
    lines.extend(doctor_text(view))
    if view.done:
        lines.append(summary_text(view))
    else:
        lines.append(f"logs: {view.paths.logs}")
    return "\n".join(lines)


def doctor_text(view: RunView) -> list[str]:
    """The hang warning and the stacks' lines and verdict, for the record's text form."""
    lines = [f"warning during the run: {view.hang_warning}"] if view.hang_warning else []
    found = view.stacks
    if found is not None:
        at = time.strftime("%H:%M:%S", time.localtime(found.taken))
        lines.append(f"stacks at {at}" + (f": {found.verdict}" if found.verdict else ""))
        lines.extend(f"  rank {r} \u00b7 {line}" for r, line in sorted(found.lines.items()))
    return lines
