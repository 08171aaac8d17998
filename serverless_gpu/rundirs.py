"""Private per-run directories: payload, per-rank logs, results and error records.

They live under ``$SERVERLESS_GPU_RUNS_DIR`` (default: ``<tmp>/serverless-gpu-<uid>``), mode
0700. Bulk files are deleted once a call returns; logs of the newest runs are kept for the user
and older run directories are pruned.
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


def runs_root() -> Path:
    configured = os.environ.get(RUNS_DIR_ENV)
    root = (
        Path(configured)
        if configured
        else Path(tempfile.gettempdir()) / f"serverless-gpu-{os.getuid()}"
    )
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    if root.stat().st_uid != os.getuid():
        raise PermissionError(f"{root} belongs to another user; set {RUNS_DIR_ENV}")
    os.chmod(root, 0o700)
    return root


def new_run_dir(name: str) -> tuple[str, Path]:
    """A fresh private directory for one run, and the run's id."""
    run_id = uuid.uuid4().hex[:12]
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:40]
    path = runs_root() / f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}-{run_id}"
    path.mkdir(mode=0o700)
    prune_runs(keep=int(os.environ.get(KEEP_RUNS_ENV, DEFAULT_KEEP_RUNS)), exclude=path)
    return run_id, path


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
