"""What one NVML session costs on this machine (init, handles, one reading, shutdown).

    PYTHONPATH=. python benchmarks/nvml_cost.py [--n 10]

Until this was measured, the launcher opened such a session for each system-metrics reading
inside its one loop (at the start of every run and every 10 s), where any stall blocks the
ranks' output pipes. Prints the median and the maximum over ``--n`` sessions, and the cost of
one reading inside an open session.
"""

from __future__ import annotations

import argparse
import statistics
import time

from serverless_gpu.caller.system_metrics import gpu_sample
from serverless_gpu.common.gpus import visible_nvml_devices


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10)
    n = parser.parse_args().n
    sessions, readings = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        with visible_nvml_devices(None) as (nvml, handles):
            t1 = time.perf_counter()
            gpu_sample(nvml, handles)
            readings.append(time.perf_counter() - t1)
        sessions.append(time.perf_counter() - t0)
    ms = [s * 1000 for s in sessions]
    print(
        f"NVML session (init, handles, one reading, shutdown) over {n}: median "
        f"{statistics.median(ms):.1f} ms, max {max(ms):.1f} ms; one reading in an open session: "
        f"median {statistics.median(readings) * 1000:.2f} ms"
    )


if __name__ == "__main__":
    main()
