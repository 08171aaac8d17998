"""The sharding rule and the resume mapping, checked against a real DataLoader."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from serverless_gpu.data import VolumeDataLoader, VolumeDataset
from serverless_gpu.data.sharding import delivery_order, epoch_order, rank_share, resume_plan


def test_epoch_order_is_seeded_per_epoch() -> None:
    assert epoch_order(10, epoch=0, seed=1, shuffle=False) == list(range(10))
    first = epoch_order(50, epoch=0, seed=1, shuffle=True)
    assert first == epoch_order(50, epoch=0, seed=1, shuffle=True)
    assert sorted(first) == list(range(50))
    assert first != epoch_order(50, epoch=1, seed=1, shuffle=True)
    assert first != epoch_order(50, epoch=0, seed=2, shuffle=True)
    assert epoch_order(50, epoch=1, seed=0, shuffle=True) != epoch_order(
        50, epoch=0, seed=1, shuffle=True
    )


@pytest.mark.parametrize("num_files", [1, 7, 8, 23])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_rank_share_balance_modes(num_files: int, world_size: int) -> None:
    order = list(range(num_files))
    shares = {
        mode: [
            rank_share(order, rank=r, world_size=world_size, balance=mode)
            for r in range(world_size)
        ]
        for mode in ("none", "pad", "drop")
    }
    assert sorted(i for s in shares["none"] for i in s) == order
    padded = Counter(i for s in shares["pad"] for i in s)
    assert set(padded) == set(order)  # nothing lost
    assert len({len(s) for s in shares["pad"]}) == 1  # every rank the same count
    assert len({len(s) for s in shares["drop"]}) == 1
    dropped = [i for s in shares["drop"] for i in s]
    assert len(dropped) == len(set(dropped)) == num_files - num_files % world_size


def test_delivery_order_round_robin_skips_exhausted_workers() -> None:
    assert delivery_order([3, 1, 2]) == [0, 1, 2, 0, 2, 0]
    plan = resume_plan([5, 2, 4], batch_size=2, drop_last=False, batches_consumed=4)
    # batches: w0 x3, w1 x1, w2 x2 -> order 0,1,2,0,2,0; four consumed: w0 2, w1 1, w2 1
    assert plan.skip == (4, 2, 2)
    assert plan.first == 2


def _names(batch: list[str]) -> list[str]:
    return [os.path.basename(p) for p in batch]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("batch_size", "drop_last", "num_workers"),
    [(2, False, 2), (3, False, 2), (3, True, 2), (2, False, 0)],
)
def test_resume_after_every_batch_matches_uninterrupted_dataloader(
    tmp_path: Path, batch_size: int, drop_last: bool, num_workers: int
) -> None:
    volume = tmp_path / "vol"
    volume.mkdir()
    for i in range(15):
        (volume / f"f{i:02d}").write_bytes(b"x" * (i + 1))

    def loader() -> tuple[VolumeDataset[str], VolumeDataLoader]:
        ds: VolumeDataset[str] = VolumeDataset(
            volume, tmp_path / "cache", shuffle=True, seed=5, rank=1, world_size=2, min_free_bytes=0
        )
        return ds, ds.loader(batch_size=batch_size, drop_last=drop_last, num_workers=num_workers)

    ds, dl = loader()
    ds.set_epoch(4)
    full = [_names(b) for b in dl]
    total = ds.epoch_batches(batch_size=batch_size, drop_last=drop_last, num_workers=num_workers)
    assert len(full) == total
    for consumed in range(total + 1):
        ds, dl = loader()
        ds.set_epoch(4)
        iterator = iter(dl)
        head = [_names(next(iterator)) for _ in range(consumed)]
        state = ds.state_dict()
        del iterator
        resumed, resumed_dl = loader()
        resumed.load_state_dict(state)
        resumed.set_epoch(4)
        tail = [_names(b) for b in resumed_dl]
        assert head + tail == full, f"resume after {consumed} batches"
