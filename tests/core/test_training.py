"""The seed's SimpleMLP trained on 2 CPU ranks over gloo, with DDP and with FSDP2."""

from __future__ import annotations

import pytest

from serverless_gpu import distributed
from serverless_gpu.examples.mlp import train


@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp2"])
def test_simple_mlp_trains_on_two_ranks(fsdp: bool) -> None:
    run = distributed(gpus=2, gpu_type="cpu", tracking=False)(train)
    results = run.distributed(4, 64, fsdp=fsdp)
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:
        losses = r["epoch_losses"]
        assert len(losses) == 4
        assert losses[-1] < 0.5 * losses[0], losses
    # Both ranks end with the same model: gradients were really synchronised.
    assert results[0]["checksum"] == pytest.approx(results[1]["checksum"], rel=1e-6)
