"""Process groups formed ahead of the call (``warm_process_group``), in CPU mode over gloo.

A call of the same shape goes first in each test: its end makes the standby set that the call
under test takes, so that call starts with the set's group (``warm`` True at entry).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import warm_fns
from eventually import eventually

from serverless_gpu import distributed
from serverless_gpu.common.proctitle import is_launcher

OPTIONS: dict[str, Any] = {"gpus": 2, "timeout": 120, "tracking": False, "output": "none"}


def _after_a_call(fn: Any, **options: Any) -> Any:
    distributed(**OPTIONS)(warm_fns.warm).distributed()
    return distributed(**{**OPTIONS, **options})(fn)


def test_the_call_takes_the_warm_group_and_a_second_init_is_torchs_own() -> None:
    results = _after_a_call(warm_fns.init_use_destroy_twice).distributed()
    for rank, seen in enumerate(results):
        assert seen["warm"] is True
        assert seen["first"] == (rank, 2, "gloo", 2.0)
        assert not seen["first_store_is_master_port"]  # the group formed ahead of the call
        assert seen["after_destroy"] is False
        assert seen["second"] == (rank, 2, 2.0)
        assert seen["second_store_is_master_port"]  # MASTER_PORT is the call's, and free


def test_runtime_init_with_a_timeout_takes_the_group_with_that_timeout() -> None:
    results = _after_a_call(warm_fns.runtime_init_with_timeout).distributed()
    assert results == [{"warm": True, "timeout_s": 42.0, "taken": True, "sum": 2.0}] * 2


def test_an_init_with_a_store_of_its_own_drops_the_warm_group() -> None:
    results = _after_a_call(warm_fns.init_with_own_store).distributed()
    assert results == [{"warm": True, "store_is_master_port": True, "sum": 2.0}] * 2


def test_a_backend_that_disagrees_fails_as_it_does_without_the_warm_group() -> None:
    """nccl on CPU ranks: the warm gloo group is not handed over; torch's own error arrives."""
    with pytest.raises(Exception) as warm:
        _after_a_call(warm_fns.init_nccl).distributed()
    with pytest.raises(Exception) as cold:
        distributed(**OPTIONS, warm_process_group=False)(warm_fns.init_nccl).distributed()
    assert type(warm.value) is type(cold.value)
    assert str(warm.value).splitlines()[0] == str(cold.value).splitlines()[0]


def test_the_flight_recorder_counts_the_calls_collectives_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The group's warm-up all-reduce is not the user's: the hang doctor's ``#N`` counts from
    the call's first collective."""
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "100")
    fn = _after_a_call(warm_fns.last_collective_after_three)
    assert fn.distributed(str(tmp_path)) == ["gloo:all_reduce #3 (scheduled)"] * 2


def test_warm_process_group_false_starts_without_a_group() -> None:
    distributed(**OPTIONS)(warm_fns.warm).distributed()  # leaves a set with a group
    # One group of torch's own: two in a row on MASTER_PORT race in torch (warm_fns says how;
    # it failed so in CI with "Gloo connectFullMesh failed ... Connection closed by peer").
    fn = distributed(**OPTIONS, warm_process_group=False)(warm_fns.init_use_destroy)
    for seen in fn.distributed():
        assert seen["warm"] is False
        assert seen["first_store_is_master_port"]


def test_a_changed_nccl_setting_gets_fresh_ranks_then_warm_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NCCL and gloo read their settings once per process: a set formed under others cannot
    serve the call; the next set is formed under the new ones."""
    fn = _after_a_call(warm_fns.warm)
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    assert fn.distributed() == [False, False]
    assert fn.distributed() == [True, True]


def test_a_group_that_cannot_be_formed_leaves_the_call_without_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "no-such-interface0")
    fn = _after_a_call(warm_fns.warm)
    handle = fn.start()
    assert handle.result(timeout=60) == [False, False]
    for rank in (0, 1):
        assert "no process group made ahead of the call" in handle.logs(rank)


def test_results_come_back_before_the_ranks_teardown_and_the_next_call_waits_for_it() -> None:
    """The ranks' group shutdown (made to take 3 s here) runs after the results are back; the
    next call's ranks start only once those ranks are gone (their memory is free)."""
    pids = _after_a_call(warm_fns.slow_teardown).distributed(3.0)
    alive = [pid for pid in pids if psutil.pid_exists(pid)]
    assert alive == list(pids), "the results waited for the ranks' teardown"
    assert distributed(**OPTIONS)(warm_fns.gone).distributed(list(pids)) == [True, True]


def _launcher() -> psutil.Process:
    found = [p for p in psutil.Process().children() if is_launcher(p.cmdline())]
    assert len(found) == 1
    return found[0]


def _live_children(launcher: psutil.Process) -> list[int]:
    live = []
    for child in launcher.children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.status() != psutil.STATUS_ZOMBIE:
                live.append(child.pid)
    return live


def _results_folders() -> set[str]:
    root = f"/dev/shm/serverless-gpu-{os.getuid()}"
    names = os.listdir(root) if os.path.isdir(root) else []
    return {name for name in names if "init_all_reduce_destroy" in name}


def test_a_hundred_warm_calls_leak_nothing() -> None:
    fn = _after_a_call(warm_fns.init_all_reduce_destroy)
    assert fn.distributed() == [2.0, 2.0]
    launcher = _launcher()
    # The baseline with the next call's standby set formed (its pipes and sockets are the
    # launcher's descriptors too): on a busy machine it forms after the first call returns.
    eventually(lambda: len(_live_children(launcher)) == 2, "the standby set formed", timeout=60)
    fds, threads = launcher.num_fds(), launcher.num_threads()
    results = _results_folders()
    for _ in range(100):
        assert fn.distributed() == [2.0, 2.0]
    deadline = time.monotonic() + 30
    while len(children := _live_children(launcher)) != 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # the last call's ranks exit after its results
    assert len(children) == 2, children  # the next call's standby set, nothing else
    eventually(lambda: launcher.num_fds() <= fds, f"the launcher back to {fds} descriptors", 10)
    assert launcher.num_threads() == threads
    assert _results_folders() <= results  # every call's results folder was deleted


def test_a_rendezvous_environment_changed_by_the_function_gets_the_group_it_describes() -> None:
    """RANK, WORLD_SIZE, MASTER_PORT set in os.environ before init_process_group: torch forms
    the group they describe, so the warm group is dropped."""
    results = _after_a_call(warm_fns.init_a_group_of_ones_own).distributed()
    assert results == [(1, 1.0), (1, 2.0)]


def test_a_formed_groups_store_takes_no_new_connection_from_anyone(
    other_user: tuple[int, int],
) -> None:
    """Standby ranks wait with their group, perhaps for the caller's whole life: the store
    they formed it on stops listening once it is formed, so no process, another local user's
    included, can read or write its keys."""
    results = _after_a_call(warm_fns.store_reach).distributed(other_user)
    expected = {
        "warm": True,
        "connects": False,
        "other_user_connects": False,
        "keys_reachable": False,
        "group_works": True,
    }
    assert results == [expected, expected]
