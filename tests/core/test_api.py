"""The public API on 2 CPU ranks: results in rank order, environment, shipping, direct calls."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import serverless_gpu
from serverless_gpu import DistributedConfig, RunResult, distributed, runtime
from serverless_gpu.common.errors import ConfigurationError, UsageError
from serverless_gpu.compute import GPUType
from serverless_gpu.wire.events import (
    RankFinished,
    RankStarted,
    RunFinished,
    RunStarted,
    RunStatus,
    SystemMetrics,
)


def test_ranks_return_their_rank_in_order() -> None:
    @distributed(gpus=2, gpu_type="cpu")
    def rank() -> int:
        return runtime.get_global_rank()

    result = rank.distributed()
    assert result == [0, 1]
    assert isinstance(result, RunResult)
    assert (result.run_dir / "logs" / "rank_1.txt").exists()
    assert stat.S_IMODE(result.run_dir.stat().st_mode) == 0o700


def test_arguments_reach_every_rank() -> None:
    @distributed(gpus=2)
    def scale(x: int, *, factor: int) -> int:
        return (runtime.get_global_rank() + x) * factor

    assert scale.distributed(10, factor=3) == [30, 33]


def test_environment_of_each_rank(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    @distributed(gpus=2, gpu_type="cpu")
    def env() -> dict[str, Any]:
        import sys as rank_sys

        keys = [
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "NODE_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "PYTHONUNBUFFERED",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING",
            "OMP_NUM_THREADS",
            "SET_AFTER_DECORATION",
            "CUDA_VISIBLE_DEVICES",
            "NCCL_NVLS_ENABLE",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST",
            "NVSHMEM_DISABLE_NVLS",
        ]
        return {
            **{k: os.environ.get(k) for k in keys},
            "cwd": os.getcwd(),
            "path_entry": "/call/time/entry" in rank_sys.path,
            "pid": os.getpid(),
        }

    # Set after decoration: the ranks must see the caller's state at call time.
    monkeypatch.setenv("SET_AFTER_DECORATION", "yes")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    monkeypatch.delenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", raising=False)
    monkeypatch.setenv("NVSHMEM_DISABLE_NVLS", "0")  # the caller's own choice is kept
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend("/call/time/entry")
    r0, r1 = env.distributed()
    for rank, e in enumerate((r0, r1)):
        assert e["RANK"] == e["LOCAL_RANK"] == str(rank)
        assert e["WORLD_SIZE"] == e["LOCAL_WORLD_SIZE"] == "2"
        assert e["NODE_RANK"] == "0"
        assert e["MASTER_ADDR"] == "127.0.0.1"
        assert e["PYTHONUNBUFFERED"] == "1"
        assert e["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
        assert int(e["OMP_NUM_THREADS"]) >= 1
        assert e["SET_AFTER_DECORATION"] == "yes"
        assert e["CUDA_VISIBLE_DEVICES"] == ""
        # NVLink multicast off unless the caller chose otherwise.
        assert e["NCCL_NVLS_ENABLE"] == "0" and e["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
        assert e["NVSHMEM_DISABLE_NVLS"] == "0"
        assert e["cwd"] == str(tmp_path)
        assert e["path_entry"] is True
        assert e["pid"] != os.getpid()
    assert r0["MASTER_PORT"] == r1["MASTER_PORT"]
    assert r0["pid"] != r1["pid"]


def test_user_omp_num_threads_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    @distributed(gpus=2)
    def threads() -> str:
        return os.environ["OMP_NUM_THREADS"]

    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert threads.distributed() == ["7", "7"]


def test_cpu_ranks_see_no_gpu() -> None:
    """CPU mode on a machine with GPUs: libraries that pick CUDA when it is there (FSDP2's
    default mesh) must not, or rank N asks for a GPU ordinal the machine does not have."""

    @distributed(gpus=2)
    def visible() -> tuple[str | None, int]:
        import torch

        return os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count()

    assert visible.distributed() == [("", 0), ("", 0)]


def test_concurrent_calls_get_different_ports() -> None:
    @distributed(gpus=2)
    def port() -> str:
        import time

        time.sleep(0.5)
        return os.environ["MASTER_PORT"]

    first, second = port.start(), port.start()
    a, b = first.result(), second.result()
    assert a[0] == a[1] and b[0] == b[1]
    assert a[0] != b[0]


def test_each_call_gets_fresh_processes() -> None:
    @distributed(gpus=2)
    def pid() -> int:
        import builtins

        # State planted by one call must not be visible to the next.
        seen = getattr(builtins, "_planted", False)
        builtins._planted = True  # type: ignore[attr-defined]
        return os.getpid() if not seen else -1

    first, second = pid.distributed(), pid.distributed()
    assert -1 not in first + second
    assert not set(first) & set(second)


def test_gloo_collectives_through_runtime_helpers() -> None:
    @distributed(gpus=2)
    def all_reduce() -> tuple[float, str, int, int, int]:
        import torch
        import torch.distributed as dist

        runtime.init_process_group()
        t = torch.ones(3, device=runtime.device()) * (runtime.get_global_rank() + 1)
        dist.all_reduce(t)
        dist.destroy_process_group()
        return (
            float(t.sum()),
            str(runtime.device()),
            runtime.get_world_size(),
            runtime.get_local_world_size(),
            runtime.get_node_rank(),
        )

    assert all_reduce.distributed() == [(9.0, "cpu", 2, 2, 0)] * 2


def test_calling_the_decorated_object_directly_is_refused() -> None:
    @distributed(gpus=2)
    def add(a: int, b: int) -> int:
        return a + b

    with pytest.raises(UsageError, match=r"add\.distributed"):
        add(1, 2)
    assert add.func(1, 2) == 3
    assert add.__name__ == "add"  # type: ignore[attr-defined]


def test_bare_decorator_and_config_defaults() -> None:
    @distributed
    def world() -> int:
        return runtime.get_world_size()

    assert world.config == DistributedConfig()
    assert world.distributed() == [2, 2]  # CPU mode default: 2 ranks


def test_env_switch_turns_every_decorator_to_cpu_mode() -> None:
    @distributed(gpus=3)
    def device() -> str:
        return str(runtime.device())

    assert device.distributed() == ["cpu"] * 3


def test_events_arrive_in_order() -> None:
    @distributed(gpus=2)
    def hello() -> None:
        print("hi from", runtime.get_global_rank())

    handle = hello.start()
    seen: list[Any] = []
    handle.subscribe(seen.append)
    assert handle.result() == [None, None]
    kinds = [type(e) for e in seen]
    assert kinds[0] is RunStarted and kinds[-1] is RunFinished
    assert sorted(e.rank for e in seen if isinstance(e, RankStarted)) == [0, 1]
    assert sorted(e.rank for e in seen if isinstance(e, RankFinished)) == [0, 1]
    assert seen[-1].status is RunStatus.SUCCEEDED
    assert handle.status is RunStatus.SUCCEEDED


def test_system_metrics_are_sampled_during_the_run_and_stop_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SERVERLESS_GPU_SYSTEM_METRICS_INTERVAL", "0.2")

    @distributed(gpus=2, output="none", tracking=False)
    def pause() -> None:
        time.sleep(1.0)

    handle = pause.start()
    readings: list[SystemMetrics] = []
    handle.subscribe(lambda e: readings.append(e) if isinstance(e, SystemMetrics) else None)
    handle.result()
    assert len(readings) >= 3  # one at once, then every 0.2 s of a 1 s run
    assert all("system/cpu_utilization_percentage" in r.values for r in readings)
    time.sleep(0.5)
    assert not [t for t in threading.enumerate() if t.name == "serverless-gpu-metrics"]


def test_main_module_objects_ship_by_value_and_plain_results_need_no_torch(
    tmp_path: Path,
) -> None:
    script = tmp_path / "notebook_like.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys
            from serverless_gpu import distributed, shutdown

            class Point:
                def __init__(self, rank):
                    self.rank = rank
                def doubled(self):
                    return 2 * self.rank

            def helper(rank):
                return Point(rank)

            @distributed(gpus=2, gpu_type="cpu")
            def work():
                return helper(int(os.environ["RANK"]))

            points = work.distributed()
            print("RESULT", [type(p).__name__ for p in points], [p.doubled() for p in points])
            print("TORCH IMPORTED", "torch" in sys.modules)
            shutdown()
            """
        )
    )
    # Run from another directory: the ranks cannot import the script, so it must travel by value.
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "RESULT ['Point', 'Point'] [0, 2]" in out.stdout
    # The ranks have torch loaded, yet results without tensors are plain pickles: a caller that
    # never imported torch is not made to import it (seconds) just to read them.
    assert "TORCH IMPORTED False" in out.stdout


@pytest.mark.parametrize("bad", [0, -5, float("inf"), float("nan"), "10", True])
def test_bad_timeout_rejected_at_decoration(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="timeout"):
        distributed(gpus=2, timeout=bad)
    assert issubclass(ConfigurationError, serverless_gpu.DistributedError)
    assert issubclass(ConfigurationError, ValueError)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_bad_gpu_count_rejected(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="gpus"):
        distributed(gpus=bad)


def test_unknown_option_and_gpu_type_rejected() -> None:
    with pytest.raises(ConfigurationError, match="colour"):
        distributed(gpus=2, colour="red")
    with pytest.raises(ConfigurationError, match="unknown gpu_type"):
        distributed(gpus=2, gpu_type="Z80")


def test_gpu_type_parsing_and_detection() -> None:
    assert GPUType.parse("a10g") is GPUType.A10
    assert GPUType.parse(" h100 ") is GPUType.H100
    assert GPUType.parse("Cpu") is GPUType.CPU
    assert GPUType.from_device_name("NVIDIA H200") is GPUType.H200
    assert GPUType.from_device_name("NVIDIA H100 80GB HBM3") is GPUType.H100
    assert GPUType.from_device_name("NVIDIA A100-SXM4-80GB") is GPUType.A100
    assert GPUType.from_device_name("NVIDIA A10G") is GPUType.A10
    assert GPUType.from_device_name("NVIDIA L40S") is GPUType.L40S
    assert GPUType.from_device_name("NVIDIA L4") is GPUType.L4
    assert GPUType.from_device_name("NVIDIA B200") is GPUType.B200
    assert GPUType.from_device_name("Tesla T4") is None
