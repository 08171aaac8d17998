"""A standby rank's process group, formed before its call (``warm_process_group=True``).

Standby ranks of one shape rendezvous on a private store (rank 0 listens on a socket the
launcher bound for them) and initialize the default process group eagerly: NCCL with
``device_id`` plus one all-reduce, so the communicator and its connections exist before the
call; gloo in CPU mode. Nothing of a user's run is in them yet. Once the group is formed the
store stops listening: every rank's client is connected, and no other process (another local
user's included) can reach the store while the set waits, possibly for the caller's whole life.

In the call, ``torch.distributed.init_process_group`` returns at once when what it asks for
agrees with the warm group (backend, rank, world size, device; a timeout is applied to it);
otherwise the warm group is dropped and torch forms the one asked for.
``destroy_process_group`` unregisters groups at once and leaves their shutdown (half a second
for NCCL) to :func:`finish`, after the result is on its way.

Runs only in rank processes; torch is imported by the functions, never at module level.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from serverless_gpu.doctor import flight
from serverless_gpu.wire.env import RENDEZVOUS_ENV

FORM_TIMEOUT_S = 60.0
"""How long a standby rank waits for its peers at the rendezvous before giving up the group."""


@dataclass(frozen=True)
class GroupPlan:
    """What a standby rank needs to form its group; handed over by fork, never pickled."""

    rank: int
    world_size: int
    device: str
    """``"cuda"`` (NCCL on ``cuda:rank``) or ``"cpu"`` (gloo)."""
    port: int
    """Rank 0's store port on 127.0.0.1."""
    listen_fd: int | None
    """Rank 0: the listening socket behind ``port`` (bound by the launcher, so no other
    process can take the port in between); other ranks: None."""
    env: dict[str, str]
    """The environment the group is formed under (a call's, with the launcher's base)."""
    host: str = "127.0.0.1"
    """Where rank 0's store listens (a Ray rank's node address; the launcher's: loopback)."""
    local_rank: int | None = None
    """The rank's GPU index on its node (``cuda:local_rank``) where it differs from ``rank``
    (ranks across Ray nodes)."""

    @property
    def gpu_index(self) -> int:
        return self.rank if self.local_rank is None else self.local_rank

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"

    @property
    def device_backend(self) -> str:
        """The same backend spelled for its device (``cuda:nccl``)."""
        return f"{self.device}:{self.backend}"


_plan: GroupPlan | None = None
"""Set while the warm group is the default group and may still be handed to the call."""
_started_with: dict[str, str | None] = {}
"""The rendezvous environment (``env.RENDEZVOUS_ENV``) the call started with: the warm group is
the group it describes, and a function that changes it asks torch for another one."""
_deferred: list[Any] = []
"""Groups destroyed in the call whose shutdown waits for :func:`finish`."""
_real: dict[str, Callable[..., Any]] = {}


def form(plan: GroupPlan) -> bool:
    """Form the default process group for ``plan``; False (with one line on stderr) if it
    could not be formed, and the call's own ``init_process_group`` will do it."""
    import torch
    import torch.distributed as dist

    # A Ray actor forms one group per call: the last one's hand-over ends here, also where
    # its call never took that group (else this init would meet the old hand-over).
    global _plan
    _plan = None
    _uninstall()
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(plan.env)
    try:
        store = dist.TCPStore(
            plan.host,
            plan.port,
            plan.world_size,
            plan.rank == 0,
            timeout=timedelta(seconds=FORM_TIMEOUT_S),
            master_listen_fd=plan.listen_fd,
        )
        device = torch.device("cuda", plan.gpu_index) if plan.device == "cuda" else None
        dist.init_process_group(
            plan.backend, store=store, rank=plan.rank, world_size=plan.world_size, device_id=device
        )
        probe = torch.zeros(1, device=device or "cpu")
        dist.all_reduce(probe)  # connects the communicator's peers now, not in the call
        probe.item()
        flight.mark_warmup()
        _stop_listening(plan.listen_fd)
    except Exception as exc:
        print(f"serverless-gpu: no process group made ahead of the call: {exc}", file=sys.stderr)
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()
        return False
    finally:
        os.environ.clear()
        os.environ.update(saved)
    _plan = plan
    _install()
    return True


def _stop_listening(fd: int | None) -> None:
    """Rank 0, once every rank has joined (the all-reduce returned): close the store's
    listening socket. The store's server still watches the descriptor number, so the socket is
    replaced with one that never becomes ready (an eventfd) rather than closed under it; the
    connected clients go on being served (``new_group`` in the call goes through them)."""
    if fd is None:
        return
    quiet = os.eventfd(0)
    try:
        os.dup2(quiet, fd, inheritable=False)
    finally:
        os.close(quiet)


def settle(adopt: bool, defer: bool) -> None:
    """At the call's start: keep the warm group for the call, or drop it (a peer has none) so
    that the call starts with no group at all. ``defer``: the call's
    ``destroy_process_group`` leaves the shutdown to :func:`finish` (``warm_process_group``)."""
    global _plan
    _started_with.clear()
    _started_with.update({name: os.environ.get(name) for name in RENDEZVOUS_ENV})
    if _plan is not None and not adopt:
        _plan = None
        destroy_process_group()
        _uninstall()
    if defer:
        _install(("destroy_process_group",))


def finish() -> None:
    """After the result is reported: shut down what the call destroyed, then whatever group is
    still registered (a call need not destroy its group)."""
    import torch.distributed as dist

    flush_deferred()
    with contextlib.suppress(Exception):
        if dist.is_initialized():
            _real.get("destroy_process_group", dist.destroy_process_group)()


def pre_formed() -> bool:
    """The warm group is up and not taken yet: a session starts with it."""
    return _plan is not None


def flush_deferred() -> None:
    """Shut what ``destroy_process_group`` deferred (a session: at each cell's end)."""
    for group in _deferred:
        with contextlib.suppress(Exception):
            group.shutdown()
    _deferred.clear()


def release() -> None:
    """A session's owner takes the group over: no hand-over to a later ``init_process_group``
    (torch's own functions again), and what was deferred is shut now."""
    global _plan
    _plan = None
    flush_deferred()
    _uninstall()


# -- what the call's torch.distributed calls meet ------------------------------------------------


def init_process_group(*args: Any, **kwargs: Any) -> None:
    """``torch.distributed.init_process_group``: the warm group when it agrees, else torch's."""
    global _plan
    plan = _plan
    if plan is not None:
        why = _disagreement(plan, _real["init_process_group"], args, kwargs)
        _plan = None  # taken or dropped: a later init (after a destroy) is torch's own
        if why is None and _apply_timeout(_bound(_real["init_process_group"], args, kwargs)):
            return
        destroy_process_group()
    _real["init_process_group"](*args, **kwargs)


def _apply_timeout(asked: dict[str, Any]) -> bool:
    """Give the warm group the timeout asked for; False where this torch cannot."""
    import torch.distributed as dist

    timeout = asked.get("timeout")
    if timeout is None:
        return True
    try:
        dist.distributed_c10d._set_pg_timeout(timeout)
    except Exception:  # a torch without it: the group asked for is formed as torch would
        return False
    return True


def destroy_process_group(*args: Any, **kwargs: Any) -> None:
    """``torch.distributed.destroy_process_group``, with the groups' shutdown deferred."""
    global _plan
    import torch.distributed as dist

    with _shutdown_deferred():
        _real["destroy_process_group"](*args, **kwargs)
    if not dist.is_initialized():
        _plan = None


def _bound(real: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict:
    return dict(inspect.signature(real).bind(*args, **kwargs).arguments)


def _disagreement(
    plan: GroupPlan, real: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> str | None:
    """Why the group asked for is not the warm one, or None when it is."""
    try:
        asked = _bound(real, args, kwargs)
    except TypeError as exc:
        return str(exc)  # torch will say it better
    backend = asked.pop("backend", None)
    if backend is None and plan.device == "cuda":
        return "no backend named: torch makes gloo and nccl together"
    if backend is not None and str(backend).lower() not in (plan.backend, plan.device_backend):
        return f"backend {backend!r}"
    if asked.pop("init_method", None) not in (None, "env://"):
        return "an init_method of its own"
    if asked.pop("world_size", -1) not in (-1, plan.world_size):
        return "another world size"
    if asked.pop("rank", -1) not in (-1, plan.rank):
        return "another rank"
    if not _same_device(plan, asked.pop("device_id", None)):
        return "another device"
    asked.pop("timeout", None)
    changed = [name for name, value in _started_with.items() if os.environ.get(name) != value]
    if changed:
        return f"{', '.join(changed)} changed in os.environ"
    given = [name for name, value in asked.items() if value not in (None, "", {})]
    return f"{', '.join(given)} given" if given else None


def _same_device(plan: GroupPlan, device_id: Any) -> bool:
    if device_id is None:
        return True
    import torch

    if isinstance(device_id, int):
        device_id = torch.device("cuda", device_id)
    device = torch.device(device_id)
    return plan.device == "cuda" and device.type == "cuda" and device.index == plan.gpu_index


def _defer(group: Any) -> None:
    _deferred.append(group)


@contextlib.contextmanager
def _shutdown_deferred() -> Iterator[None]:
    from torch.distributed import ProcessGroup

    real = ProcessGroup.__dict__["shutdown"]
    ProcessGroup.shutdown = _defer  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        ProcessGroup.shutdown = real  # type: ignore[method-assign]


def _install(names: tuple[str, ...] = ("init_process_group", "destroy_process_group")) -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    ours = {
        "init_process_group": init_process_group,
        "destroy_process_group": destroy_process_group,
    }
    for name in names:
        _real.setdefault(name, getattr(c10d, name))
        setattr(dist, name, ours[name])
        setattr(c10d, name, ours[name])


def _uninstall() -> None:
    if not _real:
        return
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name, real in _real.items():
        setattr(dist, name, real)
        setattr(c10d, name, real)
    _real.clear()
