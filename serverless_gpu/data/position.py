"""The resumable position of a :class:`~serverless_gpu.data.VolumeDataset` on one rank."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from serverless_gpu.data.errors import CheckpointMismatchError

__all__ = ["Fingerprint", "Position"]


@dataclass(frozen=True)
class Fingerprint:
    """What must not change between save and resume for a position to stay meaningful."""

    num_files: int
    files_digest: str
    shuffle: bool
    seed: int
    balance: str
    rank: int
    world_size: int


@dataclass
class Position:
    """Epoch plus batches delivered to the training loop by a ``VolumeDataLoader``.

    ``batch_size``, ``drop_last`` and ``num_workers`` describe the loader that produced the
    count; a resumed loader must use the same values (see :func:`sharding.resume_plan`).
    """

    epoch: int = 0
    batches_consumed: int = 0
    batch_size: int | None = None
    drop_last: bool = False
    num_workers: int = 1

    def to_state(self, fingerprint: Fingerprint) -> dict[str, Any]:
        """A plain, JSON-serialisable dict (for ``state_dict``)."""
        return {"version": 1, **asdict(self), **asdict(fingerprint)}

    @classmethod
    def from_state(cls, state: dict[str, Any], expected: Fingerprint) -> Position:
        """Validate ``state`` against the current dataset and return its position."""
        if state.get("version") != 1:
            raise CheckpointMismatchError(f"unknown dataset state version {state.get('version')!r}")
        for field in fields(Fingerprint):
            saved, now = state.get(field.name), getattr(expected, field.name)
            if saved != now:
                raise CheckpointMismatchError(
                    f"dataset state was saved with {field.name}={saved!r} but this dataset has "
                    f"{field.name}={now!r}; resuming would repeat or skip files"
                )
        return cls(**{f.name: state[f.name] for f in fields(cls)})

    def check_loader(self, *, batch_size: int | None, drop_last: bool, num_workers: int) -> None:
        """Refuse to continue a partly consumed epoch with a differently shaped loader."""
        if self.batches_consumed == 0:
            return
        saved = (self.batch_size, self.drop_last, self.num_workers)
        if saved != (batch_size, drop_last, num_workers):
            raise CheckpointMismatchError(
                "the epoch was partly consumed with (batch_size, drop_last, num_workers)="
                f"{saved} but the loader now uses {(batch_size, drop_last, num_workers)}"
            )
