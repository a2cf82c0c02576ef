"""The state machines of DESIGN.md, checked as data."""

import pytest

from framework.states import (
    JOB_ACTIVE,
    JOB_CANCELLABLE,
    JOB_TERMINAL,
    JOB_TRANSITIONS,
    SUBTASK_TERMINAL,
    SUBTASK_TRANSITIONS,
    IllegalTransition,
    JobState,
    SubtaskState,
    check_job_transition,
    check_subtask_transition,
)

J, S = JobState, SubtaskState

# The diagram of DESIGN.md, edge by edge (plus pausing -> running: a resume
# that arrives before the pause completed).
DESIGN_JOB_EDGES = {
    (J.QUEUED, J.RUNNING), (J.RUNNING, J.SUCCEEDED), (J.RUNNING, J.PAUSING),
    (J.PAUSING, J.PAUSED), (J.PAUSING, J.RUNNING), (J.PAUSED, J.RESUMING),
    (J.RESUMING, J.RUNNING), (J.CANCELLING, J.REVERTING), (J.REVERTING, J.CANCELLED),
    (J.FAILED, J.REVERTING), (J.REVERTING, J.REVERTED), (J.QUEUED, J.FAILED),
    (J.RUNNING, J.FAILED),
    *((s, J.CANCELLING) for s in (J.QUEUED, J.RUNNING, J.PAUSING, J.PAUSED, J.RESUMING)),
}


def test_job_transitions_are_exactly_the_design_diagram():
    edges = {(a, b) for a, nxt in JOB_TRANSITIONS.items() for b in nxt}
    assert edges == DESIGN_JOB_EDGES


def test_terminal_states_have_no_way_out_and_everything_reaches_one():
    assert {J.SUCCEEDED, J.CANCELLED, J.REVERTED} == JOB_TERMINAL
    assert {S.SUCCEEDED, S.FAILED, S.CANCELLED} == SUBTASK_TERMINAL
    for start in JobState:
        seen, todo = set(), [start]
        while todo:
            s = todo.pop()
            if s not in seen:
                seen.add(s)
                todo.extend(JOB_TRANSITIONS[s])
        assert seen & JOB_TERMINAL, f"{start} can never finish"


def test_cancellable_and_active_sets():
    assert {J.QUEUED, J.RUNNING, J.PAUSING, J.PAUSED, J.RESUMING} == JOB_CANCELLABLE
    assert JOB_ACTIVE.isdisjoint(JOB_TERMINAL)
    assert set(JobState) == JOB_ACTIVE | JOB_TERMINAL


def test_a_failed_or_cancelled_subtask_never_becomes_succeeded():
    for dead in (S.FAILED, S.CANCELLED):
        with pytest.raises(IllegalTransition):
            check_subtask_transition(dead, S.SUCCEEDED)
    assert S.PENDING in SUBTASK_TRANSITIONS[S.RUNNING]  # released, resumable


@pytest.mark.parametrize("src,dst", [(J.SUCCEEDED, J.CANCELLING), (J.CANCELLED, J.RUNNING),
                                     (J.QUEUED, J.SUCCEEDED), (J.PAUSED, J.RUNNING)])
def test_illegal_job_transitions_raise(src, dst):
    with pytest.raises(IllegalTransition):
        check_job_transition(src, dst)


def test_store_guards_are_built_from_the_transition_maps():
    """The compare-and-set guards the stores run come from these maps, so the
    tests above test running code."""
    from framework.store import jobs, subtasks

    assert jobs._into(J.CANCELLING) == JOB_CANCELLABLE
    assert jobs._into(J.FAILED) == {J.QUEUED, J.RUNNING}
    assert jobs._into(J.REVERTING) == {J.CANCELLING, J.FAILED}
    assert subtasks.guard_into(S.SUCCEEDED) == "state IN ('running')"
    assert subtasks.guard_into(S.FAILED) == "state IN ('pending', 'running')"
    # A subtask is claimed from pending, or again from running once its lease expired.
    assert subtasks.guard_into(S.RUNNING) == "state IN ('pending', 'running')"
    assert subtasks._held(S.PENDING).endswith("state IN ('running')")
