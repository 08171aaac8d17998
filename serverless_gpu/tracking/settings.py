"""Names shared by tracking in the caller and in the ranks. Its environment variables are
``common/settings.py``'s (``MLFLOW_*``); the spill file is ``RunPaths.unsent``."""

from __future__ import annotations

MESSAGE_KIND = "serverless_gpu.tracking.batch"
"""``RankMessage.kind`` of a batch of metrics, params and tags sent by a rank."""

RANK_INITIALIZER = "serverless_gpu.tracking.rank:install"

PROBE_TIMEOUT_S = 3.0
"""How long a reachability check of an HTTP tracking server may take."""
