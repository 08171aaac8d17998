"""Warming up ahead of the first call: the launcher and standby ranks of the expected shape,
started in the background when a function is decorated (or ``%load_ext`` runs), so that
decorating never delays the cell."""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Callable

from serverless_gpu.backends.base import Backend
from serverless_gpu.backends.local import default_backend
from serverless_gpu.common import settings
from serverless_gpu.common.errors import DistributedError
from serverless_gpu.common.gpus import GPUType, resolve_placement
from serverless_gpu.tracking.hook import prepare_ahead

_prewarm_threads: set[threading.Thread] = set()
WARMUP_ENV = settings.WARMUP.name


def warm_up(gpus: int | None = None, gpu_type: str | GPUType | None = None) -> None:
    """Start the launcher and standby ranks in the background (``%load_ext`` calls this), so
    that the first call of a session finds them ready. ``SERVERLESS_GPU_WARMUP=0`` disables."""
    if settings.WARMUP.read():
        start_prewarm(lambda: prewarm(default_backend(), gpus, gpu_type, tracking=True))


def prewarm(
    backend: Backend,
    gpus: int | None,
    gpu_type: str | GPUType | None,
    tracking: bool,
    warm_group: bool = True,
    per_node: int | None = None,
) -> None:
    # The launcher's start (a fresh interpreter importing torch: seconds) goes first, so that
    # reading the GPUs through NVML overlaps it instead of delaying it.
    backend.start()
    try:
        placement = resolve_placement(gpus, gpu_type, per_node)
    except Exception:  # the call itself will report a bad configuration
        return
    # Ranks of a tracked call import mlflow; importing it once in the launcher saves seconds of
    # CPU per rank.
    tracked = tracking and importlib.util.find_spec("mlflow") is not None
    backend.prewarm(placement, ("mlflow",) if tracked else (), warm_group)
    if tracked:  # after the launcher's start, which it would otherwise slow down
        prepare_ahead()


def start_prewarm(target: Callable[[], None]) -> None:
    """Warm up in the background so decorating never delays the cell."""

    def run() -> None:
        try:
            target()
        except DistributedError:
            pass  # e.g. an unsafe runs folder: the call raises the same error, in the cell
        finally:
            _prewarm_threads.discard(thread)

    thread = threading.Thread(target=run, name="serverless-gpu-prewarm", daemon=True)
    _prewarm_threads.add(thread)
    thread.start()


def join_prewarm(timeout: float = 10.0) -> None:
    """Wait for background warm-ups (so that a shutdown is not followed by a late start)."""
    for thread in list(_prewarm_threads):
        thread.join(timeout)
