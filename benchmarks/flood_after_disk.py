"""Does heavy disk writing just before a log flood slow the flooding ranks?

    PYTHONPATH=. python benchmarks/flood_after_disk.py [--gpus N] [--cpu] [--reps K] [--gib G]

A diagnostic for the log-flood figure of ``overheads.py``, whose outliers came right after the
result-transfer section had written GiBs into the run directory. Alternates, K times: a flood
call after a quiet pause, and a flood call right after this process wrote (and deleted) G GiB
in the runs directory without fsync, as a checkpoint save would. Prints the worst rank's
slowdown vs writing a file for each call.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import _common as C
import overheads as O


def write_gib(folder: Path, gib: float) -> float:
    """Write ``gib`` GiB of fresh data into ``folder`` and delete it; returns seconds taken."""
    block = os.urandom(1 << 20) * 64  # 64 MiB
    path = folder / "ballast.bin"
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(int(gib * 16)):
            f.write(block)
    path.unlink()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=4.0)
    known, rest = parser.parse_known_args()
    s = C.parse_settings(__doc__.splitlines()[0], rest)
    tmp = Path(tempfile.mkdtemp(prefix="sgpu-bench-flood-"))
    os.environ.setdefault("SERVERLESS_GPU_RUNS_DIR", str(tmp / "runs"))
    caller = O.Caller(s, tmp)
    lines = 5_000 if s.quick else 100_000
    rows = []
    try:
        import torch  # noqa: F401 - like a notebook

        fn = caller.decorate(O.flood)
        fn.distributed(10)  # launcher and standby ranks up
        runs_dir = Path(os.environ["SERVERLESS_GPU_RUNS_DIR"])
        for rep in range(s.reps):
            for before in ("quiet", f"after writing {known.gib:g} GiB"):
                wrote = write_gib(runs_dir, known.gib) if before != "quiet" else 0.0
                r = O.flood_once(caller, fn, lines)
                if before == "quiet":
                    time.sleep(C.SETTLE_S[s.device])
                rows.append([str(rep), before, f"{wrote:.2f} s", f"{r['vs_file'] * 100:.1f} %"])
                print(" | ".join(rows[-1]), flush=True)
    finally:
        sys.modules["serverless_gpu"].shutdown()
        if caller.memory is not None:
            caller.memory.close()
        C.reap_leftovers()
        shutil.rmtree(tmp, ignore_errors=True)
    table = C.markdown_table(["rep", "flood call", "write took", "slowdown vs a file"], rows)
    C.emit_report(s, "Log flood after disk writes", [("Flood calls", table)])


if __name__ == "__main__":
    main()
