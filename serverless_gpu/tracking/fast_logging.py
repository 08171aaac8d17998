"""Fast ``mlflow.log_metric`` & co. inside a rank: validate, append to the rank's buffer, return.

A call is buffered only when plain MLflow would log it into the call's run: no other run active,
no ``run_id`` other than ours, no model or dataset, not ``synchronous=True``, not in a process
forked from the rank. Anything else goes to the original function unchanged.

Metric names are validated with MLflow's own checks the first time each name is seen, values
and steps whenever they are not plain ``float``/``int``; params and tags on every call (they are
rare). Errors are MLflow's own ``MlflowException``, raised in the rank like plain MLflow does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, SupportsFloat

from serverless_gpu.tracking.fast_artifacts import RunArtifacts
from serverless_gpu.tracking.rank_buffer import RankBuffer


def _now_ms() -> int:
    return int(time.time() * 1000)


class FastLogging:
    """The replacement functions, bound to one rank's buffer."""

    def __init__(
        self, buffer: RankBuffer, fluent: Any, artifact_uri: str | None = None, rank: int = 0
    ) -> None:
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
        from mlflow.tracking.metric_value_conversion_utils import (
            convert_metric_value_to_float_if_possible,
        )
        from mlflow.utils import validation

        self.buffer = buffer
        self.originals: dict[str, Callable[..., Any]] = {}
        self._run_stack = fluent._active_run_stack
        self._active_model_id = fluent.get_active_model_id
        self._validation = validation
        self._to_float = convert_metric_value_to_float_if_possible
        self._error = MlflowException
        self._invalid = INVALID_PARAMETER_VALUE
        self._metric_names: set[str] = set()
        self._params: dict[str, str] = {}
        self._artifacts = None if artifact_uri is None else RunArtifacts(artifact_uri)
        self._rank_prefix = f"rank_{rank}/" if rank else ""
        self._rank_keys: dict[str, str] = {}

    # -- routing ----------------------------------------------------------------------------

    def _ours(self, run_id: str | None) -> bool:
        buffer = self.buffer
        if not buffer.active:
            return False
        if run_id is not None and run_id != buffer.run_id:
            return False
        stack = self._run_stack.get()
        if stack and stack[-1].info.run_id != buffer.run_id:
            return False
        return self._active_model_id() is None

    def _original(self, name: str, *args: Any, **kwargs: Any) -> Any:
        # Pass only what the caller gave: older MLflow versions lack some keywords.
        given = {k: v for k, v in kwargs.items() if v is not None}
        return self.originals[name](*args, **given)

    # -- metrics ----------------------------------------------------------------------------

    def _fast_path(
        self,
        synchronous: bool | None,
        run_id: str | None,
        model_id: str | None,
        dataset: Any,
        extra: dict[str, Any],
    ) -> bool:
        """Only plain calls into our run are buffered; anything MLflow-specific goes through."""
        return (
            not synchronous
            and model_id is None
            and dataset is None
            and not extra
            and self._ours(run_id)
        )

    def log_metric(
        self,
        key: str,
        value: SupportsFloat,
        step: int | None = None,
        synchronous: bool | None = None,
        timestamp: int | None = None,
        run_id: str | None = None,
        model_id: str | None = None,
        dataset: Any = None,
        **extra: Any,
    ) -> Any:
        if not self._fast_path(synchronous, run_id, model_id, dataset, extra):
            if self._ours(run_id):
                key = self._rank_key(key)
            return self._original(
                "log_metric", key, value, step=step, synchronous=synchronous,
                timestamp=timestamp, run_id=run_id, model_id=model_id, dataset=dataset, **extra,
            )  # fmt: skip
        self._add_metric(key, value, step, timestamp or _now_ms())
        return _no_wait(synchronous)

    def log_metrics(
        self,
        metrics: Mapping[str, SupportsFloat],
        step: int | None = None,
        synchronous: bool | None = None,
        run_id: str | None = None,
        timestamp: int | None = None,
        model_id: str | None = None,
        dataset: Any = None,
        **extra: Any,
    ) -> Any:
        if not self._fast_path(synchronous, run_id, model_id, dataset, extra):
            if self._ours(run_id):
                metrics = {self._rank_key(k): v for k, v in metrics.items()}
            return self._original(
                "log_metrics", metrics, step=step, synchronous=synchronous, run_id=run_id,
                timestamp=timestamp, model_id=model_id, dataset=dataset, **extra,
            )  # fmt: skip
        timestamp = timestamp or _now_ms()
        for key, value in metrics.items():
            self._add_metric(key, value, step, timestamp)
        return _no_wait(synchronous)

    def _add_metric(self, key: str, value: Any, step: Any, timestamp: int) -> None:
        if self._rank_prefix:
            key = self._rank_key(key)
        if type(value) is not float or key not in self._metric_names or type(step) not in _STEPS:
            value = self._checked_metric(key, value, step, timestamp)
        self.buffer.add_metric((key, value, timestamp, step or 0))

    def _rank_key(self, key: str) -> str:
        """Rank 0's metrics keep their names; rank N's go under ``rank_N/`` (unless already
        there), so that two ranks never interleave their values under one key."""
        if not self._rank_prefix:
            return key
        named = self._rank_keys.get(key)
        if named is None:
            named = key if key.startswith(self._rank_prefix) else self._rank_prefix + key
            self._rank_keys[key] = named
        return named

    def _checked_metric(self, key: str, value: Any, step: Any, timestamp: int) -> float:
        value = self._to_float(value)
        self._validation._validate_metric(key, value, timestamp, step or 0)
        self._metric_names.add(key)
        return float(value)

    # -- params and tags ----------------------------------------------------------------------

    def log_param(self, key: str, value: Any, synchronous: bool | None = None, **extra: Any) -> Any:
        if synchronous or extra or not self._ours(None):
            return self._original("log_param", key, value, synchronous=synchronous, **extra)
        self._add_param(key, value)
        return _no_wait(synchronous, value)

    def log_params(
        self,
        params: dict[str, Any],
        synchronous: bool | None = None,
        run_id: str | None = None,
        **extra: Any,
    ) -> Any:
        if synchronous or extra or not self._ours(run_id):
            return self._original(
                "log_params", params, synchronous=synchronous, run_id=run_id, **extra
            )
        for key, value in params.items():
            self._add_param(key, value)
        return _no_wait(synchronous)

    def set_tag(self, key: str, value: Any, synchronous: bool | None = None, **extra: Any) -> Any:
        if synchronous or extra or not self._ours(None):
            return self._original("set_tag", key, value, synchronous=synchronous, **extra)
        self._add_tag(key, value)
        return _no_wait(synchronous)

    def set_tags(self, tags: dict[str, Any], synchronous: bool | None = None, **extra: Any) -> Any:
        if synchronous or extra or not self._ours(None):
            return self._original("set_tags", tags, synchronous=synchronous, **extra)
        for key, value in tags.items():
            self._add_tag(key, value)
        return _no_wait(synchronous)

    # -- artifacts ----------------------------------------------------------------------------

    def log_artifact(
        self, local_path: str, artifact_path: str | None = None, run_id: str | None = None
    ) -> None:
        if self._artifacts is None or not self._ours(run_id):
            return self._original(
                "log_artifact", local_path, artifact_path=artifact_path, run_id=run_id
            )
        self._artifacts.log_artifact(local_path, artifact_path)
        return None

    def log_artifacts(
        self, local_dir: str, artifact_path: str | None = None, run_id: str | None = None
    ) -> None:
        if self._artifacts is None or not self._ours(run_id):
            return self._original(
                "log_artifacts", local_dir, artifact_path=artifact_path, run_id=run_id
            )
        self._artifacts.log_artifacts(local_dir, artifact_path)
        return None

    def _add_param(self, key: str, value: Any) -> None:
        key, text = _checked_pair(self._validation._validate_param(key, str(value)), key, value)
        known = self._params.get(key)
        if known == text:
            return  # already sent: every rank tends to log the same hyperparameters
        if known is not None:
            # What the store would answer, raised where plain MLflow raises it.
            raise self._error(
                f"Changing param values is not allowed. Param with key='{key}' was already "
                f"logged with value='{known}' for run ID='{self.buffer.run_id}'. "
                f"Attempted logging new value '{text}'.",
                self._invalid,
            )
        self._params[key] = text
        self.buffer.add_param(key, text)

    def _add_tag(self, key: str, value: Any) -> None:
        key, text = _checked_pair(self._validation._validate_tag(key, str(value)), key, value)
        self.buffer.add_tag(key, text)


_STEPS = (int, type(None))


def _checked_pair(validated: Any, key: str, value: Any) -> tuple[str, str]:
    """MLflow's validators return the (possibly truncated) entity; older ones return None."""
    if validated is not None and hasattr(validated, "value"):
        return validated.key, validated.value
    return key, str(value)


def _no_wait(synchronous: bool | None, value: Any = None) -> Any:
    """What plain MLflow returns: the value (log_param) or, when asked to be asynchronous, an
    operation to wait on: ours is already done, delivery is guaranteed by the rank's exit."""
    if synchronous is False:
        from mlflow.utils.async_logging.run_operations import RunOperations

        return RunOperations(None)
    return value
