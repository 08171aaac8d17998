"""Names shared by the caller and the ranks, and the tunables read from the environment."""

from __future__ import annotations

import os

MLFLOW_RUN_ID_ENV = "SERVERLESS_GPU_MLFLOW_RUN_ID"
"""The MLflow run a rank's fast logging writes into; empty: the store is unreachable and points
go to the run directory instead. Kept apart from ``MLFLOW_RUN_ID``, which MLflow's own
``start_run`` deletes from the environment when it resumes the run."""

ARTIFACT_URI_ENV = "SERVERLESS_GPU_MLFLOW_ARTIFACT_URI"
"""The run's artifact location, so that a rank's ``log_artifact`` need not look the run up."""

FLUSH_INTERVAL_ENV = "SERVERLESS_GPU_MLFLOW_FLUSH_INTERVAL"
"""Seconds between two batches a rank sends to the caller (default 1)."""

LOG_UPLOAD_INTERVAL_ENV = "SERVERLESS_GPU_MLFLOW_LOG_UPLOAD_INTERVAL"
"""Seconds between two uploads of the per-rank logs during a run (default 60; 0 disables)."""

MESSAGE_KIND = "serverless_gpu.tracking.batch"
"""``RankMessage.kind`` of a batch of metrics, params and tags sent by a rank."""

RANK_INITIALIZER = "serverless_gpu.tracking.rank:install"

UNSENT_FILE = "mlflow_unsent.jsonl"
"""In the run directory: what could not be written to MLflow, one JSON record per line."""

START_TIMEOUT_ENV = "SERVERLESS_GPU_MLFLOW_START_TIMEOUT"
"""Seconds a tracking server may take to open the call's run (default 10); past that the call
runs untracked."""

PROBE_TIMEOUT_S = 3.0
"""How long a reachability check of an HTTP tracking server may take."""


def env_float(name: str, default: float, environ: dict[str, str] | None = None) -> float:
    """A non-negative number from the environment; a malformed value falls back to ``default``."""
    raw = (os.environ if environ is None else environ).get(name, "")
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if value >= 0 else default
