"""How a caller's wait for a run reads its arguments and says it gave up (a live handle, a
re-attached one and a retrying run alike)."""

from __future__ import annotations

from pathlib import Path

from serverless_gpu.common.errors import WaitTimeoutError


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
