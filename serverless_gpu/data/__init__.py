"""Data and checkpoints for distributed functions: a streaming, sharded, resumable
``VolumeDataset`` over any fsspec URL, and ``torch.distributed.checkpoint`` storage that
publishes a checkpoint atomically (see docs/data.md)."""

from __future__ import annotations

from serverless_gpu.data.cache import LocalCache
from serverless_gpu.data.checkpoint import (
    UCVolumeReader,
    UCVolumeWriter,
    VolumeReader,
    VolumeWriter,
)
from serverless_gpu.data.checkpointable import Checkpointable
from serverless_gpu.data.dataloader import DataLoader
from serverless_gpu.data.dataset import VolumeDataset
from serverless_gpu.data.discovery import checkpoint_path, is_complete, latest_checkpoint
from serverless_gpu.data.errors import (
    CacheFullError,
    CheckpointMismatchError,
    CorruptCheckpointError,
    EmptyVolumeError,
    IncompleteCheckpointError,
    PositionUnknownError,
    VolumeError,
    VolumeNotFoundError,
    VolumeReadError,
)
from serverless_gpu.data.listing import VolumeFile, list_volume
from serverless_gpu.data.loader import VolumeDataLoader
from serverless_gpu.data.training_state import (
    TrainingState,
    load_training_state,
    save_training_state,
)
from serverless_gpu.data.uc_dataset import UCVolumeDataset

__all__ = [
    "CacheFullError",
    "CheckpointMismatchError",
    "Checkpointable",
    "CorruptCheckpointError",
    "DataLoader",
    "EmptyVolumeError",
    "IncompleteCheckpointError",
    "LocalCache",
    "PositionUnknownError",
    "TrainingState",
    "UCVolumeDataset",
    "UCVolumeReader",
    "UCVolumeWriter",
    "VolumeDataLoader",
    "VolumeDataset",
    "VolumeError",
    "VolumeFile",
    "VolumeNotFoundError",
    "VolumeReadError",
    "VolumeReader",
    "VolumeWriter",
    "checkpoint_path",
    "is_complete",
    "latest_checkpoint",
    "list_volume",
    "load_training_state",
    "save_training_state",
]
