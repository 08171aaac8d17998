"""Overheads of running under serverless_gpu, each as a ratio or against a stated floor:

* DDP training step time under ``@distributed`` vs the same step function under torchrun;
* one rank raising (its peer blocked in a collective) -> the caller's exception;
* ``handle.cancel()`` and ``timeout=`` -> every rank process gone (and, on GPUs, memory back);
* result transfer of a large tensor per rank (GB/s), as a CPU tensor and (on GPUs) a CUDA one;
* a log flood of 100,000 lines per rank: how much slower the rank's own print loop runs.

    PYTHONPATH=. python benchmarks/overheads.py [--gpus N] [--cpu] [--reps K] [--quick] [--out F]
        [--only ddp|failure|stop|transfer|flood ...]

This process is the caller: it never touches CUDA (GPU memory is read through NVML).
"""

# ruff: noqa: E402 - the environment below must be set before anything else is imported.
from __future__ import annotations

import os

from serverless_gpu.wire.env import multicast_off

multicast_off(os.environ)  # NVLink multicast off here and in every process started from here

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import _common as C
import _jobs

from serverless_gpu.common.proctitle import is_launcher

RESULTS_DIR_ENV = "SERVERLESS_GPU_RESULTS_DIR"
GONE_LIMIT_S = 30.0
MEMORY_SLACK_MIB = 256.0
"""GPU memory counts as back when every GPU is within this of its level before the run."""

Section = tuple[str, str, list[list[str]]]
"""(heading, explanation, target rows) of one figure."""


# -- rank-side functions (defined here, shipped by value like a notebook's) ---------------------


def raise_while_peer_blocked(device: str, out_dir: str) -> None:
    """The last rank raises while every other rank waits in an all-reduce it never joins."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    _jobs.init_group(device)
    _jobs.allreduce_once(device)  # the communicator is up: the next collective really blocks
    if rank == world - 1:
        time.sleep(0.5)  # the peers are inside the next collective by now
        Path(out_dir, "raised_at").write_text(repr(time.time()))
        raise RuntimeError("planned failure")
    _jobs.allreduce_once(device)


def hang(device: str, out_dir: str, gib: float) -> None:
    """Hold GPU memory and block (rank 0 in a collective, the others asleep) until killed."""
    import torch

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    _jobs.init_group(device)
    _jobs.allreduce_once(device)
    if device == "cuda":
        held = torch.ones(int(gib * 2**30) // 4, device=f"cuda:{_jobs.local_rank()}")
        torch.cuda.synchronize()
        del held  # freed to torch's cache, still held on the GPU, as a training job would
    Path(out_dir, f"ready_{rank}").write_text("1")
    if rank == 0 and world > 1:
        _jobs.allreduce_once(device)
    time.sleep(3600)


def blob(nbytes: int, send: bool, on_gpu: bool = False, copy: dict[str, Any] | None = None) -> Any:
    """A tensor of ``nbytes`` made in the rank, on its CPU or its GPU, returned or dropped (same
    work, no transfer). ``copy``: settings of ``serverless_gpu.runfiles.cuda_copy`` for a CUDA
    result (which ways it may take; None: the library's defaults)."""
    import torch

    device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if on_gpu else "cpu"
    tensor = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    if on_gpu:
        torch.cuda.synchronize()  # made, whether it is returned or not
    if copy:
        from serverless_gpu.runfiles import cuda_copy

        for name, value in copy.items():
            setattr(cuda_copy, name, value)
    return tensor if send else None


CUDA_WAYS: dict[str, dict[str, Any]] = {"plain": {"STAGED": False}}
"""The library's other ways to copy a CUDA result, timed beside its default (settings of
``serverless_gpu.runfiles.cuda_copy``; ``plain`` is torch's pageable copy)."""


FLOOD_LINE = "step {:7d} | loss 2.345678 | lr 3.0e-04 | tokens/s 123456.7 | grad-norm 0.98"


def flood(lines: int) -> dict[str, float]:
    """Time the same print loop into three sinks in this rank: /dev/null, a file, the real stdout
    (the library's capture). The sinks are line-buffered text streams like the rank's stdout."""
    import io

    def loop(stream: Any) -> float:
        real, sys.stdout = sys.stdout, stream
        try:
            t0 = time.perf_counter()
            for i in range(lines):
                print(FLOOD_LINE.format(i))
            sys.stdout.flush()
            return time.perf_counter() - t0
        finally:
            sys.stdout = real

    def sink(path: str) -> io.TextIOWrapper:
        return io.TextIOWrapper(open(path, "wb", buffering=0), line_buffering=True)

    log = os.path.join(os.environ["SERVERLESS_GPU_RUN_DIR"], f"flood_{os.environ['RANK']}.txt")
    with sink(os.devnull) as null, sink(log) as file:
        times = {"null": loop(null), "file": loop(file), "captured": loop(sys.stdout)}
        times["null"] = (times["null"] + loop(null)) / 2  # bracket: no warm-up bias
        times["file"] = (times["file"] + loop(file)) / 2
    os.unlink(log)
    times["t_end"] = time.time()
    return times


# -- caller-side helpers ---------------------------------------------------------------------


class Caller:
    """The decorated functions and the small amount of state every section needs."""

    def __init__(self, s: C.Settings, tmp: Path) -> None:
        self.s = s
        self.tmp = tmp
        self.settle = C.SETTLE_S[s.device] / (2 if s.quick else 1)
        self._n = 0
        self.memory = C.GpuMemory(s.world_size) if not s.cpu else None

    def decorate(self, func: Callable[..., Any], **options: Any) -> Any:
        from serverless_gpu import distributed

        gpu_type = "cpu" if self.s.cpu else None
        return distributed(
            gpus=self.s.world_size, gpu_type=gpu_type, output="none", tracking=False, **options
        )(func)

    def fresh_dir(self) -> Path:
        self._n += 1
        path = self.tmp / f"d{self._n}"
        path.mkdir()
        return path


def wait_gone(pids: Iterable[int], limit: float) -> float:
    """Wall-clock time when none of ``pids`` runs any more (a zombie counts as gone)."""
    import psutil

    deadline = time.monotonic() + limit
    pending = list(pids)
    while pending and time.monotonic() < deadline:
        pending = [p for p in pending if _alive(psutil, p)]
        if pending:
            time.sleep(0.002)
    return float("nan") if pending else time.time()


def _alive(psutil: Any, pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_memory(memory: C.GpuMemory | None, base: list[float], limit: float) -> float:
    if memory is None:
        return float("nan")
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        used = memory.used_mib()
        if all(u <= b + MEMORY_SLACK_MIB for u, b in zip(used, base, strict=True)):
            return time.time()
        time.sleep(0.005)
    return float("nan")


def check(value: float, limit: float, above: bool = False) -> str:
    if value != value:
        return C.verdict(None)
    return C.verdict(value >= limit if above else value <= limit)


# -- 1. DDP step time ------------------------------------------------------------------------


def ddp_section(c: Caller) -> Section:
    s = c.s
    cfg = {"warmup": 2, "steps": 3} if s.quick else {"warmup": 10, "steps": 40}
    fn = c.decorate(_jobs.user_fn)
    ours, theirs = [], []
    params, threads = 0.0, {}
    for rep in range(s.reps):
        # Alternate who goes first: GPU clocks and caches must not favour one launcher.
        for who in ("torchrun", "ours") if rep % 2 == 0 else ("ours", "torchrun"):
            time.sleep(c.settle)
            if who == "torchrun":
                results = torchrun_ddp(c, cfg)
                theirs.append(max(r["median_step_s"] for r in results))
            else:
                results = fn.distributed("ddp", s.device, None, cfg)
                ours.append(max(r["median_step_s"] for r in results))
            params, threads[who] = results[0]["params"], int(results[0]["threads"])
    ratio = C.median(ours) / C.median(theirs)
    shape = _jobs.CPU_MODEL if s.cpu else _jobs.GPU_MODEL
    precision = "fp32 (CPU: a toy model, only the ratio means something)" if s.cpu else "bf16"
    model = (
        f"{params / 1e6:.1f}M-parameter transformer, batch {shape['batch']} x {shape['seq']} "
        f"tokens, {precision + (' autocast' if not s.cpu else '')}"
    )
    text = (
        f"{model}; DDP over {C.gloo_or_nccl(s)}; median step time over {cfg['steps']} steps "
        f"after {cfg['warmup']} warm-up, slowest rank; ours {C.fmt_s(ours)}, torchrun "
        f"{C.fmt_s(theirs)}; runs alternate who goes first. Torch CPU threads per rank: ours "
        f"{threads.get('ours')}, torchrun {threads.get('torchrun')} (each launcher's default)."
    )
    row = ["DDP step time, ours / torchrun", "<= 1.01x", C.fmt_ratio(ratio), check(ratio, 1.01)]
    return "DDP training step", text, [row]


def torchrun_ddp(c: Caller, cfg: dict[str, Any]) -> list[dict[str, float]]:
    out = c.fresh_dir()
    cmd = [C.python(), "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={c.s.world_size}", str(C.BENCH_DIR / "_jobs.py"), "--job=ddp"]
    cmd += [f"--device={c.s.device}", f"--out={out}", f"--cfg={json.dumps(cfg)}"]
    code = C.run_subprocess(cmd, 600, c.tmp / "torchrun-ddp.log")
    if code != 0:
        raise RuntimeError(f"torchrun exited {code}; see {c.tmp / 'torchrun-ddp.log'}")
    return [json.loads((out / f"ddp_{r}.json").read_text()) for r in range(c.s.world_size)]


# -- 2. failure -> exception -----------------------------------------------------------------


def failure_section(c: Caller) -> Section:
    fn = c.decorate(raise_while_peer_blocked)
    delays, wrong = [], 0
    for _ in range(c.s.reps):
        time.sleep(c.settle)
        out = c.fresh_dir()
        try:
            fn.distributed(c.s.device, str(out))
            wrong += 1
            continue
        except RuntimeError as exc:
            t_exc = time.time()
            wrong += "planned failure" not in str(exc)
        delays.append(t_exc - float((out / "raised_at").read_text()))
    text = (
        f"The last of {c.s.world_size} rank(s) raises 0.5 s after the others entered an "
        f"all-reduce it never joins; from its raise (its own clock) to the exception in the "
        f"caller: {C.fmt_s(delays)}."
        + (f" {wrong} call(s) did not raise the rank's RuntimeError." if wrong else "")
    )
    value = C.median(delays)
    row = ["rank raises -> caller's exception", "<= 2 s", f"{value:.3f} s", check(value, 2.0)]
    return "Failure propagation", text, [row]


# -- 3. cancel and timeout -> every rank gone (and GPU memory back) ---------------------------


def start_and_wait_ready(c: Caller, fn: Any, out: Path) -> tuple[Any, dict[int, int], float]:
    from serverless_gpu.wire.events import RankStarted

    pids: dict[int, int] = {}
    t_start = time.time()
    handle = fn.start(c.s.device, str(out), 1.0)
    handle.subscribe(lambda e: pids.update({e.rank: e.pid}) if isinstance(e, RankStarted) else None)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not handle.done():
        ready = sum((out / f"ready_{r}").exists() for r in range(c.s.world_size))
        if ready == c.s.world_size and len(pids) == c.s.world_size:
            break
        handle.wait(0.01)
    else:
        handle.cancel()
        raise RuntimeError("the ranks did not become ready")
    return handle, pids, t_start


def stop_once(c: Caller, fn: Any, timeout: float | None) -> tuple[float, float]:
    """(stop -> all ranks gone, stop -> GPU memory back); stop = cancel() or the deadline."""
    time.sleep(c.settle)
    base = c.memory.used_mib() if c.memory else []
    out = c.fresh_dir()
    handle, pids, t_start = start_and_wait_ready(c, fn, out)
    if timeout is None:
        time.sleep(c.settle)  # the launcher's replacement standby ranks are ready too
        t_stop = time.time()
        handle.cancel()
    else:
        t_stop = t_start + timeout  # the launcher's deadline starts a little after this
    gone = wait_gone(pids.values(), GONE_LIMIT_S + (timeout or 0))
    back = wait_memory(c.memory, base, GONE_LIMIT_S)
    handle.wait(GONE_LIMIT_S)
    return gone - t_stop, back - t_stop


def stop_section(c: Caller) -> Section:
    timeout = 4.0 if not c.s.cpu else (2.0 if c.s.quick else 3.0)
    cancel = [stop_once(c, c.decorate(hang), None) for _ in range(c.s.reps)]
    timed_out = [stop_once(c, c.decorate(hang, timeout=timeout), timeout) for _ in range(c.s.reps)]
    rows, parts = [], []
    for name, values in (("cancel()", cancel), (f"timeout={timeout:g} s", timed_out)):
        gone = C.median([v[0] for v in values])
        rows.append([f"{name} -> every rank process gone", "<= 3 s", f"{gone:.3f} s"])
        rows[-1].append(check(gone, 3.0))
        parts.append(f"{name}: gone {C.fmt_s([v[0] for v in values])}")
        if c.memory is not None:
            back = C.median([v[1] for v in values])
            rows.append([f"{name} -> GPU memory back", "<= 3 s", f"{back:.3f} s", check(back, 3.0)])
            parts.append(f"memory back {C.fmt_s([v[1] for v in values])}")
    text = (
        "Ranks init the process group, hold memory (1 GiB a GPU), then rank 0 blocks in an "
        "all-reduce and the others sleep. Gone = psutil sees none of the RankStarted pids "
        "(a zombie counts as gone); memory back = NVML used memory within "
        f"{MEMORY_SLACK_MIB:.0f} MiB of the level before the call, on every GPU. The timeout is "
        "counted from just before start(). " + "; ".join(parts) + "."
    )
    return "Cancel and timeout", text, rows


# -- 4. result transfer ---------------------------------------------------------------------


def transfer_section(c: Caller) -> Section:
    from serverless_gpu.runfiles.rundirs import results_root

    nbytes = (16 if c.s.quick else 1024) * 2**20
    fn = c.decorate(blob)
    total_gb = c.s.world_size * nbytes / 1e9
    where = results_root()
    calls = {
        "cpu": partial(fn.distributed, nbytes, True),
        "none": partial(fn.distributed, nbytes, False),
    }
    if not c.s.cpu:  # the same on the GPU, side by side: CUDA results, default and plain copy
        calls["cuda"] = partial(fn.distributed, nbytes, True, True)
        calls["cuda none"] = partial(fn.distributed, nbytes, False, True)
        for way, settings in CUDA_WAYS.items():
            calls[f"cuda {way}"] = partial(fn.distributed, nbytes, True, True, settings)
    times = timed_calls(c, calls)
    agg, raw = net_rate(total_gb, times, "cpu", "none"), total_gb / C.median(times["cpu"])
    # Side by side: the same calls with the results written to the run directory instead.
    previous = os.environ.get(RESULTS_DIR_ENV)
    os.environ[RESULTS_DIR_ENV] = "off"  # read by the caller when it makes a run directory
    try:
        disk = timed_calls(c, {k: calls[k] for k in ("cpu", "none")})
    finally:
        if previous is None:
            os.environ.pop(RESULTS_DIR_ENV)
        else:
            os.environ[RESULTS_DIR_ENV] = previous
    disk_agg = net_rate(total_gb, disk, "cpu", "none")
    r = file_path_rates(nbytes, where)
    text = (
        f"Each rank makes a {nbytes / 2**30:g} GiB CPU float32 tensor and returns it, against the "
        f"same call returning None (same work, no transfer): {C.fmt_s(times['cpu'])} vs "
        f"{C.fmt_s(times['none'])}. Results written to "
        f"{where or 'the run directory'} ({fs_type(where)}). Aggregate = {c.s.world_size} x "
        f"{nbytes / 2**30:g} GiB / difference = {agg:.2f} GB/s; raw = over the whole call = "
        f"{raw:.2f} GB/s. Side by side with the results in the run directory "
        f"({fs_type(None)}, {RESULTS_DIR_ENV}=off): aggregate {disk_agg:.2f} GB/s, raw "
        f"{total_gb / C.median(disk['cpu']):.2f} GB/s. Breakdown, one tensor in this process, in "
        f"the results folder: the library's dump_result {r['lib_dump']:.2f} GB/s and load_result "
        f"{r['lib_load']:.2f} GB/s (memory-mapped: pages are read when first touched); the same "
        f"tensor as a protocol-5 numpy pickle: dump {r['np_dump']:.2f}, load "
        f"{r['np_load']:.2f} GB/s. Floor: a plain copy into fresh memory runs at "
        f"{r['copy']:.2f} GB/s here."
    )
    rows = [
        ["result transfer, aggregate", ">= 2 GB/s", f"{agg:.2f} GB/s", check(agg, 2.0, True)],
        ["result transfer, raw (whole call)", "(info)", f"{raw:.2f} GB/s", ""],
        ["result transfer, aggregate, run directory", "(info)", f"{disk_agg:.2f} GB/s", ""],
    ]
    if not c.s.cpu:
        cuda_text, cuda_rows = cuda_transfer(times, total_gb)
        text, rows = f"{text} {cuda_text}", cuda_rows + rows
    return "Result transfer", text, rows


def cuda_transfer(times: dict[str, list[float]], total_gb: float) -> tuple[str, list[list[str]]]:
    """The CUDA results' part of the transfer section, from the same run's timings."""
    from serverless_gpu.runfiles import cuda_copy  # no torch, no CUDA: only its defaults are read

    cuda, cpu = (
        net_rate(total_gb, times, "cuda", "cuda none"),
        net_rate(total_gb, times, "cpu", "none"),
    )
    ways = {way: net_rate(total_gb, times, f"cuda {way}", "cuda none") for way in CUDA_WAYS}
    text = (
        f"In the same run, interleaved with those calls, each rank makes the tensor on its GPU "
        f"and returns it as a CUDA tensor (the caller gets CPU tensors), against the same call "
        f"returning None: {C.fmt_s(times['cuda'])} vs {C.fmt_s(times['cuda none'])} with the "
        f"library's default (cuda_copy.STAGED = {cuda_copy.STAGED}); aggregate {cuda:.2f} GB/s "
        f"(CPU tensor: {cpu:.2f} GB/s). "
        "The same with each other way the library has to copy a CUDA result "
        "(settings of serverless_gpu.runfiles.cuda_copy; plain = torch's pageable copy): "
        + "; ".join(
            f"{way} {C.fmt_s(times[f'cuda {way}'])}, aggregate {ways[way]:.2f} GB/s"
            for way in CUDA_WAYS
        )
        + "."
    )
    rows = [["CUDA result transfer, aggregate", ">= 5 GB/s", f"{cuda:.2f} GB/s"]]
    rows[0].append(check(cuda, 5.0, True))
    for way, rate in ways.items():
        rows.append([f"CUDA result transfer, {way}, aggregate", "(info)", f"{rate:.2f} GB/s", ""])
    return text, rows


def timed_calls(c: Caller, calls: Mapping[str, Callable[[], Any]]) -> dict[str, list[float]]:
    """Seconds of each call, ``c.s.reps`` times, the calls interleaved."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(c.s.reps):
        for name, call in calls.items():
            time.sleep(c.settle)
            t_call, t_back, _values = C.timed(call)
            del _values
            times[name].append(t_back - t_call)
    return times


def net_rate(total_gb: float, times: dict[str, list[float]], sent: str, kept: str) -> float:
    """GB/s of ``sent`` over ``kept`` (medians): the transfer alone."""
    return total_gb / (C.median(times[sent]) - C.median(times[kept]))


def file_path_rates(nbytes: int, folder: Path | None) -> dict[str, float]:
    """GB/s, in this process, of one tensor through the library's result files
    (serialization.dump_result / load_result), against two floors on the same machine:
    the same tensor pickled as a numpy array with protocol 5 (one copy each way) and a plain
    copy of the tensor into fresh memory."""
    import pickle

    import torch

    from serverless_gpu.runfiles.rundirs import runs_root
    from serverless_gpu.runfiles.serialization import dump_result, load_result

    def np_dump(t: Any, path: Path) -> None:
        with open(path, "wb") as f:
            pickle.dump(t.numpy(), f, protocol=5)

    def np_load(path: Path) -> Any:
        with open(path, "rb") as f:
            return torch.from_numpy(pickle.load(f))

    tensor = torch.ones(nbytes // 4, dtype=torch.float32)
    path = (folder or runs_root()) / f"bench-{os.getpid()}.pkl"
    rates = {"copy": _rate(nbytes, lambda: tensor.clone())}
    try:
        for name, dump, load in (("lib", dump_result, load_result), ("np", np_dump, np_load)):
            rates[f"{name}_dump"] = _rate(nbytes, partial(dump, tensor, path))
            rates[f"{name}_load"] = _rate(nbytes, partial(load, path))
    finally:
        path.unlink(missing_ok=True)
    return rates


def _rate(nbytes: int, action: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    result = action()
    elapsed = time.perf_counter() - t0
    del result
    return nbytes / 1e9 / elapsed


def fs_type(folder: Path | None) -> str:
    """The filesystem type of ``folder`` (default: the runs directory): tmpfs, ext4, overlay..."""
    from serverless_gpu.runfiles.rundirs import runs_root

    root, best = str(folder or runs_root()), ("", "?")
    with open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if root.startswith(fields[1]) and len(fields[1]) > len(best[0]):
                best = (fields[1], fields[2])
    return best[1]


# -- 5. log flood ----------------------------------------------------------------------------


def flood_section(c: Caller) -> Section:
    lines = 5_000 if c.s.quick else 100_000
    fn = c.decorate(flood)
    runs = [flood_once(c, fn, lines) for _ in range(c.s.reps)]
    vs_null, vs_file = [r["vs_null"] for r in runs], [r["vs_file"] for r in runs]
    per_line = {k: C.median([r[k] for r in runs]) / (lines * c.s.world_size) * 1e6 for k in runs[0]}
    text = (
        f"{lines:,} lines of {len(FLOOD_LINE.format(0)) + 1} bytes per rank, all ranks at once. "
        "Each rank times the same print loop into /dev/null, into a file, and into its real "
        "stdout (captured by the launcher, tee'd to the log file and streamed to the caller); "
        "the sinks are line-buffered like the rank's stdout, and /dev/null and the file are "
        "timed before and after the captured loop. Slowdown = captured / sink - 1, worst rank. "
        f"Slowdown vs /dev/null {pct(vs_null)}, vs a file {pct(vs_file)}. Results back "
        f"{C.fmt_s([r['lag'] for r in runs])} after the ranks' last line. CPU time per captured "
        f"line: launcher {per_line['launcher_cpu']:.2f} us, caller {per_line['caller_cpu']:.2f} us"
        f" (whole call; {os.cpu_count()} cores for {c.s.world_size} ranks, launcher and caller)."
        " Each rep, worst rank, captured / file / null seconds: "
        + "; ".join(f"{r['captured']:.3f} / {r['file']:.3f} / {r['null']:.3f}" for r in runs)
        + "."
    )
    value = C.median(vs_file)
    rows = [
        ["log flood, slowdown vs writing a file", "< 5 %", f"{value * 100:.1f} %"],
        ["log flood, slowdown vs /dev/null (floor)", "(info)", f"{C.median(vs_null) * 100:.1f} %"],
    ]
    rows[0].append(check(value, 0.05))
    rows[1].append("")
    return "Log flood", text, rows


def flood_once(c: Caller, fn: Any, lines: int) -> dict[str, float]:
    import psutil

    time.sleep(c.settle)
    caller = psutil.Process()
    launcher = next(p for p in caller.children() if is_launcher(p.cmdline()))
    cpu0 = (sum(caller.cpu_times()[:2]), sum(launcher.cpu_times()[:2]))
    _, t_back, results = C.timed(lambda: fn.distributed(lines))
    worst = max(results, key=lambda r: r["captured"] / r["file"])
    return {
        "captured": worst["captured"],
        "file": worst["file"],
        "null": worst["null"],
        "vs_null": max(r["captured"] / r["null"] - 1 for r in results),
        "vs_file": max(r["captured"] / r["file"] - 1 for r in results),
        "lag": t_back - max(r["t_end"] for r in results),
        "caller_cpu": sum(caller.cpu_times()[:2]) - cpu0[0],
        "launcher_cpu": sum(launcher.cpu_times()[:2]) - cpu0[1],
    }


def pct(values: list[float]) -> str:
    return f"{C.median(values) * 100:.1f} % ({min(values) * 100:.1f}-{max(values) * 100:.1f})"


# -- main ------------------------------------------------------------------------------------

SECTIONS: tuple[Callable[[Caller], Section], ...] = (
    ddp_section,
    failure_section,
    stop_section,
    transfer_section,
    flood_section,
)


def run_sections(c: Caller) -> list[Section]:
    import torch  # noqa: F401 - a notebook has it imported; loading results needs it (no CUDA)

    from serverless_gpu import distributed

    C.quiet_console()
    warm = distributed(gpus=c.s.world_size, gpu_type="cpu" if c.s.cpu else None, tracking=False)
    warm(_jobs.user_fn).distributed("noop", c.s.device, None)  # launcher and standby ranks up
    done = []
    for section in SECTIONS:
        if c.s.only and section.__name__.removesuffix("_section") not in c.s.only:
            continue
        try:
            done.append(section(c))
        except Exception as exc:  # report the others even if one figure cannot be measured
            name = section.__name__.removesuffix("_section")
            done.append((name, f"failed: {type(exc).__name__}: {exc}", [[name, "", "failed", ""]]))
    return done


def main() -> None:
    s = C.parse_settings(__doc__.splitlines()[0])
    tmp = Path(tempfile.mkdtemp(prefix="sgpu-bench-overheads-"))
    # Private run directories: other callers of this user prune the shared default one.
    os.environ.setdefault("SERVERLESS_GPU_RUNS_DIR", str(tmp / "runs"))
    caller = Caller(s, tmp)
    try:
        sections = run_sections(caller)
    finally:
        if "serverless_gpu" in sys.modules:
            sys.modules["serverless_gpu"].shutdown()
        if caller.memory is not None:
            caller.memory.close()
        left = C.reap_leftovers()
    failed = any(text.startswith("failed") for _, text, _ in sections)
    if failed:
        print(f"logs kept in {tmp}", file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    targets = [row for _, _, rows in sections for row in rows]
    parts = [(heading, text) for heading, text, _ in sections]
    parts.append(
        ("Targets", C.markdown_table(["figure", "target", "measured", "verdict"], targets))
    )
    if left:
        parts.append(("Leftover processes killed", "\n".join(left)))
    C.emit_report(s, "Overheads benchmark", parts)


if __name__ == "__main__":
    main()
