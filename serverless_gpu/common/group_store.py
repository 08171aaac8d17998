"""A process group's rendezvous store that listens on one address only.

torch's ``TCPStore`` server listens on every interface and has no authentication; a session's
store may live for hours. Here its listening socket is made first, bound to the one address the
ranks use (127.0.0.1 for a session of this machine, the caller's cluster address for a remote
session's re-formed group), and handed to the store.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any


def listening_store(host: str, port: int, world_size: int | None, timeout: timedelta) -> Any:
    """A ``TCPStore`` server on ``host:port`` only (``port`` 0: a free one, ``store.port``)."""
    import torch.distributed as dist

    listener = socket.create_server((host, port), backlog=(world_size or 0) + 16)
    bound = int(listener.getsockname()[1])
    # the store's server owns the socket from here (it closes it with the store)
    return dist.TCPStore(
        host,
        bound,
        world_size,
        True,
        timeout=timeout,
        wait_for_workers=False,
        multi_tenant=True,
        master_listen_fd=listener.detach(),
    )
