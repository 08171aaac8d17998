"""VolumeDataset over tar shards (``shards="tar"``): samples by key, contiguous parts per rank
and worker, resume, the index file, one request per shard on S3, and bad shards; against a
local directory and the moto S3 server."""

from __future__ import annotations

import io
import os
import tarfile
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest
from data_support import Storage

from serverless_gpu.data import EmptyVolumeError, VolumeDataset, VolumeReadError
from serverless_gpu.data.shards import INDEX_NAME, write_tar_index

FIELDS = ("bin", "cls")


def tar_bytes(shard: int, samples: int, fields: tuple[str, ...] = FIELDS) -> bytes:
    """A shard of ``samples`` samples, each with ``fields``; every field's bytes name it."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for i in range(samples):
            for field in fields:
                data = f"{shard}/{i}.{field}".encode() * (i + 1)
                info = tarfile.TarInfo(f"s{shard:02d}-{i:03d}.{field}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def fill_shards(storage: Storage, counts: list[int], relpath: str = "shards") -> None:
    for shard, count in enumerate(counts):
        storage.write(f"{relpath}/shard-{shard:03d}.tar", tar_bytes(shard, count))


def make(storage: Storage, tmp_path: Path, **kwargs: Any) -> VolumeDataset[Any]:
    kwargs.setdefault("min_free_bytes", 0)
    return VolumeDataset(
        storage.url("shards"),
        tmp_path / "cache",
        storage_options=storage.storage_options,
        shards="tar",
        **kwargs,
    )


def keys(loader: Any) -> list[str]:
    return [key for batch in loader for key in batch["__key__"]]


def test_samples_are_grouped_by_key_with_every_field(storage: Storage, tmp_path: Path) -> None:
    fill_shards(storage, [3, 2])
    ds = make(storage, tmp_path)
    samples = list(ds.loader(batch_size=None))
    assert [s["__key__"] for s in samples] == [
        "s00-000", "s00-001", "s00-002", "s01-000", "s01-001"
    ]  # fmt: skip
    assert samples[4] == {"__key__": "s01-001", "bin": b"1/1.bin" * 2, "cls": b"1/1.cls" * 2}


def test_ranks_and_workers_read_contiguous_parts_once(storage: Storage, tmp_path: Path) -> None:
    """Every sample once over 3 ranks of 2 workers (balance="none"), and a rank fetches only
    the shards its part of the order lies in."""
    fill_shards(storage, [4, 4, 4, 4, 4, 4])  # 24 samples: 8 a rank, in two shards
    seen: list[str] = []
    for rank in range(3):
        ds = make(storage, tmp_path / str(rank), rank=rank, world_size=3, balance="none")
        mine = keys(ds.loader(batch_size=2, num_workers=2))
        assert {k[:3] for k in mine} == {f"s{2 * rank:02d}", f"s{2 * rank + 1:02d}"}
        if storage.kind == "s3":  # the remote shards this rank cached: its own two
            cached = {p.name for p in (tmp_path / str(rank) / "cache").rglob("*.tar")}
            assert cached == {f"shard-{2 * rank:03d}.tar", f"shard-{2 * rank + 1:03d}.tar"}
        seen += mine
    assert sorted(seen) == sorted(f"s{s:02d}-{i:03d}" for s in range(6) for i in range(4))


def test_shuffle_permutes_shards_and_samples_per_epoch(tmp_path: Path) -> None:
    storage = Storage("local", str(tmp_path / "vol"), {}, fsspec.filesystem("file"))
    fill_shards(storage, [8] * 6)
    ds = make(storage, tmp_path, shuffle=True, seed=3)
    loader = ds.loader(batch_size=4)
    first, second = keys(loader), keys(loader)
    assert sorted(first) == sorted(second) and first != second
    runs = [k[:3] for k in first]  # each shard's samples stay together
    assert len([i for i in range(1, len(runs)) if runs[i] != runs[i - 1]]) == 5
    again = make(storage, tmp_path, shuffle=True, seed=3)
    assert keys(again.loader(batch_size=4)) == first


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_gives_the_remaining_batches(
    storage: Storage, tmp_path: Path, workers: int
) -> None:
    fill_shards(storage, [5, 3, 7, 2])
    plain = make(storage, tmp_path / "a", shuffle=True)
    whole = keys(plain.loader(batch_size=3, num_workers=workers))
    ds = make(storage, tmp_path / "b", shuffle=True)
    batches = iter(ds.loader(batch_size=3, num_workers=workers))
    head = [k for _ in range(2) for k in next(batches)["__key__"]]
    state = ds.state_dict()
    del batches
    resumed = make(storage, tmp_path / "c", shuffle=True)
    resumed.load_state_dict(state)
    assert head + keys(resumed.loader(batch_size=3, num_workers=workers)) == whole


def test_the_index_file_spares_reading_the_shards(tmp_path: Path) -> None:
    """With the index written, construction reads no shard (one overwritten with noise of the
    same size goes unnoticed until its turn); a shard whose size changed since is indexed
    again, and without the index the noise is found at construction."""
    storage = Storage("local", str(tmp_path / "vol"), {}, fsspec.filesystem("file"))
    fill_shards(storage, [2, 2])
    index_url = write_tar_index(storage.url("shards"))
    assert index_url.endswith(f"/shards/{INDEX_NAME}")
    first = Path(storage.url("shards", "shard-000.tar"))
    first.write_bytes(os.urandom(first.stat().st_size))
    assert len(make(storage, tmp_path).samples or []) == 4
    Path(storage.url("shards", INDEX_NAME)).unlink()
    with pytest.raises(VolumeReadError, match=r"shard-000\.tar is not a readable tar shard"):
        make(storage, tmp_path)
    first.write_bytes(tar_bytes(0, 3))
    write_tar_index(storage.url("shards"))
    first.write_bytes(tar_bytes(0, 5))  # a new size: its entry no longer fits
    assert keys(make(storage, tmp_path).loader(batch_size=2))[:5] == [
        f"s00-{i:03d}" for i in range(5)
    ]


def test_a_cold_epoch_asks_s3_once_per_shard(
    s3_endpoint: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    options = {"endpoint_url": s3_endpoint}
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    storage = Storage("s3", f"s3://{bucket}", options, fs)
    fs.mkdir(bucket)
    fill_shards(storage, [40, 40, 40])
    write_tar_index(storage.url("shards"), options)
    ds = make(storage, tmp_path)
    with caplog.at_level("INFO", logger="werkzeug"):
        assert len(keys(ds.loader(batch_size=8, num_workers=2))) == 120
    lines = [r.getMessage() for r in caplog.records if r.name == "werkzeug"]
    for shard in range(3):
        mine = [line for line in lines if f"/shard-{shard:03d}.tar " in line]
        assert len(mine) == 1 and "GET /" in mine[0], (shard, mine)


def test_a_truncated_shard_is_an_error_naming_it(storage: Storage, tmp_path: Path) -> None:
    fill_shards(storage, [3])
    # The second member's header, then 5 of its data bytes.
    storage.write("shards/shard-001.tar", tar_bytes(1, 4)[: 3 * 512 + 5])
    with pytest.raises(VolumeReadError, match=r"shard-001\.tar is not a readable tar shard"):
        make(storage, tmp_path)


def test_a_shard_rewritten_after_listing_is_an_error(storage: Storage, tmp_path: Path) -> None:
    fill_shards(storage, [3, 3])
    ds = make(storage, tmp_path)
    storage.write("shards/shard-001.tar", tar_bytes(1, 5))
    with pytest.raises(VolumeReadError, match="the file changed after the dataset listed"):
        keys(ds.loader(batch_size=2))


def test_a_volume_without_shards_or_samples_is_refused(tmp_path: Path) -> None:
    storage = Storage("local", str(tmp_path / "vol"), {}, fsspec.filesystem("file"))
    storage.write("shards/notes.txt", b"not a shard")
    with pytest.raises(EmptyVolumeError, match=r"has no files matching '\*\.tar'"):
        make(storage, tmp_path)
    storage.write("shards/empty.tar", tar_bytes(0, 0))
    with pytest.raises(EmptyVolumeError, match="hold no regular file"):
        make(storage, tmp_path)
    with pytest.raises(ValueError, match="shards must be None or 'tar'"):
        VolumeDataset(storage.url("shards"), shards="zip")  # type: ignore[arg-type]
