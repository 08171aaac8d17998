"""What a queued run waits for, said and bounded: who holds the devices it needs (an idle
session holds its devices for its whole life), and its ``timeout`` counting the wait."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable

from serverless_gpu.launcher_process.allocation import devices_of
from serverless_gpu.wire.runspec import RunSpec


def holders(spec: RunSpec, running: Iterable[RunSpec]) -> str:
    """``session 's' holds CPU slots 0, 1``: the runs holding devices of ``spec``'s kind."""
    kind = "CPU slots" if spec.device == "cpu" else "GPUs"
    said = []
    for other in running:
        devices = devices_of(other)
        if other.device != spec.device or not devices:
            continue
        what = "session" if other.paths.session.is_dir() else "run"
        said.append(f"{what} {other.name!r} holds {kind} {', '.join(devices)}")
    return "; ".join(said) or "other runs hold its devices"


class QueueClock:
    """When each queued run with a timeout is due, and how much of it the wait used."""

    def __init__(self) -> None:
        self.since: dict[str, float] = {}

    def queued(self, spec: RunSpec) -> None:
        self.since[spec.run_id] = time.monotonic()

    def overdue(self, queue: Iterable[RunSpec]) -> list[RunSpec]:
        now = time.monotonic()
        return [
            s
            for s in queue
            if s.timeout is not None and now - self.since.get(s.run_id, now) >= s.timeout
        ]

    def leaving(self, spec: RunSpec) -> RunSpec:
        """The run leaves the queue: its timeout is what the wait left of it."""
        since = self.since.pop(spec.run_id, None)
        if since is None or spec.timeout is None:
            return spec
        left = max(spec.timeout - (time.monotonic() - since), 0.001)
        return dataclasses.replace(spec, config=dataclasses.replace(spec.config, timeout=left))
