"""What tracking reports when MLflow is unavailable: a warning, never an exception."""

from __future__ import annotations


class TrackingWarning(UserWarning):
    """MLflow tracking of a run is off or stopped (mlflow missing, store unreachable ...).

    The training itself is unaffected: results are returned and logs stay on disk. Silence it
    with ``warnings.filterwarnings("ignore", category=TrackingWarning)`` or ``tracking=False``.
    """


class TrackingUnavailableError(Exception):
    """The tracking store cannot be reached; the run goes on untracked."""
