"""DDP and FSDP2 training checkpointed with VolumeWriter, a coordinator SIGKILLed mid-save,
resume from the latest complete checkpoint: the loss curve continues bit-for-bit."""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from data_rank_main import KILLED_IN_FINISH
from data_support import Launch, Storage

from serverless_gpu.data import (
    IncompleteCheckpointError,
    VolumeReader,
    checkpoint_path,
    is_complete,
    latest_checkpoint,
)

NUM_FILES = 30  # 15 per rank, 8 + 7 per worker, batch 2: 8 steps per epoch


def write_samples(storage: Storage) -> str:
    generator = torch.Generator().manual_seed(1234)
    for i in range(NUM_FILES):
        x = torch.randn(8, generator=generator)
        y = x[:3].sum(dim=0, keepdim=True) + 0.1 * torch.randn(1, generator=generator)
        storage.write(f"train/sample_{i:03d}.bin", torch.cat([x, y]).numpy().tobytes())
    return storage.url("train")


@dataclass(frozen=True)
class Case:
    async_save: bool
    save_steps: list[int]
    crash_at: int
    resume_step: int


CASES = {
    # DDP: async saves, resume mid-epoch at an odd batch count (exercises worker rotation).
    "ddp": Case(async_save=True, save_steps=[5, 9], crash_at=13, resume_step=9),
    # FSDP2: blocking saves, resume from an end-of-epoch checkpoint.
    "fsdp2": Case(async_save=False, save_steps=[4, 8], crash_at=12, resume_step=8),
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_crash_and_resume_continues_loss_curve_exactly(
    parallel: str, storage: Storage, tmp_path: Path, launch: Launch
) -> None:
    case = CASES[parallel]
    root = storage.url("ckpt")
    config = {
        "scenario": "training",
        "parallel": parallel,
        "volume": write_samples(storage),
        "cache_dir": str(tmp_path / "cache"),
        "storage_options": storage.storage_options,
        "ckpt_root": root,
        "total_steps": 16,
        "save_steps": case.save_steps,
        "crash_at": case.crash_at,
        "async_save": case.async_save,
        "expect_resume_step": case.resume_step,
    }

    crash_dir = tmp_path / "crash"
    crash = launch(
        {**config, "phase": "crash", "workdir": str(crash_dir)}, crash_dir, allow_failure=True
    )
    assert crash.returncodes[0] == -signal.SIGKILL, crash.logs[0][-2000:]
    assert (crash_dir / KILLED_IN_FINISH).exists(), crash.logs

    crashed = checkpoint_path(root, case.crash_at)
    shards = storage.ls_names(crashed.removeprefix(storage.root + "/"))
    assert {"__0_0.distcp", "__1_0.distcp"} <= shards  # every rank's shard was uploaded...
    assert ".metadata" not in shards  # ...but the checkpoint was never published
    assert not is_complete(crashed, storage.storage_options)
    with pytest.raises(IncompleteCheckpointError):
        VolumeReader(crashed, storage_options=storage.storage_options).read_metadata()
    for step in case.save_steps:
        assert is_complete(checkpoint_path(root, step), storage.storage_options)
    latest = latest_checkpoint(root, storage.storage_options)
    assert latest == checkpoint_path(root, case.resume_step)

    resume_dir = tmp_path / "resume"
    resumed = launch({**config, "phase": "resume", "workdir": str(resume_dir)}, resume_dir)
    for rank in range(2):
        result = resumed.results[rank]
        assert result is not None
        reference = result["reference"]
        assert len(reference) == 16
        # The run that crashed saw exactly the reference numbers up to its death (an async
        # save lets the training thread run on a little while the coordinator uploads)...
        logged = [json.loads(line) for line in (crash_dir / f"losses{rank}.jsonl").open()]
        assert len(logged) >= case.crash_at
        assert [s for s, _ in logged] == list(range(1, len(logged) + 1))
        assert [loss for _, loss in logged] == reference[: len(logged)]
        # ...and the resumed run continues the uninterrupted curve exactly (==, not approx).
        assert result["resumed"] == reference[case.resume_step :]
