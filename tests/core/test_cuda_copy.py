"""The CPU-visible parts of writing a result file fast: the file's pages reserved chunk by chunk
in the background while the stores wait for their chunk, and CUDA storages' copies, whose
small or plain cases need no CUDA set-up (the staged copy itself needs a GPU:
``scripts/cuda_copy_check.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from serverless_gpu.runfiles import cuda_copy, file_space, tensor_file
from serverless_gpu.runfiles.serialization import load_result


def _bytes(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)


def test_pieces_cover_a_storage_chunk_by_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_space, "CHUNK_BYTES", 16)
    src = _bytes(40, 0)
    pieces = list(file_space.pieces(4096, src))
    assert [(offset, piece.numel()) for offset, piece in pieces] == [
        (4096, 16),
        (4112, 16),
        (4128, 8),
    ]
    assert torch.equal(torch.cat([piece for _, piece in pieces]), src)


def test_reservation_backs_the_whole_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_space, "CHUNK_BYTES", 64 << 10)
    nbytes = (1 << 20) + 123
    with open(tmp_path / "f", "wb") as f:
        f.truncate(nbytes)
        with file_space.Reservation(f.fileno(), nbytes) as reserved:
            assert reserved.supported
            reserved.wait(nbytes)
            assert reserved.reserved == nbytes
    assert os.stat(tmp_path / "f").st_blocks * 512 >= nbytes


def test_small_cuda_parts_take_the_plain_copy_without_cuda() -> None:
    into = torch.zeros(3 * 4096, dtype=torch.uint8)
    a, b = _bytes(5000, 0), _bytes(100, 1)
    waited: list[int] = []
    assert cuda_copy.copy_into(into, [(0, a), (8192, b)], torch, waited.append) == "plain"
    assert waited == [5000, 8292]  # each store waited for the pages under it
    assert torch.equal(into[:5000], a) and torch.equal(into[8192:8292], b)
    assert not into[5000:8192].any()
    assert not torch.cuda.is_initialized()


def test_a_result_larger_than_a_chunk_round_trips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(file_space, "CHUNK_BYTES", 64 << 10)
    original = {"big": torch.randn(300_000), "small": torch.arange(7), "tail": torch.ones(5)}
    path = tmp_path / "result"
    tensor_file.dump(original, path, torch, mapped=True)
    loaded = load_result(path)
    assert all(torch.equal(loaded[k], v) for k, v in original.items())
