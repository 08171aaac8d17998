"""Installing the fast functions of :mod:`.fast_logging` in place of MLflow's fluent ones.

MLflow's fluent functions resolve the active run, build a client and validate on every call
(~0.3 ms each even over a store that does nothing), which is why they are replaced rather than
given a faster store.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from serverless_gpu.tracking.fast_logging import FastLogging
from serverless_gpu.tracking.rank_buffer import RankBuffer

PATCHED = (
    "log_metric", "log_metrics", "log_param", "log_params", "set_tag", "set_tags",
    "log_artifact", "log_artifacts",
)  # fmt: skip
_MARK = "__serverless_gpu_fast__"


def install(buffer: RankBuffer, artifact_uri: str | None = None, rank: int = 0) -> None:
    """Replace the fluent functions in ``mlflow`` and ``mlflow.tracking.fluent`` (idempotent)."""
    import mlflow
    from mlflow.tracking import fluent

    if getattr(fluent.log_metric, _MARK, False):
        return
    fast = FastLogging(buffer, fluent, artifact_uri, rank)
    for name in PATCHED:
        original = getattr(fluent, name)
        fast.originals[name] = original
        wrapper = _function(getattr(fast, name), original)
        # Both names: user code calls mlflow.log_metric; a pickled reference resolves the
        # function through its defining module, mlflow.tracking.fluent.
        setattr(fluent, name, wrapper)
        setattr(mlflow, name, wrapper)


def _function(method: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """A plain function (a bound method cannot carry the original's name and docstring)."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return method(*args, **kwargs)

    setattr(wrapper, _MARK, True)
    return wrapper
