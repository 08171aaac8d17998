"""Data loading at the speed of the disk: ``VolumeDataset`` beside its peers, on the same bytes.

One run, one generated dataset (random bytes, so nothing compresses), served from a local folder
and from a moto S3 server on 127.0.0.1 in its own process (a real HTTP round trip). Every reader
reads every byte of every sample, in ``--ranks`` processes at once (default 2, started
together), with 0, 2 and 4 DataLoader workers per rank:

- ``VolumeDataset`` + its loader (cold: an empty cache; warm: the next epoch, cached), over the
  files and (``VolumeDataset (tar)``, ``shards="tar"``) over tar shards of them with their index;
- a plain ``DataLoader`` over a file-list dataset (local: ``open``; S3: ``s3fs.cat_file``);
- ``webdataset`` over tar shards of the same samples (local), when it is installed;
- ``streaming-community``'s ``StreamingDataset`` over MDS shards of the same samples (local
  shards read in place; S3: its own download into an empty local folder), when installed.
  ``streaming.vision`` is left out of its import: it needs torchvision, whose PyPI wheels do not
  load against a CPU build of torch; the MDS reader does not use it.

Ceilings in the same run: ``cat`` of the same files (local) and a 16-thread ``s3fs`` read (S3).
A local epoch lasts tens to hundreds of milliseconds on two busy cores, and a cold S3 epoch
writes the cache to a disk whose rate drifts, so every row (and ceiling) is measured in
``--rounds`` rounds (3 with ``--full``), the readers in a rotated order each round, and every
figure is the median of its rounds.
Figures: samples/s and MB/s (all ranks together, the slowest rank's wall time), time to first
batch, and for ``VolumeDataset`` the first batch after resuming mid-epoch from ``state_dict``.
The local source is in the page cache for every reader (it was just written): "cold" is the
reader's own cache, not the disk. Every local file, of every layout, is written in ``write()``
calls of at most 256 KiB (the shards rewritten so after ``tarfile`` or ``MDSWriter`` made them):
the kernel keeps a file's cached pages in groups sized by how they arrived, and a read of the
same bytes ran 1.5x slower from a file written in ``tarfile``'s 16 KiB calls (see
``benchmarks/data_io.py``), which would measure the generator, not the reader.
A first batch lasts a few milliseconds, so each first batch (fresh and resumed) is timed
``FIRST_BATCH_REPS`` times in every round, and the round keeps the median.

With ``--persistent-workers`` every reader's DataLoader keeps its workers from one epoch to the
next (the warm epoch then starts none).

    PYTHONPATH=. .venv/bin/python benchmarks/data.py            # quick, about 2-3 min
    PYTHONPATH=. .venv/bin/python benchmarks/data.py --full     # the issue's sizes
    PYTHONPATH=. .venv/bin/python benchmarks/data.py --full --persistent-workers
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO_ROOT, fmt_ratio, free_port, markdown_table, verdict

BATCH = 32
KiB = 1024
MB = 1e6
_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass(frozen=True)
class Variant:
    name: str
    files: int
    size: int
    s3_files: int


@dataclass
class Source:
    """One variant's bytes in each place: a local folder, an S3 prefix, tar shards."""

    variant: Variant
    folder: Path
    s3_url: str
    s3_paths: list[str]
    shards: list[str]
    s3_tar: str = ""
    s3_options: dict[str, Any] = field(default_factory=dict)
    mds: Path | None = None
    s3_mds: str = ""


@dataclass(frozen=True)
class Epoch:
    samples: int
    nbytes: int
    seconds: float
    first: float

    @property
    def rate(self) -> float:
        return self.samples / self.seconds

    @property
    def mbps(self) -> float:
        return self.nbytes / MB / self.seconds


# -- the readers (each runs in a rank process) --------------------------------------------------


def read_len(path: str) -> int:
    with open(path, "rb") as f:
        return len(f.read())


class FileList(Dataset[int]):
    """A map-style dataset: item i is the length of file i, every byte read."""

    def __init__(self, paths: list[str], s3_options: dict[str, Any] | None) -> None:
        super().__init__()
        self.paths = paths
        self.s3_options = s3_options
        self._fs: tuple[int, Any] | None = None

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> int:
        if self.s3_options is None:
            return read_len(self.paths[index])
        if self._fs is None or self._fs[0] != os.getpid():  # one client per process
            import fsspec

            fs = fsspec.filesystem("s3", skip_instance_cache=True, **self.s3_options)
            self._fs = (os.getpid(), fs)
        return len(self._fs[1].cat_file(self.paths[index]))


PERSISTENT = "SGPU_BENCH_PERSISTENT_WORKERS"
"""Set by ``--persistent-workers`` for the ranks (whatever their start method)."""


def loader_options(workers: int) -> dict[str, Any]:
    """Every reader's DataLoader options: the batch, the workers, and whether they persist."""
    persistent = workers > 0 and os.environ.get(PERSISTENT) == "1"
    return {"batch_size": BATCH, "num_workers": workers, "persistent_workers": persistent}


def timed_epoch(batches: Iterable[Any]) -> Epoch:
    start = time.perf_counter()
    first = math.nan
    samples = nbytes = 0
    for batch in batches:
        if samples == 0:
            first = time.perf_counter() - start
        samples += len(batch)
        nbytes += int(sum(int(x) for x in batch))
    return Epoch(samples, nbytes, time.perf_counter() - start, first)


def sample_len(sample: dict[str, Any]) -> int:
    return len(sample["bin"])


def volume_epochs(
    src: Source, where: str, rank: int, world: int, workers: int, cache: str, tar: bool = False
) -> dict[str, Epoch]:
    from serverless_gpu.data import VolumeDataset

    url, options = (str(src.folder), {}) if where == "local" else (src.s3_url, src.s3_options)
    if tar:
        url = str(Path(src.shards[0]).parent) if where == "local" else src.s3_tar
    kind: dict[str, Any] = (
        {"shards": "tar", "transform": sample_len} if tar else {"transform": read_len}
    )

    def dataset() -> Any:
        return VolumeDataset(
            url, cache, min_free_bytes=0, rank=rank, world_size=world, storage_options=options,
            **kind,
        )  # fmt: skip

    ds = dataset()
    loader = ds.loader(**loader_options(workers))
    out = {"cold": timed_epoch(loader), "warm": timed_epoch(loader)}
    # Resume: stop half way through an epoch, then a new dataset resumes from its state.
    half = ds.epoch_batches(batch_size=BATCH, drop_last=False, num_workers=workers) // 2
    ds.set_epoch(ds.epoch + 1)
    batches = iter(loader)
    for _ in range(max(1, half)):
        next(batches)
    state = ds.state_dict()
    del batches
    out["fresh"] = _median_first(lambda: dataset().loader(**loader_options(workers)))

    def resumed() -> Any:
        ds = dataset()
        ds.load_state_dict(state)
        return ds.loader(**loader_options(workers))

    out["resume"] = _median_first(resumed)
    return out


FIRST_BATCH_REPS = 3
"""Times each first batch is measured in a round (it lasts milliseconds: one is noise)."""


def _median_first(make_loader: Callable[[], Any]) -> Epoch:
    firsts = sorted((_first_batch(make_loader()) for _ in range(FIRST_BATCH_REPS)),
                    key=lambda e: e.first)  # fmt: skip
    return firsts[len(firsts) // 2]


def _first_batch(loader: Any) -> Epoch:
    start = time.perf_counter()
    batches = iter(loader)
    batch = next(batches)
    seconds = time.perf_counter() - start
    del batches
    return Epoch(len(batch), 0, seconds, seconds)


def filelist_epochs(
    src: Source, where: str, rank: int, world: int, workers: int, cache: str
) -> dict[str, Epoch]:
    if where == "local":
        paths = sorted(str(p) for p in src.folder.iterdir())[rank::world]
        data = FileList(paths, None)
    else:
        data = FileList(src.s3_paths[rank::world], src.s3_options)
    loader = DataLoader(data, **loader_options(workers))
    return {"cold": timed_epoch(loader), "warm": timed_epoch(loader)}


def webdataset_epochs(
    src: Source, where: str, rank: int, world: int, workers: int, cache: str
) -> dict[str, Epoch]:
    import webdataset as wds

    def mine(urls: Iterable[Any]) -> Iterator[Any]:
        for i, url in enumerate(urls):
            if i % world == rank:
                yield url

    data = wds.WebDataset(src.shards, shardshuffle=False, nodesplitter=mine, empty_check=False)
    data = data.map(lambda sample: len(sample["bin"]))
    loader = DataLoader(data, **loader_options(workers))
    return {"cold": timed_epoch(loader), "warm": timed_epoch(loader)}


def import_streaming() -> Any:
    """``streaming`` without ``streaming.vision`` (see the module docstring)."""
    import importlib.util

    if "streaming" not in sys.modules and importlib.util.find_spec("streaming") is not None:
        import types

        vision = types.ModuleType("streaming.vision", "left out: it imports torchvision")
        sys.modules.setdefault("streaming.vision", vision)
    import streaming

    return streaming


def streaming_epochs(
    src: Source, where: str, rank: int, world: int, workers: int, cache: str
) -> dict[str, Epoch]:
    streaming = import_streaming()
    # Its ranks find each other through these (and shared memory), not torch.distributed.
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1")  # fmt: skip
    if where == "s3":
        os.environ["S3_ENDPOINT_URL"] = src.s3_options["endpoint_url"]
        where_from = {"remote": src.s3_mds, "local": os.path.join(cache, "mds")}
    else:
        where_from = {"local": str(src.mds)}

    class Lengths(streaming.StreamingDataset):  # type: ignore[name-defined]
        def __getitem__(self, index: int) -> int:
            return len(super().__getitem__(index)["bin"])

    data = Lengths(**where_from, batch_size=BATCH, shuffle=False, predownload=8 * BATCH)
    loader: DataLoader[int] = DataLoader(data, **loader_options(workers))
    return {"cold": timed_epoch(loader), "warm": timed_epoch(loader)}


def volume_tar_epochs(
    src: Source, where: str, rank: int, world: int, workers: int, cache: str
) -> dict[str, Epoch]:
    return volume_epochs(src, where, rank, world, workers, cache, tar=True)


OURS = ("VolumeDataset", "VolumeDataset (tar)")
READERS: dict[str, Callable[..., dict[str, Epoch]]] = {
    "VolumeDataset": volume_epochs,
    "VolumeDataset (tar)": volume_tar_epochs,
    "file-list DataLoader": filelist_epochs,
    "webdataset": webdataset_epochs,
    "streaming-community": streaming_epochs,
}


def _rank_entry(reader: str, args: tuple[Any, ...], rank: int, barrier: Any, out: Any) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        barrier.wait(120)
        out.put((rank, READERS[reader](*args[:1], args[1], rank, *args[2:])))
    except BaseException as exc:
        out.put((rank, f"{type(exc).__name__}: {exc}"))


def run_ranks(reader: str, src: Source, where: str, world: int, workers: int) -> dict[str, Epoch]:
    """Every rank's epochs, folded: samples and bytes summed, the slowest rank's times."""
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(world), ctx.Queue()
    cache = tempfile.mkdtemp(prefix="sgpu-bench-cache-")
    os.environ["MASTER_PORT"] = str(free_port())  # streaming-community's ranks meet there
    procs = [
        ctx.Process(
            target=_rank_entry,
            args=(reader, (src, where, world, workers, cache), rank, barrier, out),
        )
        for rank in range(world)
    ]
    for proc in procs:
        proc.start()
    try:
        results = dict(out.get(timeout=600) for _ in procs)
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join()
        shutil.rmtree(cache, ignore_errors=True)
    failed = [r for r in results.values() if isinstance(r, str)]
    if failed:
        raise RuntimeError(failed[0])
    return {
        phase: Epoch(
            sum(results[r][phase].samples for r in results),
            sum(results[r][phase].nbytes for r in results),
            max(results[r][phase].seconds for r in results),
            max(results[r][phase].first for r in results),
        )
        for phase in results[0]
    }


# -- ceilings -----------------------------------------------------------------------------------


def cat_ceiling(folder: Path, total: int) -> Epoch:
    start = time.perf_counter()
    subprocess.run(
        "find . -type f -print0 | xargs -0 cat > /dev/null", shell=True, cwd=folder, check=True
    )
    seconds = time.perf_counter() - start
    return Epoch(sum(1 for _ in folder.iterdir()), total, seconds, math.nan)


def s3fs_ceiling(src: Source, threads: int = 16) -> Epoch:
    import fsspec

    fs = fsspec.filesystem("s3", skip_instance_cache=True, **src.s3_options)
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        nbytes = sum(pool.map(lambda p: len(fs.cat_file(p)), src.s3_paths))
    return Epoch(len(src.s3_paths), nbytes, time.perf_counter() - start, math.nan)


# -- the data -----------------------------------------------------------------------------------


def make_source(variant: Variant, root: Path, endpoint: str) -> Source:
    import fsspec

    folder = root / variant.name
    folder.mkdir(parents=True)
    names = [f"{i:06d}.bin" for i in range(variant.files)]
    for name in names:
        (folder / name).write_bytes(os.urandom(variant.size))
    options = {"endpoint_url": endpoint}
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
    bucket = f"bench-{variant.name}"
    fs.mkdir(bucket)
    s3_names = names[: variant.s3_files]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: fs.pipe_file(f"{bucket}/files/{n}", (folder / n).read_bytes()),
                      s3_names))  # fmt: skip
    from serverless_gpu.data.shards import write_tar_index

    shards = _tar_shards(folder, names, root / f"{variant.name}-shards", count=16)
    write_tar_index(str(Path(shards[0]).parent))
    s3_tar = _tar_shards(folder, s3_names, root / f"{variant.name}-shards-s3", count=16)
    write_tar_index(str(Path(s3_tar[0]).parent))
    fs.put(str(Path(s3_tar[0]).parent), f"{bucket}/tar", recursive=True)
    src = Source(
        variant, folder, f"s3://{bucket}/files", [f"{bucket}/files/{n}" for n in s3_names],
        shards, s3_tar=f"s3://{bucket}/tar", s3_options=options,
    )  # fmt: skip
    if "streaming-community" not in unavailable():
        src.mds = _mds_shards(folder, names, root / f"{variant.name}-mds", count=16)
        s3_mds = _mds_shards(folder, s3_names, root / f"{variant.name}-mds-s3", count=16)
        fs.put(str(s3_mds), f"{bucket}/mds", recursive=True)
        src.s3_mds = f"s3://{bucket}/mds"
    return src


def _mds_shards(folder: Path, names: list[str], out: Path, count: int) -> Path:
    streaming = import_streaming()
    limit = max(1, len(names) * (folder / names[0]).stat().st_size // count)
    with streaming.MDSWriter(out=str(out), columns={"bin": "bytes"}, size_limit=limit) as mds:
        for name in names:
            mds.write({"bin": (folder / name).read_bytes()})
    for shard in out.glob("*.mds"):
        _rewrite_in_pieces(shard)
    return out


def _tar_shards(folder: Path, names: list[str], out: Path, count: int) -> list[str]:
    out.mkdir()
    shards = []
    for i in range(count):
        path = out / f"shard-{i:04d}.tar"
        with tarfile.open(path, "w") as tar:
            for name in names[i::count]:
                tar.add(folder / name, arcname=name)
        _rewrite_in_pieces(path)
        shards.append(str(path))
    return shards


def _rewrite_in_pieces(path: Path) -> None:
    """Writes ``path`` again in 256 KiB ``write`` calls (the library's ``open_piecewise``), so
    its cached pages are held as those of the files (one 256 KiB write each) are."""
    from serverless_gpu.data.piecewise import open_piecewise

    data = path.read_bytes()
    with open_piecewise(path) as out:
        out.write(data)


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, **_AWS}
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    import urllib.request

    while True:
        try:
            urllib.request.urlopen(endpoint, timeout=1)
            return proc, endpoint
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("the moto S3 server did not start in 30 s") from None
            time.sleep(0.2)


# -- the report ---------------------------------------------------------------------------------


@dataclass
class Row:
    variant: str
    where: str
    reader: str
    workers: int
    phases: dict[str, Epoch]


def unavailable() -> dict[str, str]:
    """Peers that cannot run here, with why."""
    missing = {}
    try:
        import webdataset  # noqa: F401
    except ImportError as exc:
        missing["webdataset"] = f"not installed ({exc})"
    try:
        import_streaming()
    except Exception as exc:
        missing["streaming-community"] = f"does not import here: {type(exc).__name__}: {exc}"
    return missing


def measure(
    sources: list[Source], world: int, workers: list[int], rounds: int, log: Any
) -> tuple[list[Row], dict[tuple[str, str], Epoch]]:
    """Every reader's row and the ceilings, each measured ``rounds`` times (the readers in a
    rotated order each round, the ceiling with them) and given as the median of its rounds:
    a local epoch lasts tens to hundreds of milliseconds on two busy cores, and a cold S3 epoch
    also writes the cache to a disk whose rate drifts."""
    skip = unavailable()
    runs: dict[tuple[str, str, str, int], list[dict[str, Epoch]]] = {}
    ceilings: dict[tuple[str, str], list[Epoch]] = {}
    for src in sources:
        name, total = src.variant.name, src.variant.files * src.variant.size
        for where in ("local", "s3"):
            readers = [r for r in READERS if r not in skip and (r, where) != ("webdataset", "s3")]
            for k in range(rounds):
                if where == "local":
                    ceilings.setdefault((name, where), []).append(cat_ceiling(src.folder, total))
                else:
                    ceilings.setdefault((name, where), []).append(s3fs_ceiling(src))
                for w in workers:
                    for reader in readers[k % len(readers) :] + readers[: k % len(readers)]:
                        log(f"{name} {where} {reader} workers={w} (round {k + 1})")
                        phases = run_ranks(reader, src, where, world, w)
                        runs.setdefault((name, where, reader, w), []).append(phases)
    rows = [
        Row(name, where, reader, w, {p: _median([r[p] for r in each]) for p in each[0]})
        for (name, where, reader, w), each in runs.items()
    ]
    order = list(READERS)
    rows.sort(key=lambda r: (r.variant != sources[0].variant.name, r.where != "local",
                             order.index(r.reader), r.workers))  # fmt: skip
    return rows, {key: _median(each) for key, each in ceilings.items()}


def _median(epochs: list[Epoch]) -> Epoch:
    """The same samples and bytes in the median time (and median first batch)."""
    return Epoch(
        epochs[0].samples,
        epochs[0].nbytes,
        statistics.median(e.seconds for e in epochs),
        statistics.median(e.first for e in epochs),
    )


def _fmt(e: Epoch | None, what: str) -> str:
    if e is None:
        return "-"
    if what == "rate":
        return f"{e.rate:,.0f} / {e.mbps:,.0f}"
    return f"{e.first * 1e3:,.0f}"


def results_table(rows: list[Row]) -> str:
    body = []
    for r in rows:
        p = r.phases
        resume = "-"
        if "resume" in p:
            resume = f"{p['resume'].first * 1e3:,.0f} / {p['fresh'].first * 1e3:,.0f}"
        body.append(
            [r.variant, r.where, r.reader, str(r.workers), _fmt(p["cold"], "rate"),
             _fmt(p["warm"], "rate"), _fmt(p["cold"], "first"), resume]
        )  # fmt: skip
    headers = [
        "data", "source", "reader", "workers", "cold: samples/s / MB/s",
        "warm: samples/s / MB/s", "first batch (ms, cold)", "resume / fresh first batch (ms)",
    ]  # fmt: skip
    return markdown_table(headers, body)


def ceilings_table(ceilings: dict[tuple[str, str], Epoch]) -> str:
    body = [
        [variant, where, "cat (1 process)" if where == "local" else "s3fs, 16 threads",
         f"{e.rate:,.0f} / {e.mbps:,.0f}"]
        for (variant, where), e in ceilings.items()
    ]  # fmt: skip
    return markdown_table(["data", "source", "ceiling", "samples/s / MB/s"], body)


def targets_table(rows: list[Row], ceilings: dict[tuple[str, str], Epoch]) -> str:
    """Ours is the better of VolumeDataset's two layouts (files, tar shards) on each row: a
    user picks the layout, as with the peers (file list: files; the others: shards)."""
    body = []
    keys = sorted({(r.variant, r.where, r.workers) for r in rows})
    for variant, where, workers in keys:
        same = [r for r in rows if (r.variant, r.where, r.workers) == (variant, where, workers)]
        ours = [r for r in same if r.reader in OURS]
        peers = [r for r in same if r.reader not in OURS]
        if not ours:
            continue
        label = f"{variant} {where} w={workers}"
        for phase in ("cold", "warm"):
            best = max(ours, key=lambda r: r.phases[phase].mbps)
            peer = max((p.phases[phase].mbps for p in peers), default=math.nan)
            ratio = best.phases[phase].mbps / peer
            met = None if math.isnan(ratio) else ratio >= 1.0
            body.append([f"{label} {phase}: {best.reader} vs best peer", ">= 1.0x",
                         fmt_ratio(ratio), verdict(met)])  # fmt: skip
        ceiling = ceilings[(variant, where)]
        phase, goal = ("warm", "cat") if where == "local" else ("cold", "s3fs")
        best = max(ours, key=lambda r: r.phases[phase].mbps)
        ratio = best.phases[phase].mbps / ceiling.mbps
        body.append([f"{label} {phase}: {best.reader} vs {goal}", ">= 0.8x",
                     fmt_ratio(ratio), verdict(ratio >= 0.8)])  # fmt: skip
        for r in ours:
            ratio = r.phases["resume"].first / r.phases["fresh"].first
            body.append([f"{label}: {r.reader} resume / fresh first batch", "<= 2x",
                         fmt_ratio(ratio), verdict(ratio <= 2.0)])  # fmt: skip
    return markdown_table(["figure", "target", "measured", "verdict"], body)


def _flags(args: argparse.Namespace) -> str:
    rounds = args.rounds != (3 if args.full else 1)
    return (
        (" --full" if args.full else "")
        + (" --persistent-workers" if args.persistent_workers else "")
        + (f" --rounds {args.rounds}" if rounds else "")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="2,000 x 256 KiB and 20,000 x 4 KiB")
    parser.add_argument("--files", type=int, default=None, help="large files (quick: 400)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--workers", type=int, action="append", default=None)
    parser.add_argument(
        "--persistent-workers", action="store_true",
        help="every reader's DataLoader keeps its workers between epochs",
    )  # fmt: skip
    parser.add_argument(
        "--rounds", type=int, default=None,
        help="rounds of every row, medians reported (default 3 with --full, else 1)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="also write the tables here (md)")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (3 if args.full else 1)
    os.environ[PERSISTENT] = "1" if args.persistent_workers else "0"
    large = args.files or (2000 if args.full else 400)
    variants = [Variant("256KiB", large, 256 * KiB, large // (1 if args.full else 2))]
    if args.full:
        variants.append(Variant("4KiB", 20_000, 4 * KiB, 4000))
    workers = args.workers or [0, 2, 4]
    os.environ.update(_AWS)
    started = time.monotonic()

    def log(text: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {text}", file=sys.stderr, flush=True)

    moto, endpoint = start_moto()
    root = Path(tempfile.mkdtemp(prefix="sgpu-bench-data-"))
    try:
        sources = [make_source(v, root, endpoint) for v in variants]
        os.sync()  # else the first reader measured competes with the write-back of it all
        log("data written")
        rows, ceilings = measure(sources, args.ranks, workers, args.rounds, log)
    finally:
        moto.kill()
        moto.wait()
        shutil.rmtree(root, ignore_errors=True)
    report(args, rows, ceilings, variants, time.monotonic() - started)
    return 0


def report(
    args: argparse.Namespace,
    rows: list[Row],
    ceilings: dict[tuple[str, str], Epoch],
    variants: list[Variant],
    elapsed: float,
) -> None:
    import torch

    data = ", ".join(f"{v.files} x {v.size // KiB} KiB ({v.s3_files} on S3)" for v in variants)
    missing = "".join(f"\n- {name}: {why}" for name, why in unavailable().items())
    text = "\n".join(
        [
            "## Data loading (benchmarks/data.py)",
            "",
            f"Machine: {os.cpu_count()} CPU cores; Python {sys.version.split()[0]}; torch "
            f"{torch.__version__}; {args.ranks} ranks; batch {BATCH}; data {data}; "
            f"{time.strftime('%Y-%m-%d %H:%M')}; {elapsed:.0f} s in all; every figure the median "
            f"of {args.rounds} round(s), readers in a rotated order.",
            f"Command: `PYTHONPATH=. python benchmarks/data.py{_flags(args)}`",
            f"Peers not measured:{missing or ' none'}",
            "",
            "### Readers",
            "",
            results_table(rows),
            "",
            "### Ceilings",
            "",
            ceilings_table(ceilings),
            "",
            "### Targets",
            "",
            targets_table(rows, ceilings),
            "",
        ]
    )
    print(text, flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    os.chdir(REPO_ROOT)
    raise SystemExit(main())
