"""Hang and straggler detection in the caller: each rank's last sign of life.

A sign of life is an output line, a metric batch or a heartbeat (any ``RankMessage``). When a
running rank has shown none for ``hang_warning`` seconds, the handle dispatches
:class:`~serverless_gpu.wire.events.RanksSilent` naming the silent ranks; renderers warn and offer
stacks. Nothing is stopped. The warning is given once per silence, and withdrawn (an empty
``RanksSilent``) once every named rank shows life again.
"""

from __future__ import annotations

import time

from serverless_gpu.wire.events import (
    Event,
    OutputLines,
    RankFinished,
    RankMessage,
    RanksSilent,
    RankStarted,
)


class HangWatch:
    def __init__(self, run_id: str, hang_warning: float | None) -> None:
        self.run_id = run_id
        self.hang_warning = hang_warning
        self.last: dict[int, float] = {}
        """Running ranks -> monotonic time of their last sign of life."""
        self.warned: tuple[int, ...] = ()

    def seen(self, event: Event) -> None:
        if isinstance(event, (RankStarted, OutputLines, RankMessage)):
            self.last[event.rank] = time.monotonic()
        elif isinstance(event, RankFinished):
            self.last.pop(event.rank, None)

    def check(self, now: float | None = None) -> RanksSilent | None:
        """A warning to dispatch now, or None (nothing new)."""
        if self.hang_warning is None or not self.last:
            return None
        now = time.monotonic() if now is None else now
        silent = tuple(r for r, t in sorted(self.last.items()) if now - t >= self.hang_warning)
        if silent == self.warned or (silent and set(silent) < set(self.warned)):
            return None  # already said (a rank coming back alone does not re-warn)
        if not silent and not self.warned:
            return None
        self.warned = silent
        everyone = bool(silent) and len(silent) == len(self.last)
        return RanksSilent(self.run_id, silent, float(self.hang_warning), everyone, time.time())


def warning_text(event: RanksSilent) -> str:
    """``rank 1 silent for 300 s (no output, metric or heartbeat) ...``; one wording."""
    names = ", ".join(map(str, event.ranks))
    who = f"rank {names}" if len(event.ranks) == 1 else f"ranks {names}"
    if event.everyone and len(event.ranks) > 1:
        who = f"every rank ({names})"
    return (
        f"{who} silent for {event.seconds:g} s (no output, metric or heartbeat); nothing was "
        "stopped. Stacks show where each rank is"
    )
