"""Prefetching overlaps fetching with the consumer's work and releases what it fetched ahead."""

from __future__ import annotations

import threading

from serverless_gpu.data.prefetch import prefetched


def test_fetches_overlap_with_consumer() -> None:
    """While the consumer holds one value, the next key is already being fetched (shown by the
    fetch itself, not by how long the loop took)."""
    started = {key: threading.Event() for key in range(6)}

    def fetch(key: int) -> int:
        started[key].set()
        return key * 10

    out = []
    for index, value in enumerate(prefetched(range(6), fetch, depth=2, release=lambda _: None)):
        if index + 1 in started:  # a bound, not a speed claim: without prefetching it never comes
            assert started[index + 1].wait(30), f"key {index + 1} was not fetched ahead"
        out.append(value)
    assert out == [0, 10, 20, 30, 40, 50]


def test_early_stop_releases_prefetched_results_and_threads() -> None:
    released: list[int] = []
    fetched: list[int] = []

    def fetch(key: int) -> int:
        fetched.append(key)
        return key

    before = threading.active_count()
    stream = prefetched(range(10), fetch, depth=3, release=released.append)
    assert next(stream) == 0
    stream.close()
    assert 1 in fetched and max(fetched) <= 3  # fetched ahead, but no further than depth
    assert sorted(released) == sorted(set(fetched) - {0})  # everything not yielded is released
    assert threading.active_count() == before
