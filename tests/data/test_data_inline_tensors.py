"""A DataLoader worker of ours sends small tensors by value and large ones through shared
memory (:mod:`serverless_gpu.data.inline_tensors`); a tensor that came through shared memory
says so (``Tensor.is_shared()``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import IterableDataset

from serverless_gpu.data import DataLoader, VolumeDataset
from serverless_gpu.data.inline_tensors import INLINE_MAX_BYTES

MADE = {
    "float": torch.arange(12, dtype=torch.float32).reshape(3, 4),
    "bfloat16": torch.linspace(-1, 1, 7).to(torch.bfloat16),
    "bool": torch.tensor([True, False, True]),
    "complex_conj": torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj(),
    "scalar": torch.tensor(5),
    "empty": torch.zeros(0, 3),
    "strided_view": torch.arange(20).reshape(4, 5).t(),
    "large": torch.ones(INLINE_MAX_BYTES // 4 + 1),
}


class Made(IterableDataset[dict[str, torch.Tensor]]):
    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        yield dict(MADE)


def check(batch: dict[str, Any]) -> None:
    for key, value in MADE.items():
        got = batch[key]
        assert got.dtype == value.dtype, key
        assert torch.equal(got, value.resolve_conj()), key
        assert got.is_shared() == (key == "large"), key


@pytest.mark.parametrize("persistent", [False, True])
def test_small_tensors_come_by_value_and_large_ones_through_shared_memory(
    persistent: bool,
) -> None:
    # No collation: the sample's own tensors travel (default_collate cannot stack some).
    loader = DataLoader(Made(), batch_size=None, num_workers=1, persistent_workers=persistent)
    for _ in range(2):
        (batch,) = list(loader)
        check(batch)
    del loader  # and with it the persistent worker


def test_the_users_worker_init_fn_still_runs(tmp_path: Path) -> None:
    for i in range(4):
        (tmp_path / f"{i}.bin").write_bytes(bytes([i]) * 10)

    def seed_of(path: str) -> torch.Tensor:
        return torch.tensor([torch.initial_seed() % 1000, 0])

    ds = VolumeDataset(str(tmp_path), tmp_path / "cache", rank=0, world_size=1, transform=seed_of)
    seeds = [
        int(batch[0, 0])
        for batch in ds.loader(batch_size=1, num_workers=2, worker_init_fn=_seed_worker)
    ]
    assert seeds == [worker % 1000 for worker in (0, 1, 0, 1)]
    again = VolumeDataset(str(tmp_path), tmp_path / "cache", rank=0, world_size=1,
                          transform=lambda path: torch.tensor([1, 2]))  # fmt: skip
    assert not any(batch.is_shared() for batch in again.loader(batch_size=2, num_workers=1))


def _seed_worker(worker_id: int) -> None:
    torch.manual_seed(worker_id)
