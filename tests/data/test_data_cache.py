"""The node-local cache: free-disk floor with LRU eviction, pins, a full disk, and several
processes fetching the same files at once."""

from __future__ import annotations

import fcntl
import hashlib
import json
import multiprocessing
import os
import random
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

from serverless_gpu.data import CacheFullError, LocalCache, VolumeDataset, VolumeReadError
from serverless_gpu.data import dataset as dataset_module

MiB = 1 << 20


@pytest.fixture
def cache_disk(tmp_path: Path) -> Iterator[Path]:
    """A small tmpfs when it can be mounted, else a directory on the real disk (the tests
    compute their floors from the free space they find either way)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,mode=700", "tmpfs", str(mount)], capture_output=True
    )
    try:
        yield mount
    finally:
        if mounted.returncode == 0:
            subprocess.run(["umount", "-l", str(mount)], check=False)


def writer(data: bytes) -> Callable[[BinaryIO], None]:
    def download(out: BinaryIO) -> None:
        out.write(data)

    return download


def cached_files(root: Path) -> list[Path]:
    """The cached copies under ``root`` (each sits in a folder named for its source version)."""
    return [p for p in root.rglob("*") if p.is_file() and ".locks" not in p.parts]


def free(path: Path) -> int:
    return shutil.disk_usage(path).free


def test_dataset_keeps_free_disk_floor_by_evicting(cache_disk: Path, tmp_path: Path) -> None:
    volume = tmp_path / "vol"
    volume.mkdir()
    contents = {f"blob_{i:02d}": bytes([i]) * MiB for i in range(12)}  # 12 MiB > the budget
    for name, data in contents.items():
        (volume / name).write_bytes(data)
    floor = free(cache_disk) - 4 * MiB - 256 * 1024  # room for ~4 files
    seen_free: list[int] = []

    def check(path: str) -> tuple[str, bytes]:
        seen_free.append(free(cache_disk))
        return os.path.basename(path), Path(path).read_bytes()

    dataset = VolumeDataset(volume, cache_disk, transform=check, prefetch=2, min_free_bytes=floor)
    for epoch in range(2):
        dataset.set_epoch(epoch)
        got = dict(dataset)
        assert got == contents  # every file delivered intact despite eviction
    assert min(seen_free) >= floor, "the free-disk floor was crossed"
    cached = [p for p in cache_disk.rglob("blob_*")]
    assert 0 < len(cached) <= 4
    assert free(cache_disk) >= floor


def test_lru_order_and_pins(cache_disk: Path) -> None:
    cache = LocalCache(cache_disk / "c", min_free_bytes=0)
    cache.min_free_bytes = free(cache_disk) - 3 * MiB - 128 * 1024  # room for 3 files
    for name in ("a", "b", "c"):
        cache.acquire(name, MiB, writer(name.encode() * MiB)).close()
        time.sleep(0.01)
    cache.acquire("a", MiB, writer(b"unused")).close()  # "a" is now most recently used
    with cache.acquire("d", MiB, writer(b"d" * MiB)) as pin:
        assert pin.path.read_bytes() == b"d" * MiB
    assert sorted(p.name for p in cached_files(cache_disk / "c")) == ["a", "c", "d"]

    # Pinned files are never evicted; with everything pinned the cache says it is full.
    pins = [cache.acquire(n, MiB, writer(b"")) for n in ("a", "c", "d")]
    with pytest.raises(CacheFullError):
        cache.acquire("e", MiB, writer(b"e" * MiB))
    for pin in pins:
        pin.close()
    cache.acquire("e", MiB, writer(b"e" * MiB)).close()
    assert not list((cache_disk / "c").glob(".*.tmp"))

    # Another volume sharing the cache directory shares the floor and evicts across volumes.
    other = LocalCache(cache_disk / "c", namespace="vol2", min_free_bytes=cache.min_free_bytes)
    other.acquire("x", MiB, writer(b"x" * MiB)).close()
    first_volume = [p for p in cached_files(cache_disk / "c") if "vol2" not in p.parts]
    assert len(first_volume) == 2
    [x] = cached_files(cache_disk / "c" / "vol2")
    assert x.read_bytes() == b"x" * MiB


def test_file_larger_than_the_disk_is_a_clear_error(cache_disk: Path) -> None:
    cache = LocalCache(cache_disk / "c", min_free_bytes=0)
    huge = free(cache_disk) + MiB
    with pytest.raises(CacheFullError):
        cache.acquire("huge", huge, writer(b""))
    assert not [p for p in (cache_disk / "c").rglob("*") if p.is_file() and ".locks" not in p.parts]


def _fetch_all(cache_dir: str, names: list[str], me: int, count: int) -> None:
    """One "rank": fetch every file in its own order, record what it got."""
    cache = LocalCache(cache_dir, min_free_bytes=0)
    random.Random(me).shuffle(names)
    # Start together, and download slowly, so the processes really overlap.
    meet = Path(cache_dir).parent / "meet"
    Path(meet, f"ready{me}").touch()
    while len(list(meet.glob("ready*"))) < count:
        time.sleep(0.01)
    seen = {}
    for name in names:
        data = name.encode() * MiB

        def download(out: BinaryIO, data: bytes = data) -> None:
            for i in range(0, len(data), 1 << 18):
                out.write(data[i : i + (1 << 18)])
                time.sleep(0.02)

        with cache.acquire(name, len(data), download) as pin:
            inode = pin.path.stat().st_ino
            seen[name] = [inode, hashlib.sha256(pin.path.read_bytes()).hexdigest()]
    Path(meet, f"seen{me}.json").write_text(json.dumps(seen))


@pytest.mark.timeout(60)
def test_processes_sharing_a_cache_download_each_file_once(tmp_path: Path) -> None:
    names = [f"shared_{i}" for i in range(6)]
    cache_dir = tmp_path / "cache"
    (tmp_path / "meet").mkdir()
    count = 3
    context = multiprocessing.get_context("fork")  # cheap: no torch re-import per process
    procs = [
        context.Process(target=_fetch_all, args=(str(cache_dir), list(names), me, count))
        for me in range(count)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=50)
    assert [proc.exitcode for proc in procs] == [0] * count
    meet = tmp_path / "meet"
    outputs = [json.loads((meet / f"seen{me}.json").read_text()) for me in range(count)]
    for name in names:
        expected = hashlib.sha256(name.encode() * MiB).hexdigest()
        views = {tuple(out[name]) for out in outputs}
        assert len(views) == 1, f"{name} was cached more than once: {views}"
        assert views.pop()[1] == expected
    assert [p for p in cache_dir.rglob(".*") if p.is_file()] == []  # no temp files left


def test_a_process_forked_while_a_lock_is_held_does_not_keep_it(tmp_path: Path) -> None:
    """A flock belongs to the open file, which fork() shares with the child. A process that
    forks while it downloads or pins a file (a DataLoader starting workers, say) must not
    leave that file locked for as long as the child lives."""
    cache = LocalCache(tmp_path / "cache")
    fork = multiprocessing.get_context("fork")
    children: list[multiprocessing.process.BaseProcess] = []

    def fork_a_child() -> None:
        child = fork.Process(target=time.sleep, args=(60,))
        child.start()
        children.append(child)

    def download(out: BinaryIO) -> None:
        fork_a_child()  # while the per-file download lock is held
        out.write(b"x" * 100)

    try:
        pin = cache.acquire("a.bin", 100, download)
        fork_a_child()  # while the pin's shared lock is held
        pin.close()
        assert all(child.is_alive() for child in children)
        for path in (cache._lock_path("a.bin"), pin.path):
            fd = os.open(path, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError if still held
            finally:
                os.close(fd)
    finally:
        for child in children:
            child.kill()
            child.join()


def test_a_file_grown_past_its_listing_never_fills_the_cache_disk(
    cache_disk: Path, tmp_path: Path
) -> None:
    volume = tmp_path / "vol"
    volume.mkdir()
    (volume / "a.bin").write_bytes(b"a" * 1024)
    (volume / "b.bin").write_bytes(b"b" * 1024)
    floor = free(cache_disk) - 2 * MiB
    dataset: VolumeDataset[str] = VolumeDataset(
        volume, cache_disk, prefetch=0, min_free_bytes=floor
    )
    (volume / "b.bin").write_bytes(b"b" * (free(cache_disk) + 4 * MiB))  # more than the disk
    seen_free: list[int] = []
    with pytest.raises(VolumeReadError, match=r"b\.bin is longer than the 1024 bytes"):
        for path in dataset:
            seen_free.append(free(cache_disk))
            assert Path(path).read_bytes() == b"a" * 1024
    assert seen_free and min(seen_free) >= floor
    assert free(cache_disk) >= floor
    assert not [p for p in cache_disk.rglob("*b.bin*")], "a partial copy was left behind"


def test_a_dataset_never_reads_files_cached_before_a_reboot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cached files are published without fsync: after a crash, one may hold zeros."""
    volume = tmp_path / "vol"
    volume.mkdir()
    (volume / "a.bin").write_bytes(b"a" * 1024)
    cache = tmp_path / "cache"  # the same file system: copied only when asked to
    before: list[str] = list(VolumeDataset(volume, cache, min_free_bytes=0, in_place=False))
    monkeypatch.setattr(dataset_module, "boot_id", lambda: "the next boot")
    after: list[str] = list(VolumeDataset(volume, cache, min_free_bytes=0, in_place=False))
    assert Path(before[0]).parent != Path(after[0]).parent
    assert Path(after[0]).read_bytes() == b"a" * 1024
