"""@ray_launch: Ray-native code run once as a driver on the cluster."""

from __future__ import annotations

import pytest
import ray_fns

from serverless_gpu import ConfigurationError, ray_launch

pytestmark = pytest.mark.usefixtures("cluster", "untracked")


def test_ray_native_code_runs_as_a_driver_on_the_cluster() -> None:
    fn = ray_launch(timeout=120)(ray_fns.tasks_on_every_node)

    out = fn.distributed(6)

    assert out == {"nodes": 2, "gpus": 0, "cpu_mode": False}


def test_more_gpus_than_the_cluster_has_fails_before_starting() -> None:
    fn = ray_launch(gpus=2, gpu_type="H100")(ray_fns.tasks_on_every_node)

    with pytest.raises(
        ConfigurationError, match=r"needs 2 H100 GPUs on the Ray cluster, and it has 0"
    ):
        fn.distributed(1)
