"""A result's CUDA tensors come back bit for bit through each way the library copies them from
the device into the result file (``serverless_gpu.runfiles.cuda_copy``: ``staged`` through pinned
buffers, ``plain`` torch's copy), also when the kernels that made them are still queued and
when a side stream is current; each way is the one actually taken.

    python scripts/cuda_copy_check.py [--dir /dev/shm]

Needs a GPU. Prints one PASS/FAIL line per check; exit code 1 on any failure.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from _checks import check, summary

from serverless_gpu.runfiles import cuda_copy, file_space
from serverless_gpu.runfiles.serialization import dump_result, load_result

WAYS = {"staged": True, "plain": False}
"""Each way, as the value of ``cuda_copy.STAGED``."""


def sample() -> dict[str, Any]:
    """CUDA tensors of awkward sizes (several chunks and a tail, a few bytes, none), views,
    CPU tensors between them, and a product whose kernels are still queued when it is saved."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    big = torch.randn(file_space.CHUNK_BYTES // 4 * 3 + 1001, device="cuda", generator=gen)
    queued = torch.randn(1 << 26, device="cuda", generator=gen)
    for _ in range(20):  # about a second of work still on the stream when dump starts
        queued = queued.sin() * 1.5 + 0.25
    return {
        "big": big,
        "view": big[5:900],
        "cpu": torch.arange(10),
        "tiny": torch.arange(3, dtype=torch.uint8, device="cuda"),
        "empty": torch.empty(0, device="cuda"),
        "bf16": torch.randn(4097, device="cuda", generator=gen).bfloat16(),
        "state": torch.nn.Linear(512, 512).cuda().state_dict(),
        "queued": queued,
    }


def same(loaded: Any, original: Any) -> bool:
    if isinstance(original, dict):
        return loaded.keys() == original.keys() and all(
            same(loaded[k], v) for k, v in original.items()
        )
    return bool(loaded.dtype == original.dtype and torch.equal(loaded, original.cpu()))


def round_trip(way: str, folder: Path, on_side_stream: bool) -> None:
    path = folder / f"cuda-copy-check-{os.getpid()}"
    cuda_copy.STAGED = WAYS[way]
    stream = torch.cuda.Stream() if on_side_stream else torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        original = sample()
        dump_result(original, path)
        ok = same(load_result(path), original)
    path.unlink()
    check(f"{way}: bit for bit{' (side stream current)' if on_side_stream else ''}", ok)


def way_taken(way: str, folder: Path) -> None:
    src = torch.randint(0, 256, (3 << 20,), dtype=torch.uint8, device="cuda")
    with mapped(folder, src.numel()) as into:
        cuda_copy.STAGED = WAYS[way]
        taken = cuda_copy.copy_into(into, [(0, src)], torch, lambda end: None)
        ok = taken == way and torch.equal(into, src.cpu())
    check(f"{way}: the way taken", ok, f"{taken}")


@contextlib.contextmanager
def mapped(folder: Path, nbytes: int) -> Iterator[Any]:
    """A reserved tmpfs file of ``nbytes``, mapped shared as uint8, removed on exit."""
    path = folder / f"cuda-copy-check-map-{os.getpid()}"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    finally:
        os.close(fd)
    try:
        yield torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8)
    finally:
        path.unlink()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", type=Path, default=Path("/dev/shm"))
    folder = parser.parse_args().dir
    if not torch.cuda.is_available():
        print("no GPU: nothing to check")
        return 1
    for way in WAYS:
        way_taken(way, folder)
        round_trip(way, folder, on_side_stream=False)
        round_trip(way, folder, on_side_stream=True)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
