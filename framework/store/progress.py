"""Progress of jobs for ``reorg status``: one statement per call, so the live
and history tables are read in one snapshot and a history move can neither
hide nor double-count a subtask's rows."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection

from framework.db import Database


def jobs_progress(
    db: Database, conn: Connection, job_id: int | None = None, limit: int = 20
) -> list[dict[str, Any]]:
    rows = conn.execute(
        db.sql("""
            WITH picked AS (
                SELECT * FROM {s}.jobs
                WHERE (CAST(:job_id AS bigint) IS NULL OR id = :job_id)
                ORDER BY id DESC LIMIT :limit),
            subtasks AS (
                SELECT job_id, state, row_count, exec_id, exec_expired
                FROM {s}.background_subtask WHERE job_id IN (SELECT id FROM picked)
                UNION ALL
                SELECT job_id, state, row_count, NULL, NULL
                FROM {s}.background_subtask_history WHERE job_id IN (SELECT id FROM picked)),
            agg AS (
                SELECT job_id,
                       coalesce(sum(row_count), 0)::bigint AS rows_done,
                       count(*) FILTER (WHERE state = 'pending') AS pending,
                       count(*) FILTER (WHERE state = 'running') AS running,
                       count(*) FILTER (WHERE state = 'succeeded') AS succeeded,
                       count(*) FILTER (WHERE state = 'failed') AS failed,
                       count(*) FILTER (WHERE state = 'cancelled') AS cancelled,
                       array_remove(array_agg(DISTINCT exec_id) FILTER (
                           WHERE state = 'running' AND exec_expired > clock_timestamp()),
                           NULL) AS nodes
                FROM subtasks GROUP BY job_id)
            SELECT p.id, p.type, p.state, p.step, p.target_table, p.priority, p.concurrency,
                   p.batch_rows, p.max_rows_per_sec, p.row_estimate AS rows_total, p.error,
                   p.created_at, p.started_at, p.finished_at, p.job_key,
                   coalesce(a.rows_done, 0) AS rows_done,
                   coalesce(a.pending, 0) AS pending, coalesce(a.running, 0) AS running,
                   coalesce(a.succeeded, 0) AS succeeded, coalesce(a.failed, 0) AS failed,
                   coalesce(a.cancelled, 0) AS cancelled,
                   coalesce(a.nodes, ARRAY[]::text[]) AS nodes,
                   extract(epoch FROM coalesce(p.finished_at, clock_timestamp())
                                      - p.started_at) AS elapsed_seconds
            FROM picked p LEFT JOIN agg a ON a.job_id = p.id
            ORDER BY p.id DESC"""),
        {"job_id": job_id, "limit": limit},
    ).mappings()
    return [with_rates(dict(r)) for r in rows]


def with_rates(job: dict[str, Any]) -> dict[str, Any]:
    """Add percent, rows/s and ETA. Percent is capped below 100 until the job
    succeeds, so rows written after the estimate never show as 'done early'."""
    done, total = job["rows_done"], job["rows_total"]
    elapsed = float(job["elapsed_seconds"] or 0.0)
    if job["state"] == "succeeded":
        percent = 100.0
    elif total:
        percent = min(99.9, 100.0 * done / total)
    else:
        percent = 0.0
    rate = done / elapsed if elapsed > 0 and done else 0.0
    remaining = max((total or 0) - done, 0)
    eta = remaining / rate if rate > 0 and job["state"] == "running" else None
    job.update(percent=round(percent, 1), rows_per_sec=round(rate, 1),
               eta_seconds=round(eta, 1) if eta is not None else None,
               elapsed_seconds=round(elapsed, 1))
    return job
