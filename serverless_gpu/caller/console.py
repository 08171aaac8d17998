"""The plain-text subscriber: rank output with ``[rank N]`` prefixes and one line per rank state.

By default it shows rank 0's stdout and every rank's stderr (``output="default"``); ``"all"``
shows every rank's stdout too, ``"none"`` only the header and the summary.

:class:`ConsolePrinter` is also the notebook's text renderer's base (``jupyter_ext/
text_renderer.py``): both fold the events into the same per-run state (when the run started,
lines printed per rank, when each progress line was shown last) and write the same lines; the
renderer words the header, a failed rank and the summary from its view of the run.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TextIO

from serverless_gpu.caller.hangs import warning_text
from serverless_gpu.common.errors import other_failures_text
from serverless_gpu.wire.events import (
    EventSubscriber,
    OutputLines,
    RankFinished,
    RanksSilent,
    RankState,
    RunFinished,
    RunQueued,
    RunStarted,
    RunWaiting,
)
from serverless_gpu.wire.runpaths import RunPaths

_PROGRESS_EVERY_S = 2.0


class ConsolePrinter(EventSubscriber):
    """Writes a run's events as readable text to a stream (``sys.stdout`` at call time)."""

    stacks_hint = "handle.stacks()"
    """Where the silent-ranks warning says the stacks are."""

    def __init__(
        self, output: str = "default", stream: TextIO | None = None, max_lines: int | None = None
    ) -> None:
        self.output = output
        self.stream = stream
        self.max_lines = max_lines
        """Finished lines printed per rank, then one line naming its log (None: no limit)."""
        self._progress_shown: dict[tuple[int, str], float] = {}
        self._printed: dict[int, int] = {}
        self._started = 0.0
        self._paths: RunPaths | None = None

    def _out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stdout

    def wants(self, rank: int, stream: str) -> bool:
        if self.output == "none":
            return False
        if self.output == "all":
            return True
        if self.output == "rank0":
            return rank == 0
        return rank == 0 or stream == "stderr"

    # -- the events -------------------------------------------------------------------------

    def on_run_started(self, event: RunStarted) -> None:
        self._started = event.time
        self._paths = RunPaths(event.run_dir)
        self._write(self.header(event))

    def on_output_lines(self, event: OutputLines) -> None:
        if self.wants(event.rank, event.stream):
            self._write("".join(self._format(event, line) for line in event.lines))

    def on_rank_finished(self, event: RankFinished) -> None:
        if event.state is RankState.FAILED:
            self._write(
                f"serverless_gpu: rank {event.rank} {event.state} ({self.failure(event)})\n"
            )

    def on_ranks_silent(self, event: RanksSilent) -> None:
        if event.ranks:
            self._write(f"serverless_gpu: warning: {warning_text(event)} ({self.stacks_hint}).\n")

    def on_run_queued(self, event: RunQueued) -> None:
        if event.holders:
            self._write(f"serverless_gpu: queued: {event.holders}\n")

    def on_run_waiting(self, event: RunWaiting) -> None:
        if event.message:
            self._write(f"serverless_gpu: {event.message}\n")

    def on_run_finished(self, event: RunFinished) -> None:
        self._write(self.summary(event))

    # -- the words a subclass may change --------------------------------------------------------

    def header(self, event: RunStarted) -> str:
        names = ", ".join(sorted(set(event.gpu_names))) or _device_kind(event)
        return (
            f"serverless_gpu: {event.name} on {event.world_size} x {names} "
            f"(logs: {RunPaths(event.run_dir).logs})\n"
        )

    def failure(self, event: RankFinished) -> str:
        """How a failed rank ended, in the parentheses after ``rank N failed``."""
        if event.signal_name:
            return event.signal_name
        return f"exit code {event.exit_code}" if event.exit_code is not None else event.summary

    def summary(self, event: RunFinished) -> str:
        elapsed = event.time - self._started if self._started else 0.0
        detail = f": {event.message}" if event.message else ""
        text = f"serverless_gpu: run {event.status.value} after {elapsed:.1f} s{detail}\n"
        others = other_failures_text(event.failures, event.root_cause_rank).strip()
        return text + (f"serverless_gpu: {others}\n" if others else "")

    def log_path(self, rank: int) -> Path | None:
        return self._paths.log(rank) if self._paths is not None else None

    # -- the fold of output lines ---------------------------------------------------------------

    def _format(self, event: OutputLines, line: str) -> str:
        """Finished lines are printed (up to ``max_lines`` per rank); progress lines (``\\r``)
        at most every few seconds."""
        if line.endswith("\n"):
            return self._finished_line(event.rank, line)
        key = (event.rank, event.stream)
        now = time.monotonic()
        if not line.strip() or now - self._progress_shown.get(key, 0.0) < _PROGRESS_EVERY_S:
            return ""
        self._progress_shown[key] = now
        return f"[rank {event.rank}] {line.strip(chr(13))}\n"

    def _finished_line(self, rank: int, line: str) -> str:
        count = self._printed.get(rank, 0) + 1
        self._printed[rank] = count
        if self.max_lines is None or count <= self.max_lines:
            return f"[rank {rank}] {line}"
        if count == self.max_lines + 1:
            return f"[rank {rank}] ... further output only in {self.log_path(rank)}\n"
        return ""

    def _write(self, text: str) -> None:
        if text:
            out = self._out()
            out.write(text)
            out.flush()


def _device_kind(event: RunStarted) -> str:
    """What the ranks run on when no GPU names are known here (ranks on a Ray cluster's GPUs):
    the family asked for, or just GPU."""
    if event.device != "cuda":
        return "CPU"
    return "GPU" if event.gpu_type in ("OTHER", "CPU") else event.gpu_type
