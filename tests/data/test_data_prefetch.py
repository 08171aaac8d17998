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


def test_with_one_thread_the_fetches_ahead_run_one_after_the_other_in_order() -> None:
    """``threads=1`` (tar shards): ``depth`` keys are queued, one fetch runs at a time, the
    next key first. The first fetch waits (2 s at most) for a second one to start beside it,
    which happens at once where several run."""
    order: list[tuple[int, int]] = []
    another_started = threading.Event()

    def fetch(key: int) -> int:
        order.append((key, threading.get_ident()))
        if key == 0:
            another_started.wait(2)
        else:
            another_started.set()
        return key

    assert list(prefetched(range(5), fetch, depth=4, release=lambda _: None, threads=1)) == [
        0, 1, 2, 3, 4,
    ]  # fmt: skip
    assert [key for key, _ in order] == [0, 1, 2, 3, 4]
    assert len({thread for _, thread in order}) == 1
