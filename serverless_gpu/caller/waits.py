"""How a caller's wait for a run reads its arguments and says it gave up (a live handle, a
re-attached one and a retrying run alike)."""

from __future__ import annotations

import math
import time
from pathlib import Path

from serverless_gpu.common.errors import WaitTimeoutError
from serverless_gpu.wire.runpaths import RunPaths


def logs_first(timeout: float | bool | None, logs: bool) -> tuple[float | None, bool]:
    """``result(True)``: the original API's ``result`` takes ``logs`` first, and a timeout of
    True seconds means nothing."""
    if isinstance(timeout, bool):
        return None, timeout or logs
    return timeout, logs


def still_running(run_id: str, timeout: float | None, run_dir: Path) -> WaitTimeoutError:
    """What ``result(timeout)`` raises when the run outlives the wait."""
    return WaitTimeoutError(
        f"run {run_id} still running after waiting {timeout:g} s; it goes on "
        "(call result() again to keep waiting, or cancel() to stop it)",
        run_dir=run_dir,
    )


def read_log(paths: RunPaths, rank: int) -> str:
    """Rank ``rank``'s log so far; empty before the rank has started."""
    try:
        return paths.log(rank).read_text(errors="replace")
    except FileNotFoundError:
        return ""


def check_timeout(timeout: float | None) -> None:
    """A wait's ``timeout``: None (no limit) or seconds >= 0; NaN would never be reached."""
    if timeout is not None and (math.isnan(timeout) or timeout < 0):
        raise ValueError(
            f"timeout must be None (wait until the run ends) or a number of seconds >= 0, "
            f"not {timeout!r}"
        )


def deadline_of(timeout: float | None) -> float | None:
    """When (``time.monotonic()``) a wait of ``timeout`` seconds ends; None: never."""
    check_timeout(timeout)
    return None if timeout is None else time.monotonic() + timeout
