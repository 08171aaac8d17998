"""Host and GPU utilisation sampled in the launcher (never in the ranks, never through CUDA)."""

from __future__ import annotations

import psutil

from .gpus import visible_nvml_devices


def sample(device: str, cuda_visible: str | None, gpus: int) -> dict[str, float]:
    """One reading, keyed by MLflow's system-metric names."""
    values = {
        "system/cpu_utilization_percentage": psutil.cpu_percent(interval=None),
        "system/system_memory_usage_megabytes": psutil.virtual_memory().used / 2**20,
    }
    if device == "cuda":
        values.update(_gpu_sample(cuda_visible, gpus))
    return values


def _gpu_sample(cuda_visible: str | None, gpus: int) -> dict[str, float]:
    values: dict[str, float] = {}
    with visible_nvml_devices(cuda_visible) as (nvml, handles):
        try:
            for ordinal, handle in enumerate(handles[:gpus]):
                util = nvml.nvmlDeviceGetUtilizationRates(handle)
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                values[f"system/gpu_{ordinal}_utilization_percentage"] = float(util.gpu)
                values[f"system/gpu_{ordinal}_memory_usage_megabytes"] = mem.used / 2**20
                values[f"system/gpu_{ordinal}_memory_usage_percentage"] = (
                    100.0 * mem.used / mem.total
                )
        except nvml.NVMLError:
            return {}  # a GPU that stopped answering: skip this reading
    return values
