"""The suite's one way to wait: poll a condition until it holds or a bounded time runs out.

Tests never sleep a fixed time to let something happen; they wait for the thing itself, with a
limit, and fail with what they were waiting for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def eventually(
    condition: Callable[[], T], what: str, timeout: float = 30.0, interval: float = 0.05
) -> T:
    """Call `condition` until it returns a truthy value and return that value.

    Raises AssertionError naming `what` after `timeout` seconds; an exception raised by the
    condition propagates at once (a broken probe is not something to wait out).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(interval)


def wait_for_lines(handle: Any, text: str, ranks: int, seconds: float = 60) -> None:
    """Until ``ranks`` ranks of the running call ``handle`` printed a line holding ``text``."""
    from serverless_gpu.wire.events import OutputLines

    seen: set[int] = set()

    def collect(event: object) -> None:
        if isinstance(event, OutputLines) and any(text in line for line in event.lines):
            seen.add(event.rank)

    handle.subscribe(collect)
    deadline = time.monotonic() + seconds
    while len(seen) < ranks:
        assert time.monotonic() < deadline, f"only ranks {seen} printed {text!r}"
        assert not handle.wait(0.1), "the run ended early"
