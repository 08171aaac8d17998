"""Lines in the launcher's own log (its stderr, a file in the runs folder).

The launcher runs unattended: what it could not do must be written down, and writing it down
must never be what ends it (the log shares the runs folder, which may be full).
"""

from __future__ import annotations

import sys
import traceback


def log(text: str) -> None:
    """One entry in the launcher's log; dropped if the log cannot be written."""
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def log_exception(text: str) -> None:
    """``text`` and the traceback of the exception being handled."""
    log(f"{text}\n{traceback.format_exc().rstrip()}")
