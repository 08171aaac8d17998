"""Checkpoints at the speed of the disk: ``VolumeWriter`` / ``VolumeReader`` beside torch's
``FileSystemWriter`` / ``FileSystemReader`` and ``dd``, to and from the same folder.

Every rank saves its own part of a state dict (distinct keys, random fp32 tensors of 64 MiB)
with ``dcp.save``, all ranks started together behind a barrier; the figure is the total bytes
over the slowest rank's time. Before each load every file of the checkpoint is dropped from the
page cache (``posix_fadvise(DONTNEED)`` after ``fsync``), so a load reads the disk; the loaded
tensors are compared with the saved ones. ``dd`` writes the same number of bytes with
``conv=fsync`` and reads them back after the same drop, as one process (the disk's ceiling).
Each writer runs twice, alternating with the other, and keeps its best time. The atomic
publish's cost is ``VolumeWriter.finish`` (``.metadata`` written, then renamed), as
a share of the save.

    PYTHONPATH=. .venv/bin/python benchmarks/checkpoint.py           # 256 MiB, quick
    PYTHONPATH=. .venv/bin/python benchmarks/checkpoint.py --full    # 1 GiB and 4 GiB
    PYTHONPATH=. .venv/bin/python benchmarks/checkpoint.py --dir /local_disk/ckpt

``save_load`` is also what ``scripts/checkpoint_gpu_check.py`` runs for an FSDP2 model.
"""

from __future__ import annotations

import argparse
import os
import shutil
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


def save_load(root: str, state: dict[str, Any], nbytes: int, reps: int = 2) -> dict[str, Any]:
    """In every rank: save ``state`` (this rank's ``nbytes``) with each writer, then load it
    back; seconds per step (the slowest rank's, through barriers) and whether it round-tripped."""
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

    kinds = {
        "VolumeWriter / VolumeReader": (TimedVolumeWriter, VolumeReader),
        "torch FileSystemWriter / Reader": (FileSystemWriter, FileSystemReader),
    }
    rank = dist.get_rank()
    out: dict[str, Any] = {}
    for rep in range(reps):
        # Best of reps, each writer first in one of them: whichever saves first in a round
        # saves slower (so did each of the two when the order was swapped).
        order = list(kinds.items()) if rep % 2 == 0 else list(reversed(kinds.items()))
        for name, (writer, reader) in order:
            path = Path(root) / f"{name.split()[0]}-{rep}"
            save_s = _timed(partial(dcp.save, state, storage_writer=writer(str(path))))
            if rank == 0:
                drop_cached(path)
            dist.barrier()
            target = {k: torch.zeros_like(v) for k, v in state.items()}
            load_s = _timed(partial(dcp.load, target, storage_reader=reader(str(path))))
            same = all(torch.equal(_local(target[k]), _local(v)) for k, v in state.items())
            del target
            best = out.get(name, {"save_s": save_s, "load_s": load_s, "same": True})
            out[name] = {
                "save_s": min(save_s, best["save_s"]),
                "load_s": min(load_s, best["load_s"]),
                "same": same and best["same"],
                "bytes": nbytes,
            }
            dist.barrier()
            if rank == 0:
                shutil.rmtree(path, ignore_errors=True)
    out["publish_s"] = TimedVolumeWriter.finish_s
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


def dd(folder: Path, nbytes: int) -> tuple[float, float]:
    """(write GB/s with fsync, read GB/s from the disk) of ``nbytes`` through one process."""
    path = folder / "dd.bin"
    count = max(1, nbytes // CHUNK)
    started = time.perf_counter()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={path}", f"bs={CHUNK}", f"count={count}", "conv=fsync"],
        check=True, capture_output=True,
    )  # fmt: skip
    write = count * CHUNK / GB / (time.perf_counter() - started)
    drop_cached(folder)
    started = time.perf_counter()
    subprocess.run(
        ["dd", f"if={path}", "of=/dev/null", f"bs={CHUNK}"], check=True, capture_output=True
    )
    read = count * CHUNK / GB / (time.perf_counter() - started)
    path.unlink()
    return write, read


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


def rows_for(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per writer: save and load GB/s of all ranks together, and whether every rank's load
    matched."""
    folded = {}
    for name in results[0]:
        if name == "publish_s":
            continue
        total = sum(r[name]["bytes"] for r in results)
        folded[name] = {
            "save": total / GB / max(r[name]["save_s"] for r in results),
            "load": total / GB / max(r[name]["load_s"] for r in results),
            "save_s": max(r[name]["save_s"] for r in results),
            "same": float(all(r[name]["same"] for r in results)),
            "bytes": total,
        }
    return folded


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="1 GiB and 4 GiB (default 256 MiB)")
    parser.add_argument("--mib", type=int, default=256, help="the quick run's size")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--reps", type=int, default=2, help="rounds; the best of each is kept")
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
    targets: list[list[str]] = []
    try:
        for size in sizes:
            results = list(fn.distributed(str(root), size, args.reps))
            # A virtual disk's host may still cache what the guest dropped: best of reps too.
            rates = [dd(root, size) for _ in range(args.reps)]
            write, read = max(w for w, _ in rates), max(r for _, r in rates)
            label = f"{size / (1 << 30):g} GiB"
            folded = rows_for(results)
            for name, f in folded.items():
                same = "yes" if f["same"] else "NO"
                body.append([label, name, f"{f['save']:.2f}", f"{f['load']:.2f}", same])
            body.append([label, "dd (1 process)", f"{write:.2f}", f"{read:.2f}", "-"])
            publish = max(r["publish_s"] for r in results)
            targets += targets_for(label, folded, (write, read), publish)
    finally:
        serverless_gpu.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    report(args, root, body, targets)
    return 0


def targets_for(
    label: str, folded: dict[str, dict[str, float]], dd_rates: tuple[float, float], publish: float
) -> list[list[str]]:
    ours = folded["VolumeWriter / VolumeReader"]
    theirs = folded["torch FileSystemWriter / Reader"]
    rows = []
    for what in ("save", "load"):
        ratio = ours[what] / theirs[what]
        rows.append(
            [f"{label} {what} vs torch", ">= 0.9x", fmt_ratio(ratio), verdict(ratio >= 0.9)]
        )
    for what, ceiling in zip(("save", "load"), dd_rates, strict=True):
        ratio = ours[what] / ceiling
        rows.append([f"{label} {what} vs dd", ">= 0.7x", fmt_ratio(ratio), verdict(ratio >= 0.7)])
    share = publish / ours["save_s"]
    rows.append([f"{label} atomic publish, share of the save", "<= 5 %", f"{share:.1%}",
                 verdict(share <= 0.05)])  # fmt: skip
    return rows


def report(
    args: argparse.Namespace, root: Path, body: list[list[str]], targets: list[list[str]]
) -> None:
    import torch

    flag = (" --full" if args.full else "") + (f" --reps {args.reps}" if args.reps != 2 else "")
    headers = ["state dict", "writer / reader", "save GB/s", "load GB/s", "round trip"]
    text = "\n".join(
        [
            "## Checkpoints (benchmarks/checkpoint.py)",
            "",
            f"Machine: {os.cpu_count()} CPU cores; torch {torch.__version__}; {args.ranks} CPU "
            f"ranks; disk of {root.parent}; {time.strftime('%Y-%m-%d %H:%M')}.",
            f"Command: `PYTHONPATH=. python benchmarks/checkpoint.py{flag}`",
            "",
            markdown_table(headers, body),
            "",
            "### Targets",
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
