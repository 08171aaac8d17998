"""One real Ray cluster for the Ray tests: 2 worker nodes x 2 CPUs on 127.0.0.1
(``ray.cluster_utils.Cluster``) and a head node without CPUs (as production clusters keep
their head free of work), so that a test can remove a node holding ranks and the cluster
lives on. This process is connected to it as the caller."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from eventually import eventually

# Before ray is imported: Ray then runs a multi-node cluster on one machine, on 127.0.0.1.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.state import list_actors, list_placement_groups  # noqa: E402
from ray.util.state.exception import RayStateApiException  # noqa: E402

from serverless_gpu import tracking  # noqa: E402
from serverless_gpu.backends.ray import ray_backend  # noqa: E402
from serverless_gpu.caller import hooks  # noqa: E402

NODE_CPUS = 2
OUR_ACTORS = {"RankActor", "EventSink"}
STUB = Path(__file__).resolve().parent / "no_rfc3987"


def node_of(cluster: Cluster, node_id: str) -> Any:
    """The cluster's node object with this Ray node id."""
    return next(n for n in cluster.list_all_nodes() if n.node_id == node_id)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _node_args() -> dict[str, Any]:
    # Two GPUs per node as Ray resources only (there are none): Ray assigns their ids to
    # actors and sets CUDA_VISIBLE_DEVICES as on a GPU node.
    return {"num_cpus": NODE_CPUS, "num_gpus": 2, "object_store_memory": 100 * 2**20}


_START_ATTEMPTS = 4


def _start_cluster() -> Cluster:
    """A head without CPUs and two worker nodes. A raylet exits when its dashboard agent takes
    more than a fixed 15 s to start, which happens on a 2-core machine busy with other work:
    then the whole cluster is started again."""
    for attempt in range(_START_ATTEMPTS):
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        head = {
            "num_cpus": 0,
            "object_store_memory": 100 * 2**20,
            "dashboard_port": _free_port(),
            "include_dashboard": True,
        }
        cluster = None
        try:
            cluster = Cluster(initialize_head=True, head_node_args=head)
            for _ in range(2):
                cluster.add_node(**_node_args())
            cluster.wait_for_nodes()
            return cluster
        except Exception:
            if cluster is not None:
                cluster.shutdown()
            _kill_started_since(before)  # a node that failed to start is not the cluster's
            if attempt == _START_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _kill_started_since(before: set[int]) -> None:
    new = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    for proc in new:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(new, timeout=10)


_ENDS: list[Callable[[], None]] = []
"""How to end the session's cluster while it runs (see pytest_runtest_teardown)."""


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The cluster, started once for every Ray test; this process is connected to it."""
    old_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(STUB), old_path]))
    cluster = _start_cluster()

    def end() -> None:
        ray.shutdown()
        cluster.shutdown()
        os.environ["PYTHONPATH"] = old_path

    _ENDS.append(end)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        yield cluster
    finally:
        if _ENDS:
            _ENDS.pop()()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last Ray test, when a test of another folder follows in this process (the
    Ray tests run together: tests/conftest.py), the cluster ends at once, not at the session's
    end: the tests after it expect a process that is connected to no Ray cluster and has no
    raylet among its children."""
    if nextitem is not None and _RAY_TESTS not in nextitem.path.resolve().parents and _ENDS:
        _ENDS.pop()()


_RAY_TESTS = Path(__file__).resolve().parent


@pytest.fixture
def cluster(
    ray_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cluster]:
    """The cluster with two worker nodes of 2 CPUs (a test that removed one gets a fresh one)
    and run directories under the test's tmp dir; no standby actors before or after."""
    workers = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU")]
    for _ in range(2 - len(workers)):
        ray_cluster.add_node(**_node_args())
    ray_cluster.wait_for_nodes()
    monkeypatch.setenv("SERVERLESS_GPU_RUNS_DIR", str(tmp_path / "runs"))
    yield ray_cluster
    ray_backend().standby.release_all()


def node_args() -> dict[str, Any]:
    """A worker node as the test cluster adds it."""
    return _node_args()


@pytest.fixture
def untracked() -> Iterator[None]:
    hooks.unregister_hook(tracking.tracking_hook)
    try:
        yield
    finally:
        hooks.register_hook(tracking.tracking_hook, order=10)


def leftovers(timeout: float = 15.0, standby: bool = False) -> tuple[list[Any], list[Any]]:
    """Our actors still alive and placement groups not removed, after waiting up to
    ``timeout`` for Ray to finish removing them; the standby actors (of calls that succeeded)
    are released first unless ``standby``."""
    if not standby:
        ray_backend().standby.release_all()
    seen: list[tuple[list[Any], list[Any]]] = []

    def nothing_left() -> bool:
        listing = _complete_listing()
        if listing is None:
            return False
        seen.append(listing)
        return not listing[0] and not listing[1]

    try:
        eventually(nothing_left, "Ray to remove our actors and placement groups", timeout, 0.5)
    except AssertionError:
        if not seen:
            raise  # Ray never completed a listing: nothing is known of what is left
    return seen[-1]


def _complete_listing() -> tuple[list[Any], list[Any]] | None:
    """Our live actors and every placement group not removed; None where Ray could not
    complete the listing (a busy node's state not in), which must not read as "nothing left"."""
    try:
        actors = list_actors(filters=[("state", "!=", "DEAD")])
        groups = list_placement_groups(filters=[("state", "!=", "REMOVED")])
    except RayStateApiException:
        return None
    return [a for a in actors if a.class_name in OUR_ACTORS], groups
