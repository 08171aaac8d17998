"""One run outcome for the launcher and the Ray backend: the root cause, every rank's failure
on the exception the caller gets, and one wording of each way a run ends."""

from __future__ import annotations

import io
import re
import signal
from pathlib import Path

import pytest

import serverless_gpu
from serverless_gpu.caller.console import ConsolePrinter
from serverless_gpu.caller.results import failure_exception
from serverless_gpu.common.errors import (
    DistributedTimeoutError,
    FailureKind,
    RankFailedError,
    RankFailure,
    attach_remote_context,
    exit_words,
    failures_of,
    rank_of,
    root_cause,
    run_dir_of,
    timeout_sentence,
    with_failures,
)
from serverless_gpu.wire.events import RankFinished, RankState, RunFinished, RunStatus
from serverless_gpu.wire.outcome import RunOutcome
from serverless_gpu.wire.runpaths import RunPaths

RUN = "run-1"


def _raised(rank: int, time: float, message: str, type_name: str = "ValueError") -> RankFailure:
    return RankFailure.reported(rank, time, FailureKind.RAISED, type_name, message)


def test_the_root_cause_is_the_first_failure_in_time_a_lost_peer_last() -> None:
    lost = _raised(0, 1.0, "[gloo] Connection closed by peer [127.0.0.1]:4242", "RuntimeError")
    crash = RankFailure.of_exit(1, 1.2, 1)
    later = _raised(0, 1.5, "bad labels")
    assert root_cause([lost, crash]) == crash
    assert root_cause([crash, lost]) == crash
    assert root_cause([later, crash]) == crash
    assert root_cause([lost]) == lost
    assert root_cause([]) is None


def test_failures_are_worded_once() -> None:
    assert exit_words(-signal.SIGKILL) == "was killed by SIGKILL"
    assert exit_words(3) == "exited with code 3"
    killed = RankFailure.of_exit(2, 1.0, -signal.SIGSEGV)
    assert (killed.kind, killed.signal_name, killed.text) == (
        FailureKind.KILLED,
        "SIGSEGV",
        "rank 2 was killed by SIGSEGV",
    )
    assert RankFailure.of_exit(0, 1.0, 0).message == "exited with code 0 without returning a result"
    raised = _raised(1, 1.0, "bad value\nsecond line")
    assert (raised.message, raised.detail) == (
        "raised ValueError: bad value",
        "ValueError: bad value",
    )
    sentence = timeout_sentence(1.5, (0, 2))
    assert sentence == "exceeded its timeout of 1.5 s; ranks still running: 0, 2"
    assert str(DistributedTimeoutError(1.5, (0, 2), run_dir=None)).endswith(sentence)


def test_a_failed_run_names_its_root_cause_first_and_keeps_every_failure() -> None:
    outcome = RunOutcome(RUN)
    outcome.rank_failed(_raised(1, 2.0, "second"))
    outcome.rank_failed(_raised(0, 1.0, "first"))
    outcome.stopped_for(RunStatus.FAILED)
    finished = outcome.finished((2,), 3.0)
    assert (finished.status, finished.root_cause_rank) == (RunStatus.FAILED, 0)
    assert finished.message == "rank 0 raised ValueError: first"
    assert finished.cause == "raised ValueError: first"
    assert [f.rank for f in finished.failures] == [0, 1]
    assert finished.unfinished_ranks == (2,)


def test_a_failure_of_the_run_itself_competes_by_time() -> None:
    early = RunOutcome(RUN)
    early.run_failed(1.0, "could not write rank 0's log")
    early.stopped_for(RunStatus.FAILED, "could not write rank 0's log")
    early.rank_failed(_raised(1, 2.0, "later"))
    finished = early.finished((), 3.0)
    assert (finished.root_cause_rank, finished.message) == (None, "could not write rank 0's log")
    assert [f.rank for f in finished.failures] == [1]
    late = RunOutcome(RUN)
    late.rank_failed(_raised(1, 1.0, "first"))
    late.stopped_for(RunStatus.FAILED)
    late.run_failed(2.0, "ignored: the run was stopped already")
    assert late.finished((), 3.0).root_cause_rank == 1


def test_a_stop_and_a_success_are_reported_in_their_words() -> None:
    stopped = RunOutcome(RUN)
    assert stopped.stopped_for(RunStatus.CANCELLED, "the user pressed Cancel")
    assert not stopped.stopped_for(RunStatus.FAILED)  # the first reason to stop stays
    finished = stopped.finished((0, 1), 2.0)
    assert (finished.status, finished.message) == (RunStatus.CANCELLED, "the user pressed Cancel")
    assert finished.root_cause is None and finished.cause == ""
    ok = RunOutcome(RUN).finished((), 2.0, "stopped early (x); every rank returned")
    assert (ok.status, ok.message, ok.failures) == (
        RunStatus.SUCCEEDED,
        "stopped early (x); every rank returned",
        (),
    )


def test_a_rank_failed_error_shows_the_other_failures() -> None:
    crash = RankFailure.of_exit(0, 1.0, -signal.SIGKILL)
    other = _raised(2, 1.5, "bad batch")
    err = with_failures(RankFailedError(crash, run_dir=Path("/runs/x")), (crash, other))
    assert str(err).splitlines()[0] == "rank 0 was killed by SIGKILL"
    assert str(err).endswith("\nother failures: rank 2 raised ValueError: bad batch")
    assert failures_of(err) == (crash, other)
    assert (rank_of(err), run_dir_of(err)) == (0, Path("/runs/x"))


def test_a_ranks_own_exception_carries_the_other_failures_in_a_note() -> None:
    first, other = _raised(1, 1.0, "boom"), RankFailure.of_exit(3, 1.1, 3)
    exc = attach_remote_context(ValueError("boom"), 1, "Traceback ...", Path("/runs/y"))
    exc = with_failures(exc, (first, other))
    assert "other failures: rank 3 exited with code 3" in exc.__notes__
    assert (rank_of(exc), run_dir_of(exc), failures_of(exc)) == (1, Path("/runs/y"), (first, other))
    assert (rank_of(KeyError("x")), run_dir_of(KeyError("x")), failures_of(KeyError())) == (
        None,
        None,
        (),
    )


def test_the_callers_exception_has_every_ranks_failure(tmp_path: Path) -> None:
    """The launcher's RunFinished to the caller's exception: each failure with its rank's log."""
    paths = RunPaths(tmp_path)
    crash, other = RankFailure.of_exit(1, 1.0, 3), RankFailure.of_exit(0, 1.2, -signal.SIGSEGV)
    finished = RunFinished.rank_failed(RUN, (other, crash), (), 2.0)
    ranks = {1: RankFinished(RUN, 1, RankState.FAILED, 3, None, 1.0)}
    err = failure_exception(finished, ranks, {1: "last line\n"}, paths, None)
    assert isinstance(err, RankFailedError) and (err.rank, err.exit_code) == (1, 3)
    assert "other failures: rank 0 was killed by SIGSEGV" in str(err)
    assert [(f.rank, f.log_path) for f in failures_of(err)] == [
        (1, paths.log(1)),
        (0, paths.log(0)),
    ]


def test_the_console_names_the_other_failures() -> None:
    out = io.StringIO()
    first, other = _raised(1, 1.0, "boom"), RankFailure.of_exit(0, 1.1, -signal.SIGKILL)
    ConsolePrinter(stream=out)(RunFinished.rank_failed(RUN, (other, first), (), 2.0))
    assert out.getvalue().splitlines() == [
        "serverless_gpu: run failed after 0.0 s: rank 1 raised ValueError: boom",
        "serverless_gpu: other failures: rank 0 was killed by SIGKILL",
    ]


def test_the_helpers_are_public() -> None:
    assert serverless_gpu.rank_of is rank_of
    assert serverless_gpu.run_dir_of is run_dir_of
    assert serverless_gpu.failures_of is failures_of
    assert "rank_of" in serverless_gpu.__all__ and "run_dir_of" in serverless_gpu.__all__


def test_no_display_only_state_on_the_wire() -> None:
    assert "cancelled" not in {s.value for s in RankState}


@pytest.mark.parametrize("kind", list(FailureKind))
def test_failure_kinds_read_as_their_value(kind: FailureKind) -> None:
    assert str(kind) == kind.value == f"{kind}"


def test_run_finished_is_built_only_by_its_named_constructors() -> None:
    """A positional ``RunFinished(...)`` outside its own module could word an outcome its own
    way; every backend and the launcher use ``succeeded`` / ``rank_failed`` / ``run_failed`` /
    ``stopped``."""
    import serverless_gpu.wire.events as events

    package = Path(events.__file__).parents[1]
    built = {
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path != Path(events.__file__) and re.search(r"(?<![.\w])RunFinished\(", path.read_text())
    }
    assert built == set()


def test_ranks_that_never_started_the_function_are_not_said_to_be_running() -> None:
    never = timeout_sentence(5, (), (0, 1, 2, 3))
    assert never.startswith(
        "exceeded its timeout of 5 s before any rank started the function: ranks 0, 1, 2, 3 "
        "were still starting (waiting for their devices"
    ), never
    assert "still running" not in never
    some = timeout_sentence(5, (0,), (1,))
    assert some.startswith("exceeded its timeout of 5 s; ranks still running: 0; ranks 1 were ")
    error = DistributedTimeoutError(5, (), starting=(0, 1), run_dir=None)
    assert "before any rank started the function" in str(error)
