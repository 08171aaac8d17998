"""The session group's transition table, without processes: every path a cell can end by
lands in a state from which the next cell works."""

from __future__ import annotations

import pytest

from serverless_gpu.rank.group_state import (
    TABLE,
    GroupAction,
    GroupEvent,
    GroupState,
    cell_ended,
    step,
)

S, E, A = GroupState, GroupEvent, GroupAction


@pytest.mark.parametrize("state", [S.NONE, S.PRE_FORMED, S.USERS])
def test_a_failed_cell_with_a_group_shuts_it_at_once(state: GroupState) -> None:
    assert step(state, E.FAILED_WITH_GROUP) == (S.BROKEN, A.ABORT)


@pytest.mark.parametrize("state", [S.NONE, S.PRE_FORMED, S.USERS, S.BROKEN])
def test_every_rank_can_join_a_reform(state: GroupState) -> None:
    assert step(state, E.REFORM) == (S.REFORMING, A.FORM)
    assert step(S.REFORMING, E.REFORMED) == (S.USERS, A.NOTHING)
    assert step(S.REFORMING, E.REFORM_FAILED) == (S.BROKEN, A.ABORT)


def test_a_pre_formed_group_destroyed_by_the_user_hands_over_nothing_more() -> None:
    assert step(S.PRE_FORMED, E.OK_WITHOUT_GROUP) == (S.NONE, A.RELEASE)
    assert step(S.NONE, E.OK_WITH_GROUP) == (S.USERS, A.NOTHING)  # the user's init, later


def test_no_pair_is_left_out_but_the_impossible_ones() -> None:
    # Only a re-form ends in REFORMED / REFORM_FAILED, and a re-form runs no cell.
    ends = (E.REFORMED, E.REFORM_FAILED)
    impossible = {(s, e) for s in S for e in E if (s is S.REFORMING) != (e in ends)}
    assert {(s, e) for s in S for e in E} - set(TABLE) == impossible
    with pytest.raises(ValueError, match="not possible when re-forming"):
        step(S.REFORMING, E.OK_WITH_GROUP)


def test_a_cells_end_is_one_event() -> None:
    assert cell_ended(failed=True, group_up=True) is E.FAILED_WITH_GROUP
    assert cell_ended(failed=True, group_up=False) is E.FAILED_WITHOUT_GROUP
    assert cell_ended(failed=False, group_up=True) is E.OK_WITH_GROUP
    assert cell_ended(failed=False, group_up=False) is E.OK_WITHOUT_GROUP
