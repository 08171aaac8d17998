"""Readable text for a run where no widget can be shown (terminal IPython, nbclient/nbconvert).

Prints what the widget shows: a header with the hardware, links and log directory; rank output
with ``[rank N]`` prefixes (bounded per rank, progress lines thinned out); failed ranks as they
fail; and the final per-rank summary.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from serverless_gpu.caller.console import ConsolePrinter
from serverless_gpu.caller.hangs import warning_text
from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.tracking import store
from serverless_gpu.wire.events import (
    OutputLines,
    RankFinished,
    RanksSilent,
    RankState,
    RunFinished,
    RunStarted,
    RunWaiting,
)

from .formatting import hardware_label, links_text, summary_text
from .runstate import RunView

MAX_PRINTED_LINES = 1000
PROGRESS_EVERY_S = 2.0


class TextRenderer:
    """Subscriber that writes the run to a text stream (``sys.stdout`` at write time)."""

    def __init__(
        self,
        ctx: RunContext,
        stream: TextIO | None = None,
        *,
        max_lines: int = MAX_PRINTED_LINES,
    ) -> None:
        self.view = RunView(ctx, max_lines=1)
        self.stream = stream
        self.max_lines = max_lines
        self._selection = ConsolePrinter(ctx.config.output)
        self._printed: dict[int, int] = {}
        self._progress_at: dict[tuple[int, str], float] = {}

    def __call__(self, event: object) -> None:
        if isinstance(event, RanksSilent) and event.ranks:
            self._write(f"serverless_gpu: warning: {warning_text(event)} (%distributed_stacks).\n")
        if isinstance(event, RunWaiting) and event.message:
            self._write(f"serverless_gpu: {event.message}\n")
        if not self.view.apply(event):
            return
        if isinstance(event, RunStarted):
            self._write(self._header())
        elif isinstance(event, OutputLines) and self._selection.wants(event.rank, event.stream):
            self._write("".join(self._lines(event)))
        elif isinstance(event, RankFinished) and event.state is RankState.FAILED:
            detail = self.view.ranks[event.rank].detail
            self._write(f"serverless_gpu: rank {event.rank} failed ({detail})\n")
        elif isinstance(event, RunFinished):
            self._write(summary_text(self.view) + "\n" + self._mlflow_hint())

    def show_results(self, descriptions: list[str]) -> None:
        self.view.set_results(descriptions)
        listed = ", ".join(f"rank {r}: {d}" for r, d in enumerate(descriptions))
        self._write(f"  results: {listed}\n")

    def abandon(self, message: str) -> None:
        self.view.failed_to_start(message)
        self._write(summary_text(self.view) + "\n")

    def _mlflow_hint(self) -> str:
        """The run's MLflow page, and how to serve the store when no UI does (the record is read
        later, when the UI that served it may be gone)."""
        meta = self.view.metadata
        uri, run, experiment = (
            meta.get("mlflow_tracking_uri"),
            meta.get("mlflow_run_id"),
            meta.get("mlflow_experiment_id"),
        )
        if "mlflow" not in self.view.links or not (uri and run and experiment):
            return ""
        return f"  MLflow {store.open_hint(str(uri), str(experiment), str(run))}\n"

    def _header(self) -> str:
        view = self.view
        parts = [f"serverless_gpu: {view.name} on {hardware_label(view)}"]
        if view.links:
            parts.append(links_text(view))
        parts.append(f"logs: {view.paths.logs}")
        return " | ".join(parts) + "\n"

    def _lines(self, event: OutputLines) -> list[str]:
        out = []
        for line in event.lines:
            if line.endswith("\n"):
                out.append(self._finished_line(event.rank, line))
            elif line.strip() and self._progress_due(event.rank, event.stream):
                out.append(f"[rank {event.rank}] {line.strip(chr(13))}\n")
        return out

    def _finished_line(self, rank: int, line: str) -> str:
        count = self._printed.get(rank, 0) + 1
        self._printed[rank] = count
        if count <= self.max_lines:
            return f"[rank {rank}] {line}"
        if count == self.max_lines + 1:
            return f"[rank {rank}] ... further output only in {self.view.log_path(rank)}\n"
        return ""

    def _progress_due(self, rank: int, stream: str) -> bool:
        now = time.monotonic()
        if now - self._progress_at.get((rank, stream), 0.0) < PROGRESS_EVERY_S:
            return False
        self._progress_at[(rank, stream)] = now
        return True

    def _write(self, text: str) -> None:
        if text:
            out = self.stream if self.stream is not None else sys.stdout
            out.write(text)
            out.flush()
