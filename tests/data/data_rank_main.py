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
import torch.distributed.checkpoint as dcp

from serverless_gpu.data import (
    VolumeDataset,
    VolumeReader,
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


class NotingReader(VolumeReader):
    """Notes the keys its direct read left to torch's path."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.left: set[str] = set()

    def _read_direct(self, items: Any, planner: Any) -> Any:
        rest = super()._read_direct(items, planner)
        self.left = self.left | {item.dest_index.fqn for item in rest}
        return rest


def reshard_state(sharded: bool, shards: dict[str, int]) -> dict[str, Any]:
    """The same values, each DTensor sharded along the dim ``shards`` gives; plain tensors
    (identical on every rank, saved once) where ``sharded`` is false."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    generator = torch.Generator().manual_seed(0)
    values: dict[str, Any] = {
        "rows": torch.randn(6, 4, generator=generator),
        "cols": torch.randn(6, 4, generator=generator),
        "half": torch.randn(8, 3, generator=generator).to(torch.bfloat16),
        "flag": torch.rand(5, generator=generator) > 0.5,
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 3),
        "wide": torch.randn(3, 5, generator=generator),
        "step": 7,
    }
    if sharded:
        for key, dim in shards.items():
            values[key] = distribute_tensor(values[key], mesh, [Shard(dim)])
    return values


def reshard(cfg: dict[str, Any]) -> dict[str, Any]:
    """Save with one layout, load with another: the loads read parts of saved chunks."""
    path, options = cfg["ckpt"], cfg["storage_options"]
    saved = reshard_state(cfg["save_sharded"], {"rows": 1, "cols": 0})
    dcp.save(saved, storage_writer=VolumeWriter(path, storage_options=options))
    expected = reshard_state(False, {})
    loaded = reshard_state(True, {"rows": 0, "cols": 1})
    for key, value in list(loaded.items()):
        if isinstance(value, torch.Tensor) and not hasattr(value, "full_tensor"):
            loaded[key] = torch.zeros_like(value)
        elif hasattr(value, "full_tensor"):
            value.to_local().zero_()
    loaded["half"] = torch.zeros(8, 3)  # bf16 on disk, fp32 here: cast on the way in
    loaded["wide"] = torch.zeros(5, 3).t()  # a strided destination: read, then copied in
    loaded["step"] = 0
    reader = NotingReader(path, storage_options=options)
    dcp.load(loaded, storage_reader=reader)
    same = {}
    for key, want in expected.items():
        got = loaded[key]
        if hasattr(got, "full_tensor"):
            got = got.full_tensor()
        same[key] = bool(torch.equal(got, want.to(got.dtype))) if key != "step" else got == want
    return {"same": same, "left": sorted(reader.left)}


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
        scenarios = {"sharding": sharding, "training": training, "reshard": reshard}
        result = scenarios[cfg["scenario"]](cfg)
        out = config_path.parent / f"result{dist.get_rank()}.json"
        out.write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
