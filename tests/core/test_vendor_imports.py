"""The original API's documented usages, as its example notebooks write them: the module paths
they import from, the enum helpers, statuses in plain sets, a call's record on its handle, and
a loader state of another rank (each test cites the usage it ports)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from eventually import eventually

from serverless_gpu import ConfigurationError, distributed
from serverless_gpu.runfiles.rundirs import RESULTS_DIR_ENV, RUNS_DIR_ENV

pytestmark = pytest.mark.timeout(300)
_WAIT_S = 60.0
_OPTIONS: dict[str, Any] = {"gpu_type": "cpu", "tracking": False, "standby": False, "timeout": 120}


@pytest.fixture(autouse=True)
def private_roots(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(RUNS_DIR_ENV, str(tmp_path / "runs"))
    monkeypatch.setenv(RESULTS_DIR_ENV, str(tmp_path / "shm"))


def test_the_notebooks_import_lines_import() -> None:
    """``from serverless_gpu.compute import GPUType`` (and the others) as the notebooks begin,
    the same objects as ``serverless_gpu.compat``'s; ``serverless_gpu.ray`` does not import Ray
    until it is called, as the original's."""
    code = (
        "import sys\n"
        "from serverless_gpu.compute import AcceleratorType, GPUType, get_gpus_per_node\n"
        "from serverless_gpu.launcher import distributed, DistributedFunction\n"
        "from serverless_gpu.ray import ray_init, ray_launch\n"
        "import serverless_gpu, serverless_gpu.compat as compat\n"
        "assert distributed is serverless_gpu.distributed and GPUType is compat.GPUType\n"
        "assert DistributedFunction is serverless_gpu.DistributedFunction\n"
        "assert ray_launch is compat.ray_launch and ray_init is compat.ray_init\n"
        "assert AcceleratorType is compat.AcceleratorType\n"
        "assert get_gpus_per_node is compat.get_gpus_per_node\n"
        "print('ray' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    assert importlib.import_module("serverless_gpu.launcher_process").__name__.endswith("_process")


def test_gpu_type_helpers() -> None:
    """``GPUType.values()``, ``GPUType.names()`` (lower case), ``GPUType("a10g")``,
    ``GPUType("h100_80gb")``; an unknown name raises ``GPUTypeError``, a ``ValueError``."""
    from serverless_gpu.compute import GPUType
    from serverless_gpu.exceptions import GPUTypeError

    assert {"H100", "A10", "B300"} <= set(GPUType.values())
    assert {"h100", "a10", "b300"} <= set(GPUType.names())
    assert GPUType("a10g") is GPUType.A10 and GPUType("h100_80gb") is GPUType.H100
    assert GPUType("H100") is GPUType.H100 and GPUType("b300") is GPUType.B300
    with pytest.raises(GPUTypeError, match="tpu") as raised:
        GPUType("tpu")
    assert isinstance(raised.value, ValueError)


def test_accelerator_type_helpers_and_gpus_per_node() -> None:
    """``AcceleratorType.values()``, ``AcceleratorType.from_gpu_type(gpu_type, n)``,
    ``get_gpus_per_node(gpu_type, gpus)``."""
    from serverless_gpu.compute import AcceleratorType, GPUType, get_gpus_per_node
    from serverless_gpu.exceptions import GPUTypeError

    assert AcceleratorType.values() == ["GPU_1xA10", "GPU_1xH100", "GPU_8xH100", "GPU_8xB300"]
    assert AcceleratorType.from_gpu_type(GPUType.H100, 1) is AcceleratorType.GPU_1xH100
    assert AcceleratorType.from_gpu_type(GPUType.H100, 8) is AcceleratorType.GPU_8xH100
    assert AcceleratorType.from_gpu_type(GPUType.A10, 1) is AcceleratorType.GPU_1xA10
    assert AcceleratorType.from_gpu_type(GPUType("b300"), 8) is AcceleratorType.GPU_8xB300
    assert [get_gpus_per_node(GPUType.H100, n) for n in (1, 8)] == [1, 8]
    assert get_gpus_per_node(GPUType.H100) == 8 and get_gpus_per_node(GPUType.A10) == 1
    with pytest.raises(GPUTypeError):
        AcceleratorType.from_gpu_type(GPUType.L4, 1)
    with pytest.raises(GPUTypeError):
        AcceleratorType("GPU_3xTPU")


def test_distributed_function_gpus_per_node() -> None:
    """``DistributedFunction.gpus_per_node``: GPUs of one node of the call's shape."""
    from serverless_gpu.launcher import distributed as launcher_distributed

    shaped = launcher_distributed(num_accelerators=2, accelerator_type="GPU_8xH100")(print)
    assert shaped.gpus_per_node == 8
    assert launcher_distributed(gpus=1, gpu_type="h100_80gb")(print).gpus_per_node == 1
    assert launcher_distributed(gpus=2, gpu_type="cpu")(print).gpus_per_node is None


def test_statuses_hash_as_they_compare() -> None:
    """``h.status in {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.STOPPED}``: every status
    that compares equal to one of the set is found in it."""
    from serverless_gpu.asynchronous import RunStatus as Vendor
    from serverless_gpu.wire.events import RunStatus

    terminal = {Vendor.COMPLETED, Vendor.FAILED, Vendor.STOPPED}
    for status in RunStatus:
        assert (status in terminal) is status.finished, status
        for name in Vendor:
            if status == name:
                assert hash(status) == hash(name), (status, name)
    assert Vendor.COMPLETED in {RunStatus.SUCCEEDED: 1}


@distributed(gpus=2, output="none", **_OPTIONS)
def tagged(step: int, tag: str = "none") -> str:
    if tag == "boom":
        raise KeyError(step)
    return f"{tag}{step}"


def test_the_handle_records_the_call() -> None:
    """The handle's documented fields: ``func_name``, ``gpus``, ``instance``, ``params`` (the
    call's arguments, also ``workload_metadata.params``), ``exception``, ``start_time``; and a
    plain set of statuses finds a finished run's."""
    from serverless_gpu.asynchronous import RunStatus as Vendor

    before = time.time()
    h = tagged.start(1, tag="a")
    assert h.result(_WAIT_S) == ["a1", "a1"]
    assert h.status in {Vendor.COMPLETED, Vendor.FAILED, Vendor.STOPPED}
    assert h.workload_metadata.params == {"step": "1", "tag": "a"} == h.params
    assert (h.func_name, h.gpus, h.instance) == ("tagged", 2, "CPU")
    assert h.exception is None
    assert h.start_time is not None and before <= h.start_time <= time.time()

    failed = tagged.start(7, tag="boom")
    assert failed.exception is None or failed.done()
    eventually(lambda: failed.status in {Vendor.COMPLETED, Vendor.FAILED}, "its end", _WAIT_S)
    assert isinstance(failed.exception, KeyError) and failed.params == {"step": "7", "tag": "boom"}
    with pytest.raises(KeyError):
        failed.result(0)


def test_a_loader_state_of_another_rank_is_a_value_error(tmp_path: Path) -> None:
    """``load_state_dict`` with another rank's ``state_dict`` raises ``ValueError`` (the
    original's contract for a mismatched state); here ``PositionUnknownError``."""
    from serverless_gpu.data import PositionUnknownError, UCVolumeDataset

    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "a.txt").write_text("a")
    dataset: UCVolumeDataset[str] = UCVolumeDataset(volume, tmp_path / "cache", min_free_bytes=0)
    state = dataset.state_dict()
    state["rank"] += 1
    with pytest.raises(ValueError, match="being loaded into rank") as raised:
        dataset.load_state_dict(state)
    assert isinstance(raised.value, PositionUnknownError)


def test_an_unknown_type_in_the_decorator_is_a_gpu_type_error() -> None:
    from serverless_gpu.exceptions import GPUTypeError

    with pytest.raises(GPUTypeError):
        distributed(gpus=1, gpu_type="tpu")(print).distributed()
    assert issubclass(GPUTypeError, ConfigurationError) and issubclass(GPUTypeError, ValueError)


def test_recorded_arguments_are_bounded() -> None:
    """A large argument costs a few dozen items' worth of text in ``params``, not its size."""
    from serverless_gpu.api.trials import call_params

    def fit(data: bytes, sizes: list[int], lr: float = 0.1) -> None: ...

    params = call_params((b"x" * 10**6, list(range(10**5))), {"lr": 0.5}, fit)
    assert params["data"] == "<1000000 bytes>" and params["lr"] == "0.5"
    assert params["sizes"].endswith(", ...]") and len(params["sizes"]) < 200
