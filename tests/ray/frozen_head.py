"""A Ray head of its own for tests/ray/test_ray_frozen_head.py: prints its address and its
gcs_server's pid, then runs until its standard input closes."""

from __future__ import annotations

import os
import sys

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # on 127.0.0.1, before ray is imported
import psutil
from ray.cluster_utils import Cluster

cluster = Cluster(
    initialize_head=True,
    head_node_args={"num_cpus": 0, "include_dashboard": False, "object_store_memory": 80 << 20},
)
gcs = [p.pid for p in psutil.Process().children(recursive=True) if "gcs_server" in p.name()]
print(cluster.address, gcs[0], flush=True)
sys.stdin.read()
cluster.shutdown()
