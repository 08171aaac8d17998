"""Standby rank actors: after a ``remote=True`` call that succeeded, its rank actors, their
placement group and the event sink wait for the next call of the same shape, for
``SERVERLESS_GPU_RAY_IDLE_S`` seconds (then they are released, so that an autoscaling cluster
can scale down), with the next call's process group formed among them ahead (``form_group``).

A shape is the world size, device, CPUs per rank, GPU type and the environment NCCL, gloo and
CUDA read once per process (``env.group_env``): a call that differs in any of them gets fresh
actors. So does a call after ``ray.shutdown()`` (the set's actors were the old job's) or after
one of the set's nodes or actors died (the caller checks before using a set, ``run.py``).
``serverless_gpu.shutdown()`` and the caller's exit release every set at once.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from serverless_gpu.backends.ray.placement import Reservation

Shape = tuple[int, str, int, str | None, tuple[tuple[str, str], ...]]
"""(world size, device, CPUs per rank, GPU type, sorted ``group_env`` items)."""
MAX_SETS = 2
"""Sets kept at once (one per shape); the longest idle goes first."""


@dataclass
class ActorSet:
    """The actors of one call, kept in rank order for the next call of its shape."""

    shape: Shape
    reservation: Reservation
    actors: list[Any]
    sink: Any
    job: str
    """The Ray job the actors belong to (they die with it)."""
    places: list[dict[str, Any]] = field(default_factory=list)
    """Where each rank runs (``RankActor.where``); rank 0's ``port`` is the next call's."""
    group: list[Any] = field(default_factory=list)
    """Each rank's ``form_group`` reference: True once its process group is formed."""
    idle_since: float = 0.0


class Standby:
    """The sets waiting for a call; one thread releases those idle too long."""

    def __init__(self) -> None:
        self._sets: dict[Shape, ActorSet] = {}
        self._wake = threading.Condition()
        self._idle_s = 0.0
        self._reaper: threading.Thread | None = None
        atexit.register(self.release_all)

    def take(self, shape: Shape, job: str) -> ActorSet | None:
        with self._wake:
            found = self._sets.pop(shape, None)
        if found is not None and found.job != job:
            return None  # ray.shutdown() ended its job, and its actors with it
        return found

    def keep(self, kept: ActorSet, idle_s: float) -> None:
        """Keep ``kept`` for ``idle_s`` seconds; another set of its shape is released."""
        if idle_s <= 0:
            release(kept)
            return
        kept.idle_since = time.monotonic()
        with self._wake:
            dropped = [s for s in [self._sets.pop(kept.shape, None)] if s is not None]
            self._sets[kept.shape] = kept
            while len(self._sets) > MAX_SETS:
                oldest = min(self._sets.values(), key=lambda s: s.idle_since)
                dropped.append(self._sets.pop(oldest.shape))
            self._idle_s = idle_s
            self._start_reaper()
            self._wake.notify()
        for s in dropped:
            release(s)

    def release_all(self) -> None:
        with self._wake:
            sets = list(self._sets.values())
            self._sets.clear()
        for s in sets:
            release(s)

    def _start_reaper(self) -> None:
        if self._reaper is None or not self._reaper.is_alive():
            self._reaper = threading.Thread(
                target=self._reap, name="serverless-gpu-ray-standby", daemon=True
            )
            self._reaper.start()

    def _reap(self) -> None:
        while True:
            with self._wake:
                if not self._sets:
                    self._reaper = None
                    return
                now = time.monotonic()
                due = [s for s in self._sets.values() if now - s.idle_since >= self._idle_s]
                for s in due:
                    del self._sets[s.shape]
                if not due:
                    first = min(s.idle_since for s in self._sets.values())
                    self._wake.wait(max(0.05, first + self._idle_s - now))
            for s in due:
                release(s)


def release(s: ActorSet) -> None:
    """Kill the set's actors and sink and remove its placement group (best effort: a
    connection already closed has taken them with its job)."""
    try:
        import ray
        from ray.util.placement_group import remove_placement_group
    except ImportError:
        return
    if not ray.is_initialized():
        return
    for actor in [*s.actors, s.sink]:
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
    with contextlib.suppress(Exception):
        remove_placement_group(s.reservation.group)
