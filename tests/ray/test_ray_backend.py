"""remote=True on a real 2-node Ray cluster: placement, rank environment, results, failures."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import ray_fns
from conftest import leftovers, node_of

from serverless_gpu import distributed
from serverless_gpu.common.errors import (
    CancelledError,
    DistributedError,
    DistributedTimeoutError,
    RankFailedError,
)
from serverless_gpu.wire.events import OutputLines, RankStarted, RunStatus

pytestmark = pytest.mark.usefixtures("cluster", "untracked")


def test_four_cpu_ranks_on_two_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVERLESS_GPU_TEST_CALLER_VAR", "set at call time")
    fn = distributed(gpus=4, gpu_type="cpu", remote=True, timeout=180)(
        ray_fns.placement_and_all_reduce
    )

    out = fn.distributed(8)

    assert [o["rank"] for o in out] == [0, 1, 2, 3], "results in global-rank order"
    assert [o["node_rank"] for o in out] == [0, 0, 1, 1]
    assert [o["group_rank"] for o in out] == [0, 0, 1, 1]
    assert [o["local_rank"] for o in out] == [0, 1, 0, 1]
    assert {o["local_world_size"] for o in out} == {2}
    assert {o["world_size"] for o in out} == {4}
    assert out[0]["node_id"] == out[1]["node_id"] != out[2]["node_id"] == out[3]["node_id"]
    assert {o["master"] for o in out} == {(out[0]["node_ip"], out[0]["master"][1])}
    assert {o["sum"] for o in out} == {1.0 + 2 + 3 + 4}, "gloo all-reduce over all 4 ranks"
    assert {o["caller_var"] for o in out} == {"set at call time"}
    assert {o["cuda_visible"] for o in out} <= {None, ""}, "CPU ranks are given no GPU by Ray"
    for rank, o in enumerate(out):
        assert o["tensor"].shape == (8 * 2**18,) and bool((o["tensor"] == rank).all())
    logs = out.run_dir / "logs"
    assert [(logs / f"rank_{r}.txt").read_text() for r in range(4)] == [
        f"rank {r} reduced 10\n" for r in range(4)
    ]
    assert leftovers() == ([], [])


def test_a_rank_on_node_one_raises_its_own_exception_quickly(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fn = distributed(gpus=4, gpu_type="cpu", remote=True, timeout=180)(ray_fns.node_one_raises)

    with pytest.raises(ray_fns.NodeOneFailure) as info:
        fn.distributed()

    raised_at = info.value.args[0]
    assert time.time() - raised_at < 5.0, "the failure reached the caller within 5 s"
    assert info.value.serverless_gpu_rank == 2  # type: ignore[attr-defined]
    remote = str(info.value.__cause__)
    assert "node_one_raises" in remote, "the rank's traceback is attached"
    for ours in ("rank_actor.py", "rank/main.py", "rank/become.py"):  # from the user's frame on
        assert ours not in remote, remote
    out = capsys.readouterr().out
    assert "serverless_gpu: rank 2 failed (NodeOneFailure: " in out, out
    assert leftovers() == ([], [])


def _start_and_wait_ready(fn: Any, ready_lines: int) -> tuple[Any, dict[int, str], list[Any]]:
    """Start the call; wait until ``ready_lines`` ranks printed where they run."""
    handle = fn.start()
    events: list[Any] = []
    handle.subscribe(events.append)
    nodes: dict[int, str] = {}
    deadline = time.monotonic() + 120
    while len(nodes) < ready_lines and time.monotonic() < deadline and not handle.wait(0.2):
        for e in events:
            if isinstance(e, OutputLines):
                for line in e.lines:
                    if line.startswith("ready "):
                        fields = dict(f.split("=") for f in line.split()[1:])
                        nodes[int(fields["rank"])] = fields["node"]
    assert len(nodes) == ready_lines, f"ranks did not start: {events}"
    return handle, nodes, events


def test_a_node_that_dies_fails_the_call_naming_ranks_and_node(cluster: Any) -> None:
    fn = distributed(gpus=4, gpu_type="cpu", remote=True, timeout=180)(ray_fns.report_then_block)
    handle, nodes, events = _start_and_wait_ready(fn, 4)

    removed = time.monotonic()
    cluster.remove_node(node_of(cluster, nodes[2]))
    with pytest.raises(RankFailedError) as info:
        handle.result(timeout=60)

    assert time.monotonic() - removed < 15.0
    text = str(info.value)
    assert "node 1 (127.0.0.1) died" in text and "ranks 2, 3" in text, text
    assert info.value.rank in (2, 3)
    started = [e for e in events if isinstance(e, RankStarted)]
    assert [e.node.split(" (")[0] for e in sorted(started, key=lambda e: e.rank)] == [
        "node 0",
        "node 0",
        "node 1",
        "node 1",
    ]
    assert leftovers() == ([], [])


def test_timeout_stops_every_rank() -> None:
    fn = distributed(gpus=4, gpu_type="cpu", remote=True, timeout=25)(ray_fns.sleep_forever)
    start = time.monotonic()

    with pytest.raises(DistributedTimeoutError):
        fn.distributed()

    assert time.monotonic() - start < 25 + 10
    assert leftovers() == ([], [])


def test_cancel_stops_every_rank() -> None:
    fn = distributed(gpus=4, gpu_type="cpu", remote=True, timeout=180)(ray_fns.report_then_block)
    handle, _nodes, _events = _start_and_wait_ready(fn, 4)

    cancelled = time.monotonic()
    handle.cancel("enough")
    with pytest.raises(CancelledError, match="enough"):
        handle.result(timeout=30)

    assert time.monotonic() - cancelled < 10
    assert handle.status is RunStatus.CANCELLED
    assert leftovers() == ([], [])


def test_more_ranks_than_the_cluster_holds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SERVERLESS_GPU_RAY_RESERVE_TIMEOUT", "4")
    fn = distributed(gpus=6, gpu_type="cpu", remote=True, timeout=60)(ray_fns.sleep_forever)

    handle = fn.start()
    with pytest.raises(DistributedError) as info:
        handle.result(timeout=60)

    text = str(info.value)
    assert "could not hold 6 ranks of 1 CPU each (6 CPU in all) within 4 s" in text, text
    assert "it has 4 CPU" in text, text
    said = (
        "serverless_gpu: waiting for the Ray cluster: 6 ranks of 1 CPU requested, 4 CPU free; "
        "no autoscaler to add nodes"
    )
    assert said in capsys.readouterr().out, "the wait was told while it lasted"
    assert leftovers() == ([], [])


def test_gpu_ranks_see_their_nodes_gpus_in_local_rank_order() -> None:
    """GPU bundles on nodes whose 2 GPUs are Ray resources only (no CUDA is touched)."""
    fn = distributed(gpus=4, remote=True, timeout=120)(ray_fns.visible_gpus)

    out = fn.distributed()

    for node in (out[0:2], out[2:4]):
        [visible] = {cvd for _local, cvd, _ids in node}
        assert len(visible.split(",")) == 2, "one GPU per rank of the node"
        for local_rank, cvd, ids in node:
            assert cvd.split(",")[local_rank] == ids[0], "cuda:LOCAL_RANK is the rank's own GPU"
    assert leftovers() == ([], [])


def test_keyboard_interrupt_stops_every_rank_and_is_reraised(tmp_path: Path) -> None:
    fn = distributed(gpus=4, gpu_type="cpu", remote=True, timeout=180)(ray_fns.report_then_block)

    def interrupt_once_ready() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            logs = [p.read_text() for p in (tmp_path / "runs").glob("*/logs/rank_*.txt")]
            if len(logs) == 4 and all("ready" in log for log in logs):
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.2)

    threading.Thread(target=interrupt_once_ready, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        fn.distributed()
    assert leftovers() == ([], [])


def test_gpu_type_is_asked_of_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """The nodes' GPUs have no type Ray recognised: no H100 bundle can be placed."""
    monkeypatch.setenv("SERVERLESS_GPU_RAY_RESERVE_TIMEOUT", "2")
    fn = distributed(gpus=2, gpu_type="H100", remote=True, timeout=60)(ray_fns.sleep_forever)

    with pytest.raises(DistributedError, match=r"accelerator_type:H100"):
        fn.distributed()
    assert leftovers() == ([], [])
