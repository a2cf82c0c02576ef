"""Moving finished subtasks to ``background_subtask_history``, and retention.

The move is one DELETE ... RETURNING feeding an INSERT, so a subtask is in
exactly one of the two tables whatever moment the owner dies at (DESIGN 10).
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from framework.db import Database
from framework.store.owner_lease import FENCE, OwnerTerm

SUBTASK_COLUMNS = (
    "id, job_id, step, ordinal, state, start_key, end_key, curr_key, exec_id, exec_expired, "
    "epoch, attempts, not_before, row_count, error, meta, created_at, updated_at, "
    "started_at, finished_at"
)


def subtasks_of_job(db: Database, conn: Connection, job_id: int) -> list[dict[str, object]]:
    """Every subtask of a job, live and moved to history, in step and range
    order. One statement, so one snapshot: a move meanwhile can neither hide
    nor repeat a subtask. ``moved_at`` is None for a live one."""
    columns = ("id, job_id, step, ordinal, state, start_key, end_key, curr_key, exec_id, "
               "exec_expired, epoch, attempts, row_count, error, started_at, finished_at")
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
    db: Database, conn: Connection, term: OwnerTerm, job_id: int, limit: int
) -> int:
    """Move up to ``limit`` finished subtasks of a job; returns how many moved."""
    return conn.execute(
        db.sql(f"""
            WITH batch AS (
                SELECT id FROM {{s}}.background_subtask
                WHERE job_id = :job_id AND state IN ('succeeded', 'failed', 'cancelled')
                ORDER BY id LIMIT :limit FOR UPDATE SKIP LOCKED),
            moved AS (
                DELETE FROM {{s}}.background_subtask st USING batch
                WHERE st.id = batch.id AND {FENCE}
                RETURNING {", ".join("st." + c.strip() for c in SUBTASK_COLUMNS.split(","))})
            INSERT INTO {{s}}.background_subtask_history ({SUBTASK_COLUMNS})
            SELECT {SUBTASK_COLUMNS} FROM moved"""),
        {"job_id": job_id, "limit": limit, **term.params()},
    ).rowcount


def delete_older_than(
    db: Database, conn: Connection, term: OwnerTerm, days: float, limit: int
) -> int:
    return conn.execute(
        db.sql(f"""
            DELETE FROM {{s}}.background_subtask_history
            WHERE id IN (SELECT id FROM {{s}}.background_subtask_history
                         WHERE moved_at < clock_timestamp() - make_interval(secs => :secs)
                         ORDER BY moved_at LIMIT :limit)
              AND {FENCE}"""),
        {"secs": days * 86400, "limit": limit, **term.params()},
    ).rowcount


def list_finished(
    db: Database, conn: Connection, job_id: int | None, limit: int
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


def finished_jobs_with_live_rows(db: Database, conn: Connection, limit: int) -> list[int]:
    """Finished jobs whose subtasks still sit in the live table."""
    return list(conn.execute(
        db.sql("""
            SELECT DISTINCT st.job_id FROM {s}.background_subtask st
            JOIN {s}.jobs j ON j.id = st.job_id
            WHERE j.state IN ('succeeded', 'cancelled', 'reverted')
            LIMIT :limit"""),
        {"limit": limit},
    ).scalars())
