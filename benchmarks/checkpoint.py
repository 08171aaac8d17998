"""Checkpoints at the speed of the disk: ``VolumeWriter`` / ``VolumeReader`` beside torch's
``FileSystemWriter`` / ``FileSystemReader`` and ``dd``, to and from the same folder.

Every rank saves its own part of a state dict (distinct keys, random fp32 tensors of 64 MiB)
with ``dcp.save``, all ranks started together behind a barrier; the figure is the total bytes
over the slowest rank's time. Before each load every file of the checkpoint is dropped from the
page cache (``posix_fadvise(DONTNEED)`` after ``fsync``), so a load reads the disk; the loaded
tensors are compared with the saved ones. ``dd`` writes the same number of bytes in blocks
of 256 KiB (as ``VolumeWriter`` writes) with ``conv=fsync`` and reads them back after the
same drop, as one process (the disk's ceiling), in every round beside the writers. A virtual
disk's rate drifts from minute to minute, so each ratio is taken between steps of the same
round, and the table gives medians over the rounds (``--reps``, default 3; each step first in
one of them). The atomic publish's cost is ``VolumeWriter.finish`` (``.metadata`` written,
then renamed), as a share of the save. The per-shard checksum (XXH3-64 with ``xxhash``
installed, else crc32; recorded on save, checked on load) costs what
``VolumeWriter / VolumeReader`` loses to the same without it, in the same rounds.

    PYTHONPATH=. .venv/bin/python benchmarks/checkpoint.py           # 256 MiB, quick
    PYTHONPATH=. .venv/bin/python benchmarks/checkpoint.py --full    # 1 GiB and 4 GiB
    PYTHONPATH=. .venv/bin/python benchmarks/checkpoint.py --dir /local_disk/ckpt

``save_load`` is also what ``scripts/checkpoint_gpu_check.py`` runs for an FSDP2 model.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO_ROOT, fmt_ratio, markdown_table, verdict

MiB = 1 << 20
GB = 1e9
CHUNK = 64 * MiB
DD_WRITE = 256 * 1024


def drop_cached(folder: Path) -> None:
    """Write back, then drop from the page cache, every file under ``folder``."""
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


DD = "dd (1 process)"
OURS = "VolumeWriter / VolumeReader"
UNCHECKED = "VolumeWriter / VolumeReader, no checksum"
"""The same without the per-shard checksum (``checksums=False`` / ``verify=False``): its cost."""


def save_load(root: str, state: dict[str, Any], nbytes: int, reps: int = 3) -> dict[str, Any]:
    """In every rank: save ``state`` (this rank's ``nbytes``) with each writer, load it back, and
    (rank 0 alone) ``dd`` all ranks' bytes to the same folder and back, every round; each
    step's seconds per round (the slowest rank's, through barriers) and whether it
    round-tripped. The disk's rate drifts over minutes, so ratios are taken within a round."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    from serverless_gpu.data import VolumeReader, VolumeWriter

    class TimedVolumeWriter(VolumeWriter):
        finish_s = 0.0

        def finish(self, *args: Any, **kwargs: Any) -> None:
            started = time.perf_counter()
            super().finish(*args, **kwargs)
            TimedVolumeWriter.finish_s = time.perf_counter() - started

    kinds: dict[str, Any] = {
        OURS: (TimedVolumeWriter, VolumeReader),
        UNCHECKED: (partial(VolumeWriter, checksums=False), partial(VolumeReader, verify=False)),
        "torch FileSystemWriter / Reader": (FileSystemWriter, FileSystemReader),
        DD: None,
    }
    rank, world = dist.get_rank(), dist.get_world_size()
    dd_count = max(1, nbytes * world // CHUNK)  # dd moves whole blocks: its share of them
    out: dict[str, Any] = {
        name: {"save_s": [], "load_s": [], "same": True, "bytes": nbytes} for name in kinds
    }
    out[DD]["bytes"] = dd_count * CHUNK / world
    publish = []
    for rep in range(reps):
        # Each step first in one of the rounds: whichever saves first in a round saves slower
        # (so did each writer when the order was swapped).
        order = list(kinds.items())
        order = order[rep % len(order) :] + order[: rep % len(order)]
        for name, pair in order:
            path = Path(root) / f"{list(kinds).index(name)}-{rep}"
            if pair is None:
                save_s, load_s = _timed_dd(path, dd_count * CHUNK if rank == 0 else 0)
            else:
                writer, reader = pair
                save_s = _timed(partial(dcp.save, state, storage_writer=writer(str(path))))
                if writer is TimedVolumeWriter:
                    publish.append(TimedVolumeWriter.finish_s)
                if rank == 0:
                    drop_cached(path)
                dist.barrier()
                target = {k: torch.zeros_like(v) for k, v in state.items()}
                load_s = _timed(partial(dcp.load, target, storage_reader=reader(str(path))))
                same = all(torch.equal(_local(target[k]), _local(v)) for k, v in state.items())
                out[name]["same"] = out[name]["same"] and same
                del target
            out[name]["save_s"].append(save_s)
            out[name]["load_s"].append(load_s)
            dist.barrier()
            if rank == 0:
                shutil.rmtree(path, ignore_errors=True)
    out["publish_s"] = max(publish)
    return out


def _local(value: Any) -> Any:
    return value.to_local() if hasattr(value, "to_local") else value


def _timed(step: Any) -> float:
    import torch.distributed as dist

    dist.barrier()
    started = time.perf_counter()
    step()
    dist.barrier()
    return time.perf_counter() - started


def _timed_dd(folder: Path, nbytes: int) -> tuple[float, float]:
    """(write, read) seconds of ``dd`` moving ``nbytes`` (whole blocks) in this process; with
    0 bytes this rank only waits for the one that runs it."""
    if nbytes:
        folder.mkdir(parents=True, exist_ok=True)
    path = folder / "dd.bin"
    # Writes of 256 KiB, as VolumeWriter's: on some kernels one write of 2 MiB or more into
    # the page cache runs far below the disk's rate (serverless_gpu/data/piecewise.py), and
    # the ceiling is the disk's.
    count = nbytes // DD_WRITE
    write = ["dd", "if=/dev/zero", f"of={path}", f"bs={DD_WRITE}", f"count={count}", "conv=fsync"]
    read = ["dd", f"if={path}", "of=/dev/null", f"bs={CHUNK}"]
    save_s = _timed(partial(_run, write if nbytes else None))
    if nbytes:
        drop_cached(folder)
    load_s = _timed(partial(_run, read if nbytes else None))
    return save_s, load_s


def _run(command: list[str] | None) -> None:
    if command is not None:
        subprocess.run(command, check=True, capture_output=True)


def tensors_rank(root: str, total_bytes: int, reps: int) -> dict[str, Any]:
    """The benchmark's rank: this rank's share of ``total_bytes`` as 64 MiB fp32 tensors."""
    import torch

    from serverless_gpu import runtime

    runtime.init_process_group()
    rank, world = runtime.get_global_rank(), runtime.get_world_size()
    mine = total_bytes // world
    generator = torch.Generator().manual_seed(rank)
    state = {
        f"rank{rank}/t{i}": torch.rand(CHUNK // 4, generator=generator)
        for i in range(max(1, mine // CHUNK))
    }
    return save_load(root, state, sum(t.numel() * 4 for t in state.values()), reps)


def rows_for(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per writer (and ``dd``): each round's save and load GB/s of all ranks together (the
    slowest rank's time), their medians, and whether every rank's load matched."""
    folded: dict[str, dict[str, Any]] = {}
    for name in results[0]:
        if name == "publish_s":
            continue
        total = sum(r[name]["bytes"] for r in results)
        rounds: dict[str, list[float]] = {}
        for what in ("save", "load"):
            slowest = [max(s) for s in zip(*(r[name][f"{what}_s"] for r in results), strict=True)]
            rounds[what] = [total / GB / seconds for seconds in slowest]
            rounds[f"{what}_s"] = slowest
        folded[name] = {
            **{what: statistics.median(rates) for what, rates in rounds.items()},
            "rounds": rounds,
            "same": float(all(r[name]["same"] for r in results)),
            "bytes": total,
        }
    return folded


def round_ratio(folded: dict[str, dict[str, Any]], what: str, ours: str, theirs: str) -> float:
    """The median over rounds of ``ours``' rate over ``theirs``' in the same round."""
    mine, other = folded[ours]["rounds"][what], folded[theirs]["rounds"][what]
    return statistics.median(a / b for a, b in zip(mine, other, strict=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="1 GiB and 4 GiB (default 256 MiB)")
    parser.add_argument("--mib", type=int, default=256, help="the quick run's size")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3, help="rounds (medians are reported)")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write (default: a temp dir)"
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the tables here (md)")
    args = parser.parse_args()
    import serverless_gpu
    from serverless_gpu import distributed

    sizes = [1 << 30, 4 << 30] if args.full else [args.mib * MiB]
    root = Path(tempfile.mkdtemp(prefix="sgpu-bench-ckpt-", dir=args.dir))
    fn = distributed(gpus=args.ranks, gpu_type="cpu", tracking=False)(tensors_rank)
    body: list[list[str]] = []
    rounds: list[list[str]] = []
    targets: list[list[str]] = []
    try:
        for size in sizes:
            results = list(fn.distributed(str(root), size, args.reps))
            label = f"{size / (1 << 30):g} GiB"
            folded = rows_for(results)
            for name, f in folded.items():
                same = "-" if name == DD else "yes" if f["same"] else "NO"
                body.append([label, name, f"{f['save']:.2f}", f"{f['load']:.2f}", same])
                each = f["rounds"]
                rounds.append([label, name, rates_text(each["save"]), rates_text(each["load"])])
            publish = max(r["publish_s"] for r in results)
            targets += targets_for(label, folded, publish)
    finally:
        serverless_gpu.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    report(args, root, body, rounds, targets)
    return 0


def targets_for(label: str, folded: dict[str, dict[str, Any]], publish: float) -> list[list[str]]:
    ours = OURS
    rows = []
    for theirs, short, target in (
        (UNCHECKED, "no checksum", 0.95),
        ("torch FileSystemWriter / Reader", "torch", 0.9),
        (DD, "dd", 0.7),
    ):
        for what in ("save", "load"):
            ratio = round_ratio(folded, what, ours, theirs)
            rows.append([f"{label} {what} vs {short}", f">= {target}x", fmt_ratio(ratio),
                         verdict(ratio >= target)])  # fmt: skip
    share = publish / statistics.median(folded[ours]["rounds"]["save_s"])
    rows.append([f"{label} atomic publish, share of the save", "<= 5 %", f"{share:.1%}",
                 verdict(share <= 0.05)])  # fmt: skip
    return rows


def rates_text(values: list[float]) -> str:
    return " / ".join(f"{value:.2f}" for value in values)


def report(
    args: argparse.Namespace,
    root: Path,
    body: list[list[str]],
    rounds: list[list[str]],
    targets: list[list[str]],
) -> None:
    import torch

    flag = (" --full" if args.full else "") + (f" --reps {args.reps}" if args.reps != 3 else "")
    headers = ["state dict", "writer / reader", "save GB/s", "load GB/s", "round trip"]
    each = ["state dict", "writer / reader", "save GB/s by round", "load GB/s by round"]
    text = "\n".join(
        [
            "## Checkpoints (benchmarks/checkpoint.py)",
            "",
            f"Machine: {os.cpu_count()} CPU cores; torch {torch.__version__}; {args.ranks} CPU "
            f"ranks; disk of {root.parent}; {time.strftime('%Y-%m-%d %H:%M')}.",
            f"Command: `PYTHONPATH=. python benchmarks/checkpoint.py{flag}`",
            "",
            "Medians of the rounds:",
            "",
            markdown_table(headers, body),
            "",
            markdown_table(each, rounds),
            "",
            "### Targets (the median of the rounds' ratios)",
            "",
            markdown_table(["figure", "target", "measured", "verdict"], targets),
            "",
        ]
    )  # fmt: skip
    print(text, flush=True)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    os.chdir(REPO_ROOT)
    raise SystemExit(main())
