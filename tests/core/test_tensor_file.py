"""Results with tensors: the mapped tensor file, both writers, and what a rank hands back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from serverless_gpu import distributed
from serverless_gpu.runfiles import tensor_file
from serverless_gpu.runfiles.serialization import dump_result, load_result


def _sample() -> dict[str, Any]:
    base = torch.arange(10, dtype=torch.float32)
    return {
        "base": base,
        "view": base[2:5],
        "transposed": torch.ones(3, 4, dtype=torch.bfloat16).t(),
        "int64": torch.tensor([1, 2], dtype=torch.int64),
        "bool": torch.tensor([True, False]),
        "empty": torch.empty(0),
        "param": torch.nn.Parameter(torch.randn(2, 2)),
        "sparse": torch.eye(3).to_sparse(),
        "state": torch.nn.Linear(4, 2).state_dict(),
        "untyped": torch.full((8,), 7, dtype=torch.uint8).untyped_storage(),
        "meta": torch.ones(2, device="meta"),
        "plain": ("text", 3),
    }


def _assert_same(loaded: dict[str, Any], original: dict[str, Any]) -> None:
    for key in ("base", "view", "transposed", "int64", "bool", "empty", "param"):
        assert type(loaded[key]) is type(original[key]), key
        assert loaded[key].dtype == original[key].dtype, key
        assert torch.equal(loaded[key], original[key]), key
    assert torch.equal(loaded["sparse"].to_dense(), original["sparse"].to_dense())
    assert all(torch.equal(loaded["state"][k], v) for k, v in original["state"].items())
    assert bytes(loaded["untyped"]) == bytes(original["untyped"])
    assert loaded["meta"].device.type == "meta" and loaded["meta"].shape == (2,)
    assert loaded["plain"] == ("text", 3)
    # A view still shares its base's storage, as with torch.save.
    shared = loaded["view"].untyped_storage(), loaded["base"].untyped_storage()
    assert shared[0].data_ptr() == shared[1].data_ptr()


@pytest.mark.parametrize("mapped", [True, False], ids=["mapped", "write"])
def test_tensor_file_round_trip(tmp_path: Path, mapped: bool) -> None:
    original = _sample()
    path = tmp_path / "result"
    tensor_file.dump(original, path, torch, mapped=mapped)
    assert tensor_file.is_tensor_file(path)
    loaded = load_result(path)
    path.unlink()  # the mapping keeps the pages
    _assert_same(loaded, original)


def test_mapped_writer_only_with_room_and_threads(tmp_path: Path) -> None:
    cpu = [(0, torch.UntypedStorage(8))]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        assert tensor_file.use_mapping(tmp_path / "r", cpu, 1 << 20, torch)
        # No room for every local rank's result: a full mapping would be SIGBUS, not ENOSPC.
        assert not tensor_file.use_mapping(tmp_path / "r", cpu, 1 << 60, torch)
        torch.set_num_threads(1)
        assert not tensor_file.use_mapping(tmp_path / "r", cpu, 1 << 20, torch)
    finally:
        torch.set_num_threads(threads)


def test_storages_are_page_aligned_and_stored_once(tmp_path: Path) -> None:
    big = torch.arange(1 << 20, dtype=torch.float32)
    path = tmp_path / "result"
    dump_result([big, big[::2]], path)
    a, b = load_result(path)
    assert a.data_ptr() % 4096 == 0
    assert torch.equal(b, big[::2])
    assert path.stat().st_size < big.nbytes + 2 * 4096  # one copy of the shared storage


def test_ranks_hand_back_tensor_dicts() -> None:
    @distributed(gpus=2, output="none")
    def make() -> dict[str, torch.Tensor]:
        from serverless_gpu import runtime

        rank = runtime.get_global_rank()
        weights = torch.full((256, 256), float(rank))
        return {"weights": weights, "row": weights[1], "step": torch.tensor(rank)}

    results = make.distributed()
    for rank, result in enumerate(results):
        assert torch.equal(result["weights"], torch.full((256, 256), float(rank)))
        assert torch.equal(result["row"], torch.full((256,), float(rank)))
        assert int(result["step"]) == rank
