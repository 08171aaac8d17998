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
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from serverless_gpu import CancelledError, RankFailedError, Session, SessionEndedError, distributed

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
            grace=5.0,
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
        sess.exec(
            "import os, time, torch, torch.distributed as dist\n"
            "r = int(os.environ['RANK'])\n"
            f"dev = {dev}\n"
            "keep = {'rank': r}"
        )
        formed = list(sess.exec("dist.is_initialized()"))
        if origin == "pre-formed":
            assert formed == [True] * WORLD, f"no pre-formed group: {formed}"
        else:  # where standby ranks formed one, the user's init takes it (as in a notebook)
            if origin == "no-warm":
                assert formed == [False] * WORLD, f"a group before the user's: {formed}"
            sess.exec(_init_code(self.device))

    # -- the faults -----------------------------------------------------------------------------

    def check(self, sess: Session) -> None:
        """The namespace kept, and an all-reduce right."""
        code = f"t = {self.tensor}\ndist.all_reduce(t)\n({self.value}, keep['rank'])"
        got = list(sess.exec(code))
        want = [(float(WORLD), r) for r in range(WORLD)]
        assert got == want, f"check cell gave {got}, wanted {want}"

    def run_fault(self, sess: Session, fault: str) -> str:
        return str(getattr(self, "fault_" + fault.replace("-", "_"))(sess) or "")

    def fault_raise(self, sess: Session) -> str:
        _expect(NameError, lambda: sess.exec("undefined_name"))
        self.check(sess)
        return ""

    def fault_peer_raises(self, sess: Session) -> str:
        start = time.monotonic()
        code = (
            f"if r == 1:\n    raise ValueError('boom')\n"
            f"t = {self.tensor}\ndist.all_reduce(t)\n{self.value}"
        )
        _expect(ValueError, lambda: sess.start_exec(code).result(timeout=30))
        took = time.monotonic() - start
        assert took <= PEER_FREED_S + 2.0, f"the peer was freed after {took:.1f} s"
        self.check(sess)
        return f"peer freed in {took:.1f} s"

    def fault_interrupt(self, sess: Session) -> str:
        handle = sess.start_exec("print('entered', flush=True)\ntime.sleep(60)")
        _entered(sess)
        handle.cancel()
        _expect(CancelledError, lambda: handle.result(timeout=30))
        self.check(sess)
        return ""

    def fault_cancel_in_collective(self, sess: Session) -> str:
        code = (
            "print('entered', flush=True)\n"
            f"if r == 0:\n    t = {self.tensor}\n    dist.all_reduce(t)\n    {self.value}\n"
            "else:\n    time.sleep(60)"
        )
        handle = sess.start_exec(code)
        _entered(sess)
        start = time.monotonic()
        handle.cancel()
        _expect(CancelledError, lambda: handle.result(timeout=30))
        assert sess.alive, "the session ended"
        self.check(sess)
        return f"interrupted in {time.monotonic() - start:.1f} s"

    def fault_destroy_reinit(self, sess: Session) -> str:
        for _ in range(3):
            sess.exec("dist.destroy_process_group()")
            assert list(sess.exec("dist.is_initialized()")) == [False] * WORLD
            sess.exec(_init_code(self.device))
            self.check(sess)
        return "3 rounds"

    def fault_death(self, sess: Session) -> str:
        code = (
            f"if r == {WORLD - 1}:\n    os._exit(3)\n"
            f"t = {self.tensor}\ndist.all_reduce(t)\n{self.value}"
        )
        _expect(RankFailedError, lambda: sess.start_exec(code).result(timeout=30))
        assert not sess.alive, "the session lives on without its rank"
        _expect(SessionEndedError, lambda: sess.exec("1"))
        return "ended"

    def run(self, origin: str) -> None:
        try:
            sess = self.open(origin)
        except Exception as exc:
            for fault in FAULTS:
                self.say(origin, fault, False, f"session did not open: {exc!r}", 0.0)
            return
        try:
            for fault in FAULTS:
                self.one(sess, origin, fault)
        finally:
            sess.close()

    def one(self, sess: Session, origin: str, fault: str) -> None:
        start = time.monotonic()
        if not sess.alive:
            self.say(origin, fault, False, "the session had ended before", 0.0)
            return
        if WORLD == 1 and fault in PEER_FAULTS:
            self.say(origin, fault, True, "skipped: one rank has no peer", 0.0)
            return
        try:
            detail, ok = self.run_fault(sess, fault), True
        except Exception as exc:
            detail, ok = f"{type(exc).__name__}: {exc}", False
        self.say(origin, fault, ok, detail, time.monotonic() - start)


def _expect(kind: type[BaseException], fn: Callable[[], object]) -> None:
    try:
        fn()
    except kind:
        return
    except BaseException as exc:
        raise AssertionError(f"wanted {kind.__name__}, got {type(exc).__name__}: {exc}") from exc
    raise AssertionError(f"wanted {kind.__name__}, got no error")


def _entered(sess: Session) -> None:
    """Both ranks are in the cell (bounded)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ranks = range(WORLD)
        if all(sess.handle.logs(r).count("entered") > _entered_before(sess, r) for r in ranks):
            _seen[id(sess)] = {r: sess.handle.logs(r).count("entered") for r in ranks}
            return
        time.sleep(0.05)
    raise AssertionError("the ranks did not enter the cell within 30 s")


_seen: dict[int, dict[int, int]] = {}


def _entered_before(sess: Session, rank: int) -> int:
    return _seen.get(id(sess), {}).get(rank, 0)


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


def main(argv: list[str]) -> int:
    situation, origins = argv[0], argv[1].split(",")
    device = "cuda" if "--device" in argv and argv[argv.index("--device") + 1] == "cuda" else "cpu"
    matrix = Matrix(situation, device)
    matrix.prepare()
    for origin in origins:
        matrix.run(origin)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
