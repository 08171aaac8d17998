"""``log_artifact(s)`` in a rank: straight into the run's artifact location, as plain MLflow does,
but without resuming the run in the store first (a database connection per rank, just to learn
where artifacts go). The caller passes the location in the rank's environment."""

from __future__ import annotations

import os
from typing import Any


class RunArtifacts:
    """The call's artifact repository, opened on first use."""

    def __init__(self, artifact_uri: str) -> None:
        self.artifact_uri = artifact_uri
        self._repo: Any = None

    def log_artifact(self, local_path: str, artifact_path: str | None) -> None:
        # What MlflowClient.log_artifact does once it has the run's repository.
        if os.path.isdir(local_path):
            name = os.path.basename(os.path.normpath(local_path))
            path = os.path.join(artifact_path, name) if artifact_path else name
            self.repo().log_artifacts(local_path, path)
        else:
            self.repo().log_artifact(local_path, artifact_path)

    def log_artifacts(self, local_dir: str, artifact_path: str | None) -> None:
        self.repo().log_artifacts(local_dir, artifact_path)

    def repo(self) -> Any:
        if self._repo is None:
            from mlflow import get_tracking_uri
            from mlflow.store.artifact.artifact_repository_registry import (
                get_artifact_repository,
            )

            self._repo = get_artifact_repository(self.artifact_uri, tracking_uri=get_tracking_uri())
        return self._repo
