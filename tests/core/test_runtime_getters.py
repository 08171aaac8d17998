"""The runtime getters of the original API, as its code calls them inside a rank:
``get_global_rank(group=None)`` and ``get_world_size()`` read torch.distributed once a group
exists, ``get_replica_rank()``, ``get_node_ip()``."""

from __future__ import annotations

import ipaddress
import os

import pytest

from serverless_gpu import distributed, runtime


def test_getters_outside_a_call() -> None:
    assert (runtime.get_global_rank(), runtime.get_world_size()) == (0, 1)
    assert runtime.get_replica_rank() == 0
    ipaddress.IPv4Address(runtime.get_node_ip())


def torch_values_win() -> dict[str, object]:
    """Inside a rank whose default group exists: the environment says otherwise, torch wins."""
    import torch.distributed as dist

    runtime.init_process_group()  # the warm group when the rank has one, else a new one
    env = (os.environ["RANK"], os.environ["WORLD_SIZE"])
    os.environ["RANK"], os.environ["WORLD_SIZE"] = "7", "9"
    try:
        only_rank_1 = dist.new_group(ranks=[1])  # every rank takes part in making it
        return {
            "rank": runtime.get_global_rank(),
            "world": runtime.get_world_size(),
            "in_world": runtime.get_global_rank(dist.group.WORLD),
            "in_subgroup": runtime.get_global_rank(only_rank_1),
        }
    finally:
        os.environ["RANK"], os.environ["WORLD_SIZE"] = env


def test_torch_values_once_a_group_exists() -> None:
    results = distributed(num_accelerators=2)(torch_values_win).distributed()
    assert [r["rank"] for r in results] == [0, 1]
    assert [r["world"] for r in results] == [2, 2]
    assert [r["in_world"] for r in results] == [0, 1]
    assert results[1]["in_subgroup"] == 0  # rank 1 is rank 0 of its one-rank group


def environment_values() -> tuple[int, int, int, str]:
    import torch.distributed as dist

    assert not dist.is_initialized()
    os.environ["RANK"] = str(10 + int(os.environ["RANK"]))
    return (
        runtime.get_global_rank(),
        runtime.get_world_size(),
        runtime.get_replica_rank(),
        runtime.get_node_ip(),
    )


def test_environment_values_without_a_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLICA_RANK", "3")
    fn = distributed(num_accelerators=2, warm_process_group=False)(environment_values)
    results = fn.distributed()
    assert [r[:3] for r in results] == [(10, 2, 3), (11, 2, 3)]
    assert {r[3] for r in results} == {runtime.get_node_ip()}
