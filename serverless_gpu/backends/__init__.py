"""Backends start a run's ranks somewhere and feed its events to a :class:`RunHandle`.

Every backend receives the same record of a call, a :class:`~serverless_gpu.wire.runspec.RunSpec`.
The local backend forks ranks from a launcher process on this machine; a multi-node backend (Ray)
implements the same small interface with the same events, results and failure semantics.
"""

from serverless_gpu.backends.base import Backend
from serverless_gpu.wire.runspec import RunSpec

__all__ = ["Backend", "RunSpec"]
