"""Two 1-GPU trials started at once run side by side on different GPUs (docs/gpu-validation.md).

    PYTHONPATH=. python scripts/async_gpu_check.py          # needs 2 visible GPUs
    PYTHONPATH=. python scripts/async_gpu_check.py --cpu    # the same on 2 CPU slots

One trial alone is timed first (after a warm-up call), then two trials started with ``fn.start``
back to back. Each trial reports the device it ran on (the GPU's UUID, from torch in the rank)
and when it ran. The caller never initialises CUDA.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from _checks import check, rank_parser, summary

import serverless_gpu
from serverless_gpu import distributed

SECONDS = 5.0
"""Roughly how long one trial computes."""


def trial(seconds: float) -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available() and os.environ.get("SERVERLESS_GPU_DEVICE") == "cuda"
    device = torch.device("cuda" if cuda else "cpu")
    size = 8192 if cuda else 256
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16 if cuda else torch.float32)
    start = time.time()
    steps = 0
    while time.time() - start < seconds:
        for _ in range(50):
            a = torch.tanh(a @ a)
        if cuda:
            torch.cuda.synchronize()
        steps += 50
    uuid = str(torch.cuda.get_device_properties(0).uuid) if cuda else "cpu"
    return {
        "start": start,
        "end": time.time(),
        "steps": steps,
        "uuid": uuid,
        "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        "devices": os.environ.get("SERVERLESS_GPU_DEVICES", ""),
        "nvls": os.environ.get("NCCL_NVLS_ENABLE", ""),
    }


def main() -> int:
    args = rank_parser().parse_args()
    if args.cpu:
        os.environ["SERVERLESS_GPU_CPU_SLOTS"] = "2"
    gpu_type = "cpu" if args.cpu else None
    fn = distributed(gpus=1, gpu_type=gpu_type, tracking=False, standby=False, timeout=300)(trial)
    print(f"serverless_gpu {serverless_gpu.__version__}, python {sys.version.split()[0]}")
    fn.distributed(0.5)  # warm-up: the launcher's start is not a trial's time

    began = time.monotonic()
    alone = fn.distributed(SECONDS)[0]
    one = time.monotonic() - began
    print(f"one trial alone: {one:.2f} s wall, {alone['steps']} steps on {alone['uuid']}")

    began = time.monotonic()
    handles = [fn.start(SECONDS), fn.start(SECONDS)]
    a, b = (h.result(timeout=300)[0] for h in handles)
    two = time.monotonic() - began
    for name, r, h in (("first", a, handles[0]), ("second", b, handles[1])):
        print(
            f"{name}: devices {h.devices}, CUDA_VISIBLE_DEVICES={r['cuda_visible']!r}, "
            f"SERVERLESS_GPU_DEVICES={r['devices']!r}, uuid {r['uuid']}, {r['steps']} steps, "
            f"ran {r['start'] - a['start']:+.2f} s .. {r['end'] - a['start']:+.2f} s"
        )
    check(
        "different devices allocated",
        handles[0].devices != handles[1].devices,
        f"{handles[0].devices} and {handles[1].devices}",
    )
    if not args.cpu:
        check(
            "different GPU UUIDs seen by the ranks",
            a["uuid"] != b["uuid"],
            f"{a['uuid']} / {b['uuid']}",
        )
        check("NVLink multicast off in the ranks", a["nvls"] == b["nvls"] == "0", a["nvls"])
    check("the trials overlapped", a["start"] < b["end"] and b["start"] < a["end"])
    check(
        "two at once take about one trial's wall time",
        two < 1.5 * one,
        f"{two:.2f} s for two vs {one:.2f} s for one ({two / one:.2f} x)",
    )
    serverless_gpu.shutdown()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
