"""A checkpoint folder in a place other users can write to: a step folder (or a link at its
place) that another local user planted never receives this user's shards."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from serverless_gpu.data import VolumeWriter


def _as_user(user: tuple[int, int], *command: str) -> None:
    subprocess.run(command, user=user[0], group=user[1], check=True, timeout=30)


@pytest.fixture
def shared(other_user: tuple[int, int]) -> Iterator[tuple[Path, Path]]:
    """(a folder every user may write to, the attacker's own folder)."""
    parent = Path(tempfile.mkdtemp(prefix="sgpu-ckpt-", dir="/tmp"))
    os.chmod(parent, 0o1777)
    theirs = parent / "theirs"
    _as_user(other_user, "mkdir", "-m", "777", str(theirs))
    try:
        yield parent, theirs
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def _save(step: Path) -> None:
    dcp.save({"w": torch.ones(4)}, storage_writer=VolumeWriter(step), no_dist=True)


@pytest.mark.parametrize("planted", ["link", "folder"])
def test_a_step_folder_another_user_planted_gets_no_shard(
    other_user: tuple[int, int], shared: tuple[Path, Path], planted: str
) -> None:
    parent, theirs = shared
    step = parent / "step_000001"
    if planted == "link":
        _as_user(other_user, "ln", "-s", str(theirs), str(step))
    else:
        _as_user(other_user, "mkdir", "-m", "777", str(step))
    # dcp.save wraps every rank's error in its own CheckpointException; the message is ours.
    with pytest.raises(CheckpointException, match=f"{step} belongs to user id {other_user[0]}"):
        _save(step)
    assert not any(theirs.iterdir()) and not (step / ".metadata").exists()


def test_a_step_folder_of_ours_reached_through_our_link_is_fine(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "step_000001").symlink_to(tmp_path / "real")
    _save(tmp_path / "step_000001")
    assert (tmp_path / "real" / ".metadata").is_file()
