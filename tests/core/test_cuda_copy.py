"""The CPU-visible parts of copying a result's CUDA storages into its file: how storages are
grouped and chunked, and that small ones take torch's plain copy without any CUDA set-up (the
fast ways themselves need a GPU: ``scripts/cuda_copy_check.py``)."""

from __future__ import annotations

import itertools

import pytest
import torch

from serverless_gpu import cuda_copy


def _byte_tensor(n: int, seed: int) -> torch.Tensor:
    return torch.randint(
        0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )


def test_adjacent_storages_form_one_run() -> None:
    # As the writer lays them out: each storage starts on a page; a storage between two others
    # takes at least one page of its own.
    a, b, c = _byte_tensor(5000, 0), _byte_tensor(100, 1), _byte_tensor(10, 2)
    runs = list(cuda_copy._runs([(40960, c), (0, a), (8192, b)]))
    assert [[offset for offset, _ in run] for run in runs] == [[0, 8192], [40960]]
    assert cuda_copy._span(runs[0]) == (0, 8292)


def test_chunks_cover_every_byte_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_copy, "CHUNK_BYTES", 16)
    a, b = _byte_tensor(40, 0), _byte_tensor(16, 1)
    chunks = list(cuda_copy._chunks([(0, a), (4096, b)]))
    assert [(offset, src.numel()) for offset, src in chunks] == [
        (0, 16),
        (16, 16),
        (32, 8),
        (4096, 16),
    ]
    assert torch.equal(torch.cat([src for _, src in chunks[:3]]), a)


def test_small_runs_take_the_plain_copy_without_cuda() -> None:
    into = torch.zeros(3 * 4096, dtype=torch.uint8)
    a, b = _byte_tensor(5000, 0), _byte_tensor(100, 1)
    assert cuda_copy.copy_into(into, [(0, a), (8192, b)], torch) == ["plain"]
    assert torch.equal(into[:5000], a) and torch.equal(into[8192:8292], b)
    assert not into[5000:8192].any()
    assert not torch.cuda.is_initialized()


def test_registration_pieces_are_page_aligned_and_cover_the_range() -> None:
    end = 10 * 4096 + 5
    pieces = cuda_copy._pieces(0, end)
    assert len(pieces) == cuda_copy.REGISTER_THREADS
    assert pieces[0][0] == 0 and pieces[-1][1] == end
    assert all(a % 4096 == 0 and a < b for a, b in pieces)
    assert all(b == c for (_, b), (c, _) in itertools.pairwise(pieces))
    assert cuda_copy._pieces(4096, 4196) == [(4096, 4196)]  # too small to share out


def test_parts_are_split_where_registrations_meet() -> None:
    a, b = _byte_tensor(10, 0), _byte_tensor(5000, 1)
    split = list(cuda_copy._split([(0, a), (4096, b)], [8192]))
    assert [(offset, src.numel()) for offset, src in split] == [(0, 10), (4096, 4096), (8192, 904)]
    assert torch.equal(torch.cat([src for _, src in split[1:]]), b)
