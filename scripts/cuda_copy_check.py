"""A result's CUDA tensors come back bit for bit through each way the library copies them from
the device into the result file (``serverless_gpu.cuda_copy``: ``register``, ``staged``,
``plain``), also when the kernels that made them are still queued and when a side stream is
current; each way is the one actually taken; a range that cannot be page-locked falls back to
the staged copy and leaves no CUDA error behind for the next kernel.

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

from serverless_gpu import cuda_copy
from serverless_gpu.serialization import dump_result, load_result

WAYS = {"register": ("register",), "staged": ("staged",), "plain": ()}


def sample() -> dict[str, Any]:
    """CUDA tensors of awkward sizes (several chunks and a tail, a few bytes, none), views,
    CPU tensors between them, and a product whose kernels are still queued when it is saved."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    big = torch.randn(cuda_copy.CHUNK_BYTES // 4 * 3 + 1001, device="cuda", generator=gen)
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
    cuda_copy.ORDER = WAYS[way]
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
        cuda_copy.ORDER = WAYS[way]
        taken = cuda_copy.copy_into(into, [(0, src)], torch)
        ok = taken == [way] and torch.equal(into, src.cpu())
    check(f"{way}: the way taken", ok, f"{taken}")


def registration_refused(folder: Path) -> None:
    """The range is page-locked already, so cudaHostRegister refuses it: the staged copy runs."""
    src = torch.randint(0, 256, (3 << 20,), dtype=torch.uint8, device="cuda")
    cudart = torch.cuda.cudart()
    with mapped(folder, src.numel()) as into:
        pinned = cudart.cudaHostRegister(into.data_ptr(), into.numel(), 0)
        cuda_copy.ORDER = ("register", "staged")
        taken = cuda_copy.copy_into(into, [(0, src)], torch)
        ok = taken == ["staged"] and torch.equal(into, src.cpu())
        if pinned == cudart.cudaError.success:
            cudart.cudaHostUnregister(into.data_ptr())
    check("registration refused -> staged", ok, f"{taken}")
    try:
        after = float(torch.ones(1000, device="cuda").sum().item())  # a kernel launch
        check("no CUDA error left behind", after == 1000.0)
    except RuntimeError as exc:
        check("no CUDA error left behind", False, str(exc))


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
    registration_refused(folder)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
