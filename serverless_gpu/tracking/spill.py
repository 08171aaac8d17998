"""What MLflow did not take is kept in the run directory: one JSON record per line.

Each record is ``{"kind": "batch"|"system", "rank": N|null, "time": T, "data": {...}}`` with
the same fields a batch carries (metrics as ``[key, value, timestamp_ms, step]``).
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any


class Spill:
    """Appends undelivered records to ``path``; safe to use from several threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records = 0
        self._lock = threading.Lock()

    def touch(self) -> None:
        """Create the (empty) file now, so that a message can name it before anything is lost."""
        with self._lock:
            try:
                with open(self.path, "a", encoding="utf-8"):
                    pass
            except OSError:
                return

    def write(self, kind: str, rank: int | None, time: float, data: dict[str, Any]) -> None:
        record = {"kind": kind, "rank": rank, "time": time, "data": _json_safe(data)}
        line = json.dumps(record, allow_nan=False) + "\n"
        with self._lock:
            try:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(line)
            except OSError:
                return  # the run directory was removed; nothing left to keep it in
            self.records += 1


def _json_safe(value: Any) -> Any:
    """NaN and infinities as strings, so that every line stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value
