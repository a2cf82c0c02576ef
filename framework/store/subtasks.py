"""Live subtask rows, the worker's side: claim, renew, checkpoint and finish
under a lease (the owner's side, per job step, is ``framework.store.steps``).

Worker writes are fenced on ``(id, exec_id, epoch)``; those that commit data
(checkpoint, finish) also require the lease to be unexpired by the database
clock. A write that hits 0 rows means the worker lost the subtask. Every
state guard is built from ``SUBTASK_TRANSITIONS`` (``guard_into``).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from framework.db import Database
from framework.jobtype import STEP_REVERT, Job
from framework.keys import Key, decode, encode
from framework.states import SubtaskState, subtask_sources
from framework.store.jobs import JOB_COLUMNS

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

S = SubtaskState

LEASE_LIVE = "exec_expired > clock_timestamp()"
# The claim's lower bound on ordinals when the owner has not marked the job's
# step (the smallest integer: ordinals are ``integer``).
NO_MARK = -2147483648
# The owner's claim mark of the job's step (``steps.mark_claim_from``), or
# NO_MARK when it marks another step or none. Binds ``job_id`` and ``step``.
CLAIM_MARK = (f"coalesce((SELECT claim_from FROM {{s}}.jobs WHERE id = :job_id "
              f"AND claim_from_step = :step), {NO_MARK})")


def running_of(job_id: str) -> str:
    """SQL: how many of the job's subtasks hold a live lease now (its
    concurrency and its rate budget are shared among them). ``job_id`` is a
    SQL expression, e.g. ``j.id`` or ``:job_id``."""
    return (f"(SELECT count(*) FROM {{s}}.background_subtask r WHERE r.job_id = {job_id} "
            f"AND r.state = 'running' AND r.exec_expired > clock_timestamp())")


def guard_into(dst: SubtaskState, *, user: bool = False) -> str:
    """The guard of every transition into ``dst``: the states the transition
    map (``framework.states.SUBTASK_TRANSITIONS``) lets reach it; ``user``:
    through the edges only a user's request takes (``reorg retry``)."""
    sources = sorted(subtask_sources(dst, user=user))
    return "state IN (" + ", ".join(f"'{s}'" for s in sources) + ")"


# How a statement binds a claim's fence (``Claim.fence``): by name, or by
# position in ``fenced_batch``'s checkpoint.
NAMED_FENCE = (":id", ":exec_id", ":epoch")


def _held(dst: SubtaskState, fence: tuple[str, str, str] = NAMED_FENCE) -> str:
    """Held by the caller's claim (fenced on exec_id and epoch, DESIGN 2) and
    allowed to move to ``dst``."""
    id_, exec_id, epoch = fence
    return f"id = {id_} AND exec_id = {exec_id} AND epoch = {epoch} AND {guard_into(dst)}"


@dataclass(frozen=True)
class Claim:
    id: int
    job_id: int
    start_key: Any  # framework.keys.Key, as SubtaskContext's
    end_key: Any
    curr_key: Any
    epoch: int
    attempts: int
    meta: dict[str, Any]
    exec_id: str
    job: Job

    def fence(self) -> dict[str, object]:
        return {"id": self.id, "exec_id": self.exec_id, "epoch": self.epoch}


_JOB = "jobrow_"  # prefix of the job's columns in a claim's row
# The job's columns in a claim's RETURNING; params as text, parsed once per
# job rather than once per claimed row.
_JOB_RETURNING = ", ".join(
    f"CAST(j.params AS text) AS {_JOB}params" if c.strip() == "params"
    else f"j.{c.strip()} AS {_JOB}{c.strip()}" for c in JOB_COLUMNS.split(","))


def claim(db: Database, conn: Connection, exec_id: str, limit: int = 1,
          sized_job: int | None = None) -> list[Claim]:
    """Claim up to ``limit`` subtasks: pending ones, or running ones whose lease
    has expired, of the first running jobs (by priority; a reverting job at
    STEP_REVERT counts as running) with room under their ``concurrency``, in
    range order. With ``sized_job``, ``limit`` is that job's (the one whose
    subtask times sized it) and any other job gives one subtask at most.

    Each job's candidates come from one ordered scan of the claimable index
    (job_id, step, ordinal), which stops after the rows it needs, however many
    subtasks the job has. It starts at the owner's mark of the step's first
    claimable ordinal, past the dead index entries finished subtasks leave
    until vacuum (``steps.mark_claim_from``). SKIP LOCKED lets many workers claim at once without
    queueing on each other; the epoch increment fences out whoever held a
    subtask before. The job's row comes back with each claim.
    """
    rows = conn.execute(
        db.sql(f"""
            WITH job AS (
                SELECT j.id, j.step, j.priority,
                       j.concurrency - {running_of("j.id")} AS room,
                       -- Nothing claimable lies below the owner's mark (see
                       -- steps.mark_claim_from); one of another step is stale.
                       CASE WHEN j.claim_from_step = j.step THEN j.claim_from
                            ELSE {NO_MARK} END AS claim_from
                FROM {{s}}.jobs j
                -- A reverting job's subtasks are claimable once its revert
                -- step began: they restore the table (DESIGN 13).
                WHERE (j.state = 'running'
                       OR j.state = 'reverting' AND j.step = {STEP_REVERT})
                  AND (j.run_on_node IS NULL OR j.run_on_node = :exec_id)),
            candidate AS (
                SELECT c.id, job.room FROM (SELECT * FROM job WHERE room > 0
                                  ORDER BY priority DESC, id) job
                CROSS JOIN LATERAL (
                    SELECT st.id FROM {{s}}.background_subtask st
                    WHERE st.job_id = job.id AND st.step = job.step
                      AND st.ordinal >= job.claim_from
                      AND st.{guard_into(S.RUNNING)}
                      AND (st.state = 'pending' OR st.exec_expired <= clock_timestamp())
                      AND (st.not_before IS NULL OR st.not_before <= clock_timestamp())
                      AND st.attempts < :max_attempts
                    ORDER BY st.ordinal
                    LIMIT least(CASE WHEN CAST(:sized_job AS bigint) IS NULL
                                          OR job.id = :sized_job THEN :limit ELSE 1 END,
                                job.room)
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
            RETURNING st.id, st.job_id, CAST(st.start_key AS text) AS start_key,
                      CAST(st.end_key AS text) AS end_key, CAST(st.curr_key AS text) AS curr_key,
                      st.epoch,
                      st.attempts, st.meta, j.concurrency - candidate.room AS running_before,
                      {_JOB_RETURNING}"""),
        {"exec_id": exec_id, "ttl": db.settings.lease_seconds,
         "max_attempts": db.settings.max_attempts, "limit": limit, "sized_job": sized_job},
    ).mappings().all()
    claimed = Counter(r["job_id"] for r in rows)
    # One Job per job, not per claimed row: a slot claims up to 32 quick
    # subtasks at once and this loop is most of a claim's Python time.
    jobs: dict[int, Job] = {}
    claims = []
    for row in sorted(rows, key=lambda r: (r["job_id"], r["id"])):  # range order
        job = jobs.get(row["job_id"])
        if job is None:
            columns = {k[len(_JOB):]: v for k, v in row.items() if k.startswith(_JOB)}
            job = jobs[row["job_id"]] = Job(
                **{**columns, "params": json.loads(columns["params"])},
                running=row["running_before"] + claimed[row["job_id"]])
        claims.append(Claim(
            id=row["id"], job_id=row["job_id"], start_key=decode(row["start_key"]),
            end_key=decode(row["end_key"]), curr_key=decode(row["curr_key"]),
            epoch=row["epoch"], attempts=row["attempts"], meta=row["meta"],
            exec_id=exec_id, job=job))
    return claims


def renew(db: Database, conn: Connection, claims: list[Claim]) -> dict[int, dict[str, Any]]:
    """Renew many leases in one statement. Returns, for each lease still held,
    its job's state and knobs (so ``reorg alter`` reaches running subtasks);
    a claim missing from the result is lost."""
    if not claims:
        return {}
    # The running count is taken once per job, not once per renewed row: a
    # node renews up to slots x 32 claimed quick subtasks at once, and each
    # count walks the job's running entries (dead ones too, until vacuum)
    # while the renewed rows stay locked.
    rows = conn.execute(
        db.sql(f"""
            WITH renewed AS (
                UPDATE {{s}}.background_subtask st SET
                    exec_expired = clock_timestamp() + make_interval(secs => :ttl)
                FROM unnest(CAST(:ids AS bigint[]), CAST(:epochs AS bigint[])) AS held(id, epoch)
                WHERE st.id = held.id AND st.epoch = held.epoch AND st.exec_id = :exec_id
                  AND st.state = 'running' AND st.{LEASE_LIVE}
                RETURNING st.id, st.job_id),
            job AS (
                SELECT j.id, j.state, j.batch_rows, j.max_rows_per_sec, j.concurrency,
                       j.max_replica_lag, j.max_active_sessions,
                       {running_of("j.id")} AS running
                FROM {{s}}.jobs j WHERE j.id IN (SELECT job_id FROM renewed))
            SELECT r.id, job.state AS job_state, job.batch_rows, job.max_rows_per_sec,
                   job.concurrency, job.max_replica_lag, job.max_active_sessions,
                   job.running
            FROM renewed r JOIN job ON job.id = r.job_id"""),
        {"ids": [c.id for c in claims], "epochs": [c.epoch for c in claims],
         "exec_id": claims[0].exec_id, "ttl": db.settings.lease_seconds},
    ).mappings()
    return {r["id"]: dict(r) for r in rows}


@dataclass(frozen=True)
class Checkpointed:
    state: str  # running, or succeeded: the checkpoint reached end_key
    # The job's subtasks under a live lease (its rate is shared among them);
    # None when not asked for (``count_running``: a job with no rate limit).
    running: int | None


def checkpoint(
    db: Database, conn: Connection, claim: Claim, curr_key: Key, rows: int,
    meta: dict[str, Any] | None = None, *, count_running: bool = True,
) -> Checkpointed | None:
    """Advance curr_key inside the transaction that wrote the batch (DESIGN 3).
    The checkpoint that reaches ``end_key`` also finishes the subtask, in the
    same transaction: no extra round trip per subtask. Returns the subtask's
    state after it and (with ``count_running``) how many of the job's
    subtasks run now, or None when the lease is lost.

    ``curr_key`` never moves backward (DESIGN 6): the statement refuses it.
    """
    row = conn.execute(
        db.sql(f"""
            {_checkpoint_update("CAST(:curr_key AS jsonb)", ":rows")}
            RETURNING state,
                      CASE WHEN :count_running THEN {running_of(":job_id")} END AS running"""),
        {**claim.fence(), "job_id": claim.job_id, "count_running": count_running,
         "curr_key": encode(curr_key), "rows": rows,
         "meta": json.dumps(meta) if meta is not None else None},
    ).mappings().first()
    return Checkpointed(**row) if row else None


def _checkpoint_update(new_key: str, rows: str, meta: str = "CAST(:meta AS jsonb)",
                       fence: tuple[str, str, str] = NAMED_FENCE) -> str:
    """``checkpoint``'s fenced UPDATE, without its RETURNING: ``new_key``
    (jsonb), ``rows`` and ``meta`` (jsonb, NULL: kept) are SQL, bound
    parameters or expressions of the statement it is part of. Binds
    ``fence`` (``id``, ``exec_id``, ``epoch``) and ``meta``."""
    return f"""
        UPDATE {{s}}.background_subtask SET
            curr_key = new.k, row_count = row_count + {rows},
            meta = coalesce({meta}, meta), updated_at = clock_timestamp(),
            state = CASE WHEN new.k = end_key THEN 'succeeded' ELSE state END,
            finished_at = CASE WHEN new.k = end_key THEN clock_timestamp() END,
            error = CASE WHEN new.k = end_key THEN NULL ELSE error END
        FROM (SELECT {new_key} AS k) new
        WHERE {_held(S.SUCCEEDED, fence)} AND {LEASE_LIVE}
          AND curr_key <= new.k AND new.k <= end_key"""


def checkpoint_in_statement(db: Database, claim: Claim, new_key: str,
                            rows: str) -> tuple[str, dict[str, Any]]:
    """``checkpoint`` as a data-modifying CTE of the batch's own statement
    (``new_key``: SQL of the stored key, jsonb; ``rows``: SQL of the rows),
    and the parameters it binds. The same fenced UPDATE in the same
    transaction (DESIGN 3), one round trip fewer: it returns the subtask's
    state, no row when the lease is lost (the caller must then roll the
    statement's writes back)."""
    sql = _checkpoint_update(new_key, rows) + " RETURNING state"
    return sql.replace("{s}", f'"{db.schema}"'), {**claim.fence(), "meta": None}


# The SQLSTATE ``fenced_batch`` raises when the batch's checkpoint is refused
# (migration 0017_fenced_batch).
LEASE_LOST_SQLSTATE = "RG001"


def fenced_batch(db: Database, claim: Claim) -> tuple[str, dict[str, Any]]:
    """A batch and its checkpoint as one statement, ``{s}.fenced_batch``
    (migration 0017; the statement for ``db.sql``): in autocommit, one
    transaction in one round trip. The caller binds ``batch`` (SQL binding ``$1``, ``$2``: the range), ``lo``,
    ``hi`` and ``new_key`` (the stored key); it returns ``written`` (the
    batch's row count, which the checkpoint adds) and ``subtask_state``, or
    raises with ``LEASE_LOST_SQLSTATE`` when the lease is lost, and the
    batch's rows roll back with it (DESIGN 2, 3)."""
    call = ("SELECT written, subtask_state FROM {s}.fenced_batch(:batch, :lo, :hi, "
            ":checkpoint, CAST(:new_key AS jsonb), :id, :exec_id, :epoch)")
    return call, {**claim.fence(), "checkpoint": _positional_checkpoint(db.schema)}


@lru_cache(maxsize=8)
def _positional_checkpoint(schema: str) -> str:
    """``fenced_batch``'s checkpoint: ``checkpoint``'s fenced UPDATE binding
    ``$1`` the rows, ``$2`` the new key, ``$3``-``$5`` the fence, built once
    per schema (it is sent with every batch)."""
    return (_checkpoint_update("$2", "$1", meta="NULL", fence=("$3", "$4", "$5"))
            + " RETURNING state").replace("{s}", f'"{schema}"')


@dataclass(frozen=True)
class BatchDone:
    """One subtask's batch in a transaction shared by several subtasks: where
    its checkpoint moves ``curr_key`` to, and the rows the batch wrote."""

    claim: Claim
    curr_key: Key
    rows: int
    meta: dict[str, Any] | None = None


def checkpoint_many(db: Database, conn: Connection, done: list[BatchDone]) -> dict[int, str]:
    """``checkpoint`` for the batches of several subtasks written in one
    transaction (quick subtasks, one batch each): one statement, each row
    fenced on its own ``(id, exec_id, epoch)`` with its lease unexpired, and
    finished when it reaches ``end_key``. Returns each checkpointed subtask's
    state; a subtask missing from it is lost, and the caller must roll the
    whole transaction back, since that subtask's write is in it (DESIGN 3)."""
    if not done:
        return {}
    rows = conn.execute(
        db.sql(f"""
            UPDATE {{s}}.background_subtask st SET
                curr_key = b.curr_key, row_count = st.row_count + b.rows,
                meta = coalesce(b.meta, st.meta), updated_at = clock_timestamp(),
                state = CASE WHEN b.curr_key = st.end_key THEN 'succeeded' ELSE st.state END,
                finished_at = CASE WHEN b.curr_key = st.end_key THEN clock_timestamp() END,
                error = CASE WHEN b.curr_key = st.end_key THEN NULL ELSE st.error END
            FROM unnest(CAST(:ids AS bigint[]), CAST(:epochs AS bigint[]),
                        CAST(:keys AS jsonb[]), CAST(:rows AS bigint[]),
                        CAST(:metas AS jsonb[])) AS b(id, epoch, curr_key, rows, meta)
            WHERE st.id = b.id AND st.exec_id = :exec_id AND st.epoch = b.epoch
              AND st.{guard_into(S.SUCCEEDED)} AND st.{LEASE_LIVE}
              AND st.curr_key <= b.curr_key AND b.curr_key <= st.end_key
            RETURNING st.id, st.state"""),
        {"ids": [d.claim.id for d in done], "epochs": [d.claim.epoch for d in done],
         "keys": [encode(d.curr_key) for d in done], "rows": [d.rows for d in done],
         "metas": [json.dumps(d.meta) if d.meta is not None else None for d in done],
         "exec_id": done[0].claim.exec_id},
    ).all()
    return {r[0]: r[1] for r in rows}


def none_pending(db: Database, conn: Connection, claim: Claim) -> bool:
    """No subtask of the claim's job (at its current step) waits to be
    claimed: the job's end is near (one index probe, once per subtask, from
    the owner's claim mark on like a claim).

    Not "none but this one is left": the last subtasks finish in concurrent
    transactions, each seeing the others still running, and none would wake
    the owner. Every subtask finishing after the last claim wakes it, at most
    one wake-up per slot running the job's tail."""
    return not conn.execute(
        db.sql(f"""
            SELECT EXISTS (SELECT 1 FROM {{s}}.background_subtask
                           WHERE job_id = :job_id AND step = :step
                             AND ordinal >= {CLAIM_MARK} AND state = 'pending')"""),
        {"job_id": claim.job_id, "step": claim.job.step},
    ).scalar()


def finish_if_held(db: Database, conn: Connection, claim: Claim) -> bool:
    """Mark the subtask succeeded; only a fully covered range can succeed."""
    return conn.execute(
        db.sql(f"""
            UPDATE {{s}}.background_subtask SET
                state = 'succeeded', finished_at = clock_timestamp(),
                updated_at = clock_timestamp(), error = NULL
            WHERE {_held(S.SUCCEEDED)} AND {LEASE_LIVE} AND curr_key = end_key"""),
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
            WHERE exec_id = :exec_id AND {guard_into(S.PENDING)}"""),
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
            WHERE exec_id = :exec_id AND {guard_into(S.PENDING)}"""),
        {"exec_id": exec_id},
    ).rowcount
