"""The run machine alone (``lifecycle/run_machine.py``): every way a run goes, without a
process, a socket or a clock. Time is what each test hands it."""

from __future__ import annotations

from typing import Any

from serverless_gpu.common.errors import RankFailure
from serverless_gpu.lifecycle.run_actions import (
    Action,
    AskStop,
    CaptureStacks,
    DrainOutput,
    Emit,
    Instant,
    Kill,
    Release,
    RequestStacks,
    SaveStacks,
    SendSpecs,
    Terminate,
)
from serverless_gpu.lifecycle.run_machine import RunMachine, RunPhase, Timing
from serverless_gpu.wire.events import RankFinished, RankStarted, RankState, RunFinished, RunStatus

T0 = 100.0


def at(seconds: float) -> Instant:
    """``seconds`` after the run's start (the wall clock 1000 s ahead of the monotonic one)."""
    return Instant(T0 + seconds, 1000.0 + T0 + seconds)


def machine(world: int = 2, exits: bool = True, **timing: Any) -> RunMachine:
    timing.setdefault("timeout", None)
    return RunMachine("run-1", world, Timing(**timing), at(0), reports_exits=exits)


def running(world: int = 2, exits: bool = True, **timing: Any) -> RunMachine:
    """A machine whose ranks all have their spec and run the function."""
    m = machine(world, exits, **timing)
    assert m.may_start() == [SendSpecs(False)]
    for rank in range(world):
        m.rank_started(rank, 4000 + rank, at(0.1))
    return m


def events(actions: list[Action]) -> list[Any]:
    return [a.event for a in actions if isinstance(a, Emit)]


def raised(rank: int, when: float) -> RankFailure:
    return RankFailure.reported(rank, 1000.0 + T0 + when, "raised", "ValueError", "boom")


def finished(actions: list[Action]) -> RunFinished:
    (end,) = [e for e in events(actions) if isinstance(e, RunFinished)]
    return end


# -- success ---------------------------------------------------------------------------------


def test_specs_go_once_and_a_rank_start_is_an_event() -> None:
    m = machine()
    assert m.may_start(warm=True) == [SendSpecs(True)]
    assert m.may_start() == []
    assert events(m.rank_started(1, 77, at(0.2), "node 0")) == [
        RankStarted("run-1", 1, 77, at(0.2).wall, "node 0")
    ]
    assert m.state(1) is RankState.RUNNING


def test_success_is_reported_when_every_rank_returned_before_their_exits() -> None:
    m = running()
    assert m.rank_done(0, "int", None, at(1)) == []
    out = m.rank_done(1, "int", None, at(2))
    assert out[0] == Release()
    assert out[1] == DrainOutput(0)  # each rank's output before its end
    assert [type(a) for a in out[1:]] == [DrainOutput, Emit, DrainOutput, Emit, Emit]
    assert [e.state for e in events(out)[:2]] == [RankState.DONE, RankState.DONE]
    assert finished(out) == RunFinished.succeeded("run-1", at(2).wall)
    assert m.finished
    # The ranks then exit on their own time; those not gone after the release grace are killed.
    assert m.rank_exited(0, 0, at(3)) == []
    assert m.tick(at(2 + 4.9)) == []
    assert m.tick(at(2 + 5.0)) == [Kill((1,))]
    assert m.rank_exited(1, -9, at(7.1)) == []
    assert m.all_exited


# -- a rank raises, a rank crashes -------------------------------------------------------------


def test_a_raise_stops_the_others_and_is_the_root_cause() -> None:
    m = running(3, grace=1.0)
    out = m.rank_done(1, "ValueError: boom", raised(1, 1), at(1))
    assert out == [Terminate((0, 2))]  # one that raised exits on its own
    assert m.phase is RunPhase.STOPPING and m.unfinished == (0, 2)
    m.rank_exited(1, 1, at(1.1))
    assert [e.state for e in events(m.rank_exited(0, -15, at(1.2)))] == [RankState.STOPPED]
    assert m.tick(at(1.9)) == []
    assert m.tick(at(2.0)) == [Kill((2,))]  # the grace is over: KILL what is left
    end = finished(m.rank_exited(2, -9, at(2.1)))
    assert (end.status, end.root_cause_rank, end.unfinished_ranks) == (
        RunStatus.FAILED,
        1,
        (0, 2),
    )
    assert "raised ValueError: boom" in end.message


def test_a_rank_past_its_code_finishes_reporting_before_a_peers_failure_stops_it() -> None:
    """Rank 0 returned and sends what it logged when rank 1 raises: it is not stopped until
    its answer is in (then as the others were), and it is not among the unfinished."""
    m = running(3, grace=1.0, report_s=5.0)
    assert m.rank_reporting(0, at(0.9)) == []
    out = m.rank_done(1, "ValueError: boom", raised(1, 1), at(1))
    assert out == [Terminate((2,))]
    m.rank_exited(1, 1, at(1.1))
    assert m.tick(at(2.0)) == [Kill((2,))]  # the reporting rank is not killed with the others
    m.rank_exited(2, -9, at(2.1))
    assert m.rank_done(0, "int", None, at(3)) == [Terminate((0,))]  # it has reported: now
    assert m.tick(at(3.9)) == []
    end = finished(m.rank_exited(0, -15, at(4.0)))
    assert (end.status, end.root_cause_rank, end.unfinished_ranks) == (RunStatus.FAILED, 1, (2,))
    assert m.ranks[0].state is RankState.DONE


def test_a_rank_that_does_not_finish_reporting_in_time_is_stopped_then() -> None:
    m = running(2, grace=1.0, report_s=5.0)
    m.rank_reporting(0, at(0.5))
    assert m.rank_done(1, "ValueError: boom", raised(1, 1), at(1)) == [Terminate(())]
    m.rank_exited(1, 1, at(1.1))
    assert m.tick(at(5.9)) == []
    assert m.tick(at(6.0)) == [Terminate((0,))]
    assert m.tick(at(7.0)) == [Kill((0,))]
    end = finished(m.rank_exited(0, -9, at(7.1)))
    assert end.unfinished_ranks == (0,)


def test_a_cancel_spares_a_reporting_rank_too_but_a_rank_in_its_code_is_stopped() -> None:
    m = running(2, grace=1.0, report_s=5.0)
    m.rank_reporting(1, at(0.5))
    assert m.cancel("cancelled by the user", at(1), force=True) == [Terminate((0,))]
    assert m.unfinished == (0,)


def test_a_crash_without_an_answer_fails_the_run_with_its_exit() -> None:
    m = running()
    out = m.rank_exited(0, -11, at(1))
    crash = events(out)[0]
    assert isinstance(crash, RankFinished)
    assert (crash.state, crash.exit_code, crash.signal_name) == (RankState.FAILED, -11, "SIGSEGV")
    assert Terminate((1,)) in out
    end = finished(m.rank_exited(1, -15, at(1.1)))
    assert (end.status, end.root_cause_rank) == (RunStatus.FAILED, 0)
    assert end.failures[0].signal_name == "SIGSEGV"


def test_the_first_failure_in_time_is_the_root_cause_not_the_first_seen() -> None:
    """A survivor's "connection reset" may be seen before the exit of the peer that crashed
    first: an exit code during a failure's stop is a failure of its own, ranked by time."""
    m = running()
    m.rank_done(1, "RuntimeError", raised(1, 2.0), at(2.0))
    m.rank_exited(1, 1, at(2.1))
    out = m.rank_exited(0, 3, at(2.2))
    assert events(out)[0].state is RankState.FAILED
    end = finished(out)
    assert [f.rank for f in end.failures] == [1, 0]


# -- timeout, cancel, grace ------------------------------------------------------------------


def test_a_timeout_takes_stacks_then_stops() -> None:
    m = running(timeout=10.0, capture_s=1.5)
    m.rank_done(1, "int", None, at(5))
    assert m.tick(at(9.9)) == []
    assert m.tick(at(10)) == [CaptureStacks((0, 1))]  # rank 1 has not exited yet
    assert m.phase is RunPhase.TAKING_STACKS
    assert m.tick(at(11.4)) == []
    out = m.tick(at(11.5))
    assert out == [SaveStacks(), Terminate((0, 1))]
    assert m.outcome.stop == (
        RunStatus.TIMED_OUT,
        "exceeded its timeout of 10 s; ranks still running: 0",
    )
    m.rank_exited(1, 0, at(11.6))
    end = finished(m.rank_exited(0, -15, at(11.7)))
    assert (end.status, end.unfinished_ranks) == (RunStatus.TIMED_OUT, (0,))


def test_stacks_in_early_end_the_wait() -> None:
    m = running(exits=False, timeout=1.0, capture_s=2.0, grace=0.0)
    m.tick(at(1))
    assert m.stacks_in(at(1.2))[:2] == [SaveStacks(), Terminate((0, 1))]


def test_stacks_taken_when_a_failure_cut_the_wait_short_are_saved_at_the_end() -> None:
    m = running(exits=False, timeout=1.0, capture_s=2.0)
    m.tick(at(1))
    m.rank_done(0, "ValueError", raised(0, 1.5), at(1.5))
    assert m.stopped and m.stacks_due is not None
    assert m.end(at(1.6))[0] == SaveStacks()


def test_a_timeout_before_any_rank_started_says_so_without_stacks_to_wait_for() -> None:
    m = machine(timeout=3.0)
    out = m.tick(at(3))
    assert out == [CaptureStacks(()), SaveStacks(), Terminate((0, 1))]
    assert m.outcome.stop is not None
    assert "before any rank started the function" in m.outcome.stop[1]


def test_a_cancel_asks_first_then_stops_when_stop_grace_is_over() -> None:
    m = running(stop_grace=5.0, grace=1.0)
    assert m.cancel("Ctrl-C", at(1)) == [AskStop((0, 1))]
    assert m.phase is RunPhase.ASKED
    assert m.tick(at(5.9)) == []
    assert m.tick(at(6)) == [Terminate((0, 1))]
    assert m.tick(at(7)) == [Kill((0, 1))]
    m.rank_exited(0, -9, at(7.1))
    end = finished(m.rank_exited(1, -9, at(7.1)))
    assert (end.status, end.message) == (RunStatus.CANCELLED, "Ctrl-C")


def test_ranks_that_return_when_asked_succeed_with_a_note() -> None:
    m = running(stop_grace=5.0)
    m.cancel("Ctrl-C", at(1))
    m.rank_done(0, "int", None, at(2))
    end = finished(m.rank_done(1, "int", None, at(2)))
    assert end.status is RunStatus.SUCCEEDED
    assert end.message == "stopped early (Ctrl-C); every rank returned"


def test_a_rank_that_exits_while_asked_is_part_of_the_cancel() -> None:
    m = running(stop_grace=5.0)
    m.cancel("Ctrl-C", at(1))
    out = m.rank_exited(0, 1, at(2))
    assert events(out)[0].state is RankState.STOPPED
    assert m.outcome.stop == (RunStatus.CANCELLED, "Ctrl-C") and not m.outcome.failures


def test_a_second_cancel_or_a_forced_one_stops_at_once() -> None:
    m = running(stop_grace=5.0)
    m.cancel("first", at(1))
    assert m.cancel("second", at(1.5)) == [Terminate((0, 1))]
    assert m.outcome.stop == (RunStatus.CANCELLED, "second")
    forced = running(stop_grace=5.0)
    assert forced.cancel("shutdown", at(1), force=True) == [Terminate((0, 1))]


def test_ranks_that_cannot_be_asked_are_stopped_now() -> None:
    m = running(stop_grace=5.0)
    m.cancel("Ctrl-C", at(1))
    assert m.ask_refused(at(1)) == [Terminate((0, 1))]
    assert m.asked is None and m.outcome.stop == (RunStatus.CANCELLED, "Ctrl-C")
    without_grace = running()
    assert without_grace.cancel("Ctrl-C", at(1)) == [Terminate((0, 1))]


def test_a_cancel_before_the_specs_stops_at_once() -> None:
    m = machine(stop_grace=5.0)
    assert m.cancel("Ctrl-C", at(0.5)) == [Terminate((0, 1))]
    assert m.may_start() == []


def test_stacks_wanted_are_the_live_ranks_and_change_nothing() -> None:
    m = machine()
    m.may_start()
    m.rank_started(1, 5, at(0.1))
    assert m.stacks_wanted() == [RequestStacks((1,))]
    assert m.phase is RunPhase.RUNNING


def test_a_run_that_fails_itself_reports_its_own_message() -> None:
    m = running()
    assert m.run_failed("could not write rank 0's log", at(1)) == [Terminate((0, 1))]
    m.rank_exited(0, -15, at(1.1))
    end = finished(m.rank_exited(1, -15, at(1.1)))
    assert (end.status, end.message) == (RunStatus.FAILED, "could not write rank 0's log")


# -- a transport without exits (Ray) ---------------------------------------------------------


def test_without_exits_each_answer_is_a_rank_end_and_the_backend_ends_the_run() -> None:
    m = running(exits=False)
    assert [e.state for e in events(m.rank_done(0, "int", None, at(1)))] == [RankState.DONE]
    assert events(m.rank_done(1, "int", None, at(1))) == [
        RankFinished("run-1", 1, RankState.DONE, None, None, at(1).wall, "int")
    ]
    assert not m.finished  # the results are still to be fetched
    assert finished(m.end(at(2), announce=(0, 1))).status is RunStatus.SUCCEEDED


def test_without_exits_a_lost_rank_fails_and_the_others_are_stopped_at_the_end() -> None:
    m = running(3, exits=False)
    m.rank_done(2, "int", None, at(0.5))
    lost = RankFailure.lost(1, at(1).wall, "was lost with its node")
    out = m.rank_lost(1, "was lost with its node", lost, at(1))
    assert events(out)[0].state is RankState.FAILED
    assert out[-1] == Terminate((0,))
    end_actions = m.end(at(2), announce=(0, 1, 2))
    assert [(e.rank, e.state) for e in events(end_actions)[:-1]] == [(0, RankState.STOPPED)]
    end = finished(end_actions)
    assert (end.status, end.root_cause_rank, end.unfinished_ranks) == (RunStatus.FAILED, 1, (0,))
    assert m.rank_lost(0, "killed", lost, at(3)) == []  # stopped, not running: not a failure


def test_without_exits_a_timeout_after_every_answer_still_stops_the_run() -> None:
    """Ray's results are fetched after the ranks answered: the timeout bounds that too."""
    m = running(exits=False, timeout=5.0)
    m.rank_done(0, "int", None, at(1))
    m.rank_done(1, "int", None, at(1))
    assert m.tick(at(5))[-1] == Terminate(())
    end = finished(m.end(at(6)))
    assert end.status is RunStatus.TIMED_OUT
    assert end.message == "exceeded its timeout of 5 s; ranks still running: none"


def test_ending_a_run_that_never_started_stops_its_ranks() -> None:
    m = machine(exits=False)
    m.run_failed("no room on the cluster", at(1))
    end = finished(m.end(at(2)))
    assert (end.status, end.message, end.unfinished_ranks) == (
        RunStatus.FAILED,
        "no room on the cluster",
        (0, 1),
    )


def test_a_session_is_one_long_run_whose_cells_do_not_touch_its_lifecycle() -> None:
    """A session's cells are messages of one call (``wire/session.py``): between them the
    ranks run, and the run ends like any other, here by its close (every rank returns)."""
    m = running(timeout=None)
    for second in range(1, 100):
        assert m.tick(at(second)) == []
    assert m.phase is RunPhase.RUNNING
    m.rank_done(0, "None", None, at(100))
    assert finished(m.rank_done(1, "None", None, at(100))).status is RunStatus.SUCCEEDED
