"""Two costs under the data layer, measured side by side on this machine.

    PYTHONPATH=. python benchmarks/data_io.py [--reps 3] [--mib 32] [--dir D] [--out F.md]

* **Batch transfer**: a DataLoader with two persistent workers whose batches are one tensor
  of 4 KiB to 4 MiB: batches a second with torch's transfer (through shared memory) and by
  value (``InlineSmallTensors``, here for every size; the library sends by value only up to
  ``INLINE_MAX_BYTES``), the two alternating, the median of ``--reps`` epochs.
* **Cache fill**: six objects of ``--mib`` MiB (32) on a moto S3 server on 127.0.0.1 copied into new
  files under ``--dir`` (default: the temp folder) as the cache copies them (ranged requests
  of 8 MiB, four at a time), written with one ``write()`` per part and through
  ``open_piecewise``; boto3's ``download_file`` beside them. MB/s, not synced (the rate at
  which the page cache takes the copy), the three interleaved in every round.
* **Page-cache writes**: the same 6 x ``--mib`` MiB from memory by ``write()`` calls of 256 KiB to
  8 MiB, the sizes interleaved in every round.
* **Page-cache reads**: six files of ``--mib`` MiB read back in 256 KiB ``pread`` calls, all in
  memory, by how they came there: written in 16 KiB ``write()`` calls (as Python's
  ``tarfile`` writes a member), in 256 KiB calls, or written, dropped from the page cache and
  read back once. The kernel keeps a file's pages in groups (folios) whose size follows how
  they arrived, and a read copies group by group.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from serverless_gpu.data import inline_tensors
from serverless_gpu.data.inline_tensors import INLINE_MAX_BYTES, InlineSmallTensors
from serverless_gpu.data.listing import _copy_in_parts
from serverless_gpu.data.piecewise import PIECE, open_piecewise

KiB, MiB = 1 << 10, 1 << 20
BATCHES = 400
SIZES = (4 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB)
WRITES = (256 * KiB, 1 * MiB, 2 * MiB, 8 * MiB)
READ_AFTER = (16 * KiB, 256 * KiB)
SAMPLE = 256 * KiB


class Batches(IterableDataset[torch.Tensor]):
    """``BATCHES`` tensors of ``nbytes`` split between the workers (batch_size=None)."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        workers = info.num_workers if info is not None else 1
        for _ in range(BATCHES // workers):
            yield torch.ones(self.nbytes // 4)


def batch_rates(nbytes: int, reps: int) -> dict[str, float]:
    loaders = {
        "shared memory": DataLoader(Batches(nbytes), batch_size=None, num_workers=2,
                                    persistent_workers=True),
        "by value": DataLoader(Batches(nbytes), batch_size=None, num_workers=2,
                               persistent_workers=True, worker_init_fn=_every_size_by_value),
    }  # fmt: skip
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    for _ in range(reps + 1):  # the first epoch starts the workers: not counted
        for name, loader in loaders.items():
            start = time.perf_counter()
            count = sum(1 for _ in loader)
            rates[name].append(count / (time.perf_counter() - start))
    del loaders
    return {name: statistics.median(r[1:]) for name, r in rates.items()}


def _every_size_by_value(worker_id: int) -> None:
    inline_tensors.INLINE_MAX_BYTES = 1 << 62
    InlineSmallTensors(None)(worker_id)


def fill_rates(folder: Path, reps: int, each: int) -> dict[str, float]:
    """MB/s of copying six objects of ``each`` bytes from a moto server into files, three ways."""
    import boto3
    import fsspec
    from data import _AWS, start_moto

    os.environ.update(_AWS)
    moto, endpoint = start_moto()
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint)
        s3.create_bucket(Bucket="fill")
        blob = os.urandom(each)
        keys = [f"shard-{i}.tar" for i in range(6)]
        for key in keys:
            s3.put_object(Bucket="fill", Key=key, Body=blob)
        fs = fsspec.filesystem("s3", skip_instance_cache=True, endpoint_url=endpoint)

        def parts(opener: Callable[[Path], Any]) -> Callable[[Path, str], None]:
            def copy(path: Path, key: str) -> None:
                with opener(path) as out:
                    _copy_in_parts(fs, f"fill/{key}", out, len(blob))

            return copy

        ways: dict[str, Callable[[Path, str], None]] = {
            "cache's ranged GETs, one write() per 8 MiB part": parts(partial(open, mode="wb")),
            f"cache's ranged GETs, open_piecewise ({PIECE // KiB} KiB writes)": parts(
                open_piecewise
            ),
            "boto3 download_file": lambda path, key: s3.download_file("fill", key, str(path)),
        }
        return _interleaved(ways, keys, folder, reps, 6 * len(blob))
    finally:
        moto.kill()
        moto.wait()


def _interleaved(
    ways: dict[str, Callable[[Path, str], None]],
    keys: list[str],
    folder: Path,
    reps: int,
    nbytes: int,
) -> dict[str, float]:
    rates: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(reps):
        for n, (name, way) in enumerate(ways.items()):
            start = time.perf_counter()
            for key in keys:
                way(folder / f"{round_}-{n}-{key}", key)
            rates[name].append(nbytes / 1e6 / (time.perf_counter() - start))
    return {name: statistics.median(r) for name, r in rates.items()}


def write_rates(folder: Path, reps: int, each: int) -> dict[str, float]:
    data = memoryview(os.urandom(each))
    ways: dict[str, Callable[[Path, str], None]] = {
        f"write() of {size // KiB} KiB": partial(_plain, data=data, size=size) for size in WRITES
    }
    return _interleaved(ways, [str(i) for i in range(6)], folder, reps, 6 * len(data))


def _plain(path: Path, key: str, *, data: memoryview, size: int) -> None:
    with open(path, "wb", buffering=0) as out:
        for at in range(0, len(data), size):
            out.write(data[at : at + size])


def read_rates(folder: Path, reps: int, each: int) -> dict[str, float]:
    data = memoryview(os.urandom(each))
    files: dict[str, list[Path]] = {}
    for size in READ_AFTER:
        files[f"written in {size // KiB} KiB write() calls"] = [
            _written(folder / f"read-{size}-{i}", data, size) for i in range(6)
        ]
    files["written, dropped, read back once"] = [
        _read_back(_written(folder / f"read-back-{i}", data, PIECE)) for i in range(6)
    ]
    ways: dict[str, Callable[[Path, str], None]] = {
        name: partial(_pread_all, paths=paths) for name, paths in files.items()
    }
    return _interleaved(ways, ["all"], folder, reps, 6 * len(data))


def _written(path: Path, data: memoryview, size: int) -> Path:
    _plain(path, "", data=data, size=size)
    return path


def _read_back(path: Path) -> Path:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        while os.read(fd, 1 * MiB):
            pass
    finally:
        os.close(fd)
    return path


def _pread_all(_out: Path, _key: str, *, paths: list[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            for at in range(0, os.fstat(fd).st_size, SAMPLE):
                os.pread(fd, SAMPLE, at)
        finally:
            os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--mib", type=int, default=32, help="each object and file of the cache and page-cache rows"
    )
    parser.add_argument("--dir", type=Path, default=None, help="for the writes (default: /tmp)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    lines = [
        "## Data I/O (benchmarks/data_io.py)",
        "",
        f"Machine: {os.cpu_count()} CPU cores; torch {torch.__version__}; "
        f"{time.strftime('%Y-%m-%d %H:%M')}; medians of {args.reps}. "
        "Command: `PYTHONPATH=. python benchmarks/data_io.py`",
        "",
        "Batches a second, two persistent workers (the library sends by value up to "
        f"{INLINE_MAX_BYTES // KiB} KiB; here every size is sent both ways):",
        "",
        "| batch | shared memory | by value | by value / shared memory |",
        "|---|---|---|---|",
    ]
    for nbytes in SIZES:
        r = batch_rates(nbytes, args.reps)
        label = f"{nbytes // KiB} KiB" if nbytes < MiB else f"{nbytes // MiB} MiB"
        lines.append(f"| {label} | {r['shared memory']:,.0f} | {r['by value']:,.0f} | "
                     f"{r['by value'] / r['shared memory']:.2f}x |")  # fmt: skip
    folder = Path(tempfile.mkdtemp(prefix="sgpu-bench-io-", dir=args.dir))
    try:
        each = args.mib * MiB
        fill = fill_rates(folder, args.reps, each)
        writes = write_rates(folder, args.reps, each)
        reads = read_rates(folder, args.reps, each)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    where = args.dir or tempfile.gettempdir()
    sections = [
        (f"Cache fill from S3 into {where} (six objects of {args.mib} MiB)", fill),
        (f"Page-cache writes into {where} ({6 * args.mib} MiB)", writes),
        (
            f"Page-cache reads of {SAMPLE // KiB} KiB from {where} (six files of {args.mib} MiB)",
            reads,
        ),
    ]
    for title, rates in sections:
        lines += ["", f"{title}, MB/s:", "", "| way | MB/s |", "|---|---|"]
        lines += [f"| {name} | {rate:,.0f} |" for name, rate in rates.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
