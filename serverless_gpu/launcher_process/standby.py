"""Rank processes made ahead of calls, per shape (device, world size), inside the launcher.

A standby set holds, per rank, a CUDA context on its GPU and (``warm_process_group``) the
default process group, formed among the set on a private store (``warm_group.py``). Calls of
that shape take the set; a call whose devices, or whose environment as NCCL, gloo and CUDA
read it (``env.group_env``), differ from the set's gets freshly forked ranks instead: those
libraries read it once per process, so a set made under another one cannot serve the call.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from serverless_gpu.common.gpus import visible_device_ids
from serverless_gpu.common.lifetime import kill_group
from serverless_gpu.launcher_process.allocation import devices_of
from serverless_gpu.launcher_process.log import log
from serverless_gpu.launcher_process.rank_handle import RankProcess, fork_rank
from serverless_gpu.rank.warm_group import GroupPlan
from serverless_gpu.wire.env import group_env, rank_env
from serverless_gpu.wire.runspec import RunSpec

MAX_WARM_SHAPES = 2
Shape = tuple[str, int]
"""(device, world size)."""


@dataclass
class RankSet:
    """Ranks forked together for one shape."""

    ranks: list[RankProcess]
    formed_under: dict[str, str] | None = None
    """The environment (``env.group_env``) the set's process group is formed under; None when
    the ranks form none."""

    @property
    def grouped(self) -> bool:
        return self.formed_under is not None


def fork_set(
    shape: Shape, title: str, group_base: dict[str, str] | None, cuda_context: bool
) -> RankSet:
    """Fork ``shape``'s ranks: with a CUDA context each (``cuda_context``), forming a process
    group under ``group_base`` (a base environment) unless that is None. Raises ``OSError``
    when a fork fails, with the ranks already made killed and nothing left open."""
    device, world_size = shape
    ranks: list[RankProcess] = []
    listener = None
    formed_under = None
    try:
        if group_base is not None:
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen(max(16, world_size))
            port = int(listener.getsockname()[1])
            envs = [_formation_env(group_base, shape, rank, port) for rank in range(world_size)]
            formed_under = group_env(envs[0])
        for i in range(world_size):
            plan = None
            if listener is not None:
                fd = listener.fileno() if i == 0 else None
                plan = GroupPlan(i, world_size, device, port, fd, envs[i])
            gpu = i if cuda_context else None
            ranks.append(fork_rank(gpu, f"{title}{i}" if cuda_context else title, plan))
    except BaseException:
        for r in ranks:
            kill_group(r.pid, signal.SIGKILL)
            r.reap_by(time.monotonic() + 1.0)
        raise
    finally:
        if listener is not None:
            listener.close()  # rank 0 holds its own copy
    return RankSet(ranks, formed_under)


def _formation_env(base: dict[str, str], shape: Shape, rank: int, port: int) -> dict[str, str]:
    device, world_size = shape
    return rank_env(
        base,
        rank=rank,
        world_size=world_size,
        master_port=port,
        device=device,
        run_id="",
        run_dir="",
    )


def call_env(spec: RunSpec) -> dict[str, str]:
    """What rank 0 of ``spec`` reads as NCCL, gloo and CUDA settings."""
    env = rank_env(
        spec.env,
        rank=0,
        world_size=spec.world_size,
        master_port=0,
        device=spec.device,
        run_id="",
        run_dir="",
    )
    return group_env(env)


def on_first_devices(spec: RunSpec) -> bool:
    """Whether the call runs on the first GPUs of the launcher's own view, where ranks made
    before its spec create their CUDA contexts (CPU calls: always)."""
    if spec.device != "cuda":
        return True
    visible = visible_device_ids(os.environ.get("CUDA_VISIBLE_DEVICES"))
    return devices_of(spec) == visible[: spec.world_size]


@dataclass
class Standby:
    """The launcher's standby sets: made for the shapes used last, taken by calls."""

    sets: dict[Shape, RankSet] = field(default_factory=dict)
    shapes: dict[Shape, bool] = field(default_factory=dict)
    """Shapes to keep ready, least recently used first, each with whether its set forms a
    process group."""
    group_env: dict[str, str] | None = None
    """The caller's process-group environment as last seen (a Prewarm or a call)."""
    retired: list[RankProcess] = field(default_factory=list)
    """Standby ranks killed to make room, not reaped yet."""

    def use(self, shape: Shape, add: bool, grouped: bool) -> None:
        """Mark a shape as just used (a call with standby=False adds none). Only the latest
        MAX_WARM_SHAPES keep standby ranks: every set holds a CUDA context on GPU 0."""
        if shape not in self.shapes and not add:
            return
        self.shapes.pop(shape, None)
        self.shapes[shape] = grouped
        while len(self.shapes) > MAX_WARM_SHAPES:
            oldest = next(iter(self.shapes))
            del self.shapes[oldest]
            self.retire(self.sets.pop(oldest, None))

    def base_env(self) -> dict[str, str]:
        """The launcher's environment with the caller's process-group settings."""
        own = group_env(dict(os.environ))
        base = {k: v for k, v in os.environ.items() if k not in own}
        base.update(self.group_env if self.group_env is not None else own)
        return base

    def refill(self, fork: Callable[[Shape, bool], RankSet]) -> None:
        """Make the missing sets; ``fork(shape, grouped)`` raises ``OSError`` on failure."""
        for shape, grouped in self.shapes.items():
            if shape not in self.sets:
                try:
                    self.sets[shape] = fork(shape, grouped)
                except OSError as exc:  # calls fork their own ranks; say why there are none
                    log(f"no standby ranks: {exc}")

    def take(self, spec: RunSpec) -> RankSet | None:
        """The call's standby set if one can serve it; sets of its device are retired."""
        rank_set = self.sets.pop((spec.device, spec.world_size), None)
        # Standby ranks of other shapes would sit on the GPUs (or cores) this call uses; they
        # are made again once no call runs.
        for shape in [shape for shape in self.sets if shape[0] == spec.device]:
            self.retire(self.sets.pop(shape))
        if rank_set is None:
            return None
        usable = on_first_devices(spec) and all(r.alive() for r in rank_set.ranks)
        if usable and rank_set.grouped:
            usable = spec.config.warm_process_group and rank_set.formed_under == call_env(spec)
            if not usable:
                log(f"run {spec.run_id}: standby ranks formed under other settings; forking")
        if not usable:
            self.retire(rank_set)
            return None
        return rank_set

    def retire(self, rank_set: RankSet | list[RankProcess] | None) -> None:
        """Stop standby ranks without waiting for them (the call that needs their place is
        starting): they hold nothing of a user's, so SIGKILL; :meth:`reap` reaps them."""
        ranks = rank_set.ranks if isinstance(rank_set, RankSet) else (rank_set or [])
        for r in ranks:
            if r.exit_status is None:
                kill_group(r.pid, signal.SIGKILL)
        self.retired.extend(ranks)

    def reap(self) -> None:
        for r in self.retired:
            if r.poll() is not None:
                r.close()
        self.retired = [r for r in self.retired if r.exit_status is None]
        for rank_set in self.sets.values():
            for r in rank_set.ranks:
                r.poll()

    def reap_within(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        self.reap()
        while self.retired and time.monotonic() < deadline:
            time.sleep(0.01)
            self.reap()

    def ranks(self) -> list[RankProcess]:
        """Every standby rank, set or retired."""
        return [r for s in self.sets.values() for r in s.ranks] + self.retired

    def pids(self) -> set[int]:
        """Standby ranks not reaped yet."""
        return {r.pid for r in self.ranks() if r.exit_status is None}
