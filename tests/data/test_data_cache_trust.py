"""The cache trusts only what this user wrote, in folders only this user can write, for the
version of the file the source names: another local user who shares a ``cache_dir`` cannot
plant bytes or redirect downloads, and a source file rewritten at the same size is fetched
again."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from serverless_gpu.data import VolumeDataset
from serverless_gpu.runfiles.private_dirs import PrivateDirError

GOOD = b"good" * 256


def _as_user(user: tuple[int, int], *command: str) -> None:
    subprocess.run(command, user=user[0], group=user[1], check=True, timeout=30)


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    folder = tmp_path / "vol"
    folder.mkdir()
    (folder / "a.bin").write_bytes(GOOD)
    return folder


@pytest.fixture
def shared_cache(other_user: tuple[int, int]) -> Iterator[Path]:
    """A cache_dir another user made for everyone: ``mkdir -m 1777``."""
    parent = Path(tempfile.mkdtemp(prefix="sgpu-cache-", dir="/tmp"))
    os.chmod(parent, 0o1777)
    folder = parent / "cache"
    _as_user(other_user, "mkdir", "-m", "1777", str(folder))
    try:
        yield folder
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def test_bytes_planted_in_a_shared_cache_are_never_returned(
    other_user: tuple[int, int], shared_cache: Path, volume: Path
) -> None:
    dataset: VolumeDataset[str] = VolumeDataset(volume, shared_cache, in_place=False)
    # The namespace is computed from public facts (URL, options, boot id).
    planted = shared_cache / dataset._cache_namespace
    _as_user(other_user, "mkdir", "-p", str(planted))
    bad = b"evil" * 256
    cmd = f"printf '{bad.decode()}' > {planted}/a.bin; chmod -R a+rwx {planted}"
    _as_user(other_user, "sh", "-c", cmd)
    with pytest.raises(PrivateDirError, match=f"belongs to user id {other_user[0]}"):
        print([Path(p).read_bytes() for p in dataset])  # the attacker's bytes, before


def test_a_planted_namespace_link_does_not_redirect_downloads(
    other_user: tuple[int, int], tmp_path: Path, volume: Path
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o777)
    os.chown(theirs, *other_user)
    dataset: VolumeDataset[str] = VolumeDataset(volume, cache, in_place=False)
    (cache / dataset._cache_namespace).symlink_to(theirs)
    with pytest.raises(PrivateDirError, match="is a symlink"):
        list(dataset)
    assert list(theirs.rglob("*")) == []


def test_a_source_file_rewritten_at_the_same_size_is_fetched_again(
    tmp_path: Path, volume: Path
) -> None:
    cache = tmp_path / "cache"
    first: VolumeDataset[str] = VolumeDataset(volume, cache, in_place=False)
    assert [Path(p).read_bytes() for p in first] == [GOOD]
    newer = b"news" * 256
    (volume / "a.bin").write_bytes(newer)
    st = os.stat(volume / "a.bin")
    os.utime(volume / "a.bin", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    again: VolumeDataset[str] = VolumeDataset(volume, cache, in_place=False)
    assert [Path(p).read_bytes() for p in again] == [newer]


def test_a_cache_dir_open_to_every_user_is_refused(tmp_path: Path, volume: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chmod(cache, 0o1777)
    with pytest.raises(PrivateDirError, match="writable by every user"):
        list(VolumeDataset(volume, cache, in_place=False))
