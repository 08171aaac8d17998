"""Where the time of an all-reduce call goes: warm calls with and without the process group
formed ahead of the call (``warm_process_group``), and a first call in a fresh process.

Each rank of the ``parts`` job records when it entered user code, when ``init_process_group``,
the first all-reduce and ``destroy_process_group`` returned; the caller records the call and
when the results were back. Medians over the reps, seconds.

    PYTHONPATH=. python benchmarks/warm_parts.py [--gpus N] [--cpu] [--reps K] [--out F]

This process is the caller and never touches CUDA.
"""

# ruff: noqa: E402 - the environment below must be set before anything else is imported.
from __future__ import annotations

import os

from serverless_gpu.wire.env import multicast_off

multicast_off(os.environ)  # NVLink multicast off here and in every process started from here

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as C
import _jobs

STEPS: tuple[str, ...] = (
    "call -> user code",
    "init_process_group",
    "first all-reduce",
    "destroy_process_group",
    "last rank returned -> results back",
    "call -> results back",
)


def parts(t_call: float, t_back: float, ranks: list[dict[str, float]]) -> list[float]:
    last = max(r["destroy"] for r in ranks)
    return [
        max(r["entry"] for r in ranks) - t_call,
        max(r["init"] - r["entry"] for r in ranks),
        max(r["allreduce"] - r["init"] for r in ranks),
        max(r["destroy"] - r["allreduce"] for r in ranks),
        t_back - last,
        t_back - t_call,
    ]


def warm_calls(s: C.Settings, warm_group: bool) -> tuple[list[list[float]], bool]:
    from serverless_gpu import distributed

    fn = distributed(
        gpus=s.world_size,
        gpu_type="cpu" if s.cpu else None,
        output="none",
        tracking=False,
        warm_process_group=warm_group,
    )(_jobs.user_fn)
    fn.distributed("parts", s.device, None)  # throwaway: launcher and standby are up
    samples, warm = [], True
    for _ in range(s.reps):
        time.sleep(C.SETTLE_S[s.device])
        t_call = time.time()
        ranks = fn.distributed("parts", s.device, None)
        samples.append(parts(t_call, time.time(), list(ranks)))
        warm = warm and all(r["warm"] for r in ranks)
    return samples, warm


def first_call(s: C.Settings) -> list[float]:
    """A fresh Python process: decorate, call at once (as ``launch.py``'s first call)."""
    cmd = [C.python(), str(Path(__file__).resolve()), "--child", s.device, str(s.world_size)]
    with tempfile.TemporaryDirectory() as tmp:
        result = C.run_child_json(cmd, 300.0, Path(tmp) / "first.log")
    return [float(x) for x in result["parts"]] + [float(result["decorate_to_call"])]


def child(device: str, world: int) -> None:
    import serverless_gpu
    from serverless_gpu import distributed

    C.quiet_console()
    t_decorate = time.time()
    fn = distributed(gpus=world, gpu_type="cpu" if device == "cpu" else None, tracking=False)(
        _jobs.user_fn
    )
    t_call = time.time()
    ranks = fn.distributed("parts", device, None)
    t_back = time.time()
    serverless_gpu.shutdown()
    C.print_result(
        {"parts": parts(t_call, t_back, list(ranks)), "decorate_to_call": t_call - t_decorate}
    )


def import_torch_s() -> float:
    """A fresh interpreter importing torch: what the launcher's own start costs at least."""
    start = time.time()
    subprocess.run([C.python(), "-c", "import torch"], check=True, timeout=300)
    return time.time() - start


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
        return
    s = C.parse_settings(__doc__.splitlines()[0])
    os.environ.setdefault("SERVERLESS_GPU_RUNS_DIR", tempfile.mkdtemp(prefix="sgpu-parts-"))
    C.quiet_console()
    columns: list[tuple[str, list[float]]] = []
    notes = []
    for warm_group in (True, False):
        samples, warm = warm_calls(s, warm_group)
        medians = [C.median([x[i] for x in samples]) for i in range(len(STEPS))]
        columns.append((f"warm call, warm_process_group={warm_group}", medians))
        notes.append(f"warm_process_group={warm_group}: ranks started with a group: {warm}")
    import serverless_gpu

    serverless_gpu.shutdown()
    firsts = [first_call(s) for _ in range(s.reps)]
    columns.append(("first call", [C.median([x[i] for x in firsts]) for i in range(len(STEPS))]))
    rows: list[list[Any]] = [
        [step, *(f"{col[1][i]:.3f}" for col in columns)] for i, step in enumerate(STEPS)
    ]
    decorate = C.median([x[-1] for x in firsts])
    text = C.markdown_table(["step (median, s)", *(c[0] for c in columns)], rows)
    text += f"\n\nFirst call: decorated {decorate:.3f} s before the call. "
    text += f"A fresh interpreter importing torch: {import_torch_s():.2f} s. " + "; ".join(notes)
    C.emit_report(s, "Parts of an all-reduce call", [("Parts", text)])


if __name__ == "__main__":
    main()
