"""Process names that say what each of our processes is, in ``ps``, ``top`` and ``nvidia-smi``.

``serverless-gpu launcher``, ``serverless-gpu standby gpu0`` (or ``standby cpu``) for a rank
waiting for a call, ``serverless-gpu rank 1/8 train`` for a running rank; without them every
process reads ``python -m serverless_gpu.launcher_process``, and idle standby ranks look like a
leak.
"""

from __future__ import annotations

PREFIX = "serverless-gpu"
LAUNCHER = f"{PREFIX} launcher"


def is_launcher(cmdline: list[str]) -> bool:
    """Whether a process's command line (``psutil.Process.cmdline()``) is one of our launchers,
    named or not (setproctitle missing)."""
    return " ".join(cmdline).strip() == LAUNCHER or "serverless_gpu.launcher_process" in cmdline


def set_title(what: str) -> None:
    """Name this process ``serverless-gpu <what>``; a no-op where setproctitle is missing."""
    try:
        import setproctitle

        setproctitle.setproctitle(f"{PREFIX} {what}")
    except Exception:  # names are a convenience, never a reason for a process to fail
        pass


def set_rank_title(rank: int, world_size: int, run_name: str) -> None:
    """The title of a rank running a call: ``serverless-gpu rank 1/8 train``."""
    set_title(f"rank {rank}/{world_size} {run_name}".rstrip())
