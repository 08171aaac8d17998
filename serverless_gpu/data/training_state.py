"""Save and restore model, optimizer, RNG and dataset position as one DCP checkpoint."""

from __future__ import annotations

import os
import pickle
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from serverless_gpu.data.checkpoint import VolumeReader, VolumeWriter
from serverless_gpu.data.dataset import VolumeDataset
from serverless_gpu.data.discovery import is_complete
from serverless_gpu.data.errors import (
    CheckpointMismatchError,
    IncompleteCheckpointError,
    VolumeError,
)
from serverless_gpu.data.rng import capture_rng, restore_rng

__all__ = ["TrainingState", "load_training_state", "save_training_state"]

_async_group: dist.ProcessGroup | None = None


@dataclass(frozen=True)
class TrainingState:
    """What :func:`load_training_state` restored besides the objects it updated in place."""

    path: str
    step: int | None
    extra: Any


def save_training_state(
    path: str | os.PathLike[str],
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    dataset: VolumeDataset[Any] | None = None,
    step: int | None = None,
    extra: Any = None,
    storage_options: dict[str, Any] | None = None,
    writer: VolumeWriter | None = None,
    async_save: bool = False,
) -> Future[Any] | None:
    """Save a training checkpoint to ``path``; call it on every rank at the same step.

    Model and optimizer go through ``get_state_dict`` (DDP, FSDP2, plain modules) and are
    sharded by DCP; each rank's RNG states and dataset position are gathered so every rank
    stores the same per-rank table. ``extra`` is any picklable object (rank 0's copy is kept).
    With ``async_save=True`` the state is staged to CPU, the upload runs on a background thread
    over a dedicated gloo group, and the returned future must be waited on before the next save.
    """
    # RNG first: nothing below may have consumed random numbers yet when it is captured.
    per_rank = {"rng": capture_rng(), "dataset": dataset.state_dict() if dataset else None}
    if optimizer is None:
        model_sd, optim_sd = get_model_state_dict(model), None
    else:
        model_sd, optim_sd = get_state_dict(model, optimizer)
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    table: list[Any] = [None] * world_size
    if dist.is_initialized():
        dist.all_gather_object(table, per_rank)
    else:
        table[0] = per_rank
    trainer = {"step": step, "world_size": world_size, "ranks": table, "extra": extra}
    state: dict[str, Any] = {"model": model_sd, "trainer": pickle.dumps(trainer)}
    if optim_sd is not None:
        state["optim"] = optim_sd
    storage = writer if writer is not None else VolumeWriter(path, storage_options=storage_options)
    if not async_save:
        dcp.save(state, storage_writer=storage)
        return None
    group = _checkpoint_group() if dist.is_initialized() else None
    upload = dcp.async_save(state, storage_writer=storage, process_group=group)
    # VolumeWriter stages in this thread, for which torch returns the upload's future itself;
    # an AsyncSaveResponse (a stager with its own staging future) carries it as upload_completion.
    return upload if isinstance(upload, Future) else upload.upload_completion


def load_training_state(
    path: str | os.PathLike[str],
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    dataset: VolumeDataset[Any] | None = None,
    storage_options: dict[str, Any] | None = None,
    restore_rng_state: bool = True,
) -> TrainingState:
    """Restore what :func:`save_training_state` saved, in place; call it on every rank.

    Model and optimizer may be resharded to a new world size; the dataset position and RNG
    states are per rank and need the same world size (:class:`CheckpointMismatchError`).

    Raises:
        IncompleteCheckpointError: ``path`` has no ``.metadata`` (an interrupted save).
    """
    if not is_complete(path, storage_options):
        raise IncompleteCheckpointError(
            f"{os.fspath(path)} is not a complete checkpoint (no .metadata); use "
            "latest_checkpoint(root) to pick a complete one"
        )
    if optimizer is None:
        model_sd, optim_sd = get_model_state_dict(model), None
    else:
        model_sd, optim_sd = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_sd, "trainer": b""}
    if optim_sd is not None:
        state["optim"] = optim_sd
    _load(state, path, storage_options)
    if optimizer is None:
        set_model_state_dict(model, state["model"])
    else:
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
    trainer = pickle.loads(state["trainer"])
    _restore_rank_state(trainer, dataset=dataset, restore_rng_state=restore_rng_state)
    return TrainingState(path=os.fspath(path), step=trainer["step"], extra=trainer["extra"])


def _load(
    state: dict[str, Any], path: str | os.PathLike[str], storage_options: dict[str, Any] | None
) -> None:
    """``dcp.load``, with a volume's own error (a truncated shard, say) raised as itself:
    torch wraps every rank's failure in one ``CheckpointException``."""
    try:
        dcp.load(state, storage_reader=VolumeReader(path, storage_options=storage_options))
    except CheckpointException as exc:
        for failure in exc.failures.values():
            cause = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(cause, VolumeError):
                raise cause from exc
        raise


def _restore_rank_state(
    trainer: dict[str, Any], *, dataset: VolumeDataset[Any] | None, restore_rng_state: bool
) -> None:
    rank = dist.get_rank() if dist.is_initialized() else 0
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    if trainer["world_size"] != world_size:
        if dataset is not None:
            raise CheckpointMismatchError(
                f"checkpoint was saved by {trainer['world_size']} ranks, this job has "
                f"{world_size}; the per-rank dataset position cannot be mapped"
            )
        return
    mine = trainer["ranks"][rank]
    if dataset is not None:
        if mine["dataset"] is None:
            raise CheckpointMismatchError("the checkpoint holds no dataset position")
        dataset.load_state_dict(mine["dataset"])
    if restore_rng_state:
        restore_rng(mine["rng"])


def _checkpoint_group() -> dist.ProcessGroup:
    # Background saves must not share a communicator with the training loop's collectives,
    # or the two threads' collectives can interleave differently on different ranks.
    global _async_group
    if _async_group is None:
        _async_group = dist.new_group(backend="gloo")
    return _async_group
