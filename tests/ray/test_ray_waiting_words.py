"""What a call waiting for room on the Ray cluster says: the free total can hide that no node has
room for a rank, and ranks that never started are not "still running" when the timeout strikes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import ray
import ray_fns
from conftest import leftovers
from ray.util.placement_group import placement_group, remove_placement_group

from serverless_gpu import distributed
from serverless_gpu.common.errors import DistributedTimeoutError

pytestmark = pytest.mark.usefixtures("cluster", "untracked")


@pytest.fixture
def spread_free_cpus() -> Iterator[Any]:
    """1.5 CPU taken on one worker node and 0.5 on the other: 2 CPU free in all, but only one
    node with room for a rank of 1 CPU."""
    group = placement_group([{"CPU": 1.5}, {"CPU": 0.5}], strategy="STRICT_SPREAD")
    ray.get(group.ready(), timeout=60)
    try:
        yield group
    finally:
        remove_placement_group(group)


def test_free_cpus_spread_over_nodes_are_said_to_be_and_the_ranks_never_started(
    spread_free_cpus: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SERVERLESS_GPU_RAY_RESERVE_TIMEOUT", "120")
    fn = distributed(gpus=2, gpu_type="cpu", remote=True, timeout=6)(ray_fns.sleep_forever)

    with pytest.raises(DistributedTimeoutError) as info:
        fn.distributed()

    said = capsys.readouterr().out
    assert (
        "waiting for the Ray cluster: 2 ranks of 1 CPU requested, 2 CPU free, but room for "
        "only 1: each rank needs 1 CPU on one node, and the free CPU is spread over nodes ("
    ) in said, said
    assert re.search(r"\(node \w{8}: (1\.5|0\.5) CPU; node \w{8}: (0\.5|1\.5) CPU\)", said), said
    text = str(info.value)
    assert "still running" not in text, text
    assert (
        "exceeded its timeout of 6 s before any rank started the function: ranks 0, 1 were "
        "still starting"
    ) in text, text
    assert info.value.running_ranks == ()
    actors, groups = leftovers()
    assert actors == [] and [g.placement_group_id for g in groups] == [spread_free_cpus.id.hex()]
