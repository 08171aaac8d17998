"""Helpers shared by the benchmark scripts (run in the caller process, never in a rank).

The caller never touches CUDA: GPUs are counted and their memory read through NVML only, so that
forking baselines stay legal and the caller looks like a notebook kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULT_TAG = "BENCH_RESULT "
SETTLE_S = {"cpu": 1.0, "cuda": 1.5}
"""Pause between serverless_gpu calls: the launcher replaces the standby ranks a call used once
the call is over, and in CUDA mode each new one creates its CUDA context (~0.3 s on an H200)."""


@dataclass(frozen=True)
class Settings:
    """What every benchmark needs to know about the machine and the run."""

    world_size: int
    device: str
    """``"cuda"`` or ``"cpu"`` (gloo)."""
    reps: int
    quick: bool
    out: Path | None
    gpu_names: tuple[str, ...]
    only: tuple[str, ...] = ()
    """Sections to run (``--only``); empty: all of them."""

    @property
    def cpu(self) -> bool:
        return self.device == "cpu"


def parse_settings(description: str, argv: Sequence[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--gpus", type=int, default=None, help="ranks (default: every GPU, or 2)")
    parser.add_argument("--cpu", action="store_true", help="CPU ranks over gloo even with GPUs")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 5; quick: 1)")
    parser.add_argument("--quick", action="store_true", help="CI-size run: tiny sizes, 1 rep")
    parser.add_argument("--out", type=Path, default=None, help="also write the tables here (md)")
    parser.add_argument("--only", action="append", default=[], help="run only this section")
    args = parser.parse_args(argv)
    names = () if args.cpu else tuple(gpu_names())
    device = "cuda" if names else "cpu"
    world = args.gpus if args.gpus is not None else (len(names) or 2)
    if device == "cuda" and world > len(names):
        parser.error(f"--gpus {world}: only {len(names)} GPU(s) visible")
    if world < 1:
        parser.error("--gpus must be at least 1")
    reps = args.reps if args.reps is not None else (1 if args.quick else 5)
    only = tuple(args.only)
    return Settings(world, device, max(1, reps), args.quick, args.out, names[:world], only)


def gpu_names() -> list[str]:
    """Visible GPUs through NVML (no CUDA context in the caller)."""
    from serverless_gpu.common.gpus import visible_gpu_names

    return visible_gpu_names()


def machine_line(s: Settings) -> str:
    import torch

    import serverless_gpu

    what = f"{s.world_size} x {s.gpu_names[0]}" if s.gpu_names else f"{s.world_size} CPU ranks"
    return (
        f"{what}; {os.cpu_count()} CPU cores; Python {platform.python_version()}; "
        f"torch {torch.__version__}; serverless_gpu {serverless_gpu.__version__}; "
        f"{time.strftime('%Y-%m-%d %H:%M')}; reps={s.reps}{' (quick)' if s.quick else ''}"
    )


def gloo_or_nccl(s: Settings) -> str:
    return "gloo" if s.cpu else "NCCL"


# -- statistics and formatting ------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def fmt_s(values: Sequence[float]) -> str:
    """``median (min-max)`` in seconds, or milliseconds below one second."""
    if not values:
        return "n/a"
    med, lo, hi = median(values), min(values), max(values)
    if med < 1.0:
        return f"{med * 1e3:.0f} ms ({lo * 1e3:.0f}-{hi * 1e3:.0f})"
    return f"{med:.2f} s ({lo:.2f}-{hi:.2f})"


def fmt_ratio(value: float) -> str:
    if value != value:  # NaN: a figure is missing
        return "n/a"
    return f"{value:.3f}x" if value < 0.1 else f"{value:.2f}x"


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "NOT met")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def emit_report(s: Settings, title: str, sections: Sequence[tuple[str, str]]) -> None:
    """Print the tables and, with ``--out``, write them as one markdown file."""
    parts = [f"## {title}", "", f"Machine: {machine_line(s)}", ""]
    for heading, body in sections:
        parts += [f"### {heading}", "", body, ""]
    text = "\n".join(parts)
    print(text, flush=True)
    if s.out is not None:
        s.out.parent.mkdir(parents=True, exist_ok=True)
        s.out.write_text(text)


# -- processes ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env() -> dict[str, str]:
    """Environment for subprocesses: this one plus the benchmarks folder on the path."""
    env = dict(os.environ)
    extra = [str(BENCH_DIR), str(REPO_ROOT)]
    env["PYTHONPATH"] = os.pathsep.join([*extra, *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_subprocess(args: Sequence[str], timeout: float, log: Path) -> int:
    """Run a command in its own session; on timeout or error its whole group is killed."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=child_env(),
            cwd=REPO_ROOT,
            start_new_session=True,  # so that killpg reaches every rank it started
        )
        try:
            return proc.wait(timeout)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            else:
                _kill_group_quietly(proc.pid)  # stragglers a crashed launcher left behind


def _kill_group_quietly(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_child_json(args: Sequence[str], timeout: float, log: Path) -> dict[str, Any]:
    """Run a helper subprocess that prints one ``BENCH_RESULT {json}`` line; return that json."""
    start = log.stat().st_size if log.exists() else 0
    code = run_subprocess(args, timeout, log)
    with open(log, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    for line in reversed(text.splitlines()):
        if line.startswith(RESULT_TAG):
            result: dict[str, Any] = json.loads(line[len(RESULT_TAG) :])
            return result
    raise RuntimeError(f"{args[:4]}... exited {code} without a result; see {log}")


def print_result(value: dict[str, Any]) -> None:
    print(RESULT_TAG + json.dumps(value), flush=True)


def reap_leftovers() -> list[str]:
    """Kill any descendant of this process still alive (there should be none); say which."""
    import psutil

    left = []
    for child in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(child.cmdline())
            if "multiprocessing.resource_tracker" in cmdline:
                continue  # spawn's helper: it exits by itself when this process does
            left.append(f"{child.pid} {cmdline[:80]}")
            child.kill()
        except psutil.Error:
            pass
    return left


def quiet_console() -> None:
    """Keep the library's console printer out of the benchmark's output (events still flow)."""
    from serverless_gpu.caller.hooks import register_hook

    def claim(ctx: Any) -> None:
        ctx.display_claimed = True

    register_hook(claim, order=0)


def read_entries(out_dir: Path, world_size: int) -> list[float]:
    """Entry wall-clock times written by each rank (``entry_<rank>``)."""
    return [float((out_dir / f"entry_{r}").read_text()) for r in range(world_size)]


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """``(t_call, t_back, value)`` in wall-clock seconds (comparable with ranks' time.time())."""
    t_call = time.time()
    value = fn()
    return t_call, time.time(), value


def python() -> str:
    return sys.executable


# -- NVML (GPU memory without a CUDA context) ---------------------------------------------------


class GpuMemory:
    """Used memory of the visible GPUs the run uses, read through NVML."""

    def __init__(self, world_size: int) -> None:
        import pynvml

        from serverless_gpu.common.gpus import visible_indices

        self._nvml = pynvml
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        all_handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        uuids = [_decode(pynvml.nvmlDeviceGetUUID(h)) for h in all_handles]
        chosen = visible_indices(uuids, os.environ.get("CUDA_VISIBLE_DEVICES"))[:world_size]
        self.handles = [all_handles[i] for i in chosen]

    def used_mib(self) -> list[float]:
        return [self._nvml.nvmlDeviceGetMemoryInfo(h).used / 2**20 for h in self.handles]

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def _decode(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
