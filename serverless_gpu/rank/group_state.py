"""The states of a session rank's default process group and the one table that moves them.

Pure: no torch, no processes (``tests/sessions/test_group_state.py`` checks the table). The rank's
owner (``rank/session_group.py``) feeds it what a cell's end looked like and carries out the
action it returns; every way a cell can end badly (it raised, it was interrupted or cancelled,
a peer's failure broke a collective under it) is the one event ``FAILED_WITH_GROUP``: the group
may be half-way through a collective, so it is shut at once (its peers blocked in a collective
raise) and a new generation is formed before the next cell, in every rank together.

A rank's death is not in the table: the rank is gone, its run ends, and with it the session.
"""

from __future__ import annotations

from enum import Enum


class GroupState(Enum):
    NONE = "none"
    """No default group: the session started without one, or the user destroyed it."""
    PRE_FORMED = "pre-formed"
    """Formed before the session (standby ranks): the user's ``init_process_group`` takes it."""
    USERS = "formed"
    """Formed in a cell (by the user, or re-formed by us after a failure): torch's own."""
    BROKEN = "broken"
    """Shut after a failed cell; every rank forms the next generation before the next cell."""
    REFORMING = "re-forming"
    """Forming the next generation, at the start of a cell."""


class GroupEvent(Enum):
    OK_WITH_GROUP = "a cell ended with a default group up"
    OK_WITHOUT_GROUP = "a cell ended with no default group"
    FAILED_WITH_GROUP = "a cell failed (raised, interrupted, cancelled) with a group up"
    FAILED_WITHOUT_GROUP = "a cell failed with no default group"
    REFORM = "the caller asks for the next generation"
    REFORMED = "the next generation is formed"
    REFORM_FAILED = "the next generation could not be formed (in any rank: all take it)"


class GroupAction(Enum):
    NOTHING = "nothing"
    RELEASE = "drop the pre-formed group's hand-over: torch's own functions from now on"
    ABORT = "shut the group now: peers blocked in a collective raise"
    FORM = "form the next generation on a file store, ended by a barrier of every rank"


S, E, A = GroupState, GroupEvent, GroupAction

TABLE: dict[tuple[GroupState, GroupEvent], tuple[GroupState, GroupAction]] = {
    (S.NONE, E.OK_WITH_GROUP): (S.USERS, A.NOTHING),  # the user's init_process_group
    (S.NONE, E.OK_WITHOUT_GROUP): (S.NONE, A.NOTHING),
    (S.NONE, E.FAILED_WITH_GROUP): (S.BROKEN, A.ABORT),  # formed in the cell that failed
    (S.NONE, E.FAILED_WITHOUT_GROUP): (S.NONE, A.NOTHING),
    (S.PRE_FORMED, E.OK_WITH_GROUP): (S.PRE_FORMED, A.NOTHING),
    (S.PRE_FORMED, E.OK_WITHOUT_GROUP): (S.NONE, A.RELEASE),  # the user destroyed it
    (S.PRE_FORMED, E.FAILED_WITH_GROUP): (S.BROKEN, A.ABORT),
    (S.PRE_FORMED, E.FAILED_WITHOUT_GROUP): (S.NONE, A.RELEASE),
    (S.USERS, E.OK_WITH_GROUP): (S.USERS, A.NOTHING),
    (S.USERS, E.OK_WITHOUT_GROUP): (S.NONE, A.NOTHING),  # the user destroyed it
    (S.USERS, E.FAILED_WITH_GROUP): (S.BROKEN, A.ABORT),
    (S.USERS, E.FAILED_WITHOUT_GROUP): (S.NONE, A.NOTHING),
    (S.BROKEN, E.REFORM): (S.REFORMING, A.FORM),
    # A broken rank asked to run a cell without a re-form (its peers had no group): it stays
    # without one, as they are.
    (S.BROKEN, E.OK_WITHOUT_GROUP): (S.NONE, A.NOTHING),
    (S.BROKEN, E.OK_WITH_GROUP): (S.USERS, A.NOTHING),
    (S.BROKEN, E.FAILED_WITHOUT_GROUP): (S.BROKEN, A.NOTHING),
    (S.BROKEN, E.FAILED_WITH_GROUP): (S.BROKEN, A.ABORT),
    (S.REFORMING, E.REFORMED): (S.USERS, A.NOTHING),
    (S.REFORMING, E.REFORM_FAILED): (S.BROKEN, A.ABORT),
    # Every rank re-forms when any had a group: one that had none joins the new generation.
    (S.NONE, E.REFORM): (S.REFORMING, A.FORM),
    (S.PRE_FORMED, E.REFORM): (S.REFORMING, A.FORM),
    (S.USERS, E.REFORM): (S.REFORMING, A.FORM),
}


def step(state: GroupState, event: GroupEvent) -> tuple[GroupState, GroupAction]:
    """The next state and what to do; ``ValueError`` for a pair the table does not allow."""
    try:
        return TABLE[(state, event)]
    except KeyError:
        why = f"process group: {event.value} is not possible when {state.value}"
        raise ValueError(why) from None


def cell_ended(failed: bool, group_up: bool) -> GroupEvent:
    """The event a cell's end is, whatever ended it."""
    if failed:
        return GroupEvent.FAILED_WITH_GROUP if group_up else GroupEvent.FAILED_WITHOUT_GROUP
    return GroupEvent.OK_WITH_GROUP if group_up else GroupEvent.OK_WITHOUT_GROUP
