"""Third-party trainers inside 2 CPU ranks, unchanged: each sees a world of 2 and really
all-reduces (ranks train on different data and end with equal parameters). By default they run
in standby ranks that formed their gloo group ahead of the call (``warm_process_group``); the
quick ones also without it."""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trainers_fns

from serverless_gpu import distributed


def _run(fn: Callable[..., Any], *args: Any, warm: bool = True, timeout: int = 240) -> list[Any]:
    options: dict[str, Any] = {"gpus": 2, "gpu_type": "cpu", "timeout": timeout, "tracking": False}
    if warm:  # a call of the same shape first: the next call finds standby ranks, group formed
        distributed(**options)(trainers_fns.warm).distributed()
    results = list(distributed(**options, warm_process_group=warm)(fn).distributed(*args))
    assert [r["warm"] for r in results] == [warm, warm]
    return results


def _same_params(results: list[dict[str, Any]]) -> None:
    first, second = (r["params"] for r in results)
    assert first == pytest.approx(second, abs=1e-6), "the ranks trained alone: no all-reduce"


@pytest.mark.parametrize("warm", [True, False])
def test_accelerate_runs_multi_cpu(warm: bool) -> None:
    pytest.importorskip("accelerate")
    results = _run(trainers_fns.accelerate_step, warm=warm)
    assert [r["world_size"] for r in results] == [2, 2]
    assert {r["distributed_type"] for r in results} == {"DistributedType.MULTI_CPU"}
    _same_params(results)


def test_hf_trainer_trains_distributed(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    results = _run(trainers_fns.hf_trainer_step, str(tmp_path))
    assert [r["world_size"] for r in results] == [2, 2]
    assert {r["parallel_mode"] for r in results} == {"ParallelMode.DISTRIBUTED"}
    _same_params(results)


@pytest.mark.parametrize("warm", [True, False])
def test_lightning_fabric_runs_ddp(warm: bool) -> None:
    pytest.importorskip("lightning")
    results = _run(trainers_fns.fabric_step, warm=warm)
    assert [r["world_size"] for r in results] == [2, 2]
    _same_params(results)


def test_gloo_listens_on_loopback_only() -> None:
    """gloo's own sockets (the rendezvous store on MASTER_PORT is torch's TCPStore, not gloo)."""
    results = _run(trainers_fns.gloo_sockets)
    assert [r["sum"] for r in results] == [2.0, 2.0]
    for r in results:
        gloo = [(ip, port) for ip, port, _ in r["sockets"] if port != r["store_port"]]
        assert gloo, "gloo opened no socket"
        outside = [(ip, port) for ip, port in gloo if not _loopback(ip)]
        assert not outside, f"gloo sockets not on loopback: {outside}"


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return (mapped or address).is_loopback


@pytest.mark.timeout(960)
def test_deepspeed_zero1_all_reduces(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip(
        "deepspeed",
        reason="DeepSpeed is not in the dev extra: its CPU communication op compiles on first use, "
        "which takes minutes on a 2-core machine; `pip install --no-build-isolation deepspeed` "
        "to run this test (the op is then cached under the virtual environment)",
    )
    # The compiled op is kept with the environment, so only the first run pays for it.
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    results = _run(trainers_fns.deepspeed_step, 1, timeout=900)
    assert [r["world_size"] for r in results] == [2, 2]
    _same_params(results)
