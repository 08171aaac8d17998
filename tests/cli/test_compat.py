"""``serverless_gpu.compat.TorchDistributor``: a Spark notebook's training code, unchanged."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from serverless_gpu import distributed
from serverless_gpu.common.errors import ConfigurationError
from serverless_gpu.compat import TorchDistributor

SCRIPT = """
    import json
    import os
    import sys

    with open(f"out_{os.environ['RANK']}.json", "w") as f:
        json.dump({"argv": sys.argv[1:], "name": __name__, "world": os.environ["WORLD_SIZE"]}, f)
"""


def spark_style_train(learning_rate: float, epochs: int = 1) -> dict[str, float]:
    """As a Spark notebook writes it: torch.distributed set up from the environment."""
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    dist.destroy_process_group()
    return {"rank": rank, "sum": float(total), "lr": learning_rate, "epochs": epochs}


def test_a_function_returns_rank_0s_value() -> None:
    distributor = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False)
    result = distributor.run(spark_style_train, 1e-3, epochs=2)
    assert result == {"rank": 0, "sum": 3.0, "lr": 1e-3, "epochs": 2}


def test_a_script_path_runs_as_a_script_with_string_arguments(
    write: Callable[[str, str], Path], tmp_path: Path
) -> None:
    path = write("train.py", SCRIPT)
    distributor = TorchDistributor(num_processes=2, use_gpu=False)
    assert distributor.run(str(path), "--learning-rate", 1e-3) is None
    for rank in (0, 1):
        out = json.loads((tmp_path / f"out_{rank}.json").read_text())
        assert out == {"argv": ["--learning-rate", "0.001"], "name": "__main__", "world": "2"}


def test_what_cannot_run_here_is_refused_when_made(monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in (0, -2, True, "2"):
        with pytest.raises(ConfigurationError, match="num_processes has to be a positive integer"):
            TorchDistributor(num_processes=bad)  # type: ignore[arg-type]  # (Spark's words)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU, whatever the machine has
    monkeypatch.delenv("SERVERLESS_GPU_TYPE", raising=False)
    with pytest.raises(RuntimeError, match="GPUs were unable to be found on the driver") as info:
        TorchDistributor(num_processes=2, local_mode=True, use_gpu=True)  # not in run
    assert isinstance(info.value, ConfigurationError)  # the library's type too
    assert "pass use_gpu=False or set" in str(info.value)
    with pytest.raises(ConfigurationError, match="num_processes=1000 CPU ranks"):
        TorchDistributor(num_processes=1000, use_gpu=False)
    TorchDistributor(num_processes=2, local_mode=False, use_gpu=True)  # the cluster's GPUs: in run
    with pytest.raises(ConfigurationError, match="keyword arguments"):
        TorchDistributor(use_gpu=False).run("train.py", lr=1)


def test_hints_speak_torch_distributors_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU, whatever the machine has
    monkeypatch.delenv("SERVERLESS_GPU_TYPE", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ConfigurationError, match="pass use_gpu=False or set") as info:
        TorchDistributor(num_processes=1).run(spark_style_train, 1e-3)
    assert "gpu_type" not in str(info.value)
    with pytest.raises(ConfigurationError, match="num_processes=1000 CPU ranks") as info:
        TorchDistributor(num_processes=1000, use_gpu=False).run(spark_style_train, 1e-3)
    assert "gpus=" not in str(info.value)
    with pytest.raises(ConfigurationError, match=r"^local_mode=False runs the call") as info:
        TorchDistributor(1, local_mode=False, use_gpu=False).run(spark_style_train, 1e-3)
    assert "remote=True" not in str(info.value)
    with pytest.raises(ConfigurationError, match="pass gpu_type='cpu' or set"):
        distributed(gpus=1)(spark_style_train).distributed(1e-3)  # the decorator's own words
