"""The session fault matrix's NCCL half, on the GPUs this machine shows.

    python scripts/session_nccl_check.py          # NCCL on the visible GPUs (2 ranks where 2+)
    python scripts/session_nccl_check.py --cpu    # the same matrix with gloo on CPU ranks
    python scripts/session_nccl_check.py --cpu --ranks 16   # 16 CPU ranks per session

Every fault (a raise on every rank, one rank raising while its peer waits in an all-reduce, an
interrupt, a cancel while a rank waits in a collective, destroy + init across cells, a rank's
death) x where the session's group came from (formed ahead of the session by standby ranks;
by the user's ``init_process_group`` in a cell; ``warm_process_group=False``) x the session's
place in its process (the first; after a call; after another session). After each fault a cell
checks the namespace and an all-reduce; a rank's death must end the session clearly.

One rank per GPU: NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so with one GPU
the sessions have one rank and the faults that need a peer are skipped (the table says so).
Tracking is off and nothing here needs IPython or MLflow. Prints one table, each caller
process's rows as it ends; exits 1 if any case failed. The driver is
``tests/sessions/session_matrix.py`` (the CPU half runs in CI).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "tests" / "sessions" / "session_matrix.py"
RUNS = (
    ("first", "pre-formed"),
    ("first", "user"),
    ("first", "no-warm"),
    ("after-call", "pre-formed,user,no-warm"),
    ("second", "pre-formed,user,no-warm"),
)
PER_RUN_S = 110
"""Per caller process, by default: the five stay within a 10-minute device command even when
each hangs (``--per-run-s`` for more ranks)."""
HEADER = f"{'situation':<11} {'origin':<11} {'fault':<21} {'ok':<4} {'s':>6}  detail"


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _run(
    situation: str, origins: str, device: str, world: int, where: Path, limit: float
) -> list[dict]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["SESSION_MATRIX_WORLD"] = str(world)
    env["SERVERLESS_GPU_RUNS_DIR"] = str(where / "runs")
    env["SERVERLESS_GPU_WARMUP"] = "0"
    env["SESSION_MATRIX_DRIVER_S"] = str(max(limit - 10, 1))  # its stacks before the limit
    if device == "cpu":
        env["SERVERLESS_GPU_TYPE"] = "cpu"
    argv = [sys.executable, str(DRIVER), situation, origins, "--device", device]
    try:
        done = subprocess.run(
            argv, env=env, cwd=where, capture_output=True, text=True, timeout=limit
        )
        out, err = done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        out, err = _text(exc.stdout), f"timed out after {limit:.0f} s\n{_text(exc.stderr)}"
    cases = [json.loads(x[5:]) for x in out.splitlines() if x.startswith("CASE ")]
    missing = len(origins.split(",")) * 6 - len(cases)
    if missing:
        tail = "\n".join(err.strip().splitlines()[-15:])
        cases.append({"situation": situation, "origin": origins, "fault": f"{missing} cases",
                      "ok": False, "detail": f"did not run:\n{tail}", "s": 0.0})  # fmt: skip
    return cases


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _rows(cases: list[dict]) -> str:
    rows = []
    for c in cases:
        ok = "ok" if c["ok"] else "FAIL"
        detail = str(c["detail"]).replace("\n", " | ")[:160]
        rows.append(
            f"{c['situation']:<11} {c['origin']:<11} {c['fault']:<21} {ok:<4} {c['s']:>6}  {detail}"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="gloo on CPU ranks (no GPU needed)")
    parser.add_argument("--ranks", type=int, default=None, help="ranks per session (CPU mode)")
    parser.add_argument(
        "--per-run-s", type=float, default=PER_RUN_S, help="limit of each of the 5 caller processes"
    )
    args = parser.parse_args()
    device = "cpu" if args.cpu else "cuda"
    world = args.ranks or (2 if args.cpu else min(2, _gpus()))
    if world < 1:
        print("no GPU visible: run with --cpu for the gloo half", file=sys.stderr)
        return 2
    if importlib.util.find_spec("setproctitle") is None:
        # The driver finds the standby ranks of a pre-formed group by their process titles:
        # without them every pre-formed case would wait its minute and fail.
        print(
            "setproctitle is not installed in this interpreter: `python -m pip install "
            "setproctitle` (a dependency of serverless-gpu)",
            file=sys.stderr,
        )
        return 2
    print(f"session fault matrix: {device}, {world} rank(s) per session", flush=True)
    print(HEADER, flush=True)
    start = time.monotonic()
    cases: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="session-matrix-") as tmp:
        for situation, origins in RUNS:
            # Each caller's rows as soon as it ends: a run cut short still shows what it reached.
            done = _run(situation, origins, device, world, Path(tmp), args.per_run_s)
            print(_rows(done), flush=True)
            cases += done
    failed = [c for c in cases if not c["ok"]]
    took = time.monotonic() - start
    print(f"{len(cases) - len(failed)} of {len(cases)} cases ok in {took:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
