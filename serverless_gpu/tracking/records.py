"""What every tracked run records about itself. Never environment variables: they hold secrets."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import socket

import psutil

from serverless_gpu.caller.hooks import RunContext

PREFIX = "serverless_gpu."
"""Our params and tags are namespaced so that a user's ``log_param("gpus", ...)`` in a rank
cannot collide with them."""

STATUS_TAG = PREFIX + "status"
ERROR_TAG = PREFIX + "error"
"""The root cause of a failed run; for a cancelled one, the reason."""
HOST_TAG = PREFIX + "host"
OWNER_PID_TAG = PREFIX + "owner_pid"
OWNER_STARTED_TAG = PREFIX + "owner_started"
"""The calling process (pid and start time, which tell it from a later process with the same
pid): a RUNNING run whose owner is gone is ended as KILLED by the next tracked call."""
ATTEMPT_TAG = PREFIX + "attempt"
"""A retried call's attempt number (0 first) on each attempt's run."""
MAX_RETRIES_TAG = PREFIX + "max_retries"
CALLER_EXITED = "the calling process exited during the run"


def run_params(ctx: RunContext) -> dict[str, str]:
    gpus = ctx.config.gpus
    return {
        **ctx.metadata.get("params", {}),  # a sweep's trial: its arguments, for compare views
        PREFIX + "gpus": "all" if gpus is None else str(gpus),
        PREFIX + "gpu_type": ctx.placement.gpu_type.value,
        PREFIX + "world_size": str(ctx.placement.world_size),
        PREFIX + "timeout": "none" if ctx.timeout is None else f"{ctx.timeout:g}",
        PREFIX + "function": ctx.name,
        PREFIX + "version": _version("serverless-gpu"),
        PREFIX + "torch_version": _version("torch"),
    }


def owner_tags() -> dict[str, str]:
    return {
        HOST_TAG: socket.gethostname(),
        OWNER_PID_TAG: str(os.getpid()),
        OWNER_STARTED_TAG: f"{psutil.Process().create_time():.3f}",
    }


def run_tags(ctx: RunContext) -> dict[str, str]:
    names = ctx.placement.gpu_names
    return {
        **owner_tags(),
        PREFIX + "gpu_names": ", ".join(names) if names else "CPU",
        PREFIX + "device": ctx.placement.device,
        PREFIX + "call_id": ctx.run_id,
        PREFIX + "run_dir": str(ctx.run_dir),
    }


@functools.cache  # a lookup reads every installed distribution's metadata: ms, every call
def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
