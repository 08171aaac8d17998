"""The run hook: makes every ``.distributed()`` call an MLflow run unless ``tracking=False``.

This module is imported with ``serverless_gpu``; mlflow is imported only for tracked calls (by
the warm-up thread of a tracked decoration, else by the first call), so that ``import
serverless_gpu`` stays fast and works without mlflow installed.
"""

from __future__ import annotations

import warnings
from urllib.parse import urlparse

from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.tracking.errors import TrackingWarning
from serverless_gpu.wire.events import Subscriber

_missing_mlflow_warned: list[bool] = []


def prepare_ahead() -> None:
    """What a tracked call's setup does first, done once per store by the warm-up thread at
    decoration / ``%load_ext`` while the user writes the next cell: import the tracker (with
    mlflow, about 1.3 s of CPU) and a database store's module (SQLAlchemy, alembic: 0.6 s),
    resolve the run's context tags (GitPython, IPython for MLflow's Databricks check), and
    open a SQLite store that exists already (its engine and schema check, kept by MLflow per
    process). A store is never created here: a decorated function never called leaves no file."""
    try:
        import mlflow
        from mlflow.tracking.context.registry import resolve_tags

        import serverless_gpu.tracking.tracker  # noqa: F401
        from serverless_gpu.tracking.private import OPENING, sqlite_path

        uri = mlflow.get_tracking_uri()
        if uri in _prepared:
            return
        if urlparse(uri).scheme not in ("http", "https", "databricks"):
            import mlflow.store.tracking.sqlalchemy_store
        resolve_tags()  # the same imports and git read as the call's
        path = sqlite_path(uri)
        with OPENING:  # not while a call makes that store
            if path is not None and path.is_file() and path.stat().st_size > 0:
                mlflow.MlflowClient(uri).search_experiments(max_results=1)  # a read
        _prepared.add(uri)
    except Exception:  # no mlflow, a broken store: the call says so, as it would have
        pass


_prepared: set[str] = set()
"""Store URIs whose setup this process has done ahead (each decoration would do it again)."""


def tracking_hook(ctx: RunContext) -> Subscriber | None:
    if not ctx.config.tracking:
        return None
    try:
        import mlflow  # noqa: F401 - once per process (often ahead: prepare_ahead)
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
