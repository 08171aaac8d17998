"""Checkpoints that cannot silently load damaged data: a checksum per shard (XXH3-64 with
xxhash installed, else crc32; each checked with the algorithm its writer used), checked on load
and by latest_checkpoint; a damaged .metadata, a full disk and a second writer of one step, each
said as its cause with its path."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from data_support import Storage
from torch.distributed.checkpoint.api import CheckpointException

from serverless_gpu.data import VolumeReader, VolumeWriter, checkpoint_path, latest_checkpoint
from serverless_gpu.data.shard_checksums import recorded


@pytest.fixture(params=["xxh3_64", "crc32"])
def checksum(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The algorithm saves record: XXH3-64 with xxhash installed; crc32 where ``import
    xxhash`` fails (as without the package)."""
    if request.param == "xxh3_64":
        pytest.importorskip("xxhash")
    else:
        monkeypatch.setitem(sys.modules, "xxhash", None)  # None in sys.modules: ImportError
    return str(request.param)


def algorithms(path: str, opts: dict[str, str] | None = None) -> set[str]:
    """The algorithms the checkpoint's ``.metadata`` records for its shards."""
    infos = VolumeReader(path, storage_options=opts).read_metadata().storage_data.values()
    return {found.algorithm for found in map(recorded, infos) if found is not None}


def state(seed: int, numel: int = 1 << 16) -> dict[str, torch.Tensor]:
    return {"w": torch.rand(numel, generator=torch.Generator().manual_seed(seed))}


def load(path: str, opts: dict[str, str] | None = None, **kwargs: bool) -> torch.Tensor:
    into = {"w": torch.zeros(1 << 16)}
    reader = VolumeReader(path, storage_options=opts, **kwargs)
    dcp.load(into, storage_reader=reader)
    return into["w"]


@pytest.mark.timeout(60)
def test_flipped_bytes_name_the_shard_and_step_and_latest_passes_over_them(
    storage: Storage, checksum: str
) -> None:
    root, opts = storage.url("run"), storage.storage_options
    for step in (1, 2):
        writer = VolumeWriter(checkpoint_path(root, step), storage_options=opts)
        dcp.save(state(step), storage_writer=writer)
    assert algorithms(checkpoint_path(root, 2), opts) == {checksum}
    shard = f"{checkpoint_path(root, 2)}/__0_0.distcp"
    data = bytearray(storage.fs.cat_file(shard))
    data[len(data) // 2 : len(data) // 2 + 64] = b"\xff" * 64  # inside the tensor's bytes
    storage.fs.pipe_file(shard, bytes(data))

    # dcp.load wraps every rank's error in its own CheckpointException; the message is ours.
    with pytest.raises(CheckpointException, match=r"__0_0\.distcp of step step_000000002 does"):
        load(checkpoint_path(root, 2), opts)
    assert not torch.equal(load(checkpoint_path(root, 2), opts, verify=False), state(2)["w"])
    with pytest.warns(UserWarning, match="passing over the damaged checkpoint"):
        assert latest_checkpoint(root, opts) == checkpoint_path(root, 1)
    assert torch.equal(load(checkpoint_path(root, 1), opts), state(1)["w"])


def flip(shard: Path) -> None:
    data = bytearray(shard.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = b"\xff" * 64
    shard.write_bytes(bytes(data))


@pytest.mark.timeout(60)
def test_a_crc32_checkpoint_is_checked_with_crc32_where_xxhash_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("xxhash")
    root = str(tmp_path)
    with monkeypatch.context() as hidden:
        hidden.setitem(sys.modules, "xxhash", None)
        for step in (1, 2):
            dcp.save(state(step), storage_writer=VolumeWriter(checkpoint_path(root, step)))
    assert algorithms(checkpoint_path(root, 1)) == {"crc32"}
    assert torch.equal(load(checkpoint_path(root, 1)), state(1)["w"])
    flip(Path(checkpoint_path(root, 2)) / "__0_0.distcp")
    with pytest.raises(CheckpointException, match=r"crc32 [0-9a-f]{8}; saved: \d+ bytes, crc32"):
        load(checkpoint_path(root, 2))


@pytest.mark.timeout(60)
def test_a_checkpoint_of_the_older_format_is_still_checked(tmp_path: Path) -> None:
    """Saves before the algorithm was recorded noted ``shard_crc32 = (size, crc32)``."""
    root = str(tmp_path)
    for step in (1, 2):
        dcp.save(state(step), storage_writer=VolumeWriter(checkpoint_path(root, step)))
        metadata = Path(checkpoint_path(root, step)) / ".metadata"
        loaded = pickle.loads(metadata.read_bytes())
        for info in loaded.storage_data.values():
            size = info.shard_checksum[0]
            del info.shard_checksum
            with (Path(checkpoint_path(root, step)) / info.relative_path).open("rb") as shard:
                info.shard_crc32 = (size, zlib.crc32(shard.read()))
        metadata.write_bytes(pickle.dumps(loaded))
    assert algorithms(checkpoint_path(root, 1)) == {"crc32"}
    assert torch.equal(load(checkpoint_path(root, 1)), state(1)["w"])
    flip(Path(checkpoint_path(root, 2)) / "__0_0.distcp")
    with pytest.raises(CheckpointException, match=r"does not match what was saved"):
        load(checkpoint_path(root, 2))
    with pytest.warns(UserWarning, match="passing over the damaged checkpoint"):
        assert latest_checkpoint(root) == checkpoint_path(root, 1)


@pytest.mark.timeout(60)
def test_an_xxh3_checkpoint_loads_unchecked_with_a_warning_without_xxhash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("xxhash")
    path = checkpoint_path(str(tmp_path), 1)
    dcp.save(state(1), storage_writer=VolumeWriter(path))
    monkeypatch.setitem(sys.modules, "xxhash", None)
    with pytest.warns(UserWarning, match="saved with a xxh3_64 checksum, which needs the xxhash"):
        assert torch.equal(load(path), state(1)["w"])


@pytest.mark.timeout(60)
def test_a_truncated_metadata_is_damaged_not_missing(tmp_path: Path) -> None:
    root = str(tmp_path)
    for step in (1, 2):
        dcp.save(state(step), storage_writer=VolumeWriter(checkpoint_path(root, step)))
    metadata = Path(checkpoint_path(root, 2)) / ".metadata"
    os.truncate(metadata, metadata.stat().st_size // 2)
    with pytest.raises(CheckpointException) as raised:
        load(checkpoint_path(root, 2))
    assert f"{metadata} is damaged" in str(raised.value)
    assert "has no .metadata" not in str(raised.value)
    with pytest.warns(UserWarning, match=f"{metadata} is damaged"):
        assert latest_checkpoint(root) == checkpoint_path(root, 1)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)])
    if done.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (CI runs as root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.timeout(60)
def test_a_full_disk_is_named_and_the_previous_step_stays_intact(small_disk: Path) -> None:
    root = str(small_disk)
    dcp.save(state(1), storage_writer=VolumeWriter(checkpoint_path(root, 1)))
    with pytest.raises(CheckpointException) as raised:
        big = state(2, numel=2 << 20)  # 8 MiB on a 6 MiB disk
        dcp.save(big, storage_writer=VolumeWriter(checkpoint_path(root, 2)))
    assert f"no space left on {small_disk}" in str(raised.value)
    assert "the steps saved before it are intact" in str(raised.value)
    assert latest_checkpoint(root) == checkpoint_path(root, 1)
    assert torch.equal(load(checkpoint_path(root, 1)), state(1)["w"])


class _OtherWriter:
    """Pickled while its shard is written: deletes the folder's partial shards, as a second
    save into the same folder did with every one it found."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __reduce__(self) -> tuple[type[int], tuple[int]]:
        for name in os.listdir(self.folder):
            if name.endswith(".part"):
                os.unlink(os.path.join(self.folder, name))
        return int, (0,)


@pytest.mark.timeout(60)
def test_a_second_writer_of_one_step(tmp_path: Path) -> None:
    path = checkpoint_path(str(tmp_path), 1)
    os.makedirs(path)
    live = Path(path) / f".__1_0.distcp.{os.getpid()}.0123abcd.part"  # a live writer's
    live.write_bytes(b"being written")
    dcp.save(state(1), storage_writer=VolumeWriter(path))
    assert live.exists(), "a save deleted the partial shard of a writer still running"

    with pytest.raises(CheckpointException) as raised:
        dcp.save({"other": _OtherWriter(path)}, storage_writer=VolumeWriter(path))
    assert "of this save was deleted while it was written" in str(raised.value)
    assert f"another save into {path} ran at the same time" in str(raised.value)


def test_a_shard_written_out_of_order_is_summed_from_the_file(tmp_path: Path) -> None:
    """The sum is taken from the bytes as written; a seek back makes it re-read the file."""
    from serverless_gpu.data.piecewise import open_piecewise
    from serverless_gpu.data.shard_checksums import WrittenSum, algorithm, sum_of

    path = tmp_path / "shard"
    summed = WrittenSum(algorithm())
    with open_piecewise(path, "wb", on_bytes=summed.wrote) as stream:
        stream.write(b"a" * 1000)
        stream.seek(10)
        stream.write(b"b" * 10)
    with path.open("rb") as whole:
        assert summed.result(path) == sum_of(whole, algorithm())
