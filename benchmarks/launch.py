"""Launch latency: serverless_gpu against torch.multiprocessing spawn/fork, torchrun and
Accelerate's notebook_launcher, side by side in one run.

For every launcher each rank writes (or returns) ``time.time()`` as the first statement of the
same user function (``_jobs.user_fn``); the caller records ``time.time()`` just before the call.

* call -> every rank in user code = max(rank entry times) - call time
* call -> results back = when the call returned in the caller (all ranks finished) - call time

Our first and warm calls are measured untracked and tracked (MLflow, into a SQLite store made
once in a temporary folder, as a notebook's ``mlflow.db`` is there before its first call), the
ratio tracked / untracked in the targets table.

Two jobs: ``noop`` (return at once) and ``allreduce`` (init_process_group with NCCL, or gloo on
CPU, one all-reduce, destroy_process_group).

    PYTHONPATH=. python benchmarks/launch.py [--gpus N] [--cpu] [--reps K] [--quick] [--out F]

``--backend ray`` measures ``remote=True`` calls on a Ray cluster instead (``launch_ray.py``).

This process is the caller and never touches CUDA; baselines that need CUDA create it in their
own child processes.
"""

# ruff: noqa: E402 - the environment below must be set before anything else is imported.
from __future__ import annotations

import os

from serverless_gpu.wire.env import multicast_off

multicast_off(os.environ)  # NVLink multicast off here and in every process started from here

import argparse
import importlib.util
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import _common as C
import _jobs

JOBS = ("noop", "allreduce")
QUICK_JOBS = ("allreduce",)


def jobs_for(s: C.Settings) -> tuple[str, ...]:
    """--quick (CI) measures the all-reduce job only."""
    return QUICK_JOBS if s.quick else JOBS


SUBPROCESS_TIMEOUT_S = 300.0

Sample = tuple[float, float]
"""(call -> every rank in user code, call -> results back), in seconds."""


@dataclass
class Row:
    launcher: str
    samples: dict[str, list[Sample]] = field(default_factory=dict)
    notes: str = ""
    skipped: str = ""


def sample(t_call: float, t_back: float, entries: list[float]) -> Sample:
    return max(entries) - t_call, t_back - t_call


class Bench:
    """One run of every launcher for one world size and device."""

    def __init__(self, s: C.Settings, tmp: Path) -> None:
        self.s = s
        self.tmp = tmp
        self.jobs = jobs_for(s)
        self._n = 0

    def fresh_dir(self) -> Path:
        self._n += 1
        path = self.tmp / f"rep{self._n}"
        path.mkdir()
        return path

    # -- baselines (this process only forks/spawns; the ranks create CUDA themselves) ----------

    def mp_once(self, job: str, start_method: str) -> Sample:
        import torch.multiprocessing as mp

        out = self.fresh_dir()
        args = (self.s.world_size, C.free_port(), job, self.s.device, str(out))
        t_call = time.time()
        if start_method == "spawn":
            mp.spawn(_jobs.mp_fn, args=args, nprocs=self.s.world_size)
        else:
            mp.start_processes(_jobs.mp_fn, args, self.s.world_size, start_method=start_method)
        t_back = time.time()
        return sample(t_call, t_back, C.read_entries(out, self.s.world_size))

    def torchrun_once(self, job: str) -> Sample:
        out = self.fresh_dir()
        cmd = [
            C.python(),
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={self.s.world_size}",
            str(C.BENCH_DIR / "_jobs.py"),
            f"--job={job}",
            f"--device={self.s.device}",
            f"--out={out}",
        ]
        t_call = time.time()
        code = C.run_subprocess(cmd, SUBPROCESS_TIMEOUT_S, self.tmp / "torchrun.log")
        t_back = time.time()
        if code != 0:
            raise RuntimeError(f"torchrun exited {code}; see {self.tmp / 'torchrun.log'}")
        return sample(t_call, t_back, C.read_entries(out, self.s.world_size))

    def child(self, mode: str, job: str, reps: int, tracked: bool = False) -> list[Sample]:
        """A fresh Python process that times its own calls (first call, Accelerate)."""
        out = self.fresh_dir()
        cmd = [C.python(), str(Path(__file__).resolve()), "--child", mode, f"--job={job}"]
        cmd += [f"--device={self.s.device}", f"--world={self.s.world_size}", f"--dir={out}"]
        cmd += [f"--reps={reps}"] + (["--tracked"] if tracked else [])
        result = C.run_child_json(cmd, SUBPROCESS_TIMEOUT_S, self.tmp / f"{mode}.log")
        return [(a, b) for a, b in result["samples"]]

    # -- ours, warm: standby ranks prepared in this (caller) process's launcher ----------------

    def warm_samples(self, job: str, tracked: bool = False) -> list[Sample]:
        from serverless_gpu import distributed

        fn = distributed(
            gpus=self.s.world_size,
            gpu_type="cpu" if self.s.cpu else None,
            output="none",
            tracking=tracked,
        )(_jobs.user_fn)
        settle = C.SETTLE_S[self.s.device]
        fn.distributed(job, self.s.device, None)  # throwaway: launcher and standby are up
        samples = []
        for _ in range(self.s.reps):
            time.sleep(settle)  # fresh standby ranks ready (CUDA context included on GPUs)
            t_call, t_back, entries = C.timed(lambda: fn.distributed(job, self.s.device, None))
            samples.append(sample(t_call, t_back, list(entries)))
        return samples

    def each(self, once: Callable[[str], Sample]) -> Callable[[str], list[Sample]]:
        return lambda job: [once(job) for _ in range(self.s.reps)]

    def repeat(self, samples: Callable[[str], list[Sample]], row: Row) -> None:
        for job in self.jobs:
            try:
                row.samples[job] = samples(job)
            except Exception as exc:  # one broken baseline must not sink the whole table
                row.skipped = f"failed: {type(exc).__name__}: {str(exc)[:120]}"
                return


def measure_all(s: C.Settings, tmp: Path) -> list[Row]:
    """Baselines that fork run first, while this process has no extra threads; ours last."""
    bench = Bench(s, tmp)
    acc_note = "1 process runs in the caller itself" if s.world_size == 1 else "forks (elastic)"
    rows = [
        Row("torch.multiprocessing.spawn", notes="from this warm parent, torch imported"),
        Row("plain fork (start_processes)", notes="from this parent (never touched CUDA)"),
        Row("torchrun (cold CLI)", notes="python -m torch.distributed.run --standalone"),
        Row("accelerate notebook_launcher", notes=f"torch+accelerate imported; {acc_note}"),
        Row(
            "ours, first call",
            notes="fresh process; launcher started at decoration, call right after it",
        ),
        Row("ours, warm (standby ready)", notes="same caller, after a throwaway call"),
        Row("ours, first call, tracked", notes="as 'ours, first call', with MLflow tracking"),
        Row("ours, warm, tracked", notes="as 'ours, warm', with MLflow tracking"),
    ]
    bench.repeat(bench.each(lambda job: bench.mp_once(job, "spawn")), rows[0])
    bench.repeat(bench.each(lambda job: bench.mp_once(job, "fork")), rows[1])
    bench.repeat(bench.each(bench.torchrun_once), rows[2])
    if importlib.util.find_spec("accelerate") is None:
        rows[3].skipped = "skipped: accelerate not installed"
    else:  # one process for all reps: a notebook calling notebook_launcher again and again
        bench.repeat(lambda job: bench.child("accelerate", job, s.reps), rows[3])
    # Untracked and tracked first calls alternate: a load that changes meanwhile hits both.
    for job in bench.jobs:
        for _ in range(s.reps):
            for row, tracked in ((rows[4], False), (rows[6], True)):
                try:
                    sample_ = bench.child("first", job, 1, tracked)[0]
                except Exception as exc:
                    row.skipped = f"failed: {type(exc).__name__}: {str(exc)[:120]}"
                    continue
                row.samples.setdefault(job, []).append(sample_)
    C.quiet_console()
    for row, tracked in ((rows[5], False), (rows[7], True)):
        try:
            for job in bench.jobs:
                row.samples[job] = bench.warm_samples(job, tracked)
        except Exception as exc:
            row.skipped = f"failed: {type(exc).__name__}: {str(exc)[:120]}"
    return rows


# -- report ------------------------------------------------------------------------------------


def med(row: Row, job: str, which: int) -> float:
    return C.median([x[which] for x in row.samples.get(job, [])])


def latency_table(rows: list[Row], jobs: tuple[str, ...]) -> str:
    spawn = rows[0]
    body = []
    for job in jobs:
        for row in rows:
            if job not in row.samples:
                body.append([job, row.launcher, "-", "-", "-", "-", row.skipped or row.notes])
                continue
            cells = [job, row.launcher]
            for which in (0, 1):
                cells.append(C.fmt_s([x[which] for x in row.samples[job]]))
                cells.append(C.fmt_ratio(med(row, job, which) / med(spawn, job, which)))
            body.append([*cells, row.notes])
    headers = ["job", "launcher", "call -> all ranks in user code", "x spawn"]
    headers += ["call -> results back", "x spawn", "notes"]
    return C.markdown_table(headers, body)


def targets_table(rows: list[Row], jobs: tuple[str, ...]) -> str:
    spawn, first, warm = rows[0], rows[4], rows[5]

    def check(value: float, limit: float) -> bool | None:
        return None if value != value else value <= limit

    to_code = max(med(warm, j, 0) for j in jobs)
    warm_back = med(warm, "allreduce", 1)
    warm_ratio = warm_back / med(spawn, "allreduce", 1)
    body = [
        ["warm call -> all ranks in user code (worst job)", "<= 0.05 s", f"{to_code:.3f} s"],
        ["warm call -> results, allreduce job", "<= 0.10x spawn", C.fmt_ratio(warm_ratio)],
        ["warm call -> results, allreduce job", "<= 0.5 s", f"{warm_back:.3f} s"],
    ]
    verdicts = [check(to_code, 0.05), check(warm_ratio, 0.10), check(warm_back, 0.5)]
    for job in jobs:
        ratio = med(first, job, 1) / med(spawn, job, 1)
        body.append([f"first call -> results, {job} job", "<= 0.8x spawn", C.fmt_ratio(ratio)])
        verdicts.append(check(ratio, 0.8))
    for job in jobs:
        for plain, tracked, what, limit in (
            (first, rows[6], "first", 1.2),
            (warm, rows[7], "warm", 1.5),
        ):
            ratio = med(tracked, job, 1) / med(plain, job, 1)
            body.append(
                [
                    f"tracked {what} call -> results, {job} job",
                    f"<= {limit}x untracked",
                    C.fmt_ratio(ratio),
                ]
            )
            verdicts.append(check(ratio, limit))
    return C.markdown_table(
        ["target", "limit", "measured (median)", "verdict"],
        [[*b, C.verdict(v)] for b, v in zip(body, verdicts, strict=True)],
    )


# -- child processes: a fresh caller for "first call", and Accelerate ---------------------------


def child_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("first", "accelerate"))
    parser.add_argument("--job", required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--tracked", action="store_true")
    a = parser.parse_args(argv)
    if a.mode == "first":
        C.print_result({"samples": [first_call(a.job, a.device, a.world, a.tracked)]})
        return
    samples = []
    for rep in range(a.reps):
        time.sleep(0 if rep == 0 else C.SETTLE_S[a.device])  # like the warm calls of ours
        out = a.dir / f"r{rep}"
        out.mkdir()
        samples.append(accelerate_call(a.job, a.device, a.world, out))
    C.print_result({"samples": samples})


def first_call(job: str, device: str, world: int, tracked: bool) -> Sample:
    import serverless_gpu
    from serverless_gpu import distributed

    C.quiet_console()
    gpu_type = "cpu" if device == "cpu" else None
    fn = distributed(gpus=world, gpu_type=gpu_type, tracking=tracked)(_jobs.user_fn)
    t_call = time.time()
    entries = fn.distributed(job, device, None)
    t_back = time.time()
    serverless_gpu.shutdown()
    return sample(t_call, t_back, list(entries))


def accelerate_call(job: str, device: str, world: int, out_dir: Path) -> Sample:
    from accelerate import notebook_launcher

    args, port = (job, device, str(out_dir)), str(C.free_port())
    t_call = time.time()
    notebook_launcher(_jobs.user_fn, args, num_processes=world, use_port=port)
    t_back = time.time()
    return sample(t_call, t_back, C.read_entries(out_dir, world))


def make_store(tmp: Path) -> None:
    """The tracked calls' MLflow store, its tables made by a process of its own (this one
    forks baselines and stays free of MLflow until its tracked calls)."""
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    code = "import mlflow; mlflow.MlflowClient().search_experiments()"
    C.run_subprocess([C.python(), "-c", code], SUBPROCESS_TIMEOUT_S, tmp / "store.log")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
        return
    argv = sys.argv[1:]
    if "--backend" in argv:
        at = argv.index("--backend")
        backend = argv[at + 1] if at + 1 < len(argv) else ""
        del argv[at : at + 2]
        if backend == "ray":
            import launch_ray

            launch_ray.main(argv)
            return
        if backend != "local":
            sys.exit(f"--backend must be local or ray, not {backend!r}")
    s = C.parse_settings(__doc__.splitlines()[0], argv)
    jobs = jobs_for(s)
    tmp = Path(tempfile.mkdtemp(prefix="sgpu-bench-launch-"))
    # Private run directories: other callers of this user prune the shared default one.
    os.environ.setdefault("SERVERLESS_GPU_RUNS_DIR", str(tmp / "runs"))
    make_store(tmp)
    try:
        rows = measure_all(s, tmp)
    finally:
        if "serverless_gpu" in sys.modules:
            sys.modules["serverless_gpu"].shutdown()
        left = C.reap_leftovers()
    if any(row.skipped.startswith("failed") for row in rows):
        print(f"logs of the failed baselines kept in {tmp}", file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    intro = (
        f"Medians over {s.reps} rep(s), (min-max) after them; x spawn = ratio of medians. "
        f"Collective backend: {C.gloo_or_nccl(s)}."
    )
    sections = [
        ("Launch latency", intro + "\n\n" + latency_table(rows, jobs)),
        ("Targets", targets_table(rows, jobs)),
    ]
    if left:
        sections.append(("Leftover processes killed", "\n".join(left)))
    C.emit_report(s, "Launch benchmark", sections)


if __name__ == "__main__":
    main()
