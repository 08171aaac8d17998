"""How fast one process can put a large tensor into a tmpfs file, by method, side by side.

    PYTHONPATH=. python benchmarks/tmpfs_write.py [--gib 1] [--reps 3] [--dir /dev/shm]

The result transfer's floor is one write of each rank's result into fresh tmpfs pages. This
measures that write in this process, each repetition into a new file, methods interleaved:

* ``dump_result``: the library's writer;
* ``write``: one ``write()`` of the whole tensor (the kernel copies, one thread);
* ``pwrite xK``: K threads, each ``pwrite()``-ing its slice;
* ``mmap copy xK``: the file mapped shared, the tensor copied in by ``Tensor.copy_`` with K
  torch threads (page faults in parallel).

Where CUDA is available, the same tensor on GPU 0 through ``dump_result`` with each of the
library's ways to copy a CUDA storage into the mapped file (``CUDA_WAYS``): ``staged``
(through pinned buffers, overlapped with the stores and the file's reservation) and
``plain`` (torch's pageable copy); and through ``mmap copy`` (torch's copy into a mapped file
without reserved pages). Then the parts, timed one by one: reserving the whole file at once
(``posix_fallocate``, one thread), the device's copy into pinned memory, and a CPU copy from
pinned memory into the reserved mapped file.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from serverless_gpu.runfiles import cuda_copy
from serverless_gpu.runfiles.serialization import dump_result


def _buffer(tensor: torch.Tensor) -> Any:
    return (ctypes.c_char * tensor.nbytes).from_address(tensor.data_ptr())


def write_once(tensor: torch.Tensor, path: Path) -> None:
    with open(path, "wb") as f:
        f.write(memoryview(_buffer(tensor)))


def pwrite_threads(k: int) -> Callable[[torch.Tensor, Path], None]:
    def run(tensor: torch.Tensor, path: Path) -> None:
        view = memoryview(_buffer(tensor))
        n = tensor.nbytes
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, n)
            bounds = [n * i // k for i in range(k + 1)]

            def part(a: int, b: int) -> None:
                while a < b:
                    a += os.pwrite(fd, view[a:b], a)

            threads = [threading.Thread(target=part, args=ab) for ab in itertools.pairwise(bounds)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            os.close(fd)

    return run


def mmap_copy(k: int) -> Callable[[torch.Tensor, Path], None]:
    def run(tensor: torch.Tensor, path: Path) -> None:
        n = tensor.nbytes
        with open(path, "wb") as f:
            f.truncate(n)
        dst = torch.from_file(str(path), shared=True, size=n, dtype=torch.uint8)
        before = torch.get_num_threads()
        torch.set_num_threads(k)
        try:
            dst.copy_(tensor.view(-1).view(torch.uint8))
        finally:
            torch.set_num_threads(before)
        del dst

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", default="/dev/shm")
    a = parser.parse_args()
    nbytes = int(a.gib * 2**30) // 4 * 4
    tensor = torch.ones(nbytes // 4, dtype=torch.float32)
    cores = os.cpu_count() or 1
    ks = sorted({2, 4, 8, min(16, cores)} - {1})
    methods: dict[str, Callable[[torch.Tensor, Path], None]] = {
        "dump_result": dump_result,
        "write": write_once,
        **{f"pwrite x{k}": pwrite_threads(k) for k in ks},
        "mmap copy x1": mmap_copy(1),
        **{f"mmap copy x{k}": mmap_copy(k) for k in ks},
    }
    sources = {name: tensor for name in methods}
    on_gpu = tensor.cuda() if torch.cuda.is_available() else None
    if on_gpu is not None:
        for way, settings in CUDA_WAYS.items():
            methods[f"cuda dump_result {way}"] = dump_with(settings)
            sources[f"cuda dump_result {way}"] = on_gpu
        methods["cuda mmap copy x1"] = mmap_copy(1)
        sources["cuda mmap copy x1"] = on_gpu
    rates: dict[str, list[float]] = {name: [] for name in methods}
    path = Path(a.dir) / f"tmpfs-write-{os.getpid()}"
    for _ in range(a.reps):
        for name, method in methods.items():
            path.unlink(missing_ok=True)
            t0 = time.perf_counter()
            method(sources[name], path)
            rates[name].append(nbytes / 1e9 / (time.perf_counter() - t0))
            assert path.stat().st_size >= nbytes
            path.unlink()
    threads = torch.get_num_threads()
    print(f"{nbytes / 2**30:g} GiB into {a.dir}, {cores} cores, torch threads {threads}")
    print("| method | GB/s median | all reps |")
    print("| --- | --- | --- |")
    for name, rs in rates.items():
        print(f"| {name} | {statistics.median(rs):.2f} | {', '.join(f'{r:.2f}' for r in rs)} |")
    if on_gpu is not None:
        timed = [parts(on_gpu, path) for _ in range(a.reps)]
        print(f"\nParts, {nbytes / 2**30:g} GiB, ms (median of the reps):")
        for key in timed[0]:
            print(f"- {key}: {statistics.median(p[key] for p in timed) * 1e3:.1f}")


CUDA_WAYS: dict[str, dict[str, Any]] = {"staged": {"STAGED": True}, "plain": {"STAGED": False}}
"""Each way of the library's to copy a CUDA storage into the file, as settings of cuda_copy."""


def dump_with(settings: dict[str, Any]) -> Callable[[torch.Tensor, Path], None]:
    def run(tensor: torch.Tensor, path: Path) -> None:
        saved = {name: getattr(cuda_copy, name) for name in settings}
        for name, value in settings.items():
            setattr(cuda_copy, name, value)
        try:
            dump_result(tensor, path)
        finally:
            for name, value in saved.items():
                setattr(cuda_copy, name, value)

    return run


def parts(src: torch.Tensor, path: Path) -> dict[str, float]:
    """Seconds of each part of writing ``src`` into a result file, timed one by one."""
    n, src_bytes = src.nbytes, src.view(-1).view(torch.uint8)
    times: dict[str, float] = {}

    def part(name: str, action: Callable[[], Any]) -> Any:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        value = action()
        torch.cuda.synchronize()
        times[name] = time.perf_counter() - t0
        return value

    def reserved_mapping() -> torch.Tensor:
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            os.posix_fallocate(fd, 0, n)
        finally:
            os.close(fd)
        return torch.from_file(str(path), shared=True, size=n, dtype=torch.uint8)

    dst = part("reserve the whole file at once, and map it", reserved_mapping)
    pinned = part("pinned alloc", lambda: torch.empty(n, dtype=torch.uint8, pin_memory=True))
    part("device -> pinned copy", lambda: pinned.copy_(src_bytes))
    part("pinned -> reserved mapped file, CPU copy", lambda: dst.copy_(pinned))
    path.unlink()  # the mapping goes with this function's frame
    return times


if __name__ == "__main__":
    main()
