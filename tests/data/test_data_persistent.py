"""VolumeDataLoader with persistent_workers=True: the workers start once and follow every
epoch, resume point and seed the training process sets."""

from __future__ import annotations

import os
from multiprocessing import resource_tracker as resource_tracker_module
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from eventually import eventually

from serverless_gpu.data import VolumeDataset

FILES = 12


def seen(path: str) -> tuple[int, str, float]:
    """The worker that read ``path``, its name, and a number from the worker's torch RNG."""
    return os.getpid(), os.path.basename(path), torch.rand(()).item()


def as_list(batch: list[Any]) -> list[Any]:
    return batch


@pytest.fixture(scope="module", autouse=True)
def resource_tracker() -> None:
    """Started before the leak check's snapshot: the first ``spawn`` starts multiprocessing's
    resource tracker, which lives as long as this process."""
    resource_tracker_module.ensure_running()


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    folder = tmp_path / "vol"
    folder.mkdir()
    for i in range(FILES):
        (folder / f"f{i:02d}.bin").write_bytes(b"x" * (i + 1))
    return folder


def dataset(volume: Path, tmp_path: Path) -> VolumeDataset[Any]:
    return VolumeDataset(
        str(volume), tmp_path / "cache", shuffle=True, seed=5, transform=seen, min_free_bytes=0,
        rank=0, world_size=1,
    )  # fmt: skip


def epoch(loader: Any) -> list[tuple[int, str, float]]:
    return [item for batch in loader for item in batch]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_persistent_workers_read_each_epoch_as_fresh_workers_would(
    volume: Path, tmp_path: Path, start: str
) -> None:
    """With ``spawn`` the dataset reaches the workers pickled: the plan's shared memory too.
    (The loader to compare with forks its workers each epoch: seeds do not depend on how.)"""
    options: dict[str, Any] = {"batch_size": 2, "num_workers": 2, "collate_fn": as_list}
    kept = dataset(volume, tmp_path).loader(
        persistent_workers=True, multiprocessing_context=start, **options
    )
    fresh = dataset(volume, tmp_path).loader(
        persistent_workers=False, multiprocessing_context="fork", **options
    )
    try:
        orders, pids = [], []
        for _ in range(3):
            ours, theirs = epoch(kept), epoch(fresh)
            # Same files in the same order, and the same random numbers: a persistent
            # worker is reseeded each epoch as torch seeds a newly started one.
            assert [(n, r) for _, n, r in ours] == [(n, r) for _, n, r in theirs]
            orders.append([n for _, n, _ in ours])
            pids.append({p for p, _, _ in ours})
        assert sorted(orders[0]) == [f"f{i:02d}.bin" for i in range(FILES)]
        assert orders[0] != orders[1] != orders[2]  # shuffled anew each epoch
        assert pids[0] == pids[1] == pids[2] and len(pids[0]) == 2  # the same two workers
    finally:
        kept.close()
    for pid in pids[0]:
        eventually(
            lambda pid=pid: not psutil.pid_exists(pid), timeout=20, what=f"worker {pid} gone"
        )


@pytest.mark.timeout(120)
def test_persistent_workers_resume_mid_epoch_and_after_a_break(
    volume: Path, tmp_path: Path
) -> None:
    reference = epoch(
        dataset(volume, tmp_path).loader(batch_size=2, num_workers=2, collate_fn=as_list)
    )
    names = [n for _, n, _ in reference]
    data = dataset(volume, tmp_path)
    loader = data.loader(batch_size=2, num_workers=2, persistent_workers=True, collate_fn=as_list)
    resumed_loader = None
    try:
        batches = iter(loader)
        head = [n for _ in range(3) for _, n, _ in next(batches)]
        state = data.state_dict()
        del batches  # the loop stops early; the workers stay for the next iteration
        tail = [n for _, n, _ in epoch(loader)]  # the same epoch, from where it stopped
        assert head + tail == names
        resumed = dataset(volume, tmp_path)
        resumed.load_state_dict(state)
        resumed_loader = resumed.loader(
            batch_size=2, num_workers=2, persistent_workers=True, collate_fn=as_list
        )
        assert [n for _, n, _ in epoch(resumed_loader)] == tail
    finally:
        loader.close()
        if resumed_loader is not None:
            resumed_loader.close()


@pytest.mark.timeout(120)
def test_the_loader_keeps_its_workers_unless_told_not_to(volume: Path, tmp_path: Path) -> None:
    """As ``serverless_gpu.data.DataLoader`` does: starting workers every epoch costs more than a
    short epoch's reading on a small machine."""
    options: dict[str, Any] = {"batch_size": 2, "num_workers": 2, "collate_fn": as_list}
    kept = dataset(volume, tmp_path).loader(**options)
    try:
        assert (kept.persistent_workers, kept.prefetch_factor) == (True, 4)
        pids = [{p for p, _, _ in epoch(kept)} for _ in range(2)]
        assert pids[0] == pids[1] and len(pids[0]) == 2
    finally:
        kept.close()
    plain = dataset(volume, tmp_path).loader(persistent_workers=False, **options)
    assert (plain.persistent_workers, plain.prefetch_factor) == (False, 4)
    assert {p for p, _, _ in epoch(plain)}.isdisjoint(pids[0])
    without = dataset(volume, tmp_path).loader(batch_size=2)  # no workers: torch's options
    assert (without.persistent_workers, without.prefetch_factor) == (False, None)
    for pid in pids[0]:
        eventually(
            lambda pid=pid: not psutil.pid_exists(pid), timeout=20, what=f"worker {pid} gone"
        )
