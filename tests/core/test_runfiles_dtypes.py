"""Every dtype torch can save comes back from a rank's result file bit for bit, whichever writer
wrote it."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from serverless_gpu.runfiles import tensor_file
from serverless_gpu.runfiles.serialization import dump_result, load_result

DTYPES = sorted(
    {value for value in vars(torch).values() if isinstance(value, torch.dtype)}, key=str
)
QUANTIZED = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """Every byte of the tensor's storage, whatever its dtype."""
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())


def _random_tensor(dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    if dtype in QUANTIZED:
        return torch.quantize_per_tensor(torch.randn(96, generator=gen), 0.1, 3, dtype)
    t = torch.empty(96, dtype=dtype)
    raw = _bytes_of(t)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    return t


def _saveable(t: torch.Tensor) -> bool:
    try:
        torch.save(t, io.BytesIO())
    except (KeyError, RuntimeError):  # torch's own format has no code for this dtype
        return False
    return True


def _write_mapped(obj: Any, path: Path) -> None:
    tensor_file.dump(obj, path, torch, mapped=True)


def _write_plain(obj: Any, path: Path) -> None:
    tensor_file.dump(obj, path, torch, mapped=False)


WRITERS: dict[str, Callable[[Any, Path], None]] = {
    "mapped": _write_mapped,
    "write": _write_plain,
    "dump_result": dump_result,
}


@pytest.mark.parametrize("writer", list(WRITERS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_saveable_dtype_round_trips_bit_identically(
    tmp_path: Path, dtype: torch.dtype, writer: str
) -> None:
    base = _random_tensor(dtype)
    if not _saveable(base):
        pytest.skip(f"torch.save itself cannot write {dtype}")
    view = base[3:80:2]  # an offset and a stride into the same storage
    path = tmp_path / "result"
    WRITERS[writer]([base, view], path)
    loaded_base, loaded_view = load_result(path)
    for loaded, original in ((loaded_base, base), (loaded_view, view)):
        assert loaded.dtype == original.dtype
        assert loaded.shape == original.shape and loaded.stride() == original.stride()
        assert loaded.storage_offset() == original.storage_offset()
        assert torch.equal(_bytes_of(loaded), _bytes_of(original))
        if dtype in QUANTIZED:
            assert (loaded.q_scale(), loaded.q_zero_point()) == (
                original.q_scale(),
                original.q_zero_point(),
            )
    # Both still view one storage, as after torch.load.
    assert loaded_view.untyped_storage().data_ptr() == loaded_base.untyped_storage().data_ptr()
