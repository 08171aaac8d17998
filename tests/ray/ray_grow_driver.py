"""A caller on the fake autoscaling cluster (RAY_ADDRESS): one call of 4 CPU ranks on a cluster
whose head has no CPUs, so the autoscaler must add nodes first; prints the console's lines."""

from __future__ import annotations

import ray_fns

from serverless_gpu import distributed

fn = distributed(gpus=4, gpu_type="cpu", remote=True, timeout=400, tracking=False)(ray_fns.who_am_i)
print("sums", [r["sum"] for r in fn.distributed()], flush=True)
