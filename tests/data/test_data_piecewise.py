"""Large writes reach the kernel in pieces of at most ``PIECE`` bytes: the cache's copies and
the checkpoint's shards (see :mod:`serverless_gpu.data.piecewise` for why). The count of
``write`` calls is the kernel's own, from ``/proc/self/io``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import pytest
import torch
import torch.distributed.checkpoint as dcp

from serverless_gpu.data import LocalCache, VolumeReader, VolumeWriter, piecewise
from serverless_gpu.data.piecewise import PIECE, open_piecewise

MiB = 1 << 20


def write_calls() -> int:
    """This process's ``write``-family system calls so far."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("syscw:"):
            return int(line.split()[1])
    raise AssertionError("no syscw line in /proc/self/io")


def test_open_piecewise_writes_everything_in_pieces(tmp_path: Path) -> None:
    data = os.urandom(3 * MiB + 123)
    before = write_calls()
    with open_piecewise(tmp_path / "f", "wb") as out:
        assert out.write(data) == len(data)
        out.write(b"tail")
    calls = write_calls() - before
    assert (tmp_path / "f").read_bytes() == data + b"tail"
    assert calls >= len(data) // PIECE, f"{calls} write calls for {len(data)} bytes"


def test_open_piecewise_is_for_writing_only(tmp_path: Path) -> None:
    for mode in ("rb", "r+b", "w"):
        with pytest.raises(ValueError, match="writing only"):
            open_piecewise(tmp_path / "f", mode)


def test_a_cached_copy_reaches_the_kernel_in_pieces(tmp_path: Path) -> None:
    data = os.urandom(8 * MiB)

    def download(out: BinaryIO) -> None:
        out.write(data)  # one call, as a ranged GET's whole part comes

    cache = LocalCache(tmp_path / "cache", min_free_bytes=0, durable=False)
    before = write_calls()
    with cache.acquire("big.bin", len(data), download) as pin:
        calls = write_calls() - before
        assert os.pread(pin.fileno(), len(data) + 1, 0) == data
    assert calls >= len(data) // PIECE, f"{calls} write calls for {len(data)} bytes"


def test_a_checkpoint_shard_reaches_the_kernel_in_pieces(tmp_path: Path) -> None:
    saved = {"w": torch.arange(2 * MiB, dtype=torch.float32)}  # 8 MiB
    before = write_calls()
    dcp.save(saved, storage_writer=VolumeWriter(str(tmp_path / "ckpt")), no_dist=True)
    calls = write_calls() - before
    assert calls >= 8 * MiB // PIECE, f"{calls} write calls for 8 MiB"
    loaded = {"w": torch.zeros(2 * MiB, dtype=torch.float32)}
    dcp.load(loaded, storage_reader=VolumeReader(str(tmp_path / "ckpt")), no_dist=True)
    assert torch.equal(loaded["w"], saved["w"])


@pytest.fixture
def write_backs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """Every ``sync_file_range`` call ``open_piecewise`` makes from now on, each still made."""
    real = piecewise._sync_file_range()
    if real is None:
        pytest.skip("no sync_file_range here (not Linux)")
    calls: list[tuple[int, ...]] = []

    def counted(*args: int) -> int:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(piecewise, "_sync_file_range", lambda: counted)
    return calls


def test_write_behind_starts_write_back_every_8_mib(
    tmp_path: Path, write_backs: list[tuple[int, ...]]
) -> None:
    data = os.urandom(2 * piecewise.WRITE_BEHIND + 5)
    with open_piecewise(tmp_path / "plain") as out:
        out.write(data)
    assert write_backs == []  # only when asked for
    with open_piecewise(tmp_path / "f", write_behind=True) as out:
        out.write(data)
        fd = out.fileno()
        os.fsync(fd)
    assert (tmp_path / "f").read_bytes() == data
    # Offset 0, length 0, SYNC_FILE_RANGE_WRITE: all that is dirty, without waiting.
    assert write_backs == [(fd, 0, 0, 2), (fd, 0, 0, 2)]


def test_a_checkpoint_shard_starts_its_write_back_as_it_grows(
    tmp_path: Path, write_backs: list[tuple[int, ...]]
) -> None:
    saved = {"w": torch.arange(2 * MiB, dtype=torch.float32)}  # 8 MiB: one write-back
    dcp.save(saved, storage_writer=VolumeWriter(str(tmp_path / "ckpt")), no_dist=True)
    assert len(write_backs) >= 1
