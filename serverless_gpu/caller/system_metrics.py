"""Host and GPU utilisation of a live run, sampled in the caller (psutil, NVML; never CUDA).

Sampling lives in a thread of the caller, not in the launcher: opening an NVML session takes
tens of milliseconds (``benchmarks/nvml_cost.py``), and the launcher's single loop must not
stall, or the ranks block on full output pipes. One NVML session serves the whole run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from serverless_gpu.common.gpus import visible_nvml_devices
from serverless_gpu.wire.events import SystemMetrics


class SystemSampler:
    """Pushes a :class:`SystemMetrics` reading at once and then every ``interval`` seconds
    until :meth:`stop`."""

    def __init__(
        self,
        run_id: str,
        device: str,
        cuda_visible: str | None,
        gpus: int,
        interval: float,
        push: Callable[[SystemMetrics], None],
    ) -> None:
        self.run_id = run_id
        self.device = device
        self.cuda_visible = cuda_visible
        self.gpus = gpus
        self.interval = interval
        self.push = push
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="serverless-gpu-metrics", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        if self.device != "cuda":
            self._loop(None, [])
            return
        # Without NVML or a driver this yields no handles: host figures only.
        with visible_nvml_devices(self.cuda_visible) as (nvml, handles):
            self._loop(nvml, handles[: self.gpus])

    def _loop(self, nvml: Any, handles: list[Any]) -> None:
        while not self._stopped.is_set():
            values = host_sample()
            if handles:
                values.update(gpu_sample(nvml, handles))
            self.push(SystemMetrics(self.run_id, values, time.time()))
            self._stopped.wait(self.interval)


def host_sample() -> dict[str, float]:
    """CPU and memory, keyed by MLflow's system-metric names."""
    return {
        "system/cpu_utilization_percentage": psutil.cpu_percent(interval=None),
        "system/system_memory_usage_megabytes": psutil.virtual_memory().used / 2**20,
    }


def gpu_sample(nvml: Any, handles: list[Any]) -> dict[str, float]:
    values: dict[str, float] = {}
    try:
        for ordinal, handle in enumerate(handles):
            util = nvml.nvmlDeviceGetUtilizationRates(handle)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            values[f"system/gpu_{ordinal}_utilization_percentage"] = float(util.gpu)
            values[f"system/gpu_{ordinal}_memory_usage_megabytes"] = mem.used / 2**20
            values[f"system/gpu_{ordinal}_memory_usage_percentage"] = 100.0 * mem.used / mem.total
    except nvml.NVMLError:
        return {}  # a GPU that stopped answering: skip this reading
    return values
