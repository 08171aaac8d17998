"""How a run that ran past its time limit is worded (the launcher, the Ray backend and the
caller's ``DistributedTimeoutError`` say it alike)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def timeout_sentence(timeout: float, running: Sequence[int], starting: Sequence[int] = ()) -> str:
    """How a run that ran past its time limit is worded, wherever it is shown. Ranks still
    ``starting`` never reached the function: they are not said to be running."""
    head = f"exceeded its timeout of {timeout:g} s"
    never = (
        f"ranks {_listed(starting)} were still starting (waiting for their devices, for room "
        "on the Ray cluster, or for their processes)"
    )
    if starting and not running:
        return (
            f"{head} before any rank started the function: {never}; the timeout counts the "
            "start too: give the call a longer one, or free what it waits for"
        )
    text = f"{head}; ranks still running: {_listed(running) or 'none'}"
    return text + (f"; {never}" if starting else "")


def ranks_timeout(timeout: float, states: Iterable[tuple[int, str]]) -> str:
    """:func:`timeout_sentence` from each rank's state (``RankState`` values): ``running``
    ranks are in the function, ``starting`` ones not yet; the others have ended."""
    pairs = list(states)
    running = [rank for rank, state in pairs if state == "running"]
    return timeout_sentence(
        timeout, running, [rank for rank, state in pairs if state == "starting"]
    )


def _listed(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in ranks)
