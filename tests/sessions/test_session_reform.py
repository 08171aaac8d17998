"""A re-formed process group is formed in every rank before the cell runs (issue #42).

On a loaded machine, ``init_process_group`` of a re-form returned in rank 0 while rank 1 was
still in gloo's handshake; the cell then destroyed the group at once (the user's
``destroy_process_group`` + ``init_process_group``), closing the connection under rank 1, whose
re-form failed, and rank 0 waited for it in the new group's rendezvous until pytest's timeout.

The test makes that order certain instead of rare: rank 1's re-form ends late, only once rank 0
has moved on (it uses the re-form's store again: the barrier that ends a re-form, or it runs the
cell). Rank 0's cell says whether rank 1 had formed the group first.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from serverless_gpu import Session

GROUP = (
    "import torch, torch.distributed as dist\n"
    "from serverless_gpu import runtime\n"
    "if not dist.is_initialized():\n"
    "    runtime.init_process_group()\n"
)

TESTS = Path(__file__).resolve().parents[1]
"""Where ``eventually`` is, for the code a rank runs."""

LATE_PEER = """
import os, pathlib, sys
import torch.distributed as dist

sys.path.insert(0, {tests!r})
from eventually import eventually

_rank = int(os.environ["RANK"])
_moved_on = pathlib.Path({folder!r}) / "rank-0-moved-on"
_formed = pathlib.Path({folder!r}) / "rank-1-formed"
_real_store, _real_init = dist.FileStore, dist.init_process_group
_init_returned = []


class _Observed(dist.Store):
    # rank 0's store of the next re-form: used after init_process_group returned, rank 0 moved on
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def _used(self):
        if _init_returned:
            _moved_on.touch()

    def set(self, key, value):
        self._used()
        return self.inner.set(key, value)

    def get(self, key):
        self._used()
        return self.inner.get(key)

    def add(self, key, amount):
        self._used()
        return self.inner.add(key, amount)

    def wait(self, keys, *timeout):
        self._used()
        return self.inner.wait(keys, *timeout)

    def check(self, keys):
        return self.inner.check(keys)

    def compare_set(self, key, expected, desired):
        return self.inner.compare_set(key, expected, desired)

    def delete_key(self, key):
        return self.inner.delete_key(key)

    def num_keys(self):
        return self.inner.num_keys()

    def set_timeout(self, timeout):
        return self.inner.set_timeout(timeout)


def _observed_store(*args, **kwargs):
    dist.FileStore = _real_store  # the next re-form only
    store = _real_store(*args, **kwargs)
    return _Observed(store) if _rank == 0 else store


def _late_init(*args, **kwargs):
    dist.init_process_group = _real_init
    _real_init(*args, **kwargs)
    _init_returned.append(True)
    if _rank == 1:  # the rest of rank 1's re-form waits for rank 0 to move on (bounded)
        eventually(_moved_on.exists, "rank 0 moved on after its re-form", timeout=60)
        _formed.touch()


dist.FileStore = _observed_store
dist.init_process_group = _late_init
"""

DESTROY_AT_ONCE = (
    "if _rank == 0:\n"
    "    formed_first = _formed.exists()\n"
    "    _moved_on.touch()\n"
    "    assert formed_first, 'rank 0 ran the cell before rank 1 had formed the group'\n"
    "dist.destroy_process_group()\n"
)


def test_no_rank_runs_the_cell_before_every_rank_formed_the_re_formed_group(
    sess: Session, tmp_path: Path
) -> None:
    sess.exec(GROUP)
    sess.exec(LATE_PEER.format(folder=str(tmp_path), tests=str(TESTS)))
    with pytest.raises(KeyError):  # a failure with the group up: the next cell re-forms it
        sess.exec("if _rank == 1:\n    raise KeyError('rank 1 failed')")
    assert list(sess.exec(DESTROY_AT_ONCE)) == [None, None]
    total = sess.exec(
        "dist.init_process_group('gloo')\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()"
    )
    assert list(total) == [2.0, 2.0]


FAILING_PEER = """
import os
import torch.distributed as dist

_real_init = dist.init_process_group


def _failing_init(*args, **kwargs):
    dist.init_process_group = _real_init  # the next re-form only
    _real_init(*args, **kwargs)
    if os.environ["RANK"] == "1":
        raise RuntimeError("rank 1 could not form the group")


dist.init_process_group = _failing_init
"""


def test_a_re_form_that_fails_in_one_rank_fails_in_every_rank(
    sess: Session, tmp_path: Path
) -> None:
    sess.exec(GROUP)
    sess.exec(FAILING_PEER)
    with pytest.raises(KeyError):  # a failure with the group up: the next cell re-forms it
        sess.exec("if int(os.environ['RANK']) == 1:\n    raise KeyError('rank 1 failed')")
    ran = tmp_path / "ran"
    with pytest.raises(RuntimeError, match="could not form"):
        sess.exec(f"import pathlib\npathlib.Path({str(ran)!r}).touch()")
    assert not ran.exists()  # no rank ran the cell: rank 0 did not go on with a group alone
    assert list(sess.exec("dist.is_initialized()")) == [False, False]
    sess.exec(GROUP)
    assert list(sess.exec("t = torch.ones(1)\ndist.all_reduce(t)\nt.item()")) == [2.0, 2.0]
