"""The environment of each rank: the caller's environment plus the torch.distributed variables."""

from __future__ import annotations

import os
import socket

from serverless_gpu.common import settings

FLIGHT_RECORDER_ENV = "TORCH_FR_BUFFER_SIZE"
FLIGHT_RECORDER_ENTRIES = "2000"
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
"""NVLink multicast off in NCCL, PyTorch and NVSHMEM unless the caller's environment says
otherwise: on shared GPU hosts a program using it has put the host's GPUs out of service."""


def multicast_off(env: dict[str, str] | os._Environ[str]) -> None:
    """Set every :data:`MULTICAST_OFF` variable that ``env`` does not set already."""
    for key, value in MULTICAST_OFF.items():
        env.setdefault(key, value)


GROUP_ENV_PREFIXES = (
    "NCCL_",
    "TORCH_NCCL_",
    "TORCH_FR_",
    "GLOO_",
    "TORCH_GLOO",
    "TORCH_DISTRIBUTED",
    "NVSHMEM_",
    "TORCH_SYMM_MEM",
    "CUDA_",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
)
"""Variables that NCCL, gloo, torch.distributed or CUDA read once per process, when the first
communicator, context or allocation is made: a rank made ahead of its call (with its CUDA
context and process group) serves only calls whose environment agrees on all of them."""


def group_env(env: dict[str, str]) -> dict[str, str]:
    """The part of ``env`` that a warm rank was made under (see :data:`GROUP_ENV_PREFIXES`);
    ``CUDA_VISIBLE_DEVICES`` is left out: the launcher matches devices itself."""
    return {
        key: value
        for key, value in env.items()
        if key.startswith(GROUP_ENV_PREFIXES) and key != "CUDA_VISIBLE_DEVICES"
    }


def free_port(exclude: set[int]) -> int:
    """A TCP port on 127.0.0.1 that is free now and not handed to another live run."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in exclude:
            return port
    raise OSError("no free TCP port found on 127.0.0.1")


RENDEZVOUS_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)
"""What :func:`rank_env` tells a rank of its group, as ``init_process_group("env://")`` reads it."""


def rank_env(
    base: dict[str, str],
    *,
    rank: int,
    world_size: int,
    master_port: int,
    device: str,
    run_id: str,
    run_dir: str,
) -> dict[str, str]:
    """The complete environment of one rank (single node: local rank == global rank)."""
    env = dict(base)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        GROUP_RANK="0",
        NODE_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(master_port),
        PYTHONUNBUFFERED="1",
        TORCH_NCCL_ASYNC_ERROR_HANDLING="1",
    )
    env[settings.DEVICE.name] = device
    env[settings.RUN_ID.name] = run_id
    env[settings.RUN_DIR.name] = run_dir
    # Without this, every rank starts one OpenMP thread per core and they oversubscribe the CPU.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world_size)))
    multicast_off(env)
    # NCCL's flight recorder: a timeout's error says which collective each GPU rank entered
    # last (a few hundred KiB of memory per rank).
    recorder_set = {FLIGHT_RECORDER_ENV, "TORCH_NCCL_TRACE_BUFFER_SIZE"} & env.keys()
    if device != "cpu" and not recorder_set:
        env[FLIGHT_RECORDER_ENV] = FLIGHT_RECORDER_ENTRIES
    if device == "cpu":
        cpu_mode_defaults(env)
    return env


def cpu_mode_defaults(env: dict[str, str]) -> None:
    """What third-party trainers need to run distributed on CPU ranks, unless ``env`` has it.

    Accelerate (and HF ``Trainer`` through it) trains each CPU rank alone unless told to use
    the CPU; gloo listens on every interface unless given one, and our ranks only ever talk to
    each other on this machine.
    """
    env.setdefault("ACCELERATE_USE_CPU", "1")
    loopback = loopback_interface()
    if loopback is not None:
        env.setdefault("GLOO_SOCKET_IFNAME", loopback)


def loopback_interface() -> str | None:
    """The name of this machine's loopback interface (``lo`` on Linux, ``lo0`` on macOS)."""
    try:
        names = {name for _, name in socket.if_nameindex()}
    except OSError:
        return None
    return next((name for name in ("lo", "lo0") if name in names), None)
