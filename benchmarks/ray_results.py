"""A large result from one rank, remote=True on Ray beside the local backend, in one run.

One rank makes a 1 GiB float32 tensor (``--quick``: 64 MiB) and returns it; the same call
returning None (same work, no transfer) is timed beside it, so the transfer is the difference
(GB/s = size / difference), as ``overheads.py`` measures the local backend. Three ways, side by
side: the local backend; ``remote=True`` with the rank on the caller's machine (the result
goes through the call's results twin, mapped by the caller); and ``remote=True`` with the
results twin off (``SERVERLESS_GPU_RESULTS_DIR=off``), so the result goes through Ray's object
store, as it does from a rank on another node (here without a network in between: the object
store's own cost). With GPUs (unless ``--cpu``) the same for a CUDA tensor. A last column reads
the arrived value once (``sum()``; a mapped result is read from its file then) against the same
read of a tensor made in this process.

Without ``RAY_ADDRESS`` the script starts a one-node Ray cluster on this machine
(``ray.init``, its object store large enough for the result).

    PYTHONPATH=. python benchmarks/ray_results.py [--cpu] [--reps K] [--quick] [--out F.md]
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before ray: 127.0.0.1

import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import _common as C

LEAN_PATH = Path(__file__).resolve().parents[1] / "tests" / "ray" / "no_rfc3987"
RESULTS_DIR_ENV = "SERVERLESS_GPU_RESULTS_DIR"
TARGET_GBS = 2.0


def blob(nbytes: int, send: bool, on_gpu: bool) -> Any:
    """A tensor of ``nbytes`` made in the rank (on its GPU with ``on_gpu``), returned or
    dropped."""
    import torch

    device = "cuda" if on_gpu else "cpu"
    tensor = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    if on_gpu:
        torch.cuda.synchronize()
    return tensor if send else None


def _start_ray(nbytes: int, device: str) -> None:
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=False)
        return
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(LEAN_PATH), os.environ.get("PYTHONPATH")])
    )
    gpus = 1 if device == "cuda" else 0
    store = max(3 * nbytes, 256 * 2**20)  # the result, and the one of the call before it
    # "local": a cluster of its own, never one that another process of this machine runs
    ray.init(
        address="local",
        num_cpus=2,
        num_gpus=gpus,
        object_store_memory=store,
        log_to_driver=False,
    )


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def _read_s(value: Any) -> float:
    start = time.perf_counter()
    float(value.sum())
    return time.perf_counter() - start


def measure_way(fn: Any, nbytes: int, on_gpu: bool, reps: int) -> dict[str, list[float]]:
    """Alternating calls returning the tensor and None; a first call of each warms up."""
    fn.distributed(nbytes, True, on_gpu)
    fn.distributed(nbytes, False, on_gpu)
    times: dict[str, list[float]] = {"send": [], "none": [], "read": []}
    for _ in range(reps):
        took, out = _timed(lambda: fn.distributed(nbytes, True, on_gpu))
        times["send"].append(took)
        times["read"].append(_read_s(out[0]))
        del out
        times["none"].append(_timed(lambda: fn.distributed(nbytes, False, on_gpu))[0])
    return times


def _with_results_dir(value: str | None, run: Callable[[], Any]) -> Any:
    previous = os.environ.get(RESULTS_DIR_ENV)
    if value is None:
        os.environ.pop(RESULTS_DIR_ENV, None)
    else:
        os.environ[RESULTS_DIR_ENV] = value  # read by the caller when it makes a run directory
    try:
        return run()
    finally:
        if previous is None:
            os.environ.pop(RESULTS_DIR_ENV, None)
        else:
            os.environ[RESULTS_DIR_ENV] = previous


def measure(s: C.Settings, nbytes: int) -> dict[tuple[str, str], dict[str, list[float]]]:
    from serverless_gpu import distributed

    _start_ray(nbytes, s.device)
    C.quiet_console()
    gpu_type = "cpu" if s.cpu else None
    kinds = ["CPU tensor"] + ([] if s.cpu else ["CUDA tensor"])
    ways = {
        "local backend": (False, None),
        "Ray, caller's machine": (True, None),
        "Ray, object store": (True, "off"),
    }
    samples = {}
    for way, (remote, results_dir) in ways.items():
        fn = distributed(gpus=1, gpu_type=gpu_type, remote=remote, output="none", tracking=False)(
            blob
        )
        for kind in kinds:
            samples[(way, kind)] = _with_results_dir(
                results_dir, partial(measure_way, fn, nbytes, kind == "CUDA tensor", s.reps)
            )
    return samples


def _baseline_read_s(nbytes: int) -> float:
    import torch

    tensor = torch.ones(nbytes // 4, dtype=torch.float32)
    return C.median([_read_s(tensor) for _ in range(3)])


def _floor_gbs(nbytes: int) -> float:
    """The rank's own part, in this process: ``dump_result`` of the tensor into the results
    root with one torch thread (a rank of ``SERVERLESS_GPU_RAY_CPUS_PER_RANK=1`` has one)."""
    import torch

    from serverless_gpu.runfiles.rundirs import results_root
    from serverless_gpu.runfiles.serialization import dump_result

    tensor = torch.ones(nbytes // 4, dtype=torch.float32)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    took = []
    with tempfile.TemporaryDirectory(dir=results_root()) as folder:
        for i in range(3):
            path = Path(folder, f"result_{i}.pkl")
            took.append(_timed(partial(dump_result, tensor, path, 1))[0])
            path.unlink()
    torch.set_num_threads(threads)
    return nbytes / 1e9 / C.median(took)


def report(
    s: C.Settings, nbytes: int, samples: dict[tuple[str, str], dict[str, list[float]]]
) -> list[tuple[str, str]]:
    gb = nbytes / 1e9
    rows, targets = [], []
    baseline = _baseline_read_s(nbytes)
    for (way, kind), t in samples.items():
        diff = C.median(t["send"]) - C.median(t["none"])
        rate = gb / diff if diff > 0 else float("inf")
        rows.append(
            [
                way,
                kind,
                C.fmt_s(t["send"]),
                C.fmt_s(t["none"]),
                f"{rate:.2f} GB/s",
                f"{gb / C.median(t['send']):.2f} GB/s",
                C.fmt_s(t["read"]),
            ]
        )
        if way == "Ray, caller's machine":
            target = f">= {TARGET_GBS:g} GB/s"
            targets.append([f"{way}, {kind}", target, f"{rate:.2f} GB/s", C.verdict(rate >= 2)])
    headers = ["way", "result", "call, returned", "call, None", "transfer", "raw (whole call)"]
    table = C.markdown_table([*headers, "read once (sum)"], rows)
    where = os.environ.get("RAY_ADDRESS") or "a one-node Ray cluster on this machine (ray.init)"
    intro = (
        f"One rank returns a {nbytes / 2**30:g} GiB float32 tensor; medians over {s.reps} reps "
        f"(min-max). Transfer = size / (call returning it - same call returning None); raw = "
        f"size / whole call. Ray: {where}. A tensor made in this process reads once (sum) in "
        f"{C.fmt_s([baseline])}. Floor of the first two ways, the rank's write alone: "
        f"dump_result of the tensor into the results root in this process with one torch thread "
        f"(as the rank has), {_floor_gbs(nbytes):.2f} GB/s."
    )
    verdicts = C.markdown_table(
        ["result from a rank on the caller's machine", "target", "measured", "verdict"], targets
    )
    return [("Results", intro + "\n\n" + table), ("Targets", verdicts)]


def main(argv: Sequence[str]) -> None:
    s = C.parse_settings(__doc__.splitlines()[0], ["--gpus", "1", *argv])  # one rank
    nbytes = (64 if s.quick else 1024) * 2**20
    os.environ.setdefault("SERVERLESS_GPU_RUNS_DIR", tempfile.mkdtemp(prefix="ray-results-"))
    import ray

    import serverless_gpu

    try:
        samples = measure(s, nbytes)
    finally:
        serverless_gpu.shutdown()
        ray.shutdown()
    C.emit_report(s, "Results on Ray beside the local backend", report(s, nbytes, samples))
    left = C.reap_leftovers()
    if left:
        print(f"killed leftover processes: {left}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
