"""``serverless_gpu.data.DataLoader`` as the original API documents it: workers kept across
epochs, and ``state_dict``/``load_state_dict`` resuming mid-epoch per worker for a user's own
``Checkpointable`` dataset, on the same grid only."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import IterableDataset, get_worker_info

from serverless_gpu.data import (
    Checkpointable,
    DataLoader,
    UCVolumeDataset,
    VolumeDataLoader,
    VolumeDataset,
)


class Numbers(IterableDataset[int]):
    """0..n-1, worker w of W yielding those with ``i % W == w``; its state counts what it
    yielded in this iteration, as the Checkpointable protocol asks of a user's dataset."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.yielded = 0
        self.skip = 0

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        mine = list(range(worker, self.n, workers))[self.skip :]
        self.yielded, self.skip = self.skip, 0  # a resume applies to one iteration
        for i in mine:
            self.yielded += 1
            yield i

    def state_dict(self) -> dict[str, Any]:
        return {"yielded": self.yielded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skip = state["yielded"]


class Pids(IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        yield os.getpid()


def flat(batches: list[torch.Tensor]) -> list[int]:
    return [int(x) for b in batches for x in b]


def test_numbers_is_checkpointable() -> None:
    assert isinstance(Numbers(3), Checkpointable)
    assert not isinstance(Pids(), Checkpointable)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_mid_epoch_continues_each_worker_where_the_loop_stopped(num_workers: int) -> None:
    """Batches prefetched but never received are delivered after the resume: nothing is lost
    and nothing comes twice."""
    first = DataLoader(Numbers(40), batch_size=3, num_workers=num_workers)
    it = iter(first)
    before = [next(it) for _ in range(5)]
    state = first.state_dict()
    del it

    again = DataLoader(Numbers(40), batch_size=3, num_workers=num_workers)
    again.load_state_dict(state)
    assert again.state_dict() == state  # before iterating it says where it will resume
    after = list(again)
    seen = flat(before) + flat(after)
    assert sorted(seen) == list(range(40))
    assert len(seen) == len(set(seen))
    # The epoch after the resumed one starts from the beginning.
    assert sorted(flat(list(again))) == list(range(40))


def test_state_is_plain_data_that_survives_json() -> None:
    import json

    loader = DataLoader(Numbers(12), batch_size=2, num_workers=2)
    it = iter(loader)
    before = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    again = DataLoader(Numbers(12), batch_size=2, num_workers=2)
    again.load_state_dict(state)
    assert sorted(flat(before) + flat(list(again))) == list(range(12))


def test_a_different_worker_count_is_refused_naming_both() -> None:
    state = DataLoader(Numbers(8), batch_size=2, num_workers=2).state_dict()
    with pytest.raises(ValueError, match=r"saved with num_workers=2 .* runs with num_workers=3"):
        DataLoader(Numbers(8), batch_size=2, num_workers=3).load_state_dict(state)


def test_a_different_world_size_is_refused_naming_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    state = DataLoader(Numbers(8), batch_size=2, num_workers=0).state_dict()
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match=r"saved with world_size=2 .* runs with world_size=4"):
        DataLoader(Numbers(8), batch_size=2, num_workers=0).load_state_dict(state)


def test_a_dataset_without_state_cannot_be_checkpointed() -> None:
    with pytest.raises(TypeError, match=r"needs a Checkpointable dataset.*Pids has none"):
        DataLoader(Pids(), num_workers=0).state_dict()


def test_workers_persist_across_epochs_by_default() -> None:
    loader = DataLoader(Pids(), batch_size=None, num_workers=2)
    assert (loader.persistent_workers, loader.prefetch_factor) == (True, 4)
    first, second = set(loader), set(loader)
    assert first == second and len(first) == 2 and os.getpid() not in first
    plain = DataLoader(Pids(), batch_size=None, num_workers=2, persistent_workers=False)
    assert set(plain).isdisjoint(first)


def test_default_worker_count_shares_the_cores_between_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert DataLoader(Pids()).num_workers == max(1, min(8, cores))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores * 2))
    assert DataLoader(Pids()).num_workers == 1


# -- UCVolumeDataset: the original API's dataset ----------------------------------------------


def volume(tmp_path: Path, count: int) -> str:
    root = tmp_path / "vol"
    root.mkdir()
    for i in range(count):
        (root / f"f{i:02d}.txt").write_text(str(i))
    return str(root)


def names(paths: list[str]) -> list[str]:
    return [Path(p).name for p in paths]


def test_uc_volume_dataset_gives_every_file_exactly_once(tmp_path: Path) -> None:
    """10 files over 3 ranks x 2 workers: ``files[worker * W + rank :: W * K]``, no padding."""
    url, cache = volume(tmp_path, 10), tmp_path / "cache"
    seen: dict[int, list[str]] = {}
    for rank in range(3):
        ds: UCVolumeDataset[str] = UCVolumeDataset(url, cache, rank=rank, world_size=3)
        seen[rank] = names(list(DataLoader(ds, batch_size=None, num_workers=2)))
    every = [n for part in seen.values() for n in part]
    assert sorted(every) == [f"f{i:02d}.txt" for i in range(10)]
    files = sorted(every)
    expected = {r: {n for w in range(2) for n in files[w * 3 + r :: 6]} for r in range(3)}
    assert {r: set(v) for r, v in seen.items()} == expected
    # VolumeDataset keeps its documented default: every rank the same count, padded.
    padded: list[VolumeDataset[str]] = [
        VolumeDataset(url, cache, rank=r, world_size=3) for r in range(3)
    ]
    assert [len(list(ds.loader(batch_size=None))) for ds in padded] == [4, 4, 4]


def test_uc_volume_dataset_resumes_per_worker(tmp_path: Path) -> None:
    url, cache = volume(tmp_path, 12), tmp_path / "cache"
    first = DataLoader(UCVolumeDataset(url, cache), batch_size=None, num_workers=2)
    it = iter(first)
    before = [next(it) for _ in range(5)]
    state = first.state_dict()
    del it
    again = DataLoader(UCVolumeDataset(url, cache), batch_size=None, num_workers=2)
    again.load_state_dict(state)
    seen = names(before) + names(list(again))
    assert sorted(seen) == [f"f{i:02d}.txt" for i in range(12)]
    assert len(set(seen)) == 12


def test_a_plain_volume_dataset_is_pointed_to_its_own_loader(tmp_path: Path) -> None:
    ds: VolumeDataset[str] = VolumeDataset(volume(tmp_path, 2), tmp_path / "cache")
    with pytest.raises(TypeError, match=r"VolumeDataLoader.*dataset.loader\(\.\.\.\)"):
        DataLoader(ds)


def test_uc_volume_dataset_reshuffles_every_epoch_in_persistent_workers(tmp_path: Path) -> None:
    url = volume(tmp_path, 16)
    ds: UCVolumeDataset[str] = UCVolumeDataset(url, tmp_path / "cache", shuffle=True, seed=3)
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    epochs = [names(list(loader)) for _ in range(2)]
    assert all(sorted(e) == [f"f{i:02d}.txt" for i in range(16)] for e in epochs)
    assert epochs[0] != epochs[1]


def test_volume_data_loader_refuses_another_dataset_naming_it() -> None:
    with pytest.raises(TypeError, match="needs a VolumeDataset, got Numbers"):
        VolumeDataLoader(Numbers(4))  # type: ignore[arg-type]
