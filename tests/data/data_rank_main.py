"""One rank of a multi-process test (started by the ``launch`` fixture; not a test module).

``entry`` runs in a process forked from the forkserver; ``python data_rank_main.py CONFIG_JSON``
(with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set) does the same by hand. Each rank writes
result<rank>.json next to the config.
"""

from __future__ import annotations

import faulthandler
import json
import multiprocessing
import os
import random
import signal
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from serverless_gpu.data import (
    VolumeDataset,
    VolumeWriter,
    checkpoint_path,
    latest_checkpoint,
    load_training_state,
    save_training_state,
)


def read_sample(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A sample file holds 9 little-endian float32: 8 features and a target."""
    values = torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.float32)
    return values[:8].clone(), values[8:].clone()


def names(batch: list[str]) -> list[str]:
    return [os.path.basename(p) for p in batch]


def sharding(cfg: dict[str, Any]) -> dict[str, Any]:
    """Two full epochs, then epoch 2 interrupted after k batches and resumed from state_dict."""

    def make() -> VolumeDataset[Any]:
        return VolumeDataset(
            cfg["volume"],
            cfg["cache_dir"],
            shuffle=True,
            seed=7,
            balance="none",
            prefetch=2,
            min_free_bytes=0,
            storage_options=cfg["storage_options"],
        )

    ds = make()
    loader = ds.loader(batch_size=2, num_workers=2)
    epochs = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        epochs.append([n for batch in loader for n in names(batch)])

    ds.set_epoch(2)
    full = [n for batch in loader for n in names(batch)]

    ds = make()
    loader = ds.loader(batch_size=2, num_workers=2)
    ds.set_epoch(2)
    iterator = iter(loader)
    first = [n for _ in range(cfg["resume_after"]) for n in names(next(iterator))]
    state = json.loads(json.dumps(ds.state_dict()))  # must survive JSON
    del iterator

    resumed = make()
    resumed_loader = resumed.loader(batch_size=2, num_workers=2)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)
    rest = [n for batch in resumed_loader for n in names(batch)]
    dist.barrier()
    return {"epochs": epochs, "full": full, "first": first, "rest": rest}


KILLED_IN_FINISH = "killed_in_finish"


class CrashingWriter(VolumeWriter):
    """Dies by SIGKILL on the coordinator after every rank's shards were uploaded but before
    ``.metadata`` is published: the worst moment for a crash."""

    def __init__(self, path: str, *, marker: Path, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.marker = marker

    def finish(self, metadata: Any, results: Any) -> None:
        # The marker tells this death from any other SIGKILL (the launch fixture's, say).
        self.marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)


def build_model(parallel: str) -> torch.nn.Module:
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1)
    )
    if parallel == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    for layer in (model[0], model[3]):
        fully_shard(layer)
    fully_shard(model)
    return model


def train(cfg: dict[str, Any], *, resume: bool, crash_at: int | None, save: bool) -> list[float]:
    """Train ``total_steps`` steps; return this rank's loss per step (index 0 = step 1 or the
    first step after the resumed one)."""
    torch.manual_seed(0)
    random.seed(0)
    model = build_model(cfg["parallel"])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    dataset = VolumeDataset(
        cfg["volume"],
        cfg["cache_dir"],
        transform=read_sample,
        shuffle=True,
        seed=3,
        prefetch=2,
        min_free_bytes=0,
        storage_options=cfg["storage_options"],
    )
    loader = dataset.loader(batch_size=2, num_workers=2)
    root, options = cfg["ckpt_root"], cfg["storage_options"]
    step = 0
    if resume:
        latest = latest_checkpoint(root, options)
        assert latest is not None
        restored = load_training_state(
            latest, model=model, optimizer=optimizer, dataset=dataset, storage_options=options
        )
        assert restored.step is not None
        assert restored.step == cfg["expect_resume_step"], (latest, restored.step)
        step = restored.step
    losses: list[float] = []
    pending = None
    log = Path(cfg["workdir"]) / f"losses{dist.get_rank()}.jsonl"
    while step < cfg["total_steps"]:
        dataset.set_epoch(dataset.epoch)
        for x, y in loader:
            step += 1
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if save:
                with log.open("a") as out:  # survives the SIGKILL
                    out.write(json.dumps([step, loss.item()]) + "\n")
            if save and step in cfg["save_steps"] + [crash_at]:
                if pending is not None:
                    pending.result()
                path = checkpoint_path(root, step)
                writer: VolumeWriter
                if step == crash_at:
                    marker = Path(cfg["workdir"]) / KILLED_IN_FINISH
                    writer = CrashingWriter(path, marker=marker, storage_options=options)
                else:
                    writer = VolumeWriter(path, storage_options=options)
                pending = save_training_state(
                    path,
                    model=model,
                    optimizer=optimizer,
                    dataset=dataset,
                    step=step,
                    storage_options=options,
                    writer=writer,
                    async_save=cfg["async_save"],
                )
            if step == cfg["total_steps"]:
                break
        dataset.set_epoch(dataset.epoch + 1)
    if pending is not None:
        pending.result()
    return losses


def training(cfg: dict[str, Any]) -> dict[str, Any]:
    if cfg["phase"] == "crash":
        train(cfg, resume=False, crash_at=cfg["crash_at"], save=True)
        raise AssertionError("the crashing save should have killed the coordinator")
    resumed = train(cfg, resume=True, crash_at=None, save=False)
    reference = train(cfg, resume=False, crash_at=None, save=False)
    return {"resumed": resumed, "reference": reference}


def entry(config_path: str, env: dict[str, str], log_path: str) -> None:
    """Forkserver target: own session (so the test can kill this rank with its DataLoader
    workers), the test's environment, output to a log file."""
    os.setsid()
    # Inherited from the forkserver; DataLoader workers should fork from the rank as they do
    # under a normal launcher on Linux.
    multiprocessing.set_start_method("fork", force=True)
    os.environ.clear()
    os.environ.update(env)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    # The launch fixture sends SIGUSR1 to the session of a rank that overran its time.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    torch.set_num_threads(1)
    main(Path(config_path))


def main(config_path: Path) -> None:
    cfg = json.loads(config_path.read_text())
    dist.init_process_group("gloo")
    try:
        result = {"sharding": sharding, "training": training}[cfg["scenario"]](cfg)
        out = config_path.parent / f"result{dist.get_rank()}.json"
        out.write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
