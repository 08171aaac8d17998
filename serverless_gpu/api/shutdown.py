"""``serverless_gpu.shutdown()``: everything this process started, stopped now
rather than at exit."""

from __future__ import annotations


def shutdown() -> None:
    """Stop the launcher and every rank it started (also done automatically at exit), and
    the calls running on a Ray cluster. Open sessions are closed first (their MLflow runs end
    FINISHED)."""
    from serverless_gpu.api.decorator import join_prewarm
    from serverless_gpu.api.session import close_all_sessions
    from serverless_gpu.backends import registry

    close_all_sessions()
    join_prewarm()
    registry.shutdown_all()  # each backend this process used: the launcher, Ray's calls
