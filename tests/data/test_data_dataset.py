"""VolumeDataset listing, caching, transforms, position bookkeeping and bad input, against a
local directory and the moto S3 server."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest
from data_support import FreezableProxy, Storage

from serverless_gpu.data import (
    CheckpointMismatchError,
    EmptyVolumeError,
    PositionUnknownError,
    VolumeDataset,
    VolumeError,
    VolumeNotFoundError,
    VolumeReadError,
    list_volume,
)


def make(storage: Storage, tmp_path: Path, relpath: str = "vol", **kwargs: Any) -> VolumeDataset:
    kwargs.setdefault("min_free_bytes", 0)
    return VolumeDataset(
        storage.url(relpath), tmp_path / "cache", storage_options=storage.storage_options, **kwargs
    )


def fill(storage: Storage, count: int, relpath: str = "vol") -> list[str]:
    names = [f"item_{i:02d}.txt" for i in range(count)]
    for name in names:
        storage.write(f"{relpath}/{name}", f"payload {name}".encode())
    return names


def test_listing_sorted_recursive_glob_and_hidden(storage: Storage) -> None:
    for rel in ["b.bin", "a.bin", "c.txt", "sub/d.bin", "sub/deeper/e.bin", ".hidden.bin"]:
        storage.write(f"vol/{rel}", b"x" * len(rel))
    url, opts = storage.url("vol"), storage.storage_options
    flat = list_volume(url, storage_options=opts)
    assert [f.relpath for f in flat] == ["a.bin", "b.bin", "c.txt"]
    assert [f.size for f in flat] == [5, 5, 5]
    deep = list_volume(url, recursive=True, glob="*.bin", storage_options=opts)
    assert [f.relpath for f in deep] == ["a.bin", "b.bin", "sub/d.bin", "sub/deeper/e.bin"]


def test_missing_and_empty_volumes_are_clear_errors(storage: Storage, tmp_path: Path) -> None:
    with pytest.raises(VolumeNotFoundError):
        make(storage, tmp_path, "does-not-exist")
    fill(storage, 2)
    with pytest.raises(EmptyVolumeError):
        make(storage, tmp_path, glob="*.nothing")
    if storage.kind == "local":  # object stores have no empty directories
        (Path(storage.root) / "empty").mkdir()
        with pytest.raises(EmptyVolumeError):
            make(storage, tmp_path, "empty")
    assert issubclass(EmptyVolumeError, VolumeError)


@pytest.mark.timeout(60)
def test_yields_cached_paths_and_transformed_items(storage: Storage, tmp_path: Path) -> None:
    names = fill(storage, 5)
    # A local volume on the cache's file system is read in place unless asked otherwise.
    copy: dict[str, Any] = {"in_place": False} if storage.kind == "local" else {}
    paths = list(make(storage, tmp_path, **copy))
    assert [os.path.basename(p) for p in paths] == names
    assert all(Path(p).is_relative_to(tmp_path / "cache") for p in paths)
    assert [Path(p).read_bytes() for p in paths] == [f"payload {n}".encode() for n in names]

    decoded = make(storage, tmp_path, transform=lambda p: Path(p).read_text().upper(), **copy)
    loader = decoded.loader(batch_size=2, num_workers=2)
    got = sorted(item for batch in loader for item in batch)
    assert got == sorted(f"PAYLOAD {n.upper()}" for n in names)

    # The second pass is served from the cache: the volume can disappear meanwhile.
    storage.fs.rm(storage.url("vol"), recursive=True)
    again = sorted(item for batch in loader for item in batch)
    assert again == got


@pytest.mark.timeout(60)
def test_unreadable_file_raises_through_dataloader_workers(
    storage: Storage, tmp_path: Path
) -> None:
    names = fill(storage, 6)
    dataset = make(storage, tmp_path)
    storage.fs.rm(storage.url("vol", names[3]))  # listed, then gone: unreadable
    with pytest.raises(VolumeReadError, match=names[3]):
        for _ in dataset.loader(batch_size=1, num_workers=2):
            pass


def test_file_changed_after_listing_is_an_error(storage: Storage, tmp_path: Path) -> None:
    names = fill(storage, 2)
    dataset = make(storage, tmp_path)
    storage.write(f"vol/{names[0]}", b"a different length now")
    with pytest.raises(VolumeReadError):
        list(dataset)


def test_position_bookkeeping_errors(storage: Storage, tmp_path: Path) -> None:
    fill(storage, 6)
    dataset = make(storage, tmp_path, shuffle=True, seed=1)
    with pytest.raises(PositionUnknownError):
        dataset.state_dict()
    loader = dataset.loader(batch_size=2)
    iterator = iter(loader)
    next(iterator)
    state = dataset.state_dict()
    assert (state["epoch"], state["batches_consumed"]) == (0, 1)
    del iterator

    with pytest.raises(CheckpointMismatchError):
        make(storage, tmp_path, shuffle=True, seed=2).load_state_dict(state)
    storage.write("vol/item_99.txt", b"new file")
    with pytest.raises(CheckpointMismatchError):
        make(storage, tmp_path, shuffle=True, seed=1).load_state_dict(state)

    other = make(storage, tmp_path, shuffle=True, seed=1, glob="item_0*")
    other.load_state_dict(state)
    with pytest.raises(CheckpointMismatchError):  # a differently batched loader cannot resume
        next(iter(other.loader(batch_size=3)))

    with pytest.raises(ValueError, match="in_order"):
        dataset.loader(batch_size=2, num_workers=1, in_order=False)


def test_epochs_advance_instead_of_silently_empty(storage: Storage, tmp_path: Path) -> None:
    fill(storage, 4)
    dataset = make(storage, tmp_path, shuffle=True)
    loader = dataset.loader(batch_size=2)
    first = [p for b in loader for p in b]
    second = [p for b in loader for p in b]  # no set_epoch: next epoch, not an empty one
    assert dataset.epoch == 1
    assert sorted(first) == sorted(second) and len(second) == 4


def test_no_batch_for_a_rank_is_an_error(storage: Storage, tmp_path: Path) -> None:
    fill(storage, 1)
    dataset = make(storage, tmp_path, rank=1, world_size=2, balance="drop")
    with pytest.raises(EmptyVolumeError):
        next(iter(dataset.loader(batch_size=1)))


@pytest.mark.parametrize("path", ["", "  "])
def test_an_empty_path_is_refused_not_read_as_the_working_directory(
    path: str, tmp_path: Path
) -> None:
    with pytest.raises(VolumeNotFoundError, match="empty"):
        VolumeDataset(path, tmp_path / "cache")


@pytest.mark.timeout(90)
def test_a_file_vanishing_mid_epoch_stops_the_loop_at_that_file(
    storage: Storage, tmp_path: Path
) -> None:
    names = fill(storage, 40)
    loader = make(storage, tmp_path, prefetch=2).loader(batch_size=1, num_workers=2)
    batches = iter(loader)
    received = [next(batches)[0]]
    storage.fs.rm(storage.url("vol", names[-1]))  # the last file of worker 1, read last
    with pytest.raises(VolumeReadError, match=names[-1]):
        for batch in batches:
            received.append(batch[0])
    # Every file before it reached the loop: nothing skipped, only the vanished file missing.
    assert sorted(os.path.basename(p) for p in received) == names[:-1]


@pytest.mark.timeout(60)
def test_an_s3_server_that_stops_answering_is_an_error_naming_the_file(
    s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVERLESS_GPU_VOLUME_TIMEOUT", "1")
    monkeypatch.setenv("SERVERLESS_GPU_VOLUME_TRIES", "2")
    host, port = s3_endpoint.removeprefix("http://").split(":")
    proxy = FreezableProxy((host, int(port)))
    try:
        fs = fsspec.filesystem("s3", skip_instance_cache=True, endpoint_url=s3_endpoint)
        bucket = f"frozen-{uuid.uuid4().hex[:12]}"
        fs.mkdir(bucket)
        for i in range(3):
            fs.pipe_file(f"{bucket}/vol/item_{i}.bin", b"x" * 1000)
        options = {"endpoint_url": proxy.endpoint}
        url = f"s3://{bucket}/vol"
        dataset: VolumeDataset[str] = VolumeDataset(
            url, tmp_path / "cache", prefetch=0, storage_options=options
        )
        items = iter(dataset.loader(batch_size=1, num_workers=0))
        next(items)
        proxy.freeze()
        with pytest.raises(VolumeReadError, match=r"item_1\.bin.*2 tries"):
            next(items)
        with pytest.raises(VolumeReadError, match=f"cannot list volume '{url}'"):
            VolumeDataset(url, tmp_path / "cache", storage_options=options)
    finally:
        proxy.close()


def test_a_small_object_is_fetched_in_one_request(
    s3_endpoint: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cold read of an object of a few MiB is one ranged GET, not a HEAD for its size and
    then a GET: on an object store the request count, not the bytes, bounds small files. The
    moto server's own request log counts what reached it."""
    options = {"endpoint_url": s3_endpoint}
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    sizes = {"a.bin": 256 << 10, "b.bin": 3 << 20, "c.bin": 1}
    for name, size in sizes.items():
        fs.pipe_file(f"{bucket}/vol/{name}", os.urandom(size))
    ds: VolumeDataset[str] = VolumeDataset(
        f"s3://{bucket}/vol", tmp_path / "cache", storage_options=options, min_free_bytes=0
    )
    with caplog.at_level("INFO", logger="werkzeug"):
        # In DataLoader workers: a worker's S3 client is its own, without the listing's sizes.
        paths = [p for batch in ds.loader(batch_size=1, num_workers=2) for p in batch]
    assert sorted(Path(p).stat().st_size for p in paths) == sorted(sizes.values())
    lines = [r.getMessage() for r in caplog.records if r.name == "werkzeug"]
    for name in sizes:
        mine = [line for line in lines if f"/vol/{name} " in line]
        assert len(mine) == 1 and "GET /" in mine[0], (name, mine)


@pytest.mark.timeout(60)
def test_a_local_volume_on_the_caches_file_system_is_read_in_place(tmp_path: Path) -> None:
    """No copy where a copy gains nothing: the paths are the volume's own, every path handed
    out is checked against its listing at its turn, and the cache folder stays empty."""
    volume = tmp_path / "vol"
    volume.mkdir()
    for i in range(6):
        (volume / f"{i}.bin").write_bytes(bytes([i]) * (100 + i))
    cache = tmp_path / "cache"
    ds = VolumeDataset(volume, cache, min_free_bytes=0, transform=lambda p: p)
    assert ds.in_place
    got = sorted(p for batch in ds.loader(batch_size=2, num_workers=2) for p in batch)
    assert got == sorted(str(volume / f"{i}.bin") for i in range(6))
    assert not any(p.is_file() for p in cache.rglob("*"))

    listed: VolumeDataset[str] = VolumeDataset(volume, cache, min_free_bytes=0)
    (volume / "2.bin").unlink()  # deleted after the listing: an error naming it, in the loop
    seen: list[str] = []
    with pytest.raises(VolumeReadError, match=r"2\.bin") as err:
        seen.extend(listed)
    assert "No such file" in str(err.value)
    assert seen == [str(volume / f"{i}.bin") for i in range(2)], "every file before it came"
    (volume / "2.bin").write_bytes(b"longer than it was")
    with pytest.raises(VolumeReadError, match="listed 102"):
        list(listed)

    assert not VolumeDataset(volume, cache, in_place=False).in_place
    remote = f"memory://{uuid.uuid4().hex}"
    fsspec.filesystem("memory").pipe_file(f"{remote}/a.bin", b"a")
    with pytest.raises(ValueError, match="local directory"):
        VolumeDataset(remote, cache, in_place=True)


def test_read_in_place_through_a_transform_checks_a_file_when_the_transform_fails(
    tmp_path: Path,
) -> None:
    """With a transform (which opens the file anyway) a file is checked only when it fails: a
    vanished or resized file is a ``VolumeReadError`` naming it, raised from the transform's
    error; the transform's own error on a file still as listed comes through as it is."""
    volume = tmp_path / "vol"
    volume.mkdir()
    for i in range(6):
        (volume / f"{i}.bin").write_bytes(bytes([i]) * (100 + i))

    def strict(path: str) -> bytes:
        data = Path(path).read_bytes()
        if len(data) < 100:
            raise ValueError(f"a short sample: {len(data)} bytes")
        return data

    cache = tmp_path / "cache"
    ds = VolumeDataset(volume, cache, min_free_bytes=0, transform=strict)
    assert ds.in_place
    (volume / "2.bin").unlink()
    seen: list[bytes] = []
    with pytest.raises(VolumeReadError, match=r"2\.bin") as err:
        seen.extend(ds)
    assert isinstance(err.value.__cause__, FileNotFoundError)
    assert seen == [bytes([i]) * (100 + i) for i in range(2)], "every file before it came"

    (volume / "2.bin").write_bytes(b"short")
    with pytest.raises(VolumeReadError, match="listed 102") as err:
        list(ds)
    assert isinstance(err.value.__cause__, ValueError)
    # Rewritten to another size and read without error: read as it is now.
    lenient = VolumeDataset(
        volume, cache, min_free_bytes=0, transform=lambda p: Path(p).read_bytes()
    )
    (volume / "2.bin").write_bytes(b"rewritten")
    assert list(lenient)[2] == b"rewritten"

    def picky(path: str) -> str:
        if path.endswith("4.bin"):
            raise ValueError("not this one")
        return path

    with pytest.raises(ValueError, match="not this one"):
        list(VolumeDataset(volume, cache, min_free_bytes=0, transform=picky))


def test_a_local_volume_on_another_file_system_is_copied(tmp_path: Path) -> None:
    """A mount (network, FUSE, tmpfs) is another file system than the cache's: its files are
    copied, as they would be from an object store."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second file system here")
    volume = Path(tempfile.mkdtemp(dir=shm, prefix="sgpu-test-vol-"))
    try:
        (volume / "a.bin").write_bytes(b"a" * 64)
        ds: VolumeDataset[str] = VolumeDataset(volume, tmp_path / "cache", min_free_bytes=0)
        assert not ds.in_place
        (path,) = list(ds)
        assert Path(path).is_relative_to(tmp_path / "cache")
    finally:
        shutil.rmtree(volume, ignore_errors=True)


def test_a_large_object_comes_in_ranged_requests_at_once(
    s3_endpoint: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An object over the one-request size is fetched in parts, several requests at once (one
    connection to an object store moves tens of MB/s), and arrives whole; one that grew after
    the listing is an error naming it, as a small one is."""
    options = {"endpoint_url": s3_endpoint}
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    big = os.urandom((16 << 20) + (5 << 20) + 7)  # 3 parts of 8 MiB, the last one short
    fs.pipe_file(f"{bucket}/vol/big.bin", big)
    ds: VolumeDataset[str] = VolumeDataset(
        f"s3://{bucket}/vol", tmp_path / "cache", storage_options=options, min_free_bytes=0
    )
    with caplog.at_level("INFO", logger="werkzeug"):
        [path] = [p for batch in ds.loader(batch_size=1, num_workers=1) for p in batch]
    assert Path(path).read_bytes() == big
    lines = [r.getMessage() for r in caplog.records if r.name == "werkzeug"]
    mine = [line for line in lines if "/vol/big.bin " in line]
    assert len(mine) == 3 and all("GET /" in line for line in mine), mine

    fs.pipe_file(f"{bucket}/vol/big.bin", big + b"grown")
    grown: VolumeDataset[str] = VolumeDataset(
        f"s3://{bucket}/vol", tmp_path / "cache2", storage_options=options, min_free_bytes=0
    )
    fs.pipe_file(f"{bucket}/vol/big.bin", big + b"grown more")  # after the listing
    with pytest.raises(VolumeReadError, match=r"big\.bin.*longer than"):
        list(grown)
