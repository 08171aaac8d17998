"""The session fault matrix, driven from one caller process per situation (run by
``test_session_matrix.py`` and ``scripts/session_nccl_check.py``).

    python tests/sessions/session_matrix.py SITUATION ORIGIN[,ORIGIN...] [--device cpu|cuda]

SITUATION: ``first`` (the process's first session), ``after-call`` (a call of the session's
shape ran first), ``second`` (a session was opened and closed first). ORIGIN: where the
session's group comes from: ``pre-formed`` (standby ranks formed it), ``user`` (a cell calls
``init_process_group``), ``no-warm`` (``warm_process_group=False``, then as ``user``).

For each origin one session runs every fault in turn, each followed by a check cell (the
namespace intact, an all-reduce right); rank death goes last, as it ends the session. Prints
one ``CASE <json>`` line per case: ``{"situation", "origin", "fault", "ok", "detail", "s"}``.
Every cell is bounded (``CELL_S``): one that does not end fails its case with the ranks' stacks
(on stderr), and the origin's later faults are not run on that session.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from serverless_gpu import (
    CancelledError,
    RankFailedError,
    Session,
    SessionEndedError,
    WaitTimeoutError,
    distributed,
)

FAULTS = ("raise", "peer-raises", "interrupt", "cancel-in-collective", "destroy-reinit", "death")
PEER_FREED_S = 3.0
"""A peer blocked in a collective is freed within this (plus a cell's round trip)."""
WORLD = int(os.environ.get("SESSION_MATRIX_WORLD", "2"))
"""Ranks per session (``scripts/session_nccl_check.py``: one per visible GPU, at most 2)."""
REMOTE = os.environ.get("SESSION_MATRIX_REMOTE") == "1"
"""Sessions (and the calls before them) on the Ray cluster at ``RAY_ADDRESS`` (``remote=True``):
``tests/ray/test_ray_sessions.py``. There a ``pre-formed`` group is a standby set's: the actors
of a call of the session's shape, which formed the next call's group after it."""
PEER_FAULTS = ("peer-raises", "cancel-in-collective")
"""Faults that need a peer: skipped (and said so) with one rank."""
CELL_S = 45.0
"""The most a cell may take (a right one takes well under a second)."""
GRACE_S = 15.0
"""The sessions' grace: a rank not back this long after an interrupt ends the session (a
case failure); seconds under a loaded machine's worst, not its usual milliseconds."""
DRIVER_S = float(os.environ.get("SESSION_MATRIX_DRIVER_S", "280"))
"""Past this the driver prints its threads' stacks and exits (a hang outside any cell)."""


def _rank() -> int:
    return int(os.environ["RANK"])


def _backend(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def _init_code(device: str) -> str:
    if device == "cuda":
        return (
            "torch.cuda.set_device(r)\n"
            "dist.init_process_group('nccl', device_id=torch.device('cuda', r))"
        )
    return "dist.init_process_group('gloo')"


class Matrix:
    def __init__(self, situation: str, device: str) -> None:
        self.situation = situation
        self.device = device
        self.gpu_type: str | None = None if device == "cuda" else "cpu"
        # .item(): a CUDA collective is asynchronous, a peer waits for its value
        self.tensor = "torch.ones(1, device=dev)"
        self.value = "t.item()"

    def say(self, origin: str, fault: str, ok: bool, detail: str, took: float) -> None:
        case = {
            "situation": self.situation,
            "origin": origin,
            "fault": fault,
            "ok": ok,
            "detail": detail[:300],
            "s": round(took, 2),
        }
        print("CASE", json.dumps(case), flush=True)

    # -- the situation ------------------------------------------------------------------------

    def prepare(self) -> None:
        if self.situation == "after-call":
            _call(self.gpu_type)
        elif self.situation == "second":
            with Session(
                gpus=WORLD, gpu_type=self.gpu_type, tracking=False, name="before", remote=REMOTE
            ) as s:
                s.exec("x = 1")

    def open(self, origin: str) -> Session:
        options: dict[str, Any] = {}
        if origin == "pre-formed":
            _call(self.gpu_type) if REMOTE else _wait_prewarmed(self.gpu_type)
        elif origin == "no-warm":
            options["warm_process_group"] = False
        sess = Session(
            gpus=WORLD,
            gpu_type=self.gpu_type,
            tracking=False,
            name=origin,
            grace=GRACE_S,
            remote=REMOTE,
            **options,
        )
        try:
            self.begin(sess, origin)
        except BaseException:
            sess.close()  # its ranks would hold the devices the next origin needs
            raise
        return sess

    def begin(self, sess: Session, origin: str) -> None:
        dev = "torch.device('cuda', r)" if self.device == "cuda" else "'cpu'"
        _exec(
            sess,
            "import os, time, torch, torch.distributed as dist\n"
            "r = int(os.environ['RANK'])\n"
            f"dev = {dev}\n"
            "keep = {'rank': r}",
        )
        formed = _exec(sess, "dist.is_initialized()")
        if origin == "pre-formed":
            assert formed == [True] * WORLD, f"no pre-formed group: {formed}"
        else:  # where standby ranks formed one, the user's init takes it (as in a notebook)
            if origin == "no-warm":
                assert formed == [False] * WORLD, f"a group before the user's: {formed}"
            _exec(sess, _init_code(self.device))

    # -- the faults -----------------------------------------------------------------------------

    def check(self, sess: Session) -> None:
        """The namespace kept, and an all-reduce right."""
        code = f"t = {self.tensor}\ndist.all_reduce(t)\n({self.value}, keep['rank'])"
        got = _exec(sess, code)
        want = [(float(WORLD), r) for r in range(WORLD)]
        assert got == want, f"check cell gave {got}, wanted {want}"

    def run_fault(self, sess: Session, fault: str) -> str:
        return str(getattr(self, "fault_" + fault.replace("-", "_"))(sess) or "")

    def fault_raise(self, sess: Session) -> str:
        _expect(NameError, lambda: _exec(sess, "undefined_name"))
        self.check(sess)
        return ""

    def fault_peer_raises(self, sess: Session) -> str:
        start = time.monotonic()
        code = (
            f"if r == 1:\n    raise ValueError('boom')\n"
            f"t = {self.tensor}\ndist.all_reduce(t)\n{self.value}"
        )
        _expect(ValueError, lambda: _exec(sess, code))
        took = time.monotonic() - start
        assert took <= PEER_FREED_S + 2.0, f"the peer was freed after {took:.1f} s"
        self.check(sess)
        return f"peer freed in {took:.1f} s"

    def fault_interrupt(self, sess: Session) -> str:
        before = _entries(sess)
        handle = sess.start_exec("print('entered', flush=True)\ntime.sleep(60)")
        try:
            _entered(sess, before)
        finally:  # a cell left sleeping would hold the next ones back
            handle.cancel()
        _expect(CancelledError, lambda: _result(sess, handle))
        self.check(sess)
        return ""

    def fault_cancel_in_collective(self, sess: Session) -> str:
        code = (
            "print('entered', flush=True)\n"
            f"if r == 0:\n    t = {self.tensor}\n    dist.all_reduce(t)\n    {self.value}\n"
            "else:\n    time.sleep(60)"
        )
        before = _entries(sess)
        handle = sess.start_exec(code)
        try:
            _entered(sess, before)
        finally:
            start = time.monotonic()
            handle.cancel()
        _expect(CancelledError, lambda: _result(sess, handle))
        assert sess.alive, "the session ended"
        self.check(sess)
        return f"interrupted in {time.monotonic() - start:.1f} s"

    def fault_destroy_reinit(self, sess: Session) -> str:
        for _ in range(3):
            _exec(sess, "dist.destroy_process_group()")
            assert _exec(sess, "dist.is_initialized()") == [False] * WORLD
            _exec(sess, _init_code(self.device))
            self.check(sess)
        return "3 rounds"

    def fault_death(self, sess: Session) -> str:
        code = (
            f"if r == {WORLD - 1}:\n    os._exit(3)\n"
            f"t = {self.tensor}\ndist.all_reduce(t)\n{self.value}"
        )
        _expect(RankFailedError, lambda: _exec(sess, code))
        assert not sess.alive, "the session lives on without its rank"
        _expect(SessionEndedError, lambda: _exec(sess, "1"))
        return "ended"

    def run(self, origin: str) -> None:
        try:
            sess = self.open(origin)
        except Exception as exc:
            for fault in FAULTS:
                self.say(origin, fault, False, f"session did not open: {exc!r}", 0.0)
            return
        try:
            stuck = ""
            for fault in FAULTS:
                if stuck:  # its cells would queue behind the stuck one
                    self.say(origin, fault, False, f"not run: {stuck}", 0.0)
                elif not self.one(sess, origin, fault):
                    stuck = f"a cell of {fault!r} did not end"
        finally:
            sess.close()

    def one(self, sess: Session, origin: str, fault: str) -> bool:
        """Run one case; False when one of its cells did not end."""
        start = time.monotonic()
        if not sess.alive:
            self.say(origin, fault, False, "the session had ended before", 0.0)
            return True
        if WORLD == 1 and fault in PEER_FAULTS:
            self.say(origin, fault, True, "skipped: one rank has no peer", 0.0)
            return True
        ended = True
        try:
            detail, ok = self.run_fault(sess, fault), True
        except Exception as exc:
            detail, ok = f"{type(exc).__name__}: {exc}", False
            ended = not isinstance(exc.__cause__ or exc, WaitTimeoutError)
        self.say(origin, fault, ok, detail, time.monotonic() - start)
        return ended


def _expect(kind: type[BaseException], fn: Callable[[], object]) -> None:
    try:
        fn()
    except kind:
        return
    except BaseException as exc:
        raise AssertionError(f"wanted {kind.__name__}, got {type(exc).__name__}: {exc}") from exc
    raise AssertionError(f"wanted {kind.__name__}, got no error")


def _exec(sess: Session, code: str) -> list[Any]:
    """Run a cell, within ``CELL_S``: its values (a rank's error raised)."""
    return list(_result(sess, sess.start_exec(code)))


def _result(sess: Session, handle: Any) -> Any:
    """``handle``'s result within ``CELL_S``; past it the ranks' stacks go to stderr."""
    try:
        return handle.result(timeout=CELL_S)
    except WaitTimeoutError:
        print(f"a cell did not end within {CELL_S:g} s; the ranks' stacks:", file=sys.stderr)
        for rank, text in sorted(sess.stacks().items()):
            print(f"--- rank {rank}\n{text}", file=sys.stderr, flush=True)
        raise


def _entries(sess: Session) -> list[int]:
    """How often each rank printed "entered" so far."""
    return [sess.handle.logs(r).count("entered") for r in range(WORLD)]


def _entered(sess: Session, before: list[int]) -> None:
    """Every rank printed "entered" once more than ``before`` (bounded)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if all(now > was for now, was in zip(_entries(sess), before, strict=True)):
            return
        time.sleep(0.05)
    raise AssertionError("the ranks did not enter the cell within 30 s")


def _call(gpu_type: str | None) -> None:
    """A call of the session's shape (on Ray: its actors then wait for the next one)."""
    call = distributed(gpus=WORLD, gpu_type=gpu_type, tracking=False, remote=REMOTE)(_rank)
    assert list(call.distributed()) == list(range(WORLD))


def _wait_prewarmed(gpu_type: str | None) -> None:
    """A standby set of the session's shape with its group formed (``%load_ext``'s warm-up,
    or what the call or session before left)."""
    from serverless_gpu.api.prewarm import prewarm as _prewarm
    from serverless_gpu.backends.local import default_backend

    _prewarm(default_backend(), WORLD, gpu_type, tracking=False)
    import psutil

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if _standby_count(psutil) >= WORLD:
            return
        time.sleep(0.1)
    raise AssertionError("no standby ranks within 60 s")


def _standby_count(psutil: Any) -> int:
    count = 0
    for proc in psutil.Process().children(recursive=True):
        try:
            count += "standby" in " ".join(proc.cmdline())
        except psutil.Error:
            pass
    return count


def check_output(stdout: str, stderr: str, situation: str, origins: str) -> None:
    """For the tests that run this driver: every case of ``origins`` ran and passed (else the
    failed ones and the driver's stderr, where a stuck cell's stacks are)."""
    cases = [json.loads(x[5:]) for x in stdout.splitlines() if x.startswith("CASE ")]
    want = len(origins.split(",")) * len(FAULTS)
    assert len(cases) == want, f"{len(cases)} of {want} cases ran:\n{stdout}\n{stderr}"
    failed = [c for c in cases if not c["ok"]]
    table = "\n".join(f"{c['origin']:>10} {c['fault']:>20}: {c['detail']}" for c in failed)
    said = f"{len(failed)} of {len(cases)} cases failed ({situation}):\n{table}\n{stderr}"
    assert not failed, said


def main(argv: list[str]) -> int:
    faulthandler.dump_traceback_later(DRIVER_S, exit=True)
    situation, origins = argv[0], argv[1].split(",")
    device = "cuda" if "--device" in argv and argv[argv.index("--device") + 1] == "cuda" else "cpu"
    matrix = Matrix(situation, device)
    matrix.prepare()
    for origin in origins:
        matrix.run(origin)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
