"""The seed's SimpleMLP trained with DDP (or FSDP2) on every local GPU, else on 2 CPU ranks.

    python -m serverless_gpu.examples.mlp --epochs 3        # all GPUs, or 2 CPU ranks
    python -m serverless_gpu.examples.mlp --fsdp --gpus 2

Metrics go to MLflow with plain ``mlflow.log_metric`` calls, following the recommended
convention: a number that describes the whole run (here the epoch loss averaged over all ranks)
is logged by rank 0 only; a per-rank number (the step loss of each rank's own batch) may be
logged by every rank, and lands under ``loss`` for rank 0 and ``rank_N/loss`` for rank N.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any

import torch
from torch import nn

from serverless_gpu import distributed, runtime
from serverless_gpu.common.gpus import visible_gpu_names


class SimpleMLP(nn.Module):
    def __init__(self, input_dim: int = 10, hidden_dim: int = 64, output_dim: int = 1) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(input_dim, hidden_dim),
            nn.ReLU(),
            nn.Dropout(0.2),
            nn.Linear(hidden_dim, hidden_dim),
            nn.ReLU(),
            nn.Dropout(0.2),
            nn.Linear(hidden_dim, output_dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _log_metric(name: str, value: float, step: int | None = None) -> None:
    # Only when the call is tracked (tracking=True and mlflow installed): otherwise every rank
    # would open its own default store.
    if "MLFLOW_RUN_ID" not in os.environ:
        return
    import mlflow

    mlflow.log_metric(name, value, step=step)


def _wrap(model: SimpleMLP, fsdp: bool) -> nn.Module:
    device = runtime.device()
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in model.net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[device] if device.type == "cuda" else None)


def train(num_epochs: int, batch_size: int, fsdp: bool = False, seed: int = 0) -> dict[str, Any]:
    """One rank's training loop; returns its per-epoch mean loss and a parameter checksum."""
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    runtime.init_process_group()
    device = runtime.device()
    torch.manual_seed(seed)  # same initial weights and data on every rank
    model = _wrap(SimpleMLP().to(device), fsdp)
    x = torch.randn(5000, 10)
    y = x[:, :3].sum(dim=1, keepdim=True) + 0.1 * torch.randn(5000, 1)
    sampler: DistributedSampler[Any] = DistributedSampler(TensorDataset(x, y), seed=seed)
    loader = DataLoader(TensorDataset(x, y), sampler=sampler, batch_size=batch_size)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.MSELoss()
    epoch_losses = []
    step = 0
    for epoch in range(num_epochs):
        sampler.set_epoch(epoch)
        model.train()
        total, count = 0.0, 0
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optimizer.step()
            _log_metric("loss", loss.item(), step=step)  # rank N's: "rank_N/loss"
            step += 1
            total += loss.item() * xb.size(0)
            count += xb.size(0)
        epoch_losses.append(total / count)
        # The run's number: every rank's mean, averaged over ranks, logged once (by rank 0).
        mean = torch.tensor([epoch_losses[-1]], device=device)
        dist.all_reduce(mean)
        run_loss = float(mean) / dist.get_world_size()
        if runtime.get_global_rank() == 0:
            _log_metric("epoch_loss", run_loss, step=epoch)
        print(f"epoch {epoch}: mean loss {epoch_losses[-1]:.4f} (all ranks: {run_loss:.4f})")
    checksum = sum(float(p.detach().float().sum()) for p in model.parameters())
    if fsdp:  # each rank holds a shard: add the shards up to compare across ranks
        total_sum = torch.tensor([checksum], device=device)
        dist.all_reduce(total_sum)
        checksum = float(total_sum)
    dist.destroy_process_group()
    return {"rank": runtime.get_global_rank(), "epoch_losses": epoch_losses, "checksum": checksum}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=None, help="ranks (default: every GPU, or 2)")
    parser.add_argument("--cpu", action="store_true", help="CPU ranks over gloo even with GPUs")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) instead of DDP")
    args = parser.parse_args(argv)
    cpu = args.cpu or not visible_gpu_names()
    run = distributed(gpus=args.gpus, gpu_type="cpu" if cpu else None)(train)
    results = run.distributed(args.epochs, args.batch_size, fsdp=args.fsdp)
    for r in results:
        losses = ", ".join(f"{v:.4f}" for v in r["epoch_losses"])
        print(f"rank {r['rank']}: epoch losses [{losses}]  checksum {r['checksum']:.6f}")
    link = results.links.get("mlflow")
    if link:
        print(f"MLflow run: {link}")
    with contextlib.suppress(Exception):
        print(f"run directory (per-rank logs): {results.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
