"""Results of remote calls: a rank on the caller's machine writes its result into the call's
results twin and the caller maps it (no object store); elsewhere the object store carries it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import ray_fns
import torch
from conftest import leftovers
from eventually import eventually

from serverless_gpu import distributed
from serverless_gpu.backends.ray import results
from serverless_gpu.runfiles.rundirs import RESULTS_DIR_ENV

pytestmark = pytest.mark.usefixtures("cluster", "untracked")
MIB = 64


@pytest.fixture
def twins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The results twins' root, under the test's tmp dir."""
    root = tmp_path / "twins"
    monkeypatch.setenv(RESULTS_DIR_ENV, str(root))
    return root


def _mapped_files() -> str:
    return Path("/proc/self/maps").read_text()


def test_a_large_tensor_result_is_mapped_from_the_callers_twin(twins: Path) -> None:
    fn = distributed(gpus=1, gpu_type="cpu", remote=True, timeout=180)(ray_fns.tensor_of)

    out = fn.distributed(MIB)

    assert torch.equal(out[0], torch.arange(MIB * 2**18, dtype=torch.float32))
    # The value is a view of the rank's file, mapped by the caller (the twin is gone since).
    assert f"{twins / out.run_dir.name}/result_0.pkl" in _mapped_files()
    assert not (twins / out.run_dir.name).exists(), "the twin is removed once read"
    assert leftovers() == ([], [])


def test_a_result_without_tensors_comes_as_a_file_from_each_rank(twins: Path) -> None:
    fn = distributed(gpus=2, gpu_type="cpu", remote=True, timeout=180)(ray_fns.bytes_of)

    handle = fn.start(8)
    assert handle.wait(180)
    run_dir = handle.context.run_dir
    places = [twins / run_dir.name, run_dir]  # unread, the results move to the run directory

    def written() -> bool:
        return all(any((p / f"result_{r}.pkl").exists() for p in places) for r in (0, 1))

    eventually(written, "each rank's result file in the twin or the run directory")
    out = handle.result()
    assert [o["rank"] for o in out] == [0, 1]
    assert {o["data"] for o in out} == {bytes(range(256)) * (8 * 4096)}


def test_without_a_twin_the_object_store_carries_the_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(RESULTS_DIR_ENV, "off")
    fn = distributed(gpus=1, gpu_type="cpu", remote=True, timeout=180)(ray_fns.tensor_and_views)

    handle = fn.start(MIB)
    assert handle.wait(180)
    assert not list(handle.context.run_dir.glob("result_*")), "no file was written"
    out = handle.result()[0]

    expected = torch.arange(MIB * 2**18, dtype=torch.float32)
    assert torch.equal(out["t"], expected)
    assert torch.equal(out["evens"], expected[::2]) and torch.equal(out["head"], expected[:4])
    assert out["bf"].dtype == torch.bfloat16 and torch.equal(out["bf"], expected[:8].bfloat16())
    # Views of one storage still share it, and it is the caller's own (writable) memory.
    out["head"][0] = -1.0
    assert out["t"][0] == -1.0 and out["evens"][0] == -1.0
    assert f"{handle.context.run_dir.name}/result_0.pkl" not in _mapped_files()


def test_a_rank_takes_the_twin_only_where_it_finds_the_callers_key(tmp_path: Path) -> None:
    from serverless_gpu.wire.runpaths import RunPaths

    twin = tmp_path / "twin"
    twin.mkdir(mode=0o700)
    place = results.place_for(RunPaths(tmp_path, twin))
    assert place is not None
    assert results.reachable(place) == twin
    # A folder of the same name on another machine (or in another container) has another key
    # or none; another machine has another boot id or name; another user is another uid.
    other_key = results.ResultsPlace(place.twin, place.machine, place.uid, "0" * 32)
    assert results.reachable(other_key) is None
    other_machine = results.ResultsPlace(place.twin, "another/host", place.uid, place.key)
    assert results.reachable(other_machine) is None
    other_user = results.ResultsPlace(place.twin, place.machine, os.getuid() + 1, place.key)
    assert results.reachable(other_user) is None
    assert results.place_for(RunPaths(tmp_path, None)) is None
