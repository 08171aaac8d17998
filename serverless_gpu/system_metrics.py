"""Host and GPU utilisation sampled in the launcher (never in the ranks, never through CUDA)."""

from __future__ import annotations

import psutil

from .gpus import visible_indices


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
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return {}
    # Init and shut down around each reading: forked ranks must not inherit live NVML state.
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        uuids = [_text(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
        values: dict[str, float] = {}
        for ordinal, index in enumerate(visible_indices(uuids, cuda_visible)[:gpus]):
            util = pynvml.nvmlDeviceGetUtilizationRates(handles[index])
            mem = pynvml.nvmlDeviceGetMemoryInfo(handles[index])
            values[f"system/gpu_{ordinal}_utilization_percentage"] = float(util.gpu)
            values[f"system/gpu_{ordinal}_memory_usage_megabytes"] = mem.used / 2**20
            values[f"system/gpu_{ordinal}_memory_usage_percentage"] = 100.0 * mem.used / mem.total
        return values
    except pynvml.NVMLError:
        return {}
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
