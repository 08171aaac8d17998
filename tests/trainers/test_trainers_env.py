"""What CPU ranks get so that third-party trainers run distributed there, unless the user set it."""

from __future__ import annotations

import socket

import pytest
import trainers_fns

from serverless_gpu import distributed
from serverless_gpu.wire.env import rank_env


def _env(base: dict[str, str], device: str) -> dict[str, str]:
    return rank_env(
        base, rank=0, world_size=2, master_port=1234, device=device, run_id="r", run_dir="/x"
    )


def _loopback() -> str:
    return next(name for _, name in socket.if_nameindex() if name in ("lo", "lo0"))


def test_cpu_ranks_tell_accelerate_and_gloo_where_to_run() -> None:
    env = _env({}, "cpu")
    assert env["ACCELERATE_USE_CPU"] == "1"
    assert env["GLOO_SOCKET_IFNAME"] == _loopback()


def test_the_users_own_settings_win() -> None:
    env = _env({"ACCELERATE_USE_CPU": "0", "GLOO_SOCKET_IFNAME": "eth7"}, "cpu")
    assert env["ACCELERATE_USE_CPU"] == "0"
    assert env["GLOO_SOCKET_IFNAME"] == "eth7"


def test_gpu_ranks_are_left_alone() -> None:
    env = _env({}, "cuda")
    assert "ACCELERATE_USE_CPU" not in env and "GLOO_SOCKET_IFNAME" not in env


def test_a_rank_sees_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", _loopback())  # the user's, passed on unchanged
    fn = distributed(gpus=2, gpu_type="cpu", timeout=120, tracking=False)(trainers_fns.trainer_env)
    for seen in fn.distributed():
        assert seen == {"ACCELERATE_USE_CPU": "1", "GLOO_SOCKET_IFNAME": _loopback()}
