"""Fetch the next few items on background threads while the caller computes."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

__all__ = ["prefetched"]

K = TypeVar("K")
R = TypeVar("R")


def prefetched(
    keys: Iterable[K],
    fetch: Callable[[K], R],
    *,
    depth: int,
    release: Callable[[R], None],
    threads: int | None = None,
) -> Generator[R, None, None]:
    """Yield ``fetch(key)`` for every key, in order, keeping ``depth`` fetches queued or in
    flight, ``threads`` of them (default ``depth``) running at once, in order.

    Results fetched ahead but never yielded (the consumer stopped early or a fetch failed) are
    handed to ``release`` so resources such as cache pins are not leaked. ``depth <= 0`` fetches
    synchronously.
    """
    if depth <= 0:
        for key in keys:
            yield fetch(key)
        return
    remaining = iter(keys)
    pending: deque[Future[R]] = deque()
    running = depth if threads is None else max(1, min(threads, depth))
    pool = ThreadPoolExecutor(max_workers=running, thread_name_prefix="volume-prefetch")
    try:
        for key in remaining:
            pending.append(pool.submit(fetch, key))
            if len(pending) >= depth:
                break
        while pending:
            result = pending.popleft().result()
            for key in remaining:
                pending.append(pool.submit(fetch, key))
                break
            yield result
    finally:
        for future in pending:
            future.cancel()
        pool.shutdown(wait=True)
        for future in pending:
            if not future.cancelled() and future.exception() is None:
                release(future.result())
