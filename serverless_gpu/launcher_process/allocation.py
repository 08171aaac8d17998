"""Which devices each run of one launcher holds, and the queue of runs waiting for some.

Runs started at once (``fn.start()``, sweeps) share the machine: each gets its own devices,
never one another run of ours holds. A run that finds too few free waits in a first-in,
first-out queue per kind of device (a big run is never overtaken by small ones for ever) and
starts when runs ending free enough. GPUs are the entries of the caller's
``CUDA_VISIBLE_DEVICES`` (or the GPUs NVML sees); CPU mode allocates the same way over
``SERVERLESS_GPU_CPU_SLOTS`` virtual devices, so the scheduling is the same code in CI.

The allocation a run got reaches its ranks as ``CUDA_VISIBLE_DEVICES`` (GPUs) and
``SERVERLESS_GPU_DEVICES`` (both kinds), and the caller as ``RunScheduled``.
"""

from __future__ import annotations

import dataclasses
from collections import deque

from serverless_gpu.common import settings
from serverless_gpu.common.gpus import visible_device_ids
from serverless_gpu.wire.runspec import RunSpec

"""The devices a run was allocated, comma-separated (GPU entries or CPU slot numbers)."""


class DevicePool:
    """The devices of one kind; each free or held by one run."""

    def __init__(self, devices: tuple[str, ...]) -> None:
        self.devices = devices
        self.held: dict[str, tuple[str, ...]] = {}
        """Run id -> the devices it holds."""

    def resize(self, devices: tuple[str, ...]) -> None:
        """The caller's view changed (another slot count): held devices stay held."""
        self.devices = devices

    def need(self, world_size: int) -> int:
        """Devices a run of ``world_size`` ranks takes: a CPU run larger than the pool takes
        all of it (its ranks share the slots, as they would share the cores)."""
        return max(1, min(world_size, len(self.devices)))

    def claim(self, run_id: str, count: int) -> tuple[str, ...] | None:
        busy = {d for held in self.held.values() for d in held}
        free = [d for d in self.devices if d not in busy]
        if len(free) < count:
            return None
        self.held[run_id] = tuple(free[:count])
        return self.held[run_id]

    def release(self, run_id: str) -> None:
        self.held.pop(run_id, None)


class Allocator:
    """Pools per kind of device and the FIFO queue of runs waiting for them."""

    def __init__(self) -> None:
        self.pools: dict[str, DevicePool] = {}
        self.queue: deque[RunSpec] = deque()

    def admit(self, spec: RunSpec) -> RunSpec | None:
        """The run with its allocation in its environment, or None: it waits in the queue."""
        pool = self._pool(spec)
        if not pool.devices:
            raise ValueError(f"no {spec.device} device is visible to the launcher")
        if any(q.device == spec.device for q in self.queue):
            self.queue.append(spec)  # first in, first out: no overtaking a waiting run
            return None
        devices = pool.claim(spec.run_id, pool.need(spec.world_size))
        if devices is None:
            self.queue.append(spec)
            return None
        return with_devices(spec, devices)

    def position(self, spec: RunSpec) -> int:
        """How many runs of its kind of device wait ahead of this queued one."""
        return [q.run_id for q in self.queue if q.device == spec.device].index(spec.run_id)

    def release(self, run_id: str) -> list[RunSpec]:
        """A run ended: free its devices; the queued runs that can start now, in order."""
        for pool in self.pools.values():
            pool.release(run_id)
        started: list[RunSpec] = []
        blocked: set[str] = set()
        for spec in list(self.queue):
            if spec.device in blocked:
                continue
            pool = self.pools[spec.device]
            devices = pool.claim(spec.run_id, pool.need(spec.world_size))
            if devices is None:
                blocked.add(spec.device)
                continue
            self.queue.remove(spec)
            started.append(with_devices(spec, devices))
        return started

    def dequeue(self, run_id: str) -> RunSpec | None:
        """Take a waiting run out of the queue (cancelled); None if it is not waiting."""
        for spec in self.queue:
            if spec.run_id == run_id:
                self.queue.remove(spec)
                return spec
        return None

    def busy(self) -> bool:
        """Some device is held or some run waits: no standby ranks may be made now."""
        return bool(self.queue) or any(pool.held for pool in self.pools.values())

    def _pool(self, spec: RunSpec) -> DevicePool:
        if spec.device == "cpu":
            devices = tuple(str(i) for i in range(settings.CPU_SLOTS.read(spec.env)))
        else:
            devices = visible_device_ids(spec.env.get("CUDA_VISIBLE_DEVICES"))
        pool = self.pools.get(spec.device)
        if pool is None:
            pool = self.pools[spec.device] = DevicePool(devices)
        elif pool.devices != devices:
            pool.resize(devices)
        return pool


def with_devices(spec: RunSpec, devices: tuple[str, ...]) -> RunSpec:
    """The spec with its allocation in the ranks' environment."""
    env = dict(spec.env)
    env[settings.DEVICES.name] = ",".join(devices)
    # CPU ranks see no GPU: libraries that take CUDA when it is there (FSDP2's default mesh
    # binds cuda:RANK) would otherwise reach for GPUs a CPU run was never given.
    env["CUDA_VISIBLE_DEVICES"] = ",".join(devices) if spec.device == "cuda" else ""
    return dataclasses.replace(spec, env=env)


def devices_of(spec: RunSpec) -> tuple[str, ...]:
    raw = settings.DEVICES.read(spec.env)
    return tuple(raw.split(",")) if raw else ()
