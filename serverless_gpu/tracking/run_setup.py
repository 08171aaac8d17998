"""Creating (or resuming) the MLflow run of one call, in the caller, before the ranks start.

The experiment is the one MLflow itself would use for ``mlflow.start_run()`` here:
``set_experiment``, ``MLFLOW_EXPERIMENT_NAME``/``_ID``, the notebook's context, or the default.
An active run in the caller makes ours its child; ``MLFLOW_RUN_ID`` resumes that run instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import partial

from mlflow import MlflowClient
from mlflow.entities import Run
from mlflow.tracking.context.registry import resolve_tags
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.common import settings
from serverless_gpu.tracking import records


@dataclass
class MlflowRun:
    """The MLflow run a call logs into."""

    uri: str
    mlflow_run_id: str
    experiment_id: str
    experiment_name: str
    artifact_uri: str
    resumed: bool = False
    params: dict[str, str] = field(default_factory=dict)
    """Params the run already has (a resumed run): ranks may not change them."""


def run_name(ctx: RunContext) -> str:
    name = ctx.config.run_name or ctx.name.rsplit(".", 1)[-1]
    trial = ctx.metadata.get("trial")
    return name if trial is None else f"{name} trial {trial}"


def open_run(
    ctx: RunContext,
    client: MlflowClient,
    uri: str,
    parent: Run | None,
    run_tags: dict[str, str] | None = None,
) -> MlflowRun:
    """``parent``: the caller's active run, looked up in the caller's thread (MLflow keeps it
    per thread, and this may run in another one). ``run_tags`` go into a new run's creation
    (one transaction); a resumed run is left to its caller to tag."""
    resume_id = os.environ.get("MLFLOW_RUN_ID")
    if resume_id:
        return _resume(client, uri, resume_id)
    name = run_name(ctx)
    # The owner from the start: a caller killed right after this call leaves a run to reap.
    tags = {**(run_tags or {}), **records.owner_tags()}
    call = ctx.call
    if call is not None and call.max_retries > 0:
        # Each attempt is a child of one run for the whole call: MLflow's runs table shows
        # the call as one row that unfolds into its attempts.
        parent = _call_run(ctx, client, parent)
        name = f"{name} attempt {call.attempt}"
        tags[records.ATTEMPT_TAG] = str(call.attempt)
    tags[MLFLOW_RUN_NAME] = name
    if parent is not None:
        experiment_id = parent.info.experiment_id
        tags[MLFLOW_PARENT_RUN_ID] = parent.info.run_id
    else:
        experiment_id = _current_experiment_id()
    run = client.create_run(experiment_id, tags=resolve_tags(tags), run_name=name)
    return MlflowRun(
        uri=uri,
        mlflow_run_id=run.info.run_id,
        experiment_id=experiment_id,
        experiment_name=_experiment_name(client, experiment_id),
        artifact_uri=run.info.artifact_uri,
    )


_CALL_RUN = "mlflow_call_run"
_CALL_STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}


def _call_run(ctx: RunContext, client: MlflowClient, parent: Run | None) -> Run:
    """The run grouping a retried call's attempts, made with its first attempt and ended
    with the call."""
    assert ctx.call is not None
    found: Run | None = ctx.call.state.get(_CALL_RUN)
    if found is not None:
        return found
    tags = {
        MLFLOW_RUN_NAME: run_name(ctx),
        records.MAX_RETRIES_TAG: str(ctx.call.max_retries),
        **records.owner_tags(),
    }
    if parent is not None:
        experiment_id = parent.info.experiment_id
        tags[MLFLOW_PARENT_RUN_ID] = parent.info.run_id
    else:
        experiment_id = _current_experiment_id()
    run = client.create_run(experiment_id, tags=resolve_tags(tags), run_name=run_name(ctx))
    ctx.call.state[_CALL_RUN] = run
    ctx.call.on_end(partial(_end_call_run, client, run.info.run_id))
    return run


def _end_call_run(client: MlflowClient, run_id: str, status: str) -> None:
    client.set_tag(run_id, records.STATUS_TAG, status)
    client.set_terminated(run_id, _CALL_STATUS.get(status, "FAILED"))


def _resume(client: MlflowClient, uri: str, run_id: str) -> MlflowRun:
    run = client.get_run(run_id)
    client.update_run(run_id, status="RUNNING")
    experiment_id = run.info.experiment_id
    return MlflowRun(
        uri=uri,
        mlflow_run_id=run_id,
        experiment_id=experiment_id,
        experiment_name=_experiment_name(client, experiment_id),
        artifact_uri=run.info.artifact_uri,
        resumed=True,
        params=dict(run.data.params),
    )


def _current_experiment_id() -> str:
    # MLflow's own resolution for fluent start_run; there is no public equivalent.
    from mlflow.tracking.fluent import _get_experiment_id

    return str(_get_experiment_id())


def _experiment_name(client: MlflowClient, experiment_id: str) -> str:
    # Once per store and experiment in a process: a lookup is a query on every call's path,
    # and an experiment's id keeps its name unless someone renames it meanwhile.
    key = (client.tracking_uri, experiment_id)
    name = _names.get(key)
    if name is None:
        name = _names[key] = client.get_experiment(experiment_id).name
    return name


_names: dict[tuple[str, str], str] = {}


def mlflow_env(run: MlflowRun) -> dict[str, str]:
    """What a rank needs so that plain MLflow calls land in this run."""
    return {
        "MLFLOW_TRACKING_URI": run.uri,
        "MLFLOW_RUN_ID": run.mlflow_run_id,
        # Both, consistent: a user's MLFLOW_EXPERIMENT_NAME naming another experiment would make
        # MLflow refuse to resume the run in the rank.
        "MLFLOW_EXPERIMENT_ID": run.experiment_id,
        "MLFLOW_EXPERIMENT_NAME": run.experiment_name,
        # The launcher samples the machine once for all ranks; eight monitors would repeat it.
        "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING": "false",
        settings.MLFLOW_RUN_ID.name: run.mlflow_run_id,
        settings.MLFLOW_ARTIFACT_URI.name: run.artifact_uri,
    }
