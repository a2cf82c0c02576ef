"""What a user can do to a submitted job: cancel, pause, resume, retry,
alter, and read it back (with the nodes that run it). Each change is one
compare-and-set on the job; a refused one raises InvalidParams with a
one-line reason, and changes nothing. Each change writes a job event naming
its ``actor``: the CLI passes the OS ``user@host`` of whoever ran the
command, the dashboard ``dashboard:<address>``; without one, this process's
(``local_actor``)."""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from framework.db import Database, SqlConnection, SqlDatabase
from framework.errors import InvalidParams
from framework.redact import redact_all
from framework.states import JOB_CANCELLABLE, JOB_TERMINAL, JobState
from framework.store import jobs, owner_lease, progress
from framework.store import nodes as node_store

if TYPE_CHECKING:
    from typing import TypeAlias

    from framework.directdb import DirectDatabase

    # The CLI's are psycopg's alone (framework.directdb), the dashboard's SQLAlchemy's.
    Tables: TypeAlias = Database | DirectDatabase

J = JobState


def local_actor() -> str:
    """``user@host`` of this process, as job events name a user's request."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no LOGNAME/USER (some containers)
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def _state_or_fail(db: SqlDatabase, conn: SqlConnection, job_id: int) -> JobState:
    state = jobs.state(db, conn, job_id)
    if state is None:
        raise InvalidParams(f"job {job_id} does not exist; `reorg status` lists jobs")
    return state


# A user transition: from the job's state, the CAS to try (None: refuse with the
# message), or the state to report without changing anything (already there).
_Cas = Callable[[SqlDatabase, SqlConnection, int], JobState | None]


def _request(db: Tables, job_id: int,
             decide: Callable[[JobState], _Cas | JobState | str]) -> JobState:
    """Read the state, let ``decide`` pick the compare-and-set, run it; a
    refusal or a lost race raises InvalidParams and changes nothing."""
    with db.begin() as conn:
        state = _state_or_fail(db, conn, job_id)
        choice = decide(state)
        if isinstance(choice, JobState):
            return choice
        if isinstance(choice, str):
            raise InvalidParams(choice)
        if choice(db, conn, job_id) is None:
            raise InvalidParams(f"job {job_id} changed state meanwhile; try again")
        return jobs.state(db, conn, job_id) or state


def cancel(db: Tables, job_id: int, *, actor: str | None = None) -> JobState:
    who = actor or local_actor()

    def decide(state: JobState) -> _Cas | JobState | str:
        if state in (J.CANCELLING, J.REVERTING, J.FAILED):
            return state  # already on its way back; cancelling twice is harmless
        if state not in JOB_CANCELLABLE:
            return f"job {job_id} already {state}; there is nothing to cancel"
        return lambda db, conn, job_id: jobs.request_cancel(db, conn, job_id, actor=who)

    return _request(db, job_id, decide)


def pause(db: Tables, job_id: int, *, actor: str | None = None) -> JobState:
    who = actor or local_actor()

    def decide(state: JobState) -> _Cas | JobState | str:
        if state in (J.PAUSING, J.PAUSED):
            return state
        if state is not J.RUNNING:
            return f"job {job_id} is {state}; only a running job can be paused"
        return lambda db, conn, job_id: jobs.request_pause(db, conn, job_id, actor=who)

    return _request(db, job_id, decide)


def resume(db: Tables, job_id: int, *, actor: str | None = None) -> JobState:
    who = actor or local_actor()

    def decide(state: JobState) -> _Cas | JobState | str:
        if state in (J.RESUMING, J.RUNNING):
            return state
        if state is J.PAUSING:  # not paused yet: straight back to running
            return lambda db, conn, job_id: jobs.resume_while_pausing(db, conn, job_id,
                                                                     actor=who)
        if state is not J.PAUSED:
            return f"job {job_id} is {state}; only a paused job can be resumed"
        return resume_unless_failed

    def resume_unless_failed(db: SqlDatabase, conn: SqlConnection, job_id: int) -> JobState | None:
        # Resumed as it is, it would pause on the same failure at once.
        # Imported here, by the two requests that read or change subtasks:
        # the reads (`reorg status`) would otherwise build its classes for nothing.
        from framework.store import steps

        if steps.has_failed(db, conn, job_id):
            raise InvalidParams(f"job {job_id} has failed subtasks; fix the cause, then "
                                f"`reorg retry {job_id}` re-queues them and resumes "
                                f"(or `reorg cancel {job_id}` rolls the job back)")
        return jobs.request_resume(db, conn, job_id, actor=who)

    return _request(db, job_id, decide)


def retry(db: Tables, job_id: int, *, actor: str | None = None) -> int:
    """Re-queue a paused job's failed subtasks (attempts reset, each from its
    checkpoint) and resume it; returns how many were re-queued. For a job
    submitted with ``--on-failure pause`` once the cause is fixed."""
    who = actor or local_actor()
    with db.begin() as conn:
        state = _state_or_fail(db, conn, job_id)
        if state is not J.PAUSED:
            hint = "; wait until it is paused" if state is J.PAUSING else ""
            raise InvalidParams(
                f"job {job_id} is {state}; only a paused job can be retried{hint}")
        from framework.store import steps  # as in resume

        requeued = steps.requeue_failed(db, conn, job_id)
        if not requeued:
            raise InvalidParams(f"job {job_id} has no failed subtasks to retry; "
                                f"`reorg resume {job_id}` resumes it")
        if jobs.request_retry(db, conn, job_id, actor=who,
                              detail=f"retry requested: {requeued} failed subtasks "
                                     "re-queued") is None:
            raise InvalidParams(f"job {job_id} changed state meanwhile; try again")
    return requeued


def alter(db: Tables, job_id: int, *, batch_rows: int | None = None,
          max_rows_per_sec: int | None = None, concurrency: int | None = None,
          max_replica_lag: float | None = None, max_active_sessions: int | None = None,
          actor: str | None = None) -> str:
    """Change a live job's knobs; returns what changed (``batch_rows=400,
    max_rows_per_sec=0``). A limit of 0 (``max_rows_per_sec``,
    ``max_replica_lag``, ``max_active_sessions``) removes it. The change and
    its job event (state unchanged, detail names the knobs) are one statement."""
    if all(v is None for v in (batch_rows, max_rows_per_sec, concurrency, max_replica_lag,
                               max_active_sessions)):
        raise InvalidParams(
            "nothing to change; pass --batch-rows, --max-rows-per-sec, --concurrency, "
            "--max-replica-lag or --max-active-sessions"
        )
    for name, value in (("--batch-rows", batch_rows), ("--concurrency", concurrency)):
        if value is not None and value < 1:
            raise InvalidParams(f"{name} must be at least 1, got {value}")
    for name, limit in (("--max-rows-per-sec", max_rows_per_sec),
                        ("--max-replica-lag", max_replica_lag),
                        ("--max-active-sessions", max_active_sessions)):
        if limit is not None and limit < 0:
            raise InvalidParams(f"{name} must be at least 0 (0 removes the limit), got {limit:g}")
    with db.begin() as conn:
        state = _state_or_fail(db, conn, job_id)
        detail = None if state in JOB_TERMINAL else jobs.alter(
            db, conn, job_id, batch_rows=batch_rows, max_rows_per_sec=max_rows_per_sec,
            concurrency=concurrency, max_replica_lag=max_replica_lag,
            max_active_sessions=max_active_sessions, actor=actor or local_actor(),
        )
        if detail is None:
            raise InvalidParams(f"job {job_id} already {state}; only a live job can be altered")
        jobs.notify(db, conn)
    said = detail.removeprefix("altered: ")  # what the job's event says
    if batch_rows is None and "batch_rows=" in said:
        # Resized though not given: the batch follows the limit (jobs.alter).
        said += " (none given: the type's default, at most one second of the limit)"
    return said


# A "throttled" note no worker has refreshed for this long is stale (its
# worker stopped or moved on): status shows it no more. Ten of the intervals
# a held slot refreshes it at (``throttle.HEALTH_INTERVAL_SECONDS``, 1 s),
# written out: importing the worker's throttle would cost every `reorg
# status` its classes (tests/unit/test_throttle.py holds the two together).
THROTTLED_NOTE_FRESH_SECONDS = 10.0


def throttled_now(job: dict[str, Any]) -> str | None:
    """What holds a running job's batches now, as a worker last noted it."""
    age = job.get("throttled_age")
    if job["state"] != J.RUNNING or not job.get("throttled") or age is None:
        return None
    return job["throttled"] if float(age) <= THROTTLED_NOTE_FRESH_SECONDS else None


def status(db: Tables, job_id: int | None = None,
           limit: int = 20) -> list[dict[str, Any]]:
    with db.begin() as conn:
        if job_id is not None:
            _state_or_fail(db, conn, job_id)
        found = progress.jobs_progress(db, conn, job_id, limit)
    for job in found:
        job["throttled"] = throttled_now(job)
        job.pop("throttled_age", None)
        # Shown to whoever reads status: a password in an expression or a URL
        # the job was given stays out of it, as out of errors and logs.
        job["params"] = redact_all(job["params"])
    return found


def nodes(db: Tables) -> list[dict[str, Any]]:
    """Every node: host, pid, slots, state, heartbeat age, running subtasks,
    and whether it is the owner (with the owner lease's revision)."""
    with db.begin() as conn:
        rows = node_store.list_all(db, conn)
        revision = cast(int, owner_lease.current(db, conn)["revision"])
    for r in rows:
        r["heartbeat_age"] = round(float(r["heartbeat_age"]), 1)
        r["is_owner"] = bool(r["is_owner"])
        r["owner_revision"] = revision if r["is_owner"] else None
    return rows


def events(db: Tables, job_id: int) -> list[dict[str, Any]]:
    with db.begin() as conn:
        _state_or_fail(db, conn, job_id)
        return jobs.events(db, conn, job_id)
