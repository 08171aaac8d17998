"""@ray_launch: Ray-native code run once as a driver on the cluster."""

from __future__ import annotations

from typing import Any

import pytest
import ray_fns

from serverless_gpu import ConfigurationError
from serverless_gpu.ray import ray_init, ray_launch

pytestmark = pytest.mark.usefixtures("cluster", "untracked")


def test_ray_native_code_runs_as_a_driver_on_the_cluster() -> None:
    fn = ray_launch(timeout=120)(ray_fns.tasks_on_every_node)

    out = fn.distributed(6)

    assert out == [{"nodes": 2, "gpus": 0, "cpu_mode": False}]


def test_one_entry_per_rank_and_cpu_mode_as_distributed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The original's usage: ``@ray_launch(num_accelerators=2)``; ``.distributed()`` gives one
    entry per rank (the driver's value first). In CPU mode the count is of CPU ranks, as
    ``@distributed(num_accelerators=2)`` runs 2 CPU ranks there, and no GPU is asked for."""
    monkeypatch.setenv("SERVERLESS_GPU_TYPE", "cpu")
    fn = ray_launch(num_accelerators=2, timeout=120)(ray_fns.tasks_on_every_node)

    out = fn.distributed(2)

    assert len(out) == 2 and out[1] is None
    assert out[0] is not None and out[0]["gpus"] == 2
    cpu = ray_launch(gpus=2, gpu_type="cpu", timeout=120)(ray_fns.tasks_on_every_node)
    assert [entry is None for entry in cpu.distributed(1)] == [False, True]


def test_more_gpus_than_the_cluster_has_fails_before_starting() -> None:
    fn = ray_launch(gpus=2, gpu_type="H100")(ray_fns.tasks_on_every_node)

    with pytest.raises(
        ConfigurationError, match=r"needs 2 H100 GPUs on the Ray cluster, and it has 0"
    ):
        fn.distributed(1)


def test_the_originals_spelling_names_count_and_node_shape() -> None:
    fn = ray_launch(num_accelerators=2, accelerator_type="GPU_8xH100")(ray_fns.tasks_on_every_node)
    assert (fn.gpus, fn.gpu_type) == (2, "H100")
    with pytest.raises(
        ConfigurationError, match=r"needs 2 H100 GPUs on the Ray cluster, and it has 0"
    ):
        fn.distributed(1)
    positional = ray_launch(1, "gpu_1xa10", False, 60)(ray_fns.tasks_on_every_node)
    assert (positional.gpus, positional.gpu_type) == (1, "A10")
    with pytest.raises(ConfigurationError, match="two spellings of one option"):
        ray_launch(gpus=2, num_accelerators=3)
    with pytest.raises(ConfigurationError, match="two spellings of one option"):
        ray_launch(accelerator_type="GPU_8xH100", gpu_type="A10")


def test_ray_init_is_ray_init(cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import ray

    context = ray_init(address=cluster.address, ignore_reinit_error=True)
    assert context.address_info["gcs_address"] == ray.get_runtime_context().gcs_address
    if context.dashboard_url:
        assert f"Ray dashboard: http://{context.dashboard_url}" in capsys.readouterr().out
