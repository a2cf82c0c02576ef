"""Job and subtask state machines: states, allowed transitions, terminal states.

Job states (the owner drives the right-hand side, users the left)::

    queued ──► running ──► succeeded
      │           │ ▲
      │           ▼ │
      │        pausing ─► paused ─► resuming ─► running
      │           │
      ├──► cancelling ─► reverting ─► cancelled
      └──────────►failed ─► reverting ─► reverted

``cancelling`` may be entered from any live state (queued, running, pausing,
paused, resuming); ``failed`` from queued (prepare failed) or running (a
subtask failed for good). ``reverting`` remembers where it is going in the
job's ``revert_target`` column; while it lasts, the job's revert subtasks
(step ``framework.jobtype.STEP_REVERT``) are claimed and run like a running
job's (DESIGN 13), so for them ``reverting`` is the running state.

Subtask states::

    pending ──► running ──► succeeded
       ▲           │  ├───► failed ──► pending   (only `reorg retry`, see below)
       └───────────┘  └───► cancelled      (pending ──► cancelled or failed too)

A running subtask whose lease (``exec_expired``) has passed stays ``running``
but is claimable again; it resumes from ``curr_key``. A worker that releases a
subtask (pause, drain, retryable error) moves it back to ``pending``. A
pending subtask that has used its last attempt (its holder crashed and
restarted) is failed by the owner: claims skip it.

A job submitted with ``--on-failure pause`` pauses when a subtask fails for
good instead of rolling back; ``reorg retry`` then moves its failed subtasks
back to pending (attempts reset, ``curr_key`` kept) and resumes it. To
everything else a failed subtask is finished (``SUBTASK_TERMINAL``): only that
user request leaves it.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    RESUMING = "resuming"
    CANCELLING = "cancelling"
    FAILED = "failed"
    REVERTING = "reverting"
    SUCCEEDED = "succeeded"
    CANCELLED = "cancelled"
    REVERTED = "reverted"


class SubtaskState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


J = JobState
JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    J.QUEUED: frozenset({J.RUNNING, J.CANCELLING, J.FAILED}),
    J.RUNNING: frozenset({J.SUCCEEDED, J.PAUSING, J.CANCELLING, J.FAILED}),
    J.PAUSING: frozenset({J.PAUSED, J.RUNNING, J.CANCELLING}),
    J.PAUSED: frozenset({J.RESUMING, J.CANCELLING}),
    J.RESUMING: frozenset({J.RUNNING, J.CANCELLING}),
    J.CANCELLING: frozenset({J.REVERTING}),
    J.FAILED: frozenset({J.REVERTING}),
    J.REVERTING: frozenset({J.CANCELLED, J.REVERTED}),
    J.SUCCEEDED: frozenset(),
    J.CANCELLED: frozenset(),
    J.REVERTED: frozenset(),
}

S = SubtaskState
SUBTASK_TRANSITIONS: dict[SubtaskState, frozenset[SubtaskState]] = {
    S.PENDING: frozenset({S.RUNNING, S.FAILED, S.CANCELLED}),
    # running -> running: a subtask whose lease expired is claimed again.
    S.RUNNING: frozenset({S.RUNNING, S.PENDING, S.SUCCEEDED, S.FAILED, S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    # failed -> pending: `reorg retry` of a job paused on failure, nothing else.
    S.FAILED: frozenset({S.PENDING}),
    S.CANCELLED: frozenset(),
}
# Edges only a user's request takes; the framework treats their sources as finished.
SUBTASK_USER_EDGES = frozenset({(S.FAILED, S.PENDING)})

JOB_TERMINAL = frozenset(s for s, nxt in JOB_TRANSITIONS.items() if not nxt)
SUBTASK_TERMINAL = frozenset(
    s for s, nxt in SUBTASK_TRANSITIONS.items()
    if all((s, d) in SUBTASK_USER_EDGES for d in nxt)
)

# States a user may cancel from: every state that is neither finished nor
# already on its way back.
JOB_CANCELLABLE = frozenset(
    s for s, nxt in JOB_TRANSITIONS.items() if J.CANCELLING in nxt
)
# A job is "active" on its table from submit until it is terminal; only one
# active job per table is allowed.
JOB_ACTIVE = frozenset(JobState) - JOB_TERMINAL


class IllegalTransition(ValueError):
    pass


def check_job_transition(src: JobState | str, dst: JobState | str) -> None:
    if JobState(dst) not in JOB_TRANSITIONS[JobState(src)]:
        raise IllegalTransition(f"job cannot go from {src} to {dst}")


def subtask_sources(dst: SubtaskState, *, user: bool = False) -> frozenset[SubtaskState]:
    """The states a subtask may move to ``dst`` from: the framework's edges,
    or with ``user`` only the edges a user's request takes."""
    return frozenset(s for s, nxt in SUBTASK_TRANSITIONS.items()
                     if dst in nxt and ((s, dst) in SUBTASK_USER_EDGES) == user)


def check_subtask_transition(src: SubtaskState | str, dst: SubtaskState | str) -> None:
    if SubtaskState(dst) not in SUBTASK_TRANSITIONS[SubtaskState(src)]:
        raise IllegalTransition(f"subtask cannot go from {src} to {dst}")
