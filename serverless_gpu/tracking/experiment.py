"""The experiment a call's run lands in is marked as one of model training.

MLflow 3's UI reads the experiment tag ``mlflow.experimentKind``: without it, it guesses the
kind and may list our runs as "Evaluation runs" of a GenAI experiment. A kind the user (or
MLflow) already set is kept.
"""

from __future__ import annotations

from mlflow import MlflowClient

KIND_TAG = "mlflow.experimentKind"
TRAINING = "custom_model_development"


def mark_training_experiment(client: MlflowClient, experiment_id: str) -> None:
    if KIND_TAG not in client.get_experiment(experiment_id).tags:
        client.set_experiment_tag(experiment_id, KIND_TAG, TRAINING)
