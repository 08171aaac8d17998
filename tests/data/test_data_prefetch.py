"""Prefetching overlaps fetching with the consumer's work and releases what it fetched ahead."""

from __future__ import annotations

import threading
import time

from serverless_gpu.data.prefetch import prefetched


def test_fetches_overlap_with_consumer() -> None:
    def fetch(key: int) -> int:
        time.sleep(0.1)
        return key * 10

    start = time.monotonic()
    out = []
    for value in prefetched(range(6), fetch, depth=2, release=lambda _: None):
        time.sleep(0.1)  # "compute"
        out.append(value)
    elapsed = time.monotonic() - start
    assert out == [0, 10, 20, 30, 40, 50]
    assert elapsed < 1.0, f"no overlap: {elapsed:.2f}s (sequential would be 1.2s)"


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
