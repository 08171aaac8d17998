"""The runs and results roots: another local user who plants a link or a folder at their name
in the shared tmp folder gets a clear refusal, never our files, and nothing of ours is deleted
or chmod'ed through it."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from serverless_gpu.common.errors import DistributedError
from serverless_gpu.runfiles.rundirs import (
    KEEP_RUNS_ENV,
    RESULTS_DIR_ENV,
    RUNS_DIR_ENV,
    RunsDirError,
    _default_root,
    runs_root,
)

_PROTECTED_SYMLINKS = Path("/proc/sys/fs/protected_symlinks")


@pytest.fixture
def links_followed() -> Iterator[None]:
    """``fs.protected_symlinks=0``, as on hosts where the attack works, restored after."""
    try:
        before = _PROTECTED_SYMLINKS.read_text().strip()
    except OSError:
        pytest.skip(f"cannot read {_PROTECTED_SYMLINKS}")
    if before != "0":
        try:
            _PROTECTED_SYMLINKS.write_text("0")
        except OSError:
            pytest.skip(f"fs.protected_symlinks is {before} and {_PROTECTED_SYMLINKS} is read-only")
    try:
        yield
    finally:
        if before != "0":
            _PROTECTED_SYMLINKS.write_text(before)


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A tmp folder every user may write to (sticky, like /tmp)."""
    folder = Path(tempfile.mkdtemp(prefix="sgpu-shared-", dir="/tmp"))
    os.chmod(folder, 0o1777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# What the victim's call printed of the exception's classes (its MRO, in order).
_RAISED = (
    "'RunsDirError', 'PrivateDirError', 'ConfigurationError', 'CallerError', 'DistributedError'"
)


def _as_user(user: tuple[int, int], *command: str) -> None:
    subprocess.run(command, user=user[0], group=user[1], check=True, timeout=30)


def _victim_home(tmp_path: Path) -> tuple[Path, list[str]]:
    """A folder of the victim's with 25 old sub-folders (as many as pruning would thin)."""
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o755)
    names = [f"2020010{i % 10}-000000-project-{i:012x}" for i in range(25)]
    for name in names:
        (home / name).mkdir()
        (home / name / "notes.txt").write_text("mine")
        os.utime(home / name, (0, 0))
    return home, names


_CALLER = """
from serverless_gpu import distributed


@distributed(gpus=1, output="none", tracking=False)
def one():
    return 1


try:
    print("returned", one.distributed())
except Exception as exc:
    print("raised", [c.__name__ for c in type(exc).__mro__])
    print(exc)
"""


def _call_as_victim(shared_tmp: Path, tmp_path: Path) -> str:
    """A call in a fresh process whose tmp folder is ``shared_tmp``; what it printed. The
    decoration's warm-up thread meets the same root: it leaves the error to the call."""
    env = {k: v for k, v in os.environ.items() if k not in (RUNS_DIR_ENV, RESULTS_DIR_ENV)}
    env.update({"TMPDIR": str(shared_tmp), RESULTS_DIR_ENV: "off", KEEP_RUNS_ENV: "1"})
    script = tmp_path / "victim.py"
    script.write_text(_CALLER)
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


@pytest.mark.usefixtures("links_followed")
def test_a_planted_link_is_refused_and_nothing_is_pruned_through_it(
    other_user: tuple[int, int], shared_tmp: Path, tmp_path: Path
) -> None:
    home, names = _victim_home(tmp_path)
    _as_user(other_user, "ln", "-s", str(home), str(shared_tmp / f"serverless-gpu-{os.getuid()}"))
    printed = _call_as_victim(shared_tmp, tmp_path)
    assert _RAISED in printed, printed
    assert "symlink" in printed and f"Set {RUNS_DIR_ENV} to a private folder" in printed
    assert sorted(os.listdir(home)) == sorted(names)  # nothing pruned, nothing added
    assert stat.S_IMODE(home.stat().st_mode) == 0o755  # not chmod'ed


def test_a_folder_planted_by_another_user_is_refused(
    other_user: tuple[int, int], shared_tmp: Path, tmp_path: Path
) -> None:
    planted = shared_tmp / f"serverless-gpu-{os.getuid()}"
    _as_user(other_user, "mkdir", "-m", "777", str(planted))
    printed = _call_as_victim(shared_tmp, tmp_path)
    assert _RAISED in printed, printed
    assert f"belongs to user id {other_user[0]}" in printed
    assert os.listdir(planted) == []  # no file of ours went there


@pytest.mark.usefixtures("links_followed")
@pytest.mark.parametrize("env", [RUNS_DIR_ENV, RESULTS_DIR_ENV])
def test_either_default_root_refuses_a_planted_link(
    other_user: tuple[int, int], shared_tmp: Path, tmp_path: Path, env: str
) -> None:
    home, names = _victim_home(tmp_path)
    root = shared_tmp / "root"
    _as_user(other_user, "ln", "-s", str(home), str(root))
    with pytest.raises(RunsDirError, match=f"(?i)set {env}"):
        _default_root(root, env)
    assert sorted(os.listdir(home)) == sorted(names)
    assert stat.S_IMODE(home.stat().st_mode) == 0o755


def test_default_root_is_made_private_and_a_loose_one_refused(tmp_path: Path) -> None:
    umask = os.umask(0)
    try:
        root = _default_root(tmp_path / "fresh", RUNS_DIR_ENV)
    finally:
        os.umask(umask)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    with pytest.raises(RunsDirError, match="chmod 700"):
        _default_root(loose, RUNS_DIR_ENV)
    assert stat.S_IMODE(loose.stat().st_mode) == 0o755


def test_configured_root_open_to_every_user_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv(RUNS_DIR_ENV, str(shared))
    with pytest.raises(DistributedError, match="chmod o-w"):
        runs_root()
    monkeypatch.setenv(RUNS_DIR_ENV, str(tmp_path / "new" / "runs"))
    assert stat.S_IMODE(runs_root().stat().st_mode) == 0o700  # made by us: private
