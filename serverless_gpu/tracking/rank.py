"""The rank initializer: fast MLflow logging in every rank of a tracked call.

It never imports mlflow itself (a rank that does not log should not pay ~1.5 s for the
import): if mlflow is not imported yet, an import hook patches it the moment the user's code
(or the unpickling of the user's function) imports it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType

from serverless_gpu.common import settings
from serverless_gpu.rank import runtime
from serverless_gpu.tracking.errors import TrackingWarning
from serverless_gpu.tracking.rank_buffer import RankBuffer

_STOPPED_FLUSH_WAIT_S = 0.5
"""How long a stopped rank's last flush waits for one under way (the launcher kills the rank
a second after stopping it)."""


def install() -> None:
    """Called by the worker in each rank before the user's function is loaded."""
    if not settings.MLFLOW_RUN_ID.present():
        return  # an untracked call
    run_id = settings.MLFLOW_RUN_ID.read()
    buffer = RankBuffer(run_id, settings.MLFLOW_FLUSH_INTERVAL.read(), runtime.send_to_caller)
    runtime.on_rank_exit(buffer.close)
    runtime.on_stopped(lambda: buffer.flush_within(_STOPPED_FLUSH_WAIT_S))
    runtime.on_cell_end(buffer.flush)
    if "mlflow" in sys.modules:
        _patch(buffer)
    else:
        sys.meta_path.insert(0, _PatchOnImport(lambda: _patch(buffer)))


def _patch(buffer: RankBuffer) -> None:
    from serverless_gpu.tracking.fluent_patch import install as install_fast_logging

    try:
        install_fast_logging(
            buffer, settings.MLFLOW_ARTIFACT_URI.read() or None, runtime.get_global_rank()
        )
    except Exception as exc:  # an MLflow we cannot patch still logs, through its slow path
        warnings.warn(
            f"serverless_gpu: fast MLflow logging is off in this rank ({exc!r})",
            TrackingWarning,
            stacklevel=2,
        )


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs ``after`` once the ``mlflow`` package has finished importing."""

    def __init__(self, after: Callable[[], None]) -> None:
        self._after = after

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "mlflow":
            return None
        sys.meta_path.remove(self)  # one use; the real finders locate the package
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _PatchAfterExec(spec.loader, self._after)
        return spec


class _PatchAfterExec(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, after: Callable[[], None]) -> None:
        self._loader = loader
        self._after = after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # The package keeps its real loader (importlib.resources and inspect read it).
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._after()
