"""Moving finished subtasks to ``background_subtask_history``, and retention.

The move is one DELETE ... RETURNING feeding an INSERT and the job's counters,
so a subtask is in exactly one of the two tables, and counted once, whatever
moment the owner dies at (DESIGN 10). Succeeded subtasks move while their job
runs, which keeps the live table to the work still to do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from framework.db import Database, SqlConnection, SqlDatabase
from framework.records import STEP_REVERT
from framework.states import JOB_TERMINAL
from framework.store.owner_lease import FENCE, OwnerTerm

if TYPE_CHECKING:  # `reorg history` and `checksum-report` read through psycopg alone
    from sqlalchemy.engine import Connection

_TERMINAL_SQL = ", ".join(f"'{s}'" for s in sorted(JOB_TERMINAL))

SUBTASK_COLUMNS = (
    "id, job_id, step, ordinal, state, start_key, end_key, curr_key, exec_id, exec_expired, "
    "epoch, attempts, not_before, row_count, error, meta, created_at, updated_at, "
    "started_at, finished_at"
)


def subtasks_of_job(db: SqlDatabase, conn: SqlConnection,
                    job_id: int) -> list[dict[str, object]]:
    """Every subtask of a job, live and moved to history, in step and range
    order. One statement, so one snapshot: a move meanwhile can neither hide
    nor repeat a subtask. ``moved_at`` is None for a live one."""
    columns = ("id, job_id, step, ordinal, state, start_key, end_key, curr_key, exec_id, "
               "exec_expired, epoch, attempts, row_count, error, meta, started_at, finished_at")
    rows = conn.execute(
        db.sql(f"""
            SELECT {columns}, NULL::timestamptz AS moved_at
            FROM {{s}}.background_subtask WHERE job_id = :job_id
            UNION ALL
            SELECT {columns}, moved_at
            FROM {{s}}.background_subtask_history WHERE job_id = :job_id
            ORDER BY step, ordinal, id"""),
        {"job_id": job_id},
    ).mappings()
    return [dict(r) for r in rows]


def move_finished(
    db: Database, conn: Connection, term: OwnerTerm, job_id: int, limit: int,
    *, only_succeeded: bool = False,
) -> int:
    """Move up to ``limit`` finished subtasks of a job (``only_succeeded``: of
    a job still running, whose failed or cancelled subtasks must stay where
    the owner's step snapshot sees them); returns how many moved. The job's
    counters grow by what moved, in the same statement."""
    states = "('succeeded')" if only_succeeded else "('succeeded', 'failed', 'cancelled')"
    return int(conn.execute(
        db.sql(f"""
            WITH batch AS (
                SELECT id FROM {{s}}.background_subtask
                WHERE job_id = :job_id AND state IN {states}
                LIMIT :limit FOR UPDATE SKIP LOCKED),
            moved AS (
                DELETE FROM {{s}}.background_subtask st
                -- By primary key: a join with the batch may hash the whole table.
                WHERE st.id = ANY (ARRAY(SELECT id FROM batch)) AND {FENCE}
                RETURNING {", ".join("st." + c.strip() for c in SUBTASK_COLUMNS.split(","))}),
            kept AS (
                INSERT INTO {{s}}.background_subtask_history ({SUBTASK_COLUMNS})
                SELECT {SUBTASK_COLUMNS} FROM moved),
            forward AS (SELECT * FROM moved WHERE step <> {STEP_REVERT}),
            counted AS (
                UPDATE {{s}}.jobs j SET
                    -- The job's current step has counters of its own (its
                    -- percent in status); subtasks of an earlier step moved
                    -- after the job left it count only into the job's.
                    step_moved_succeeded = step_moved_succeeded
                        + (SELECT count(*) FROM forward
                           WHERE state = 'succeeded' AND step = j.step),
                    -- A fixed step keeps the rows of the step before it
                    -- (store.progress: the job's rows).
                    step_moved_rows = step_moved_rows
                        + (SELECT coalesce(sum(row_count), 0) FROM forward
                           WHERE step = j.step AND j.step_ranges),
                    moved_succeeded = moved_succeeded
                        + (SELECT count(*) FROM forward WHERE state = 'succeeded'),
                    moved_failed = moved_failed
                        + (SELECT count(*) FROM forward WHERE state = 'failed'),
                    moved_cancelled = moved_cancelled
                        + (SELECT count(*) FROM forward WHERE state = 'cancelled'),
                    moved_rows = moved_rows
                        + (SELECT coalesce(sum(row_count), 0) FROM forward),
                    -- Revert subtasks have counters of their own: status shows
                    -- them apart, never as forward work done twice.
                    revert_moved = revert_moved
                        + (SELECT count(*) FROM moved
                           WHERE step = {STEP_REVERT} AND state = 'succeeded')
                WHERE id = :job_id AND EXISTS (SELECT 1 FROM moved))
            SELECT count(*) FROM moved"""),
        {"job_id": job_id, "limit": limit, **term.params()},
    ).scalar_one())


def delete_older_than(
    db: Database, conn: Connection, term: OwnerTerm, days: float, limit: int
) -> int:
    """Delete history rows moved more than ``days`` ago, of finished jobs only:
    a job that has not ended may still be reverted, and its revert plan reads
    the ranges it must restore from these rows (DESIGN 13)."""
    return conn.execute(
        db.sql(f"""
            DELETE FROM {{s}}.background_subtask_history
            -- = ANY(ARRAY(...)): the ids as one value, probed through the primary
            -- key; ``IN (subquery)`` is planned as a semi-join over the whole table.
            WHERE id = ANY(ARRAY(SELECT h.id FROM {{s}}.background_subtask_history h
                         WHERE h.moved_at < clock_timestamp() - make_interval(secs => :secs)
                           AND NOT EXISTS (
                               SELECT 1 FROM {{s}}.jobs j
                               WHERE j.id = h.job_id AND j.state NOT IN ({_TERMINAL_SQL}))
                         ORDER BY h.moved_at LIMIT :limit))
              AND {FENCE}"""),
        {"secs": days * 86400, "limit": limit, **term.params()},
    ).rowcount


def list_finished(
    db: SqlDatabase, conn: SqlConnection, job_id: int | None, limit: int
) -> list[dict[str, object]]:
    """Newest finished subtasks, or all of one job in range order (both orders
    follow an index: history_job, history_moved_at)."""
    order = "step, ordinal" if job_id is not None else "moved_at DESC, id DESC"
    rows = conn.execute(
        db.sql(f"""
            SELECT id, job_id, step, ordinal, state, start_key, end_key, curr_key,
                   row_count, attempts, exec_id, error, started_at, finished_at, moved_at
            FROM {{s}}.background_subtask_history
            WHERE CAST(:job_id AS bigint) IS NULL OR job_id = :job_id
            ORDER BY {order} LIMIT :limit"""),
        {"job_id": job_id, "limit": limit},
    ).mappings()
    return [dict(r) for r in rows]


def jobs_awaiting_history(db: Database, conn: Connection, limit: int) -> list[int]:
    """Finished jobs whose subtasks may still sit in the live table (a partial
    index holds exactly these, however many jobs have finished)."""
    return list(conn.execute(
        db.sql("""
            SELECT id FROM {s}.jobs
            WHERE state IN ('succeeded', 'cancelled', 'reverted') AND NOT history_done
            ORDER BY id LIMIT :limit"""),
        {"limit": limit},
    ).scalars())


def mark_done(db: Database, conn: Connection, term: OwnerTerm, job_id: int) -> bool:
    """Note that a finished job has no live subtasks left."""
    return conn.execute(
        db.sql(f"""
            UPDATE {{s}}.jobs j SET history_done = true
            WHERE j.id = :job_id AND j.state IN ('succeeded', 'cancelled', 'reverted')
              AND NOT EXISTS (SELECT 1 FROM {{s}}.background_subtask st WHERE st.job_id = j.id)
              AND {FENCE}"""),
        {"job_id": job_id, **term.params()},
    ).rowcount == 1
