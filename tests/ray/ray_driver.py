"""A caller in its own process: connects to the cluster at RAY_ADDRESS, starts a 4-rank call
that blocks, says so, and waits to be killed (tests/ray/test_ray_lifetime.py)."""

from __future__ import annotations

import sys
import time

import ray_fns

from serverless_gpu import distributed
from serverless_gpu.wire.events import RankStarted

fn = distributed(gpus=4, gpu_type="cpu", remote=True, timeout=600, tracking=False)(
    ray_fns.sleep_forever
)
handle = fn.start()
started: set[int] = set()
handle.subscribe(lambda e: started.add(e.rank) if isinstance(e, RankStarted) else None)
deadline = time.monotonic() + 120
while len(started) < 4 and time.monotonic() < deadline and not handle.wait(0.2):
    pass
print("running" if len(started) == 4 else f"not running: {handle.status}", flush=True)
time.sleep(600)
sys.exit(1)
