"""The plain-text subscriber: rank output with ``[rank N]`` prefixes and one line per rank state.

By default it shows rank 0's stdout and every rank's stderr (``output="default"``); ``"all"``
shows every rank's stdout too, ``"none"`` only the header and the summary.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from serverless_gpu.caller.hangs import warning_text
from serverless_gpu.common.errors import other_failures_text
from serverless_gpu.wire.events import (
    Event,
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


class ConsolePrinter:
    """Writes a run's events as readable text to a stream (``sys.stdout`` at call time)."""

    def __init__(self, output: str = "default", stream: TextIO | None = None) -> None:
        self.output = output
        self.stream = stream
        self._progress_shown: dict[tuple[int, str], float] = {}
        self._started = 0.0

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

    def __call__(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self._started = event.time
            names = ", ".join(sorted(set(event.gpu_names))) or _device_kind(event)
            self._write(
                f"serverless_gpu: {event.name} on {event.world_size} x {names} "
                f"(logs: {RunPaths(event.run_dir).logs})\n"
            )
        elif isinstance(event, OutputLines) and self.wants(event.rank, event.stream):
            self._write("".join(self._format(event, line) for line in event.lines))
        elif isinstance(event, RankFinished) and event.state is RankState.FAILED:
            how = event.signal_name or (
                f"exit code {event.exit_code}" if event.exit_code is not None else event.summary
            )
            self._write(f"serverless_gpu: rank {event.rank} {event.state} ({how})\n")
        elif isinstance(event, RanksSilent) and event.ranks:
            self._write(f"serverless_gpu: warning: {warning_text(event)} (handle.stacks()).\n")
        elif isinstance(event, RunQueued) and event.holders:
            self._write(f"serverless_gpu: queued: {event.holders}\n")
        elif isinstance(event, RunWaiting) and event.message:
            self._write(f"serverless_gpu: {event.message}\n")
        elif isinstance(event, RunFinished):
            elapsed = event.time - self._started if self._started else 0.0
            detail = f": {event.message}" if event.message else ""
            self._write(f"serverless_gpu: run {event.status.value} after {elapsed:.1f} s{detail}\n")
            others = other_failures_text(event.failures, event.root_cause_rank).strip()
            if others:
                self._write(f"serverless_gpu: {others}\n")

    def _format(self, event: OutputLines, line: str) -> str:
        """Finished lines are printed; progress lines (``\\r``) at most every few seconds."""
        if line.endswith("\n"):
            return f"[rank {event.rank}] {line}"
        key = (event.rank, event.stream)
        now = time.monotonic()
        if not line.strip() or now - self._progress_shown.get(key, 0.0) < _PROGRESS_EVERY_S:
            return ""
        self._progress_shown[key] = now
        return f"[rank {event.rank}] {line.rstrip(chr(13))}\n"

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
