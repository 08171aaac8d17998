"""Readable text for a run where no widget can be shown (terminal IPython, nbclient/nbconvert).

Prints what the widget shows: a header with the hardware, links and log directory; rank output
with ``[rank N]`` prefixes (bounded per rank, progress lines thinned out); failed ranks as they
fail; and the final per-rank summary. The lines are the console's (:class:`ConsolePrinter`,
the same fold of the events); the words of the header, a failed rank and the summary are the
widget's view of the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from serverless_gpu.caller.console import ConsolePrinter
from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.tracking import store
from serverless_gpu.wire.events import (
    Event,
    RankFinished,
    RunFinished,
    RunQueued,
    RunStarted,
)

from .formatting import hardware_label, links_text, summary_text
from .runstate import RunView

MAX_PRINTED_LINES = 1000


class TextRenderer(ConsolePrinter):
    """Subscriber that writes the run to a text stream (``sys.stdout`` at write time)."""

    stacks_hint = "%distributed_stacks"

    def __init__(
        self,
        ctx: RunContext,
        stream: TextIO | None = None,
        *,
        max_lines: int = MAX_PRINTED_LINES,
    ) -> None:
        super().__init__(ctx.config.output, stream, max_lines)
        self.view = RunView(ctx, max_lines=1)

    def __call__(self, event: Event) -> None:
        self.view.apply(event)  # the view first: the lines below are worded from it
        super().__call__(event)

    def on_run_queued(self, event: RunQueued) -> None:
        pass  # the header's status says it; the console, which has no header, names holders

    def header(self, event: RunStarted) -> str:
        view = self.view
        parts = [f"serverless_gpu: {view.name} on {hardware_label(view)}"]
        if view.links:
            parts.append(links_text(view))
        parts.append(f"logs: {view.paths.logs}")
        return " | ".join(parts) + "\n"

    def failure(self, event: RankFinished) -> str:
        return self.view.ranks[event.rank].detail

    def summary(self, event: RunFinished) -> str:
        return summary_text(self.view) + "\n" + self._mlflow_hint()

    def log_path(self, rank: int) -> Path:
        return self.view.log_path(rank)

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
