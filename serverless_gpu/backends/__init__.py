"""Backends start a run's ranks somewhere and feed its events to a :class:`RunHandle`.

The local backend forks ranks from a launcher process on this machine; a multi-node backend (Ray)
implements the same small interface with the same events, results and failure semantics.
"""

from .base import Backend, RunRequest

__all__ = ["Backend", "RunRequest"]
