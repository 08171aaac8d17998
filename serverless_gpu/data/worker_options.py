"""The DataLoader worker options this package's two loaders default alike.

``serverless_gpu.data.DataLoader`` and ``VolumeDataLoader`` (``VolumeDataset.loader()``) both
take them from here, so the two cannot drift apart.
"""

from __future__ import annotations

from typing import Any

__all__ = ["worker_options"]

_DEFAULT_PREFETCH = 4


def worker_options(
    workers: int, prefetch_factor: int | None, persistent_workers: bool | None
) -> dict[str, Any]:
    """torch's worker options as this package's loaders default them: with workers, 4 batches
    ahead per worker and workers kept from one epoch to the next (starting them each epoch can
    take longer than a short epoch's reading), each overridable; without, torch's own."""
    if workers == 0:
        return {"prefetch_factor": prefetch_factor, "persistent_workers": bool(persistent_workers)}
    return {
        "prefetch_factor": _DEFAULT_PREFETCH if prefetch_factor is None else prefetch_factor,
        "persistent_workers": True if persistent_workers is None else persistent_workers,
    }
