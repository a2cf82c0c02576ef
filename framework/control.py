"""What a user can do to a submitted job: cancel, pause, resume, alter, and
read it back. Each is one compare-and-set on the job; a refused one raises
InvalidParams with a one-line reason, and changes nothing."""

from __future__ import annotations

from typing import Any

from framework.db import Database
from framework.jobtype import InvalidParams
from framework.states import JOB_CANCELLABLE, JOB_TERMINAL, JobState
from framework.store import jobs, progress

J = JobState


def _state_or_fail(db: Database, conn, job_id: int) -> JobState:
    state = jobs.state(db, conn, job_id)
    if state is None:
        raise InvalidParams(f"job {job_id} does not exist; `reorg status` lists jobs")
    return state


def cancel(db: Database, job_id: int) -> JobState:
    with db.begin() as conn:
        state = _state_or_fail(db, conn, job_id)
        if state in (J.CANCELLING, J.REVERTING) or (state is J.FAILED):
            return state  # already on its way back; cancelling twice is harmless
        if state not in JOB_CANCELLABLE:
            raise InvalidParams(f"job {job_id} already {state}; there is nothing to cancel")
        if jobs.transition(db, conn, job_id, JOB_CANCELLABLE, J.CANCELLING, actor="user",
                           detail="cancel requested") is None:
            raise InvalidParams(f"job {job_id} changed state meanwhile; try again")
    return J.CANCELLING


def pause(db: Database, job_id: int) -> JobState:
    with db.begin() as conn:
        state = _state_or_fail(db, conn, job_id)
        if state in (J.PAUSING, J.PAUSED):
            return state
        if state is not J.RUNNING:
            raise InvalidParams(f"job {job_id} is {state}; only a running job can be paused")
        if jobs.transition(db, conn, job_id, J.RUNNING, J.PAUSING, actor="user",
                           detail="pause requested") is None:
            raise InvalidParams(f"job {job_id} changed state meanwhile; try again")
    return J.PAUSING


def resume(db: Database, job_id: int) -> JobState:
    with db.begin() as conn:
        state = _state_or_fail(db, conn, job_id)
        if state in (J.RESUMING, J.RUNNING):
            return state
        if state is J.PAUSING:
            # Not paused yet: go straight back to running.
            moved = jobs.transition(db, conn, job_id, J.PAUSING, J.RUNNING, actor="user",
                                    detail="resume requested while pausing")
            if moved is not None:
                return J.RUNNING
        if state is not J.PAUSED:
            raise InvalidParams(f"job {job_id} is {state}; only a paused job can be resumed")
        if jobs.transition(db, conn, job_id, J.PAUSED, J.RESUMING, actor="user",
                           detail="resume requested") is None:
            raise InvalidParams(f"job {job_id} changed state meanwhile; try again")
    return J.RESUMING


def alter(db: Database, job_id: int, *, batch_rows: int | None = None,
          max_rows_per_sec: int | None = None, concurrency: int | None = None) -> None:
    """Change a live job's knobs. ``max_rows_per_sec=0`` removes the limit."""
    if batch_rows is None and max_rows_per_sec is None and concurrency is None:
        raise InvalidParams(
            "nothing to change; pass --batch-rows, --max-rows-per-sec or --concurrency"
        )
    for name, value in (("--batch-rows", batch_rows), ("--concurrency", concurrency)):
        if value is not None and value < 1:
            raise InvalidParams(f"{name} must be at least 1, got {value}")
    if max_rows_per_sec is not None and max_rows_per_sec < 0:
        raise InvalidParams("--max-rows-per-sec must be at least 0 (0 removes the limit)")
    with db.begin() as conn:
        state = _state_or_fail(db, conn, job_id)
        if state in JOB_TERMINAL or not jobs.alter(
            db, conn, job_id, batch_rows=batch_rows, max_rows_per_sec=max_rows_per_sec,
            concurrency=concurrency,
        ):
            raise InvalidParams(f"job {job_id} already {state}; only a live job can be altered")
        jobs.notify(db, conn)


def status(db: Database, job_id: int | None = None, limit: int = 20) -> list[dict[str, Any]]:
    with db.begin() as conn:
        if job_id is not None:
            _state_or_fail(db, conn, job_id)
        return progress.jobs_progress(db, conn, job_id, limit)


def events(db: Database, job_id: int) -> list[dict[str, Any]]:
    with db.begin() as conn:
        _state_or_fail(db, conn, job_id)
        return jobs.events(db, conn, job_id)
