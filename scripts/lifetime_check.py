"""Process lifetime on real ranks (issue #7's lifetime points), GPUs or CPU ranks.

    PYTHONPATH=. python scripts/lifetime_check.py              # every visible GPU
    PYTHONPATH=. python scripts/lifetime_check.py --cpu --gpus 2

Checks, each printed as PASS/FAIL with its figure (exit code 1 on a failure):
* SIGKILL of the caller: every descendant (launcher, ranks, a grandchild each rank started)
  gone within 3 s;
* KeyboardInterrupt in the caller: it re-raises, and every descendant is gone within 3 s;
* 100 calls in a row: no process, file-descriptor or temporary-directory leak;
* the launcher has no listening socket.

The callers of the first two checks are fresh Python processes
(``tests/core/lifetime_caller.py``), so a SIGKILL is real. This process never initialises CUDA.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from _checks import check, rank_parser, ranks, summary

import serverless_gpu
from serverless_gpu import distributed
from serverless_gpu.common.proctitle import is_launcher
from serverless_gpu.runfiles.rundirs import results_root

GONE_LIMIT_S = 3.0

CALLER = Path(__file__).parents[1] / "tests" / "core" / "lifetime_caller.py"


def wait_gone(pids: set[int], limit: float) -> tuple[set[int], float]:
    """(pids still alive after ``limit`` seconds, seconds until all were gone)."""
    start = time.monotonic()
    alive = set(pids)
    while alive and time.monotonic() - start < limit:
        alive = {p for p in alive if _alive(p)}
        time.sleep(0.01)
    return alive, time.monotonic() - start


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def start_caller(gpus: int, gpu_type: str | None) -> tuple[subprocess.Popen[str], set[int]]:
    proc = subprocess.Popen(
        [sys.executable, str(CALLER), str(gpus), gpu_type or "auto"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    while line not in ("READY\n", ""):
        line = proc.stdout.readline()
    if line != "READY\n":
        proc.kill()
        raise RuntimeError(f"the caller did not get ready: {proc.communicate()}")
    return proc, {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}


def check_sigkill(gpus: int, gpu_type: str | None) -> None:
    proc, tree = start_caller(gpus, gpu_type)
    proc.kill()
    proc.wait()
    left, took = wait_gone(tree, GONE_LIMIT_S)
    check(
        "SIGKILL of the caller: every descendant gone <= 3 s",
        not left,
        f"{len(tree)} processes (launcher, ranks, grandchildren); gone after {took:.2f} s",
    )


def check_interrupt(gpus: int, gpu_type: str | None) -> None:
    proc, tree = start_caller(gpus, gpu_type)
    proc.send_signal(signal.SIGINT)
    start = time.monotonic()
    out, err = proc.communicate(timeout=60)
    left, _ = wait_gone(tree, GONE_LIMIT_S)
    took = time.monotonic() - start
    check(
        "KeyboardInterrupt: re-raised, every descendant gone <= 3 s",
        "INTERRUPTED" in out and "KeyboardInterrupt" in err and not left,
        f"{len(tree)} processes gone, caller exited after {took:.2f} s; still alive: {left}",
    )


def check_hundred_calls(gpus: int, gpu_type: str | None) -> None:
    private_tmp = Path(tempfile.mkdtemp(prefix="sgpu-lifetime-"))
    os.environ["TMPDIR"] = str(private_tmp)
    tempfile.tempdir = None  # the caller, the launcher and the ranks use the private TMPDIR
    fn = distributed(gpus=gpus, gpu_type=gpu_type, output="none", tracking=False)(os.getpid)
    fn.distributed()
    time.sleep(3.0)  # standby ranks for the next call are made once this one is over
    me = psutil.Process()
    procs, fds = len(me.children(recursive=True)), me.num_fds()
    entries = set(os.listdir(private_tmp))
    twins = results_root()
    twin_entries = set(os.listdir(twins)) if twins else set()
    start = time.monotonic()
    pids: set[int] = set()
    for _ in range(100):
        pids.update(fn.distributed())
    took = time.monotonic() - start
    time.sleep(3.0)
    after = (len(me.children(recursive=True)), me.num_fds(), set(os.listdir(private_tmp)))
    twins_after = set(os.listdir(twins)) if twins else set()
    check(
        "100 calls: no process, fd, temporary-directory or tmpfs-results leak",
        after[0] == procs
        and after[1] <= fds
        and after[2] <= entries
        and twins_after <= twin_entries
        and len(pids) == 100 * gpus,
        f"{took:.1f} s for 100 calls ({len(pids)} distinct rank pids); processes {procs} -> "
        f"{after[0]}, fds {fds} -> {after[1]}, new temp entries {sorted(after[2] - entries)}, "
        f"new results twins in {twins}: {sorted(twins_after - twin_entries)}",
    )


def check_no_listening_socket() -> None:
    launchers = [p for p in psutil.Process().children() if is_launcher(p.cmdline())]
    listening = [
        c for p in launchers for c in p.net_connections("all") if c.status == psutil.CONN_LISTEN
    ]
    check(
        "the launcher has no listening socket",
        len(launchers) == 1 and not listening,
        f"{len(launchers)} launcher(s), listening: {listening}",
    )


def main() -> int:
    gpus, gpu_type = ranks(rank_parser().parse_args())
    print(f"serverless_gpu {serverless_gpu.__version__}: {gpus} x {gpu_type or 'GPU'}", flush=True)
    try:
        check_sigkill(gpus, gpu_type)
        check_interrupt(gpus, gpu_type)
        check_hundred_calls(gpus, gpu_type)
        check_no_listening_socket()
    finally:
        serverless_gpu.shutdown()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
