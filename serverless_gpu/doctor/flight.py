"""The collectives' flight recorder: which collective each rank entered last.

torch records every collective of a process group in a ring buffer when ``TORCH_FR_BUFFER_SIZE``
(formerly ``TORCH_NCCL_TRACE_BUFFER_SIZE``) is set; ranks get it from ``env.rank_env``. A rank
dumps it (``rank_doctor``) when the stacks are taken, into ``RunPaths.flight_recorder``.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any

from serverless_gpu.wire.runpaths import RunPaths

_warmup: tuple[Any, int] | None = None
"""(the group formed ahead of the call, the newest record of its warm-up collective)."""


def _records() -> dict[str, Any] | None:
    """The flight recorder's records in this rank, or None (no group, a torch without it)."""
    torch = sys.modules.get("torch")
    if torch is None or "torch.distributed" not in sys.modules:
        return None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    c10d = torch._C._distributed_c10d
    # NCCL's recorder first (CUDA builds); _dump_fr_trace holds the other backends' records.
    dumper = getattr(c10d, "_dump_nccl_trace", None) or getattr(c10d, "_dump_fr_trace", None)
    if dumper is None:
        return None
    # No stack traces: symbolizing them can take seconds, and the ranks are stopped soon.
    data = pickle.loads(dumper(includeCollectives=True, includeStackTraces=False, onlyActive=False))
    return data if isinstance(data, dict) else None


def mark_warmup() -> None:
    """In a standby rank, after its group's warm-up collective: that collective is not the
    user's, so dumps leave it out and number the group's collectives from the user's first."""
    global _warmup
    import torch.distributed as dist

    data = _records()
    newest = max((e.get("record_id", -1) for e in (data or {}).get("entries", [])), default=-1)
    _warmup = (dist.group.WORLD, newest)


def _without_warmup(data: dict[str, Any]) -> dict[str, Any]:
    if _warmup is None:
        return data
    import torch.distributed as dist

    group: Any = _warmup[0]
    newest = _warmup[1]
    entries = [e for e in data.get("entries", []) if e.get("record_id", -1) > newest]
    if group is not None and dist.group.WORLD is group:  # taken: its first collective was #2
        name = getattr(group, "group_name", "")
        for e in entries:
            if (e.get("process_group") or ("",))[0] == name and not e.get("is_p2p"):
                e["collective_seq_id"] = e.get("collective_seq_id", 1) - 1
    return {**data, "entries": entries}


def dump(path: Path) -> bool:
    """In a rank: write the flight recorder's pickle to ``path`` (atomically); False when
    there is nothing to dump (no process group, a torch without it)."""
    data = _records()
    if data is None:
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(pickle.dumps(_without_warmup(data)))
    tmp.replace(path)
    return True


def newest(paths: RunPaths, rank: int) -> dict[str, Any] | None:
    """The rank's newest recorded collective (a flight-recorder entry); None when no dump
    exists or it cannot be read."""
    try:
        with open(paths.flight_recorder(rank), "rb") as f:
            data: Any = pickle.load(f)  # written by this user's own rank process
    except Exception:  # a missing or torn dump costs this line only
        return None
    entries = data.get("entries") if isinstance(data, dict) else None
    if not entries:
        return None
    entry: dict[str, Any] = max(entries, key=lambda e: e.get("record_id", 0))
    return entry


def sequence(entry: dict[str, Any]) -> Any:
    """The entry's number in its group: collectives and point-to-point calls count apart."""
    return entry.get("p2p_seq_id") if entry.get("is_p2p") else entry.get("collective_seq_id")


def last_collective(paths: RunPaths, rank: int) -> str:
    """``gloo:all_reduce #5 (scheduled)`` for the rank's newest recorded collective; empty when
    no dump exists or it cannot be read."""
    entry = newest(paths, rank)
    if entry is None:
        return ""
    name = entry.get("profiling_name") or "collective"
    state = entry.get("state", "")
    group = entry.get("process_group") or ("", "")
    where = f" in group {group[1]}" if group[1] and group[1] != "default_pg" else ""
    return f"{name} #{sequence(entry)} ({state}){where}"
