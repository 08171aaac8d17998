"""Exceptions raised by :mod:`serverless_gpu.data`.

Every error derives from :class:`VolumeError` so callers can catch the whole family with one
``except``. The classes take a single message argument on purpose: DataLoader workers re-raise
exceptions in the main process by calling ``type(exc)(message)``, which must keep working.
"""

from __future__ import annotations

from serverless_gpu.common.errors import DistributedError

__all__ = [
    "CacheFullError",
    "CheckpointMismatchError",
    "EmptyVolumeError",
    "IncompleteCheckpointError",
    "PositionUnknownError",
    "VolumeError",
    "VolumeNotFoundError",
    "VolumeReadError",
]


class VolumeError(DistributedError):
    """Base class of every error raised by ``serverless_gpu.data``."""


class VolumeNotFoundError(VolumeError):
    """The volume path does not exist or is not a directory."""


class EmptyVolumeError(VolumeError):
    """The volume exists but no file matched the listing options."""


class VolumeReadError(VolumeError):
    """A file of the volume could not be read or copied into the local cache."""


class CacheFullError(VolumeError):
    """The local cache cannot make room for a file without crossing ``min_free_bytes``."""


class PositionUnknownError(VolumeError, ValueError):
    """``state_dict()`` was asked for a position that no ``VolumeDataLoader`` tracked, or
    ``load_state_dict()`` was given one that does not fit (another rank's): a ``ValueError``,
    as the original's contract for a mismatched state says."""


class IncompleteCheckpointError(VolumeError):
    """A checkpoint directory has no ``.metadata``: it was never completely published."""


class CorruptCheckpointError(VolumeReadError):
    """A checkpoint shard does not match the size and checksum recorded when it was saved."""


class CheckpointMismatchError(VolumeError):
    """A checkpoint or dataset state does not fit the job that tries to resume from it."""


def changed_since_listing(name: str, found: int, listed: int) -> VolumeReadError:
    """The error for a file whose size is no longer the one the dataset listed; one wording for
    the cache's copy and the read in place."""
    return VolumeReadError(
        f"{name}: {found} bytes but the volume listed {listed}; the file changed after the "
        "dataset listed the volume"
    )
