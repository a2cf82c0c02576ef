"""Job rows: submit, one compare-and-set per transition, reads.

A transition and its audit event are one statement, so the job events table
never disagrees with the jobs table. User transitions (cancel, pause, resume)
are plain compare-and-set; owner transitions are also fenced on the owner term.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from framework.db import Database
from framework.jobtype import Job
from framework.states import JOB_ACTIVE, JOB_TERMINAL, JobState, check_job_transition
from framework.store.owner_lease import FENCE, OwnerTerm

JOB_COLUMNS = (
    "id, type, state, step, params, target_table, key_column, batch_rows, "
    "max_rows_per_sec, row_estimate, concurrency"
)
_TERMINAL_SQL = ", ".join(f"'{s}'" for s in sorted(JOB_TERMINAL))


class ActiveJobExists(RuntimeError):
    def __init__(self, table: str, job_id: int) -> None:
        readable = table.replace('"', "")
        super().__init__(
            f"table {readable} already has active job {job_id}; wait for it, "
            f"or cancel it with `reorg cancel {job_id}`"
        )
        self.job_id = job_id


def insert(
    db: Database,
    conn: Connection,
    *,
    type: str,
    params: dict[str, Any],
    target_table: str,
    key_column: str,
    job_key: str | None,
    priority: int,
    concurrency: int,
    batch_rows: int,
    max_rows_per_sec: int | None,
) -> tuple[int, bool]:
    """Insert a queued job; returns (job id, created). A repeated ``job_key``
    returns the job it already named instead of creating another."""
    if job_key is not None:
        existing = conn.execute(
            db.sql("SELECT id FROM {s}.jobs WHERE job_key = :k"), {"k": job_key}
        ).scalar()
        if existing is not None:
            return existing, False
    active = active_on_table(db, conn, target_table)
    if active is not None:
        raise ActiveJobExists(target_table, active)
    try:
        with conn.begin_nested():
            job_id = conn.execute(
                db.sql("""
                    WITH job AS (
                        INSERT INTO {s}.jobs (job_key, type, params, target_table, key_column,
                                              priority, concurrency, batch_rows, max_rows_per_sec)
                        VALUES (:job_key, :type, CAST(:params AS jsonb), :target_table,
                                :key_column, :priority, :concurrency, :batch_rows, :max_rps)
                        RETURNING id),
                    event AS (
                        INSERT INTO {s}.job_events (job_id, actor, from_state, to_state, detail)
                        SELECT id, 'user', NULL, 'queued', 'submitted' FROM job)
                    SELECT id FROM job"""),
                {
                    "job_key": job_key, "type": type, "params": json.dumps(params),
                    "target_table": target_table, "key_column": key_column,
                    "priority": priority, "concurrency": concurrency,
                    "batch_rows": batch_rows, "max_rps": max_rows_per_sec,
                },
            ).scalar_one()
    except sa.exc.IntegrityError:
        # Lost a race with another submit: report whichever job won.
        if job_key is not None:
            won = conn.execute(
                db.sql("SELECT id FROM {s}.jobs WHERE job_key = :k"), {"k": job_key}
            ).scalar()
            if won is not None:
                return won, False
        active = active_on_table(db, conn, target_table)
        raise ActiveJobExists(target_table, active or 0) from None
    notify(db, conn)
    return job_id, True


def active_on_table(db: Database, conn: Connection, table: str) -> int | None:
    return conn.execute(
        db.sql(f"""SELECT id FROM {{s}}.jobs
                   WHERE target_table = :t AND state NOT IN ({_TERMINAL_SQL})"""),
        {"t": table},
    ).scalar()


def transition(
    db: Database,
    conn: Connection,
    job_id: int,
    src: JobState | Iterable[JobState],
    dst: JobState,
    *,
    actor: str,
    term: OwnerTerm | None = None,
    detail: str | None = None,
    error: str | None = None,
    revert_target: JobState | None = None,
    step: int | None = None,
    row_estimate: int | None = None,
    run_on_node: str | None = None,
) -> JobState | None:
    """Move a job from one of ``src`` to ``dst``; returns the state it left, or
    None when it was in none of them (or, for an owner, the term is over)."""
    sources = [src] if isinstance(src, JobState) else list(src)
    for s in sources:
        check_job_transition(s, dst)
    fence = FENCE if term is not None else "TRUE"
    left = conn.execute(
        db.sql(f"""
            WITH old AS (
                SELECT id, state FROM {{s}}.jobs
                WHERE id = :job_id AND state = ANY(:sources) FOR UPDATE),
            moved AS (
                UPDATE {{s}}.jobs j SET
                    state = :dst, updated_at = clock_timestamp(),
                    error = coalesce(:error, j.error),
                    revert_target = coalesce(:revert_target, j.revert_target),
                    step = coalesce(:step, j.step),
                    row_estimate = coalesce(:row_estimate, j.row_estimate),
                    run_on_node = CASE WHEN :dst = 'running' THEN :run_on_node
                                       ELSE j.run_on_node END,
                    started_at = CASE WHEN :dst = 'running'
                                      THEN coalesce(j.started_at, clock_timestamp())
                                      ELSE j.started_at END,
                    finished_at = CASE WHEN :dst IN ({_TERMINAL_SQL})
                                       THEN clock_timestamp() ELSE NULL END
                FROM old WHERE j.id = old.id AND {fence}
                RETURNING j.id, old.state AS from_state),
            event AS (
                INSERT INTO {{s}}.job_events (job_id, actor, from_state, to_state, detail)
                SELECT id, :actor, from_state, :dst, :detail FROM moved)
            SELECT from_state FROM moved"""),
        {
            "job_id": job_id, "sources": [str(s) for s in sources], "dst": str(dst),
            "actor": actor, "detail": detail, "error": error,
            "revert_target": str(revert_target) if revert_target else None,
            "step": step, "row_estimate": row_estimate, "run_on_node": run_on_node,
            **(term.params() if term else {}),
        },
    ).scalar()
    if left is None:
        return None
    notify(db, conn)
    return JobState(left)


def bind_to_node(
    db: Database, conn: Connection, term: OwnerTerm, job_id: int, node_id: str
) -> bool:
    """Move a local-mode job onto the current owner's node (a new owner takes
    over the small jobs its predecessor was running)."""
    return conn.execute(
        db.sql(f"""
            UPDATE {{s}}.jobs SET run_on_node = :node_id, updated_at = clock_timestamp()
            WHERE id = :job_id AND run_on_node IS DISTINCT FROM :node_id
              AND run_on_node IS NOT NULL AND {FENCE}"""),
        {"job_id": job_id, "node_id": node_id, **term.params()},
    ).rowcount == 1


def alter(
    db: Database, conn: Connection, job_id: int, *, batch_rows: int | None,
    max_rows_per_sec: int | None, concurrency: int | None,
) -> bool:
    """Change a live job's knobs; workers read them at their next batch."""
    return conn.execute(
        db.sql(f"""
            UPDATE {{s}}.jobs SET
                batch_rows = coalesce(:batch_rows, batch_rows),
                max_rows_per_sec = CASE WHEN :max_rps IS NULL THEN max_rows_per_sec
                                        WHEN :max_rps = 0 THEN NULL ELSE :max_rps END,
                concurrency = coalesce(:concurrency, concurrency),
                updated_at = clock_timestamp()
            WHERE id = :job_id AND state NOT IN ({_TERMINAL_SQL})"""),
        {"job_id": job_id, "batch_rows": batch_rows, "max_rps": max_rows_per_sec,
         "concurrency": concurrency},
    ).rowcount == 1


def get(db: Database, conn: Connection, job_id: int) -> Job | None:
    row = conn.execute(
        db.sql(f"SELECT {JOB_COLUMNS} FROM {{s}}.jobs WHERE id = :id"), {"id": job_id}
    ).mappings().first()
    return Job(**row) if row else None


def state(db: Database, conn: Connection, job_id: int) -> JobState | None:
    value = conn.execute(
        db.sql("SELECT state FROM {s}.jobs WHERE id = :id"), {"id": job_id}
    ).scalar()
    return JobState(value) if value else None


def live(db: Database, conn: Connection) -> list[dict[str, Any]]:
    """Jobs the owner still has work on, oldest first within each priority."""
    rows = conn.execute(
        db.sql(f"""
            SELECT {JOB_COLUMNS}, run_on_node, revert_target FROM {{s}}.jobs
            WHERE state NOT IN ({_TERMINAL_SQL}) ORDER BY priority DESC, id""")
    ).mappings()
    return [dict(r) for r in rows]


def events(db: Database, conn: Connection, job_id: int) -> list[dict[str, Any]]:
    rows = conn.execute(
        db.sql("""
            SELECT at, actor, from_state, to_state, detail FROM {s}.job_events
            WHERE job_id = :id ORDER BY id"""),
        {"id": job_id},
    ).mappings()
    return [dict(r) for r in rows]


def notify(db: Database, conn: Connection) -> None:
    """Wake idle workers and the owner; delivered when the transaction commits."""
    conn.execute(sa.text("SELECT pg_notify(:channel, '')"), {"channel": channel(db)})


def channel(db: Database) -> str:
    return f"reorg_{db.schema}"


__all__ = ["JOB_ACTIVE", "ActiveJobExists", "insert", "transition", "get", "live", "events"]
