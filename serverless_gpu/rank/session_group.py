"""The one owner of a session rank's default process group: it applies ``group_state``'s
table after every cell and before a cell that must re-form the group.

What each action does with torch:

* ``ABORT``: the group is shut now (``ProcessGroup.shutdown``/``abort``, then destroyed), not at
  the session's end, so a peer blocked in a collective gets "connection closed" at once.
* ``RELEASE``: the pre-formed group's hand-over (``warm_group``'s ``init``/``destroy`` wrappers)
  is dropped, and what it deferred is shut: from now on the user's ``init_process_group`` is
  torch's own, as in a session that never had a group.
* ``FORM``: the next generation on a ``FileStore`` in the session folder (no port, no
  listener), or, for ranks on several machines, on the store the caller keeps for it (a
  ``TCPStore`` listening on the caller's cluster address); the same backend and device as
  before. It ends with a barrier on that store (:func:`all_formed`): no rank runs the cell
  before every rank has formed the group, and if one could not, every rank's re-form fails
  (``REFORM_FAILED``), never only that one's.

After a re-form, torch objects the cells kept (DDP, FSDP, a ``ProcessGroup``) still hold the old
group: rank 0 names them in one line, and they are left as they are.
"""

from __future__ import annotations

import contextlib
import sys
from datetime import timedelta
from typing import Any

from serverless_gpu.common.group_store import listening_store
from serverless_gpu.rank import runtime, warm_group
from serverless_gpu.rank.group_state import GroupAction, GroupEvent, GroupState, cell_ended, step


class GroupOwner:
    def __init__(self, session_dir: str, rank: int, world: int, namespace: dict[str, Any]) -> None:
        self.session_dir = session_dir
        self.namespace = namespace
        self.rank = rank
        self.world = world
        self.state = GroupState.PRE_FORMED if warm_group.pre_formed() else GroupState.NONE
        if self.state is GroupState.NONE:
            warm_group.release()  # no hand-over: the user's functions are torch's own
        _store_on_loopback()
        self.held: list[str] = []
        """The cells' names whose objects hold the group shut by the last ``ABORT``."""

    def cell_ended(self, failed: bool) -> None:
        self._apply(cell_ended(failed, group_up()))
        warm_group.flush_deferred()  # what the cell destroyed is shut at its end

    def reform(self, generation: int, store: str = "") -> None:
        self._apply(GroupEvent.REFORM)
        try:
            self._form(generation, store)
        except BaseException:
            self._apply(GroupEvent.REFORM_FAILED)
            raise
        self._apply(GroupEvent.REFORMED)

    def _apply(self, event: GroupEvent) -> None:
        self.state, action = step(self.state, event)
        if action is GroupAction.ABORT:
            self.held = holders(self.namespace, _default_group())
            abort()
        elif action is GroupAction.RELEASE:
            warm_group.release()

    def _form(self, generation: int, address: str) -> None:
        import torch.distributed as dist

        abort()
        warm_group.release()
        store = self._store(generation, address)
        kwargs: dict[str, Any] = {}
        if not runtime.is_cpu_mode():
            import torch

            torch.cuda.set_device(runtime.get_local_rank())
            kwargs["device_id"] = runtime.device()
        backend = "gloo" if runtime.is_cpu_mode() else "nccl"
        try:
            dist.init_process_group(
                backend, store=store, rank=self.rank, world_size=self.world, **kwargs
            )
        except BaseException:
            with contextlib.suppress(Exception):  # the peers at the barrier fail at once
                store.set(f"{_FORMED}{self.rank}", "failed")
            raise
        all_formed(store, self.rank, self.world)

    def _store(self, generation: int, address: str) -> Any:
        """The generation's store: the caller's (``address``, for ranks that share no folder),
        else a file store in the session folder."""
        import torch.distributed as dist

        if not address:
            return dist.FileStore(f"{self.session_dir}/group-{generation}", self.world)
        host, _, port = address.rpartition(":")
        client = dist.TCPStore(host, int(port), self.world, False, timeout=_STORE_WAIT)
        return dist.PrefixStore(f"generation-{generation}", client)


_FORMED = "serverless-gpu/formed/"
"""The re-form's barrier keys in its store, one per rank: ``ok`` or ``failed``."""


def all_formed(store: Any, rank: int, world: int) -> None:
    """The end of a re-form, in every rank together: return once every rank has formed the
    group, raise when one could not. ``init_process_group`` is no barrier: gloo's
    ``connectFullMesh`` returns in one rank while a peer still completes its handshake, and a
    cell that destroys the group at once (the user's ``destroy`` + ``init``) would close the
    connection under that peer, whose re-form then fails while this rank's succeeded."""
    store.set(f"{_FORMED}{rank}", "ok")
    keys = [f"{_FORMED}{r}" for r in range(world)]
    store.wait(keys)  # bounded by the store's timeout
    failed = [str(r) for r, key in enumerate(keys) if store.get(key) != b"ok"]
    if failed:
        raise RuntimeError(
            f"process group: rank {', '.join(failed)} could not form the next generation"
        )


def holders(namespace: dict[str, Any], group: Any) -> list[str]:
    """Names in ``namespace`` whose object is ``group`` or holds it (DDP, FSDP:
    ``.process_group``). No reference is kept: the last one gone closes its connections."""
    if group is None:
        return []
    found = []
    for name, value in namespace.items():
        if name.startswith("_"):
            continue
        held = value if value is group else getattr(value, "process_group", None)
        if held is group:
            found.append(f"{name} ({type(value).__name__})")
    return found


def _store_on_loopback() -> None:
    """The store the user's ``init_process_group`` makes (``env://``, ``tcp://``) listens on
    127.0.0.1 when that is its address, not on every interface: torch's ``TCPStore`` has no
    authentication and a session's may idle for hours. Every rank of a session is local."""
    rendezvous = sys.modules.get("torch.distributed.rendezvous")
    real = getattr(rendezvous, "_create_c10d_store", None)
    if real is None or getattr(real, "_loopback", False):
        return

    def create(hostname: str, port: int, rank: int, world_size: int, *rest: Any) -> Any:
        if rank != 0 or hostname not in _LOOPBACK or not 0 < port < 2**16:
            return real(hostname, port, rank, world_size, *rest)
        return listening_store("127.0.0.1", port, world_size, rest[0])

    create._loopback = True  # type: ignore[attr-defined]
    rendezvous._create_c10d_store = create  # type: ignore[union-attr]


_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_STORE_WAIT = timedelta(seconds=60)
"""How long a re-forming rank waits for the caller's store and its peers."""


def group_up() -> bool:
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def _default_group() -> Any:
    if not group_up():
        return None
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_group()


def abort() -> None:
    """Shut the default group now (a deferred shutdown would keep its connections open)."""
    group = _default_group()
    if group is None:
        return
    with contextlib.suppress(Exception):
        group.abort()
    warm_group.finish()
