"""The original API's view of runs: ``workload_metadata``, ``print_runs(runs)``, ``stop(runs)``.

What a run was (its name, ranks, device, parameters, links) is read from its ``run.json``
(``runrecord.py``, written when the run starts), so a handle of this process and a run
re-attached from another one describe themselves alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from serverless_gpu.caller.runrecord import read_record
from serverless_gpu.wire.events import RunStatus
from serverless_gpu.wire.runpaths import RunPaths

if TYPE_CHECKING:
    from serverless_gpu.caller.handle import RunHandle

STOPPED_BY = "stopped by serverless_gpu.stop()"


@dataclass(frozen=True)
class WorkloadMetadata:
    """One run, with the original API's field names (``h.workload_metadata``)."""

    name: str
    gpus: int
    """The run's ranks (GPUs, or CPU ranks in CPU mode)."""
    instance: str
    """The GPU family (``"H100"``), or ``"cpu"``."""
    workload_run: str
    """The run's id (``RunHandle.from_run_id`` takes it)."""
    workload_run_link: str
    """The run's MLflow page when tracked, else its run directory."""
    status: RunStatus
    view_logs_link: str
    """The folder of the ranks' logs (one file per rank, named by ``RunPaths.log``)."""
    params: dict[str, Any] = field(default_factory=dict)
    """The call's arguments by parameter name, as short strings (a ``map`` or ``sweep``
    item's arguments for a trial)."""
    system_metrics_link: str | None = None
    """The MLflow run, whose system metrics are logged with it, when tracked."""
    mlflow_run_id: str | None = None
    links: dict[str, str] = field(default_factory=dict)
    """Every link of the run (``"mlflow"`` when tracked), as ``handle.links``."""


def metadata_of(handle: RunHandle[Any]) -> WorkloadMetadata:
    status = handle.status
    run_dir = handle.run_dir
    record = read_record(run_dir)
    links = {str(k): str(v) for k, v in dict(record.get("links") or {}).items()}
    mlflow = links.get("mlflow")
    return WorkloadMetadata(
        name=str(record.get("run_name") or record.get("name") or ""),
        gpus=int(record.get("world_size") or 0),
        instance=str(record.get("gpu_type") or record.get("device") or ""),
        workload_run=handle.run_id,
        workload_run_link=mlflow or str(run_dir),
        status=status,
        view_logs_link=str(RunPaths(run_dir).logs),
        params=dict(record.get("params") or {}),
        system_metrics_link=mlflow,
        mlflow_run_id=(record.get("mlflow") or {}).get("run_id"),
        links=links,
    )


def _each(runs: RunHandle[Any] | Iterable[RunHandle[Any]]) -> list[RunHandle[Any]]:
    # A handle is not iterable, a list of them is (the handle module imports this one).
    return list(runs) if isinstance(runs, Iterable) else [runs]


def describe(handle: RunHandle[Any]) -> str:
    """What ``print_runs`` prints for one run."""
    meta = handle.workload_metadata
    return "\n".join(
        [
            f"  Run ID   : {meta.workload_run}",
            f"  Function : {meta.name}",
            f"  Params   : {meta.params}",
            f"  Status   : {meta.status.value}",
            f"  GPUs     : {meta.gpus} x {meta.instance}",
            f"  Link     : {meta.workload_run_link}",
            f"  Logs     : {meta.view_logs_link}",
        ]
    )


def print_runs(runs: RunHandle[Any] | Iterable[RunHandle[Any]]) -> None:
    """Print each run's id, function, parameters, status, ranks, link and logs folder."""
    handles = _each(runs)
    for handle in handles:
        print("=" * 40)
        print(describe(handle))
    if handles:
        print("=" * 40)


def stop(runs: RunHandle[Any] | Iterable[RunHandle[Any]]) -> None:
    """Cancel each run that is still going (``handle.cancel()``); returns at once. A run
    re-attached from another process can be stopped when ``serverless-gpu run`` started it."""
    for handle in _each(runs):
        if not handle.done():
            print(f"Stopping run {handle.run_id} ({handle.workload_metadata.name})")
            handle.cancel(STOPPED_BY)
