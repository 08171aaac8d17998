"""Private per-run directories: payload, per-rank logs, results and error records.

They live under ``$SERVERLESS_GPU_RUNS_DIR`` (default: ``<tmp>/serverless-gpu-<uid>``), mode
0700. Bulk files are deleted once a call returns; logs of the newest runs are kept for the user
and older run directories are pruned.

Result files go to a twin folder on a tmpfs when there is a large enough one (``/dev/shm``):
written there they never wait for disk write-back, and the caller maps them straight from
memory. ``$SERVERLESS_GPU_RESULTS_DIR`` names another root, or ``off`` keeps them in the run
directory.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
import uuid
from pathlib import Path

RUNS_DIR_ENV = "SERVERLESS_GPU_RUNS_DIR"
KEEP_RUNS_ENV = "SERVERLESS_GPU_KEEP_RUNS"
DEFAULT_KEEP_RUNS = 20
RESULTS_DIR_ENV = "SERVERLESS_GPU_RESULTS_DIR"
_OWNER = "run_dir"
MIN_TMPFS_BYTES = 1 << 30
"""A smaller /dev/shm (Docker's default is 64 MB) is left to NCCL and DataLoader workers."""


def runs_root() -> Path:
    configured = os.environ.get(RUNS_DIR_ENV)
    return _private(
        Path(configured) if configured else Path(tempfile.gettempdir()) / _user_dir(),
        RUNS_DIR_ENV,
    )


def results_root() -> Path | None:
    """The root of the results twins, or None (results then stay in the run directory)."""
    configured = os.environ.get(RESULTS_DIR_ENV)
    if configured == "off":
        return None
    if configured:
        return _private(Path(configured), RESULTS_DIR_ENV)
    try:
        shm = os.statvfs("/dev/shm")
    except OSError:
        return None
    if shm.f_blocks * shm.f_frsize < MIN_TMPFS_BYTES:
        return None
    try:
        return _private(Path("/dev/shm") / _user_dir(), RESULTS_DIR_ENV)
    except OSError:  # read-only or not ours: the run directory will do
        return None


def _user_dir() -> str:
    return f"serverless-gpu-{os.getuid()}"


def _private(root: Path, env: str) -> Path:
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    if root.stat().st_uid != os.getuid():
        raise PermissionError(f"{root} belongs to another user; set {env}")
    os.chmod(root, 0o700)
    return root


def new_run_dir(name: str) -> tuple[str, Path, Path | None]:
    """A fresh private directory for one run, the run's id, and its results twin (if any)."""
    run_id = uuid.uuid4().hex[:12]
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:40]
    path = runs_root() / f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}-{run_id}"
    path.mkdir(mode=0o700)
    results_base = results_root()
    results = None
    if results_base is not None:
        results = results_base / path.name
        results.mkdir(mode=0o700)
        # Callers with different runs directories share the results root: the link says whose
        # twin this is, so that a twin is pruned only once its own run directory is gone.
        (results / _OWNER).symlink_to(path)
    prune_runs(keep=int(os.environ.get(KEEP_RUNS_ENV, DEFAULT_KEEP_RUNS)), exclude=path)
    if results_base is not None:
        prune_orphans(results_base)
    return run_id, path, results


def result_paths(run_dir: Path, results_dir: Path | None, rank: int) -> list[Path]:
    """Where a rank's result may be, preferred first: the tmpfs twin when there is one (the rank
    falls back to the run directory when the tmpfs is full)."""
    name = f"result_{rank}.pkl"
    return [results_dir / name, run_dir / name] if results_dir else [run_dir / name]


def prune_orphans(results_base: Path) -> None:
    """Results twins whose run directory no longer exists: left by a caller and launcher that
    were both killed before they could delete them (tmpfs files hold memory)."""
    for twin in results_base.iterdir():
        owner = twin / _OWNER
        if owner.is_symlink() and not owner.exists():  # the link's target, the run dir, is gone
            shutil.rmtree(twin, ignore_errors=True)


def prune_runs(keep: int, exclude: Path) -> None:
    """Delete all but the newest ``keep`` run directories."""
    runs: list[tuple[float, Path]] = []
    for path in exclude.parent.iterdir():
        try:
            if path.is_dir() and path != exclude:
                runs.append((path.stat().st_mtime, path))
        except FileNotFoundError:
            pass  # another caller of the same user pruned it meanwhile
    runs.sort()
    for _, old in runs[: max(0, len(runs) - keep + 1)]:
        shutil.rmtree(old, ignore_errors=True)
