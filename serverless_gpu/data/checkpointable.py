"""``Checkpointable``: a dataset whose progress :class:`~serverless_gpu.data.DataLoader` saves
and restores, one state per DataLoader worker."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["Checkpointable"]


@runtime_checkable
class Checkpointable(Protocol):
    """A dataset that can say how far its iteration got and start again from there.

    With worker processes each worker iterates its own copy of the dataset:
    :class:`~serverless_gpu.data.DataLoader` calls ``state_dict()`` in the worker after each
    batch it makes, keeps the state of the last batch the training loop received from that
    worker (received, not prefetched), and on resume hands each worker's copy its own state
    through ``load_state_dict`` before that worker's next iteration starts. A dataset that
    wraps another one and yields a different number of items delegates both methods to it.
    """

    def state_dict(self) -> dict[str, Any]:
        """This copy's progress, as plain data (JSON-serialisable keeps it portable)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the next iteration from a state ``state_dict`` returned."""
        ...
