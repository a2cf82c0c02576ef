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
from typing import TYPE_CHECKING, Any

from framework.db import Database
from framework.keys import Key, decode, encode
from framework.records import STEP_REVERT, Job
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


def _held(dst: SubtaskState) -> str:
    """Held by the caller's claim (``Claim.fence``: fenced on exec_id and
    epoch, DESIGN 2) and allowed to move to ``dst``."""
    return f"id = :id AND exec_id = :exec_id AND epoch = :epoch AND {guard_into(dst)}"


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


# A claim's takeovers, in its statement: one job event per job and node
# whose expired leases it ended (however many subtasks), naming where the
# first few resume.
_TAKEN_SHOWN = 5
_TAKEN_OVER_EVENTS = f"""
    INSERT INTO {{s}}.job_events (job_id, actor, from_state, to_state, detail)
    SELECT job_id, :actor, {_JOB}state, {_JOB}state,
           'took over ' || count(*) || CASE WHEN count(*) = 1 THEN ' subtask' ELSE ' subtasks' END
           || ' of node ' || taken_from || ' (its lease expired): '
           || array_to_string((array_agg('subtask ' || id || ' resumed from curr_key '
                                         || curr_key ORDER BY id))[1:{_TAKEN_SHOWN}], ', ')
           || CASE WHEN count(*) > {_TAKEN_SHOWN}
                   THEN ', and ' || (count(*) - {_TAKEN_SHOWN}) || ' more' ELSE '' END
    FROM claimed WHERE taken_from IS NOT NULL
    GROUP BY job_id, taken_from, {_JOB}state"""


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
                SELECT c.id, c.taken_from, job.room FROM (SELECT * FROM job WHERE room > 0
                                  ORDER BY priority DESC, id) job
                CROSS JOIN LATERAL (
                    -- taken_from: the node whose expired lease this claim ends.
                    SELECT st.id, CASE WHEN st.state = 'running' THEN st.exec_id END
                                      AS taken_from
                    FROM {{s}}.background_subtask st
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
                LIMIT :limit),
            claimed AS (
                UPDATE {{s}}.background_subtask st SET
                    state = 'running', exec_id = :exec_id,
                    exec_expired = clock_timestamp() + make_interval(secs => :ttl),
                    epoch = st.epoch + 1, attempts = st.attempts + 1,
                    started_at = coalesce(st.started_at, clock_timestamp()),
                    updated_at = clock_timestamp()
                FROM candidate, {{s}}.jobs j
                WHERE st.id = candidate.id AND j.id = st.job_id
                RETURNING st.id, st.job_id, CAST(st.start_key AS text) AS start_key,
                          CAST(st.end_key AS text) AS end_key,
                          CAST(st.curr_key AS text) AS curr_key, st.epoch,
                          st.attempts, st.meta, j.concurrency - candidate.room AS running_before,
                          candidate.taken_from, {_JOB_RETURNING}),
            taken_over AS ({_TAKEN_OVER_EVENTS})
            SELECT * FROM claimed"""),
        {"exec_id": exec_id, "ttl": db.settings.lease_seconds,
         "max_attempts": db.settings.max_attempts, "limit": limit, "sized_job": sized_job,
         "actor": f"worker {exec_id}"},
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


@dataclass(frozen=True)
class BatchDone:
    """One subtask's committed-to-be batch: where its checkpoint moves
    ``curr_key`` to, the rows the batch scanned, and its new meta (None: kept)."""

    claim: Claim
    curr_key: Key
    rows: int
    meta: dict[str, Any] | None = None


def checkpoint(db: Database, conn: Connection, done: list[BatchDone], *,
               count_running: bool = False) -> dict[int, Checkpointed]:
    """Advance ``curr_key`` of each subtask in ``done`` inside the transaction
    that wrote their batches (DESIGN 3): one statement, each row fenced on its
    own ``(id, exec_id, epoch)`` with its lease unexpired (DESIGN 2), never
    backward (DESIGN 6). The checkpoint that reaches ``end_key`` also
    finishes its subtask, in the same transaction. Returns each checkpointed
    subtask's state (with ``count_running``, and how many of its job's
    subtasks run now); a subtask missing from it has lost its lease, and the
    caller must roll the whole transaction back, since its write is in it."""
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
            RETURNING st.id, st.state,
                      CASE WHEN :count_running THEN {running_of("st.job_id")} END"""),
        {"ids": [d.claim.id for d in done], "epochs": [d.claim.epoch for d in done],
         "keys": [encode(d.curr_key) for d in done], "rows": [d.rows for d in done],
         "metas": [json.dumps(d.meta) if d.meta is not None else None for d in done],
         "exec_id": done[0].claim.exec_id, "count_running": count_running},
    ).all()
    return {r[0]: Checkpointed(r[1], r[2]) for r in rows}


def checkpoint_one(db: Database, conn: Connection, claim: Claim, curr_key: Key, rows: int,
                   meta: dict[str, Any] | None = None, *,
                   count_running: bool = True) -> Checkpointed | None:
    """``checkpoint`` of one subtask's batch; None when its lease is lost."""
    return checkpoint(db, conn, [BatchDone(claim, curr_key, rows, meta)],
                      count_running=count_running).get(claim.id)


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


def finished_of(db: Database, conn: Connection, claims: list[Claim]) -> set[int]:
    """Those of ``claims`` whose subtask succeeded under their epoch (in the
    live table, or moved to history since). A renewal that finds a held
    subtask no longer running asks this in a statement of its own: the
    renewal's snapshot predates a finishing commit it waited for."""
    if not claims:
        return set()
    rows = conn.execute(
        db.sql("""
            SELECT held.id FROM unnest(CAST(:ids AS bigint[]), CAST(:epochs AS bigint[]))
                AS held(id, epoch)
            WHERE EXISTS (SELECT 1 FROM {s}.background_subtask st
                          WHERE st.id = held.id AND st.epoch = held.epoch
                            AND st.state = 'succeeded')
               OR EXISTS (SELECT 1 FROM {s}.background_subtask_history h
                          WHERE h.id = held.id AND h.epoch = held.epoch
                            AND h.state = 'succeeded')"""),
        {"ids": [c.id for c in claims], "epochs": [c.epoch for c in claims]},
    )
    return {row[0] for row in rows}


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


def release_until_if_held(db: Database, conn: Connection, claim: Claim, note: str,
                          seconds: float) -> bool:
    """Hand the subtask back, not claimable for ``seconds`` (``NotReady``:
    what it needs is not there yet). Its attempt is given back, as a
    voluntary release's; ``note`` (what it waits for) shows as its error
    until it finishes."""
    return conn.execute(
        db.sql(f"""
            UPDATE {{s}}.background_subtask SET
                state = 'pending', exec_id = NULL, exec_expired = NULL, error = :note,
                attempts = greatest(attempts - 1, 0),
                not_before = clock_timestamp() + make_interval(secs => :seconds),
                updated_at = clock_timestamp()
            WHERE {_held(S.PENDING)}"""),
        {**claim.fence(), "note": note, "seconds": seconds},
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
    return int(conn.execute(
        db.sql(f"""
            WITH requeued AS (
                UPDATE {{s}}.background_subtask SET
                    state = 'pending', exec_id = NULL, exec_expired = NULL,
                    updated_at = clock_timestamp()
                WHERE exec_id = :exec_id AND {guard_into(S.PENDING)}
                RETURNING id, job_id, CAST(curr_key AS text) AS curr_key),
            noted AS (
                INSERT INTO {{s}}.job_events (job_id, actor, from_state, to_state, detail)
                SELECT r.job_id, :actor, j.state, j.state,
                       'node ' || :exec_id || ' restarted: handed back the '
                       || count(*) || CASE WHEN count(*) = 1 THEN ' subtask' ELSE ' subtasks' END
                       || ' its previous run held: '
                       || array_to_string((array_agg('subtask ' || r.id || ' resumes from '
                                                     || 'curr_key ' || r.curr_key
                                                     ORDER BY r.id))[1:{_TAKEN_SHOWN}], ', ')
                       || CASE WHEN count(*) > {_TAKEN_SHOWN}
                               THEN ', and ' || (count(*) - {_TAKEN_SHOWN}) || ' more'
                               ELSE '' END
                FROM requeued r JOIN {{s}}.jobs j ON j.id = r.job_id
                GROUP BY r.job_id, j.state)
            SELECT count(*) FROM requeued"""),
        {"exec_id": exec_id, "actor": f"worker {exec_id}"},
    ).scalar_one())
