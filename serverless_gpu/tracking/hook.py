"""The run hook: makes every ``.distributed()`` call an MLflow run unless ``tracking=False``.

This module is imported with ``serverless_gpu``; mlflow is imported only by the first tracked
call, so that ``import serverless_gpu`` stays fast and works without mlflow installed.
"""

from __future__ import annotations

import warnings

from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.tracking.errors import TrackingWarning
from serverless_gpu.wire.events import Subscriber

_missing_mlflow_warned: list[bool] = []


def tracking_hook(ctx: RunContext) -> Subscriber | None:
    if not ctx.config.tracking:
        return None
    try:
        import mlflow  # noqa: F401 - the first tracked call pays for the import, once
    except ImportError:
        # Once per process: the warnings registry is reset whenever any library changes the
        # filters (torch does), so Python's own "once" is not enough.
        if _missing_mlflow_warned:
            return None
        _missing_mlflow_warned.append(True)
        warnings.warn(
            "serverless_gpu: mlflow is not installed, so calls are not tracked; install "
            "serverless-gpu[tracking], or pass tracking=False to @distributed to silence this",
            TrackingWarning,
            stacklevel=2,
        )
        return None
    from serverless_gpu.tracking.tracker import start_tracking

    try:
        return start_tracking(ctx)
    except Exception as exc:  # a tracking bug must not cost the user their training run
        warnings.warn(
            f"serverless_gpu: {ctx.name} not tracked in MLflow ({type(exc).__name__}: {exc})",
            TrackingWarning,
            stacklevel=2,
        )
        return None
