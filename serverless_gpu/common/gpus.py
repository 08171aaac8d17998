"""GPU detection without CUDA: count and names come from NVML, honouring CUDA_VISIBLE_DEVICES.

The caller (a notebook kernel) must never create a CUDA context: it pins memory on GPU 0 and
makes forking illegal. NVML reads the same facts from the driver without one.
"""

from __future__ import annotations

import enum
import functools
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from serverless_gpu.common import settings
from serverless_gpu.common.errors import GPUConfigError
from serverless_gpu.common.vocabulary import option, option_name

CPU_MODE_ENV = settings.DEVICE_TYPE.name


class GPUType(str, enum.Enum):
    """Accelerator families ``gpu_type`` accepts; parsed case-insensitively with aliases."""

    H100 = "H100"
    H200 = "H200"
    A100 = "A100"
    A10 = "A10"
    L4 = "L4"
    L40S = "L40S"
    B200 = "B200"
    B300 = "B300"
    CPU = "CPU"
    OTHER = "OTHER"
    """A GPU whose name matches none of the families above; accepted only when auto-detected."""

    @classmethod
    def parse(cls, value: str | GPUType) -> GPUType:
        """``"h100"``, ``"A10G"``, ``GPUType.H100`` -> a member; anything else -> GPUConfigError."""
        if isinstance(value, GPUType):
            return value
        key = re.sub(r"[\s_-]", "", str(value)).upper()
        if key in _ALIASES:
            return _ALIASES[key]
        if key in cls.__members__:
            return cls[key]
        known = ", ".join(m.value for m in cls)
        raise GPUConfigError(
            f"unknown {option_name('gpu_type')} {value!r}; expected one of {known}"
        )

    @classmethod
    def values(cls) -> list[str]:
        """Every member's value: ``["H100", "H200", ...]``."""
        return [member.value for member in cls]

    @classmethod
    def names(cls) -> list[str]:
        """Every member's name in lower case: ``["h100", "h200", ...]``."""
        return [member.name.lower() for member in cls]

    @classmethod
    def _missing_(cls, value: object) -> GPUType:
        # GPUType("a10g"), GPUType("h100_80gb"): the constructor takes what parse() takes, and
        # an unknown name raises GPUConfigError (the original's GPUTypeError, a ValueError).
        if not isinstance(value, str):
            raise GPUConfigError(f"a {option_name('gpu_type')} is a string, not {value!r}")
        return cls.parse(value)

    @classmethod
    def from_device_name(cls, name: str) -> GPUType | None:
        """Map a driver device name (``"NVIDIA H100 80GB HBM3"``) to a member, if known."""
        upper = name.upper()
        # Longest names first so that "A100" is not read as "A10" nor "L40S" as "L4".
        for token in sorted(_DEVICE_TOKENS, key=len, reverse=True):
            if re.search(rf"\b{token}", upper):
                return _DEVICE_TOKENS[token]
        return None


# "H10080GB" is the original API's older spelling of the H100 ("h100_80gb").
_ALIASES = {
    "A10G": GPUType.A10,
    "GH200": GPUType.H200,
    "H10080GB": GPUType.H100,
    "NONE": GPUType.CPU,
}
_DEVICE_TOKENS = {
    "H100": GPUType.H100,
    "H200": GPUType.H200,
    "GH200": GPUType.H200,
    "H800": GPUType.H100,
    "A100": GPUType.A100,
    "A800": GPUType.A100,
    "A10G": GPUType.A10,
    "A10": GPUType.A10,
    "L4": GPUType.L4,
    "L40S": GPUType.L40S,
    "B200": GPUType.B200,
    "B300": GPUType.B300,
}


@dataclass(frozen=True)
class Placement:
    """Where a run's ranks go: how many, on which kind of device."""

    world_size: int
    device: str
    """``"cuda"`` or ``"cpu"``."""
    gpu_type: GPUType
    gpu_names: tuple[str, ...]


@contextmanager
def visible_nvml_devices(cuda_visible: str | None) -> Iterator[tuple[Any, list[Any]]]:
    """``(pynvml, handles)`` of the GPUs a process with this CUDA_VISIBLE_DEVICES may use, in
    CUDA ordinal order; no handles without a driver. NVML is shut down on exit, so a process
    that forks afterwards (the launcher) hands no live NVML state to its children."""
    try:
        import pynvml
    except ImportError:
        yield None, []
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        yield pynvml, []  # no driver: a CPU-only machine
        return
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        uuids = [_decode(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
        yield pynvml, [handles[i] for i in visible_indices(uuids, cuda_visible)]
    finally:
        pynvml.nvmlShutdown()


def visible_gpu_names() -> list[str]:
    """Names of the GPUs this process may use, in CUDA ordinal order, read through NVML."""
    return list(_gpu_names(os.environ.get("CUDA_VISIBLE_DEVICES")))


@functools.lru_cache(maxsize=8)
def _gpu_names(spec: str | None) -> tuple[str, ...]:
    # Cached per CUDA_VISIBLE_DEVICES value: the GPUs of a machine do not change under a running
    # kernel, and an NVML session per call would be paid on every call's critical path.
    with visible_nvml_devices(spec) as (nvml, handles):
        return tuple(_decode(nvml.nvmlDeviceGetName(h)) for h in handles)


def visible_device_ids(cuda_visible: str | None) -> tuple[str, ...]:
    """The GPUs a process with this CUDA_VISIBLE_DEVICES may use, as entries of that variable
    (its own entries when set, else ordinals), in CUDA ordinal order; read through NVML."""
    count = len(_gpu_names(cuda_visible))
    if cuda_visible is None:
        return tuple(str(i) for i in range(count))
    return tuple(s.strip() for s in cuda_visible.split(","))[:count]


def _decode(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def visible_indices(uuids: list[str], spec: str | None) -> list[int]:
    """Apply a CUDA_VISIBLE_DEVICES value (indices or UUID prefixes) as the CUDA runtime does."""
    if spec is None:
        return list(range(len(uuids)))
    chosen: list[int] = []
    for item in (s.strip() for s in spec.split(",")):
        if item.isdigit() and int(item) < len(uuids):
            index = int(item)
        else:
            matches = [i for i, u in enumerate(uuids) if item and u.startswith(item)]
            if len(matches) != 1:
                break  # CUDA stops at the first invalid entry
            index = matches[0]
        if index in chosen:
            break
        chosen.append(index)
    return chosen


def check_gpu_count(gpus: object) -> None:
    """``gpus`` is a positive integer or None."""
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
        raise GPUConfigError(f"gpus must be a positive integer or None, not {gpus!r}")


def check_cpu_count(gpus: int | None) -> None:
    """CPU mode runs every rank on this machine's cores: at most ``settings.MAX_CPU_RANKS``."""
    if gpus is not None and gpus > settings.MAX_CPU_RANKS:
        raise GPUConfigError(
            f"{option('gpus', gpus)} CPU ranks were requested; CPU mode runs at most "
            f"{settings.MAX_CPU_RANKS} ranks (each a process holding torch on this machine)"
        )


def cpu_mode_requested(gpu_type: str | GPUType | None) -> bool:
    """CPU mode is asked for by ``gpu_type="cpu"`` or by ``SERVERLESS_GPU_TYPE=cpu``."""
    if gpu_type is not None and GPUType.parse(gpu_type) is GPUType.CPU:
        return True
    return settings.cpu_mode()


def resolve_placement(
    gpus: int | None, gpu_type: str | GPUType | None, per_node: int | None = None
) -> Placement:
    """Check the request against the machine and decide the ranks; raises before any launch.
    ``per_node`` (a node shape's GPU count) caps the default count of a GPU call: every visible
    GPU, at most that many. CPU mode ignores it, as it ignores ``gpu_type``."""
    check_gpu_count(gpus)
    if cpu_mode_requested(gpu_type):
        check_cpu_count(gpus)
        count = gpus if gpus is not None else settings.CPU_RANKS.read()
        return Placement(count, "cpu", GPUType.CPU, ())
    names = visible_gpu_names()
    if not names:
        raise GPUConfigError(
            "no GPU is visible to this process (NVML found none). To run on CPU ranks instead, "
            f"pass {option('gpu_type', 'cpu')} or set the environment variable {CPU_MODE_ENV}=cpu."
        )
    detected = GPUType.from_device_name(names[0])
    available = f"{len(names)} x {names[0]}"
    if gpu_type is not None:
        wanted = GPUType.parse(gpu_type)
        if wanted is not detected:
            raise GPUConfigError(
                f"{option('gpu_type', wanted.value)} was requested but this machine has {available}"
            )
    if gpus is not None and gpus > len(names):
        raise GPUConfigError(
            f"{option('gpus', gpus)} was requested but only {available} are visible"
        )
    count = gpus if gpus is not None else min(len(names), per_node or len(names))
    return Placement(count, "cuda", detected or GPUType.OTHER, tuple(names[:count]))
