"""``remote=True`` with a node shape (``accelerator_type="GPU_2xH100"``): whole nodes of it,
one by default. The test cluster's GPUs have no type Ray recognised, so the reservation fails
and its message shows what was asked of the cluster."""

from __future__ import annotations

import time

import pytest
import ray_fns
from conftest import leftovers

from serverless_gpu import distributed
from serverless_gpu.common.errors import DistributedError, GPUConfigError

pytestmark = pytest.mark.usefixtures("cluster", "untracked")


@pytest.mark.parametrize(("count", "ranks"), [(None, 2), (4, 4)])
def test_a_shape_asks_the_cluster_for_whole_nodes(
    monkeypatch: pytest.MonkeyPatch, count: int | None, ranks: int
) -> None:
    """The test cluster has GPUs of no type and no autoscaler: a request for H100 nodes can
    never fit, and fails at once (not after the reservation's timeout) saying so."""
    monkeypatch.setenv("SERVERLESS_GPU_RAY_RESERVE_TIMEOUT", "60")
    fn = distributed(count, "GPU_2xH100", remote=True, timeout=60)(ray_fns.sleep_forever)
    start = time.monotonic()
    with pytest.raises(DistributedError, match=rf"can never hold {ranks} ranks of .*H100") as info:
        fn.distributed()
    assert time.monotonic() - start < 10
    assert "no node has accelerator_type:H100 and no autoscaler" in str(info.value)
    assert "2 CPU, 2 GPU" in str(info.value), "what the cluster has"
    assert leftovers() == ([], [])


def test_part_of_a_node_is_refused_before_the_cluster_is_asked() -> None:
    with pytest.raises(GPUConfigError, match="whole nodes of 2 GPU"):
        distributed(3, "GPU_2xH100", remote=True)
