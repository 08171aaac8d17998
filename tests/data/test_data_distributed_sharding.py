"""2 ranks x 2 DataLoader workers over a real volume (local directory and moto S3)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from data_support import Launch, Storage

NUM_FILES = 23  # not a multiple of ranks x workers: shares are uneven on purpose


@pytest.mark.timeout(120)
def test_every_file_once_per_epoch_and_exact_resume(
    storage: Storage, tmp_path: Path, launch: Launch
) -> None:
    expected = {f"f{i:03d}.dat" for i in range(NUM_FILES)}
    for name in expected:
        storage.write(f"vol/{name}", name.encode() * 3)
    config = {
        "scenario": "sharding",
        "volume": storage.url("vol"),
        "cache_dir": str(tmp_path / "cache"),  # one cache shared by both ranks
        "storage_options": storage.storage_options,
        "resume_after": 3,
    }
    run = launch(config, tmp_path / "run")
    results = [r for r in run.results if r is not None]
    assert len(results) == 2

    for epoch in range(2):
        seen = Counter(n for r in results for n in r["epochs"][epoch])
        assert set(seen) == expected, "a file was lost"
        assert max(seen.values()) == 1, "a file was read twice"
    for rank_result in results:
        assert rank_result["epochs"][0] != rank_result["epochs"][1], "shuffle ignored the epoch"
    assert sorted(results[0]["epochs"][0]) != sorted(results[0]["epochs"][1])

    for rank_result in results:
        full, first, rest = rank_result["full"], rank_result["first"], rank_result["rest"]
        assert len(first) == 6  # 3 batches of 2
        assert first == full[: len(first)]
        assert rest == full[len(first) :], "resume repeated, skipped or reordered files"
    assert Counter(n for r in results for n in r["first"] + r["rest"]) == Counter(expected)
