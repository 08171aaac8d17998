"""Standby rank actors on a real 2-node Ray cluster: the next call of a shape runs on the last
call's actors with its process group formed ahead; a changed environment, the idle time,
``shutdown()`` and a node that died under them each end them (a call never fails for it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import ray_fns
from conftest import leftovers, node_args, node_of
from eventually import eventually

import serverless_gpu
from serverless_gpu import distributed

HERE = Path(__file__).resolve().parent
pytestmark = [pytest.mark.usefixtures("cluster", "untracked"), pytest.mark.timeout(600)]


def _fn() -> Any:
    return distributed(gpus=4, gpu_type="cpu", remote=True, timeout=180, output="none")(
        ray_fns.who_am_i
    )


def _pids(results: list[dict[str, Any]]) -> list[int]:
    return [r["pid"] for r in results]


def test_the_next_call_takes_the_actors_and_group_until_the_environment_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fn = _fn()
    monkeypatch.setenv("SERVERLESS_GPU_TEST_CALLER_VAR", "first")
    first = fn.distributed()
    assert [r["sum"] for r in first] == [4.0] * 4
    assert not any(r["group_before"] for r in first)

    monkeypatch.delenv("SERVERLESS_GPU_TEST_CALLER_VAR")
    second = fn.distributed()
    assert _pids(second) == _pids(first), "the same rank actors"
    assert all(r["group_before"] for r in second), "the group was formed ahead of the call"
    assert [r["sum"] for r in second] == [4.0] * 4
    assert [r["var"] for r in second] == [None] * 4, "nothing of the last call's environment"

    monkeypatch.setenv("GLOO_SOCKET_TIMEOUT_MS_TEST", "1")  # read by gloo once per process
    third = fn.distributed()
    assert not set(_pids(third)) & set(_pids(second)), "fresh actors for another environment"
    actors, groups = leftovers(timeout=0, standby=True)
    assert len(actors) == 5 and len(groups) == 1, "the earlier set was released"

    serverless_gpu.shutdown()
    assert leftovers(standby=True) == ([], []), "shutdown() released the standby set"


def test_a_call_that_never_takes_the_group_leaves_the_next_call_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each kept set forms the next call's group, also after a call that left the one formed
    for it untouched (the hand-over then still stood, and the next formation failed)."""
    fn = distributed(gpus=2, gpu_type="cpu", remote=True, timeout=180, output="none")(
        ray_fns.group_formed_ahead
    )
    calls = [list(fn.distributed()) for _ in range(3)]
    assert len({pid for call in calls for pid, _ in call}) == 2, "the same two actors"
    formed = [[ahead for _, ahead in call] for call in calls]
    assert formed == [[False] * 2, [True] * 2, [True] * 2]


def test_standby_actors_are_released_after_the_idle_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVERLESS_GPU_RAY_IDLE_S", "2")
    _fn().distributed()
    assert leftovers(timeout=0, standby=True) != ([], []), "kept after the call"
    eventually(lambda: leftovers(timeout=0, standby=True) == ([], []), "released", timeout=30)


def test_a_node_that_died_under_standby_actors_costs_them_not_the_call(cluster: Any) -> None:
    fn = _fn()
    first = fn.distributed()
    cluster.remove_node(node_of(cluster, first[3]["node_id"]))
    cluster.add_node(**node_args())
    cluster.wait_for_nodes()
    second = fn.distributed()
    assert [r["sum"] for r in second] == [4.0] * 4
    assert not set(_pids(second)) & set(_pids(first)), "fresh actors"


def test_the_callers_exit_releases_its_standby_actors(cluster: Any, tmp_path: Path) -> None:
    code = (
        "import ray_fns, serverless_gpu as s\n"
        "fn = s.distributed(gpus=4, gpu_type='cpu', remote=True, output='none', tracking=False)"
        "(ray_fns.who_am_i)\n"
        "print('sums', [r['sum'] for r in fn.distributed()], flush=True)\n"
    )
    env = {**os.environ, "RAY_ADDRESS": cluster.address, "SERVERLESS_GPU_RUNS_DIR": str(tmp_path)}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert "sums [4.0, 4.0, 4.0, 4.0]" in out.stdout, out
    assert leftovers(standby=True) == ([], []), "nothing of the exited caller is left"
