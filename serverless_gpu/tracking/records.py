"""What every tracked run records about itself. Never environment variables: they hold secrets."""

from __future__ import annotations

import importlib.metadata
import socket

from ..hooks import RunContext

PREFIX = "serverless_gpu."
"""Our params and tags are namespaced so that a user's ``log_param("gpus", ...)`` in a rank
cannot collide with them."""

STATUS_TAG = PREFIX + "status"
ERROR_TAG = PREFIX + "error"
"""The root cause of a failed run; for a cancelled one, the reason."""


def run_params(ctx: RunContext) -> dict[str, str]:
    gpus = ctx.options.get("gpus")
    return {
        PREFIX + "gpus": "all" if gpus is None else str(gpus),
        PREFIX + "gpu_type": ctx.placement.gpu_type.value,
        PREFIX + "world_size": str(ctx.placement.world_size),
        PREFIX + "timeout": "none" if ctx.timeout is None else f"{ctx.timeout:g}",
        PREFIX + "function": ctx.name,
        PREFIX + "version": _version("serverless-gpu"),
        PREFIX + "torch_version": _version("torch"),
    }


def run_tags(ctx: RunContext) -> dict[str, str]:
    names = ctx.placement.gpu_names
    return {
        PREFIX + "host": socket.gethostname(),
        PREFIX + "gpu_names": ", ".join(names) if names else "CPU",
        PREFIX + "device": ctx.placement.device,
        PREFIX + "call_id": ctx.run_id,
        PREFIX + "run_dir": str(ctx.run_dir),
    }


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
