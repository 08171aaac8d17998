"""Which Ray cluster a ``remote=True`` call runs on: the one this process is connected to."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from serverless_gpu.common import settings
from serverless_gpu.common.errors import ConfigurationError
from serverless_gpu.common.gpus import GPUType, Placement, check_cpu_count, cpu_mode_requested
from serverless_gpu.common.vocabulary import Placeholder, option

HOW_TO_CONNECT = (
    'connect this process to a Ray cluster first: call ray.init(address=...) ("auto" on a '
    'cluster node, "ray://<head>:10001" from elsewhere), or set RAY_ADDRESS before the call; '
    "for a cluster of one machine, run `ray start --head` in a terminal and set "
    "RAY_ADDRESS=auto (docs/ray.md)"
)

_PROBE_S = 5.0
"""How long a cluster's head may take to accept a TCP connection: a live one does in
milliseconds, and ``ray.init`` on an address nothing answers at retries for many minutes."""
_ANSWER_S = 8.0
"""How long the head's GCS may take to answer a first request. A frozen head (a stopped or
wedged ``gcs_server``) still accepts TCP connections, its kernel does that; Ray's own client
then waits 40 s for the GCS, and ``ray.init`` minutes. With the imports before it, a call
that asked for none fails within 10 s."""


def connect(timeout: float | None = None) -> Any:
    """The ``ray`` module, connected: ``ray.init`` already called, else ``RAY_ADDRESS`` set (then
    we connect, first checking within ``timeout`` (the call's) that anything answers there).
    Raises :class:`ConfigurationError` saying how to connect, before anything starts."""
    ray = connect_module()
    if ray.is_initialized():
        return ray
    address = os.environ.get("RAY_ADDRESS", "").strip()
    if not address:
        raise ConfigurationError(
            f"{option('remote', True)} runs the call on a Ray cluster, and this process is "
            f"connected to none: {HOW_TO_CONNECT}"
        )
    deadline = time.monotonic() + (_ANSWER_S if timeout is None else min(timeout, _ANSWER_S))
    _check_answers(address, _PROBE_S if timeout is None else min(timeout, _PROBE_S))
    if _gcs_refuses(address, deadline):  # ray.init would try it 20 times, printing each try
        raise ConfigurationError(_refused(address))
    try:
        # Ranks' output comes back as the call's own events; Ray's copy would print it twice.
        ray.init(address=address, log_to_driver=False)
    except Exception as exc:
        raise ConfigurationError(_not_connected(address, exc)) from None
    return ray


def caller_address() -> str:
    """This process's address on the cluster's network (where a session's actors reach it)."""
    import ray

    return str(ray.util.get_node_ip_address())


def connected() -> bool:
    """Whether a call would find a cluster: ``ray.init`` called, or ``RAY_ADDRESS`` set."""
    try:
        import ray
    except ImportError:
        return False
    return bool(ray.is_initialized() or os.environ.get("RAY_ADDRESS", "").strip())


@contextlib.contextmanager
def local_cluster(cpu_only: bool) -> Iterator[None]:
    """Nothing when this process is connected to a cluster (:func:`connected`); else a Ray
    cluster of this machine for the block, as the original API's local mode starts over its
    notebook node: ``ray.init("local")`` (a head node of this machine's CPUs and GPUs, none with
    ``cpu_only``, no dashboard), shut down at the block's end with every process it started."""
    if connected():
        yield
        return
    ray = connect_module()
    # Ranks' output comes back as the call's own events; Ray's copy would print it twice.
    # "local": a new cluster, never one that `ray start` left running on this machine.
    ray.init(
        address="local",
        num_gpus=0 if cpu_only else None,
        include_dashboard=False,
        log_to_driver=False,
    )
    try:
        yield
    finally:
        ray.shutdown()


def connect_module() -> Any:
    """The ``ray`` module, or :class:`ConfigurationError` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigurationError(
            f"{option('remote', True)} runs the call on a Ray cluster, and Ray is not installed: "
            "pip install 'serverless-gpu[ray]'"
        ) from None
    return ray


def _not_connected(address: str, exc: Exception) -> str:
    """Why ``ray.init`` failed: Ray says "Failed to connect" (and suggests ``ray stop``) even
    when the cluster answered and refused this process's token."""
    if _token_refused(address):
        return _refused(address)
    text = f"could not connect to the Ray cluster at RAY_ADDRESS={address!r}: "
    text += f"{type(exc).__name__}: {exc}"
    return text + (f"; {HOW_TO_CONNECT}" if isinstance(exc, ConnectionError) else "")


def _refused(address: str) -> str:
    return (
        f"the Ray cluster at RAY_ADDRESS={address!r} refused this process's authentication "
        "token (token authentication is on there): give this process the cluster's token "
        "in RAY_AUTH_TOKEN, or in a file named by RAY_AUTH_TOKEN_PATH (default "
        "~/.ray/auth_token); `ray get-auth-token` on the head node prints it"
    )


def _gcs_refuses(address: str, deadline: float) -> bool:
    """:func:`_token_refused`, bounded: in a thread of its own, given until ``deadline``
    (Ray's client has no timeout of its own to pass); a GCS that does not answer by then is
    a :class:`ConfigurationError` naming the address. The thread, if still waiting, is left
    to Ray's own timeout: a daemon, it keeps no process alive."""
    outcome: list[bool | BaseException] = []

    def ask() -> None:
        try:
            outcome.append(_token_refused(address, strict=True))
        except BaseException as exc:  # reported below, in the caller's thread
            outcome.append(exc)

    thread = threading.Thread(target=ask, name="ray-gcs-probe", daemon=True)
    thread.start()
    waited = max(0.0, deadline - time.monotonic())
    thread.join(waited)
    if not outcome or isinstance(outcome[0], BaseException):
        target = _host_port(address)
        where = f"{target[0]}:{target[1]}" if target else address
        why = f"no answer within {waited:.0f} s" if not outcome else str(outcome[0])
        raise ConfigurationError(
            f"the Ray cluster at RAY_ADDRESS={address!r} accepts connections at {where}, but "
            f"its GCS (the head node's gcs_server) did not answer a request ({why}): the head "
            "is frozen, stopped or overloaded. Check the head node (`ray status` there), or "
            f"set RAY_ADDRESS to a running cluster's address; {HOW_TO_CONNECT}"
        )
    return bool(outcome[0])


def _token_refused(address: str, strict: bool = False) -> bool:
    """One request to the head's GCS with this process's token settings (``RAY_AUTH_MODE``,
    ``RAY_AUTH_TOKEN`` ...): True when it is refused as unauthenticated."""
    target = None if address.startswith("ray://") else _host_port(address)
    if target is None:
        return False
    try:
        from ray._raylet import GcsClient  # type: ignore[attr-defined]  # compiled, not in the stub

        GcsClient(address=f"{target[0]}:{target[1]}")
    except Exception as exc:  # Ray's RpcError or AuthenticationError, by its words
        if any(word in str(exc) for word in ("Unauthenticated", "InvalidAuthToken")):
            return True
        if strict and any(word in str(exc) for word in _NO_ANSWER):
            raise
    return False


_NO_ANSWER = ("Timed out", "TimedOut", "unavailable", "Unavailable", "Failed to connect")
"""Words of Ray's client errors that say the GCS did not answer (not that it refused)."""


def _check_answers(address: str, wait: float) -> None:
    """Raise :class:`ConfigurationError` when nothing accepts a connection at ``address`` within
    ``wait`` seconds: a stale ``RAY_ADDRESS`` (a cluster since stopped) fails in seconds."""
    target = _host_port(address)
    if target is None:  # not an address we can resolve: ray.init reports it
        return
    try:
        socket.create_connection(target, timeout=wait).close()
    except OSError as exc:
        why = f"no answer within {wait:g} s" if isinstance(exc, TimeoutError) else exc.strerror
        raise ConfigurationError(
            f"no Ray cluster answers at RAY_ADDRESS={address!r} ({target[0]}:{target[1]}: "
            f"{why or exc}): the cluster there has stopped or never started. Start it, or set "
            f"RAY_ADDRESS to a running cluster's address; {HOW_TO_CONNECT}"
        ) from None


def _host_port(address: str) -> tuple[str, int] | None:
    """The host and port ``ray.init(address=...)`` connects to first: the client server of a
    ``ray://`` address, else the head's GCS (``auto``: the cluster Ray last started here)."""
    if address.startswith("ray://"):
        address = address[len("ray://") :]
    else:
        try:
            from ray._private.services import canonicalize_bootstrap_address

            address = canonicalize_bootstrap_address(address) or ""
        except Exception:  # no cluster for "auto", or a Ray without this helper
            return None
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def cluster_placement(gpus: int | None, gpu_type: str | GPUType | None) -> Placement:
    """The call's ranks on the cluster; the caller's own GPUs play no part."""
    if cpu_mode_requested(gpu_type):
        check_cpu_count(gpus)
        count = gpus if gpus is not None else settings.CPU_RANKS.read()
        return Placement(count, "cpu", GPUType.CPU, ())
    wanted = GPUType.parse(gpu_type) if gpu_type is not None else GPUType.OTHER
    if gpus is None:
        import ray

        gpus = int(ray.cluster_resources().get("GPU", 0))
        if gpus < 1:
            raise ConfigurationError(
                f"{option('gpus', None)} asks for every GPU of the Ray cluster, and it has "
                f"none; pass {option('gpus', Placeholder('N'))} (nodes with GPUs may still be "
                f"starting) or {option('gpu_type', 'cpu')}"
            )
    return Placement(gpus, "cuda", wanted, ())


def ray_init(*args: Any, **kwargs: Any) -> Any:
    """``ray.init(*args, **kwargs)`` (the original's ``ray_init``), then the Ray dashboard's
    address printed when Ray serves one; Ray's context is returned. The dashboard keeps Ray's
    own default host (127.0.0.1): binding every interface, as the original does for its
    notebook proxy, would open it to the network here."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            f"ray_init needs Ray, which is not installed: pip install 'serverless-gpu[ray]' ({exc})"
        ) from None
    context = ray.init(*args, **kwargs)
    url = getattr(context, "dashboard_url", None)
    if url:
        print(f"Ray dashboard: http://{url}", flush=True)
    return context
