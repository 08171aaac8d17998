"""Functions the trainer tests run in every rank: third-party trainers, used as their docs say.

Each rank trains one step on data of its own (filled with its rank number), so that ranks that
really all-reduce end with equal parameters and ranks that train alone do not. They live in
their own module so that ranks unpickle them by reference without importing the test modules.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn


def warm() -> bool:
    """Whether the rank started with its process group formed ahead of the call."""
    import torch.distributed as dist

    return dist.is_initialized()


def _rank() -> int:
    return int(os.environ["RANK"])


def _batch(rank: int, rows: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((rows, 4), float(rank + 1)), torch.zeros(rows, 1)


def _params(model: nn.Module) -> list[float]:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


def _model() -> nn.Linear:
    torch.manual_seed(0)  # same initial weights on every rank, as the trainers expect
    return nn.Linear(4, 1)


def gloo_sockets() -> dict[str, Any]:
    """The local addresses of this rank's TCP sockets after a gloo all-reduce."""
    import psutil
    import torch.distributed as dist

    from serverless_gpu import runtime

    started_warm = warm()
    runtime.init_process_group()
    value = torch.ones(1)
    dist.all_reduce(value)
    sockets = [
        (c.laddr.ip, c.laddr.port, c.status)
        for c in psutil.Process().net_connections("tcp")
        if c.laddr
    ]
    dist.destroy_process_group()
    return {
        "sum": float(value),
        "sockets": sockets,
        "store_port": int(os.environ["MASTER_PORT"]),
        "warm": started_warm,
    }


def accelerate_step() -> dict[str, Any]:
    from accelerate import Accelerator

    started_warm = warm()
    accelerator = Accelerator()
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    x, y = _batch(accelerator.process_index)
    loss = nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    return {
        "world_size": accelerator.num_processes,
        "distributed_type": str(accelerator.distributed_type),
        "params": _params(model),
        "warm": started_warm,
    }


class _Regressor(nn.Module):
    """A model as HF ``Trainer`` expects one: takes the batch's fields, returns the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = _model()

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.linear(x)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


def hf_trainer_step(output_dir: str) -> dict[str, Any]:
    from transformers import Trainer, TrainingArguments

    started_warm = warm()
    rank = _rank()
    x, y = _batch(rank)
    data = [{"x": x[i], "labels": y[i]} for i in range(len(x))]
    args = TrainingArguments(
        output_dir=os.path.join(output_dir, f"rank_{rank}"),
        per_device_train_batch_size=len(data),
        max_steps=1,
        learning_rate=0.1,
        lr_scheduler_type="constant",
        optim="sgd",
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    model = _Regressor()
    trainer = Trainer(model=model, args=args, train_dataset=data)
    # Each rank's sampler would split the dataset; every rank has its own data instead.
    trainer._get_train_sampler = lambda *_: torch.utils.data.SequentialSampler(data)  # type: ignore[method-assign]
    trainer.train()
    return {
        "world_size": args.world_size,
        "parallel_mode": str(args.parallel_mode),
        "params": _params(model),
        "warm": started_warm,
    }


def fabric_step() -> dict[str, Any]:
    from lightning.fabric import Fabric

    started_warm = warm()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    x, y = _batch(fabric.global_rank)
    loss = nn.functional.mse_loss(model(x), y)
    fabric.backward(loss)
    optimizer.step()
    return {"world_size": fabric.world_size, "params": _params(model), "warm": started_warm}


def trainer_env() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in ("ACCELERATE_USE_CPU", "GLOO_SOCKET_IFNAME")}


def deepspeed_step(stage: int) -> dict[str, Any]:
    import deepspeed

    started_warm = warm()
    model = _model()
    config = {
        "train_micro_batch_size_per_gpu": 8,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "zero_optimization": {"stage": stage},
        # DeepSpeed's SGD is not on ZeRO's list of tested optimizers (Adam is, but on CPU it needs
        # a second compiled op); ZeRO runs it all the same once allowed.
        "zero_allow_untested_optimizer": True,
    }
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    x, y = _batch(engine.global_rank)
    loss = nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
    return {"world_size": engine.world_size, "params": _params(engine.module), "warm": started_warm}
