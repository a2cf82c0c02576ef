"""Live subtask rows: the owner inserts ranges; workers claim, renew,
checkpoint and finish them under a lease.

Worker writes are fenced on ``(id, exec_id, epoch)``; those that commit data
(checkpoint, finish) also require the lease to be unexpired by the database
clock. A write that hits 0 rows means the worker lost the subtask.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection

from framework.db import Database
from framework.jobtype import Job
from framework.states import SUBTASK_TRANSITIONS, SubtaskState
from framework.store.jobs import JOB_COLUMNS
from framework.store.owner_lease import FENCE, OwnerTerm

S = SubtaskState

_LEASE_LIVE = "exec_expired > clock_timestamp()"


def _from(dst: SubtaskState) -> str:
    """The guard of every transition into ``dst``: the states the transition
    map (``framework.states.SUBTASK_TRANSITIONS``) lets reach it."""
    sources = sorted(s for s, nxt in SUBTASK_TRANSITIONS.items() if dst in nxt)
    return "state IN (" + ", ".join(f"'{s}'" for s in sources) + ")"


def _held(dst: SubtaskState) -> str:
    """Held by the caller's claim (fenced on exec_id and epoch, DESIGN 2) and
    allowed to move to ``dst``."""
    return f"id = :id AND exec_id = :exec_id AND epoch = :epoch AND {_from(dst)}"


@dataclass(frozen=True)
class Claim:
    id: int
    job_id: int
    start_key: int
    end_key: int
    curr_key: int
    epoch: int
    attempts: int
    meta: dict[str, Any]
    exec_id: str
    job: Job

    def fence(self) -> dict[str, object]:
        return {"id": self.id, "exec_id": self.exec_id, "epoch": self.epoch}


# --- owner side -------------------------------------------------------------

def insert_ranges(
    db: Database, conn: Connection, term: OwnerTerm, job_id: int, step: int,
    ranges: list[tuple[int, int]], *, first_ordinal: int = 0,
    meta: dict[str, Any] | None = None,
) -> int:
    """Insert the ranges as pending subtasks, and count them into the job's
    ``subtasks_total`` in the same statement (``reorg status`` reads it)."""
    return int(conn.execute(
        db.sql(f"""
            WITH inserted AS (
                INSERT INTO {{s}}.background_subtask
                    (job_id, step, ordinal, state, start_key, end_key, curr_key, meta)
                SELECT :job_id, :step, :first + r.ordinal - 1, 'pending', r.lo, r.hi, r.lo,
                       CAST(:meta AS jsonb)
                FROM unnest(CAST(:los AS bigint[]), CAST(:his AS bigint[]))
                     WITH ORDINALITY AS r(lo, hi, ordinal)
                WHERE {FENCE}
                RETURNING 1),
            counted AS (
                UPDATE {{s}}.jobs SET subtasks_total = subtasks_total
                                                      + (SELECT count(*) FROM inserted)
                WHERE id = :job_id AND EXISTS (SELECT 1 FROM inserted))
            SELECT count(*) FROM inserted"""),
        {"job_id": job_id, "step": step, "los": [lo for lo, _ in ranges],
         "his": [hi for _, hi in ranges], "first": first_ordinal,
         "meta": json.dumps(meta or {}), **term.params()},
    ).scalar_one())


@dataclass(frozen=True)
class LastRange:
    """The highest range of a job step: where its coverage ends."""

    ordinal: int
    end_key: int
    catch_up_round: int  # 0 for the split's own ranges


def last_range(db: Database, conn: Connection, job_id: int, step: int) -> LastRange | None:
    """One probe of the (job_id, step, ordinal) index, live and history rows
    alike (ordinals grow with keys, so the last ordinal ends the coverage)."""
    row = conn.execute(
        db.sql("""
            SELECT ordinal, end_key, coalesce((meta->>'catch_up')::int, 0) AS catch_up_round
            FROM (
                (SELECT ordinal, end_key, meta FROM {s}.background_subtask
                 WHERE job_id = :job_id AND step = :step ORDER BY ordinal DESC LIMIT 1)
                UNION ALL
                (SELECT ordinal, end_key, meta FROM {s}.background_subtask_history
                 WHERE job_id = :job_id AND step = :step ORDER BY ordinal DESC LIMIT 1)
            ) last ORDER BY ordinal DESC LIMIT 1"""),
        {"job_id": job_id, "step": step},
    ).mappings().first()
    return LastRange(**row) if row else None


def first_error(db: Database, conn: Connection, job_id: int) -> str:
    """The error to show for a failed job: its first failed subtask's."""
    return conn.execute(
        db.sql("""
            SELECT 'subtask ' || ordinal || ': ' || coalesce(error, state)
            FROM {s}.background_subtask
            WHERE job_id = :id AND state IN ('failed', 'cancelled')
            ORDER BY (state = 'failed') DESC, ordinal LIMIT 1"""),
        {"id": job_id},
    ).scalar() or "a subtask failed"


@dataclass(frozen=True)
class StepSnapshot:
    """Which states one job step's subtasks are in, read in one statement (one
    snapshot). Each field is one probe of an index, not a count, so the owner's
    tick costs the same for 40 subtasks or 100,000."""

    pending: bool = False
    running: bool = False
    live_leases: bool = False
    succeeded: bool = False
    failed: bool = False
    cancelled: bool = False

    @property
    def unfinished(self) -> bool:
        return self.pending or self.running

    @property
    def all_succeeded(self) -> bool:
        """Every subtask succeeded, or there are none (an empty table)."""
        return not (self.unfinished or self.failed or self.cancelled)


def step_snapshot(db: Database, conn: Connection, job_id: int, step: int) -> StepSnapshot:
    def probe(cond: str, in_order: bool = False) -> str:
        # Pending rows can be nearly all of a job's: in ordinal order the probe
        # takes the claimable index to its first one, where the planner would
        # otherwise bet on a sequential scan finding one early.
        # (A scalar subquery: EXISTS would drop the ORDER BY.)
        order = " ORDER BY ordinal" if in_order else ""
        return (f"(SELECT ordinal FROM {{s}}.background_subtask WHERE job_id = :job_id "
                f"AND step = :step AND {cond}{order} LIMIT 1) IS NOT NULL")

    row = conn.execute(
        db.sql(f"""
            SELECT {probe("state = 'pending'", in_order=True)} AS pending,
                   {probe("state = 'running'", in_order=True)} AS running,
                   {probe(f"state = 'running' AND {_LEASE_LIVE}")} AS live_leases,
                   {probe("state = 'succeeded'")} AS succeeded,
                   {probe("state = 'failed'")} AS failed,
                   {probe("state = 'cancelled'")} AS cancelled"""),
        {"job_id": job_id, "step": step},
    ).mappings().one()
    return StepSnapshot(**row)


def succeeded_beyond(db: Database, conn: Connection, job_id: int, kept: int) -> bool:
    """More than ``kept`` succeeded subtasks of the job in the live table (an
    index walk of at most ``kept`` entries, not a count of them all)."""
    return conn.execute(
        db.sql("""
            SELECT (SELECT 1 FROM {s}.background_subtask
                    WHERE job_id = :job_id AND state = 'succeeded'
                    OFFSET :kept LIMIT 1) IS NOT NULL"""),
        {"job_id": job_id, "kept": kept},
    ).scalar() is True


def count_in_step(db: Database, conn: Connection, job_id: int, step: int) -> int:
    """How many subtasks a step has (live and moved): for the job's final event."""
    return int(conn.execute(
        db.sql("""
            SELECT (SELECT count(*) FROM {s}.background_subtask
                    WHERE job_id = :job_id AND step = :step)
                 + (SELECT count(*) FROM {s}.background_subtask_history
                    WHERE job_id = :job_id AND step = :step)"""),
        {"job_id": job_id, "step": step},
    ).scalar_one())


def fail_exhausted(
    db: Database, conn: Connection, term: OwnerTerm, job_id: int, max_attempts: int
) -> int:
    """Fail subtasks that used their last allowed attempt and are not being
    worked on: a running one whose lease expired, or a pending one (handed back
    after its holder crashed; claims skip it, so nothing else would end it)."""
    return conn.execute(
        db.sql(f"""
            UPDATE {{s}}.background_subtask SET
                state = 'failed', finished_at = clock_timestamp(), updated_at = clock_timestamp(),
                error = coalesce(error || '; ', '')
                        || CASE WHEN state = 'running' THEN 'lease expired'
                                ELSE 'holder restarted' END
                        || ' on attempt ' || attempts || ' of ' || :max_attempts
            WHERE job_id = :job_id AND attempts >= :max_attempts
              AND state IN ('pending', 'running')  -- subtask_exhausted's predicate
              AND {_from(S.FAILED)}
              AND (state = 'pending' OR exec_expired <= clock_timestamp())
              AND {FENCE}"""),
        {"job_id": job_id, "max_attempts": max_attempts, **term.params()},
    ).rowcount


def cancel_unleased(db: Database, conn: Connection, term: OwnerTerm, job_id: int) -> int:
    """Cancel every unfinished subtask no worker holds a live lease on."""
    return conn.execute(
        db.sql(f"""
            UPDATE {{s}}.background_subtask SET
                state = 'cancelled', finished_at = clock_timestamp(),
                updated_at = clock_timestamp()
            WHERE job_id = :job_id AND {_from(S.CANCELLED)}
              AND (state = 'pending' OR exec_expired IS NULL
                   OR exec_expired <= clock_timestamp())
              AND {FENCE}"""),
        {"job_id": job_id, **term.params()},
    ).rowcount


# --- worker side ------------------------------------------------------------

_JOB = "jobrow_"  # prefix of the job's columns in a claim's row


def claim(db: Database, conn: Connection, exec_id: str, limit: int = 1) -> list[Claim]:
    """Claim up to ``limit`` subtasks: pending ones, or running ones whose lease
    has expired, of the first running jobs (by priority) with room under their
    ``concurrency``, in range order.

    Each job's candidates come from one ordered scan of the claimable index
    (job_id, step, ordinal), which stops after the rows it needs, however many
    subtasks the job has. SKIP LOCKED lets many workers claim at once without
    queueing on each other; the epoch increment fences out whoever held a
    subtask before. The job's row comes back with each claim.
    """
    rows = conn.execute(
        db.sql(f"""
            WITH job AS (
                SELECT j.id, j.step, j.priority,
                       j.concurrency - (
                           SELECT count(*) FROM {{s}}.background_subtask r
                           WHERE r.job_id = j.id AND r.state = 'running'
                             AND r.exec_expired > clock_timestamp()) AS room
                FROM {{s}}.jobs j
                WHERE j.state = 'running'
                  AND (j.run_on_node IS NULL OR j.run_on_node = :exec_id)),
            candidate AS (
                SELECT c.id FROM (SELECT * FROM job WHERE room > 0
                                  ORDER BY priority DESC, id) job
                CROSS JOIN LATERAL (
                    SELECT st.id FROM {{s}}.background_subtask st
                    WHERE st.job_id = job.id AND st.step = job.step
                      AND st.{_from(S.RUNNING)}
                      AND (st.state = 'pending' OR st.exec_expired <= clock_timestamp())
                      AND (st.not_before IS NULL OR st.not_before <= clock_timestamp())
                      AND st.attempts < :max_attempts
                    ORDER BY st.ordinal
                    LIMIT least(:limit, job.room)
                    FOR UPDATE OF st SKIP LOCKED) c
                LIMIT :limit)
            UPDATE {{s}}.background_subtask st SET
                state = 'running', exec_id = :exec_id,
                exec_expired = clock_timestamp() + make_interval(secs => :ttl),
                epoch = st.epoch + 1, attempts = st.attempts + 1,
                started_at = coalesce(st.started_at, clock_timestamp()),
                updated_at = clock_timestamp()
            FROM candidate, {{s}}.jobs j
            WHERE st.id = candidate.id AND j.id = st.job_id
            RETURNING st.id, st.job_id, st.start_key, st.end_key, st.curr_key, st.epoch,
                      st.attempts, st.meta,
                      {", ".join(f"j.{c.strip()} AS {_JOB}{c.strip()}"
                                 for c in JOB_COLUMNS.split(","))}"""),
        {"exec_id": exec_id, "ttl": db.settings.lease_seconds,
         "max_attempts": db.settings.max_attempts, "limit": limit},
    ).mappings().all()
    claims = []
    for row in sorted(rows, key=lambda r: (r["job_id"], r["start_key"])):
        job = Job(**{k[len(_JOB):]: v for k, v in row.items() if k.startswith(_JOB)})
        fields = {k: v for k, v in row.items() if not k.startswith(_JOB)}
        claims.append(Claim(**fields, exec_id=exec_id, job=job))
    return claims


def renew(db: Database, conn: Connection, claims: list[Claim]) -> dict[int, dict[str, Any]]:
    """Renew many leases in one statement. Returns, for each lease still held,
    its job's state and knobs (so ``reorg alter`` reaches running subtasks);
    a claim missing from the result is lost."""
    if not claims:
        return {}
    rows = conn.execute(
        db.sql(f"""
            UPDATE {{s}}.background_subtask st SET
                exec_expired = clock_timestamp() + make_interval(secs => :ttl)
            FROM unnest(CAST(:ids AS bigint[]), CAST(:epochs AS bigint[])) AS held(id, epoch),
                 {{s}}.jobs j
            WHERE st.id = held.id AND st.epoch = held.epoch AND st.exec_id = :exec_id
              AND st.state = 'running' AND st.{_LEASE_LIVE} AND j.id = st.job_id
            RETURNING st.id, j.state AS job_state, j.batch_rows, j.max_rows_per_sec,
                      j.concurrency"""),
        {"ids": [c.id for c in claims], "epochs": [c.epoch for c in claims],
         "exec_id": claims[0].exec_id, "ttl": db.settings.lease_seconds},
    ).mappings()
    return {r["id"]: dict(r) for r in rows}


def checkpoint(
    db: Database, conn: Connection, claim: Claim, curr_key: int, rows: int,
    meta: dict[str, Any] | None = None,
) -> str | None:
    """Advance curr_key inside the transaction that wrote the batch (DESIGN 3).
    The checkpoint that reaches ``end_key`` also finishes the subtask, in the
    same transaction: no extra round trip per subtask. Returns the subtask's
    state after it (running or succeeded), or None when the lease is lost.

    ``curr_key`` never moves backward (DESIGN 6): the statement refuses it.
    """
    return conn.execute(
        db.sql(f"""
            UPDATE {{s}}.background_subtask SET
                curr_key = :curr_key, row_count = row_count + :rows,
                meta = coalesce(CAST(:meta AS jsonb), meta), updated_at = clock_timestamp(),
                state = CASE WHEN :curr_key = end_key THEN 'succeeded' ELSE state END,
                finished_at = CASE WHEN :curr_key = end_key THEN clock_timestamp() END,
                error = CASE WHEN :curr_key = end_key THEN NULL ELSE error END
            WHERE {_held(S.SUCCEEDED)} AND {_LEASE_LIVE}
              AND curr_key <= :curr_key AND :curr_key <= end_key
            RETURNING state"""),
        {**claim.fence(), "curr_key": curr_key, "rows": rows,
         "meta": json.dumps(meta) if meta is not None else None},
    ).scalar()


def finish_if_held(db: Database, conn: Connection, claim: Claim) -> bool:
    """Mark the subtask succeeded; only a fully covered range can succeed."""
    return conn.execute(
        db.sql(f"""
            UPDATE {{s}}.background_subtask SET
                state = 'succeeded', finished_at = clock_timestamp(),
                updated_at = clock_timestamp(), error = NULL
            WHERE {_held(S.SUCCEEDED)} AND {_LEASE_LIVE} AND curr_key = end_key"""),
        claim.fence(),
    ).rowcount == 1


def release_if_held(db: Database, conn: Connection, claim: Claim) -> bool:
    """Hand the subtask back at once (pause, cancel, drain) so another worker
    can continue without waiting for the lease to expire. A voluntary release
    does not use up an attempt."""
    return conn.execute(
        db.sql(f"""
            UPDATE {{s}}.background_subtask SET
                state = 'pending', exec_id = NULL, exec_expired = NULL,
                attempts = greatest(attempts - 1, 0), updated_at = clock_timestamp()
            WHERE {_held(S.PENDING)}"""),
        claim.fence(),
    ).rowcount == 1


def retry_later_if_held(
    db: Database, conn: Connection, claim: Claim, error: str, backoff_seconds: float
) -> bool:
    return conn.execute(
        db.sql(f"""
            UPDATE {{s}}.background_subtask SET
                state = 'pending', exec_id = NULL, exec_expired = NULL, error = :error,
                not_before = clock_timestamp() + make_interval(secs => :backoff),
                updated_at = clock_timestamp()
            WHERE {_held(S.PENDING)}"""),
        {**claim.fence(), "error": error, "backoff": backoff_seconds},
    ).rowcount == 1


def fail_if_held(db: Database, conn: Connection, claim: Claim, error: str) -> bool:
    return conn.execute(
        db.sql(f"""
            UPDATE {{s}}.background_subtask SET
                state = 'failed', error = :error, finished_at = clock_timestamp(),
                updated_at = clock_timestamp()
            WHERE {_held(S.FAILED)}"""),
        {**claim.fence(), "error": error},
    ).rowcount == 1


def release_all_held_by(db: Database, conn: Connection, exec_id: str) -> int:
    """A draining node hands back what it still holds (slots stuck past the
    drain timeout); like ``release`` this is voluntary and gives the attempt
    back. Clearing exec_id fences the stuck slots out."""
    return conn.execute(
        db.sql(f"""
            UPDATE {{s}}.background_subtask SET
                state = 'pending', exec_id = NULL, exec_expired = NULL,
                attempts = greatest(attempts - 1, 0), updated_at = clock_timestamp()
            WHERE exec_id = :exec_id AND {_from(S.PENDING)}"""),
        {"exec_id": exec_id},
    ).rowcount


def requeue_after_restart(db: Database, conn: Connection, exec_id: str) -> int:
    """A node restarting with the same id hands back at once what its previous
    incarnation held, instead of letting the leases run out. That incarnation
    died mid-attempt, so the attempt counts (a subtask that kills its worker
    must not be retried forever); one on its last attempt is failed by the
    owner (``fail_exhausted``). Clearing exec_id fences the old incarnation out."""
    return conn.execute(
        db.sql(f"""
            UPDATE {{s}}.background_subtask SET
                state = 'pending', exec_id = NULL, exec_expired = NULL,
                updated_at = clock_timestamp()
            WHERE exec_id = :exec_id AND {_from(S.PENDING)}"""),
        {"exec_id": exec_id},
    ).rowcount
