"""Progress of jobs for ``reorg status``: one statement per call, so the job's
counters and its live subtasks are read in one snapshot, and a history move
(which moves rows and adds them to the counters in one statement) can neither
hide nor double-count a subtask's rows.

The work per call does not grow with the job: pending subtasks are counted as
the job's total less the others, and only live subtasks that are not pending
(those being worked on, and finished ones not yet moved) are read.

A job's rows (``rows_done`` of ``rows_total``), the one figure that status,
the dashboard, the owner's metrics, the success event and ``reorg wait`` show:
the rows of the job's current range step against that step's estimate (its
split, grown by catch-up ranges). A type of one step has one range step, so
these are simply its rows. In a fixed step (an index build), and once the job
has ended or reverts, they are those of the last range step it ran, as they
were when it left that step (``ROWS_OF_STEP_NOW`` is written into the job's
step counters then, by the transitions of ``store.jobs``); a range step that
completed has its rows exactly, so its estimate becomes them. ``rows_total``
is never below ``rows_done``: rows past a low estimate grow the total to what
is known, and the percent stays below 100 until the job succeeds.
``rows_processed`` is the work behind it: every forward batch's rows summed
over the steps (a row backfilled and then verified counts twice), the counter
rows/s is measured on.

Rows/s and ETA of a running job are over the last ``RATE_WINDOW_SECONDS``:
rows processed now less rows processed at the oldest progress sample inside
the window (``record_samples``: the owner keeps one every
``SAMPLE_EVERY_SECONDS``). With no sample yet (no owner, or the job just
started) they are the job's lifetime average.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from framework.db import Database, SqlConnection, SqlDatabase
from framework.records import FIXED_SUBTASK_UNITS, STEP_REVERT
from framework.states import JOB_TERMINAL

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

_TERMINAL_SQL = ", ".join(f"'{s}'" for s in sorted(JOB_TERMINAL))

RATE_WINDOW_SECONDS = 60.0
SAMPLE_EVERY_SECONDS = 5.0
# A sample younger than this gives a rate of too few batches to show.
_MIN_SAMPLE_AGE_SECONDS = 2.0

# The rows of the current step of job ``j`` (a row of {s}.jobs), now: those
# moved to history with it and those of its live subtasks, of any state (a
# pending one may have checkpointed rows before it was released). A fixed
# step has no rows of its own: it keeps those of the range step before it.
# The owner's step transitions keep this figure when the job leaves a step.
ROWS_OF_STEP_NOW = """(j.step_moved_rows + CASE WHEN j.step_ranges THEN (
    SELECT coalesce(sum(st.row_count), 0) FROM {s}.background_subtask st
    WHERE st.job_id = j.id AND st.step = j.step) ELSE 0 END)"""


def rows_of_step_now(db: Database, conn: Connection, job_id: int) -> int:
    """The job's rows as its current step holds them now (``ROWS_OF_STEP_NOW``):
    what the owner writes into the success event, in the transaction that
    keeps them as the job's rows."""
    return int(conn.execute(
        db.sql(f"SELECT {ROWS_OF_STEP_NOW} FROM {{s}}.jobs j WHERE j.id = :job_id"),
        {"job_id": job_id}).scalar_one())


def jobs_progress(
    db: SqlDatabase, conn: SqlConnection, job_id: int | None = None, limit: int = 20
) -> list[dict[str, Any]]:
    return _progress(db, conn, "(CAST(:job_id AS bigint) IS NULL OR id = :job_id)",
                     {"job_id": job_id, "limit": limit})


def live_jobs_progress(db: Database, conn: Connection, also: list[int],
                       limit: int = 1000) -> list[dict[str, Any]]:
    """Progress of every live job, and of the jobs ``also`` names (say, those
    that were live at the last call); the jobs are read as `jobs.live` reads them."""
    return _progress(db, conn, f"(state NOT IN ({_TERMINAL_SQL}) OR id = ANY(:also))",
                     {"also": also, "limit": limit})


def _progress(db: SqlDatabase, conn: SqlConnection, where: str,
              params: dict[str, Any]) -> list[dict[str, Any]]:
    rows = conn.execute(
        db.sql("""
            WITH picked AS (
                SELECT * FROM {s}.jobs
                WHERE """ + where + """
                ORDER BY id DESC LIMIT :limit),
            counts AS (
                -- Per picked job (LATERAL): each reads its own rows through the
                -- (job_id, state) index, never the whole table. Forward and
                -- revert subtasks are counted apart (``fwd``: not STEP_REVERT).
                SELECT p.id,
                       p.moved_rows + l.rows_done + q.rows_done AS rows_processed,
                       l.running, p.moved_succeeded + l.succeeded AS succeeded,
                       p.moved_failed + l.failed AS failed,
                       p.moved_cancelled + l.cancelled AS cancelled, l.nodes,
                       p.revert_moved + l.revert_succeeded AS revert_done,
                       l.revert_running,
                       -- The job's rows: its current step's (ROWS_OF_STEP_NOW).
                       p.step_moved_rows + l.step_rows + q.step_rows AS rows_done,
                       -- The current step's own progress (a type of several steps).
                       p.step_moved_succeeded + l.step_succeeded AS step_succeeded,
                       l.step_units_partial
                FROM picked p
                CROSS JOIN LATERAL (
                    SELECT coalesce(sum(row_count) FILTER (WHERE fwd), 0)::bigint AS rows_done,
                           count(*) FILTER (WHERE fwd AND state = 'running') AS running,
                           count(*) FILTER (WHERE fwd AND state = 'succeeded') AS succeeded,
                           count(*) FILTER (WHERE fwd AND state = 'failed') AS failed,
                           count(*) FILTER (WHERE fwd AND state = 'cancelled') AS cancelled,
                           count(*) FILTER (WHERE NOT fwd AND state = 'succeeded')
                               AS revert_succeeded,
                           count(*) FILTER (WHERE NOT fwd AND state = 'running')
                               AS revert_running,
                           coalesce(sum(row_count) FILTER (
                               WHERE fwd AND step = p.step AND p.step_ranges), 0)::bigint
                               AS step_rows,
                           count(*) FILTER (WHERE step = p.step AND state = 'succeeded')
                               AS step_succeeded,
                           -- A fixed step's units (numbers; range keys may be arrays).
                           coalesce(sum(CAST(curr_key AS numeric) - CAST(start_key AS numeric))
                               FILTER (WHERE step = p.step AND state <> 'succeeded'
                                       AND jsonb_typeof(curr_key) = 'number'), 0)::bigint
                               AS step_units_partial,
                           coalesce(array_remove(array_agg(DISTINCT exec_id) FILTER (
                               WHERE state = 'running' AND exec_expired > clock_timestamp()),
                               NULL), ARRAY[]::text[]) AS nodes
                    FROM (SELECT *, step <> """ + str(STEP_REVERT) + """ AS fwd
                          FROM {s}.background_subtask
                          WHERE job_id = p.id
                            AND state IN ('running', 'succeeded', 'failed', 'cancelled')) st
                    ) l
                CROSS JOIN LATERAL (
                    SELECT coalesce(sum(row_count), 0)::bigint AS rows_done,
                           coalesce(sum(row_count) FILTER (
                               WHERE step = p.step AND p.step_ranges), 0)::bigint AS step_rows
                    FROM {s}.background_subtask
                    WHERE job_id = p.id AND state = 'pending' AND row_count > 0
                      AND step <> """ + str(STEP_REVERT) + """) q)
            SELECT p.id, p.type, p.state, p.step, p.target_table, p.priority, p.concurrency,
                   p.batch_rows, p.max_rows_per_sec, p.error, p.params,
                   -- Who submitted it: the actor of its first event (jobs.insert).
                   (SELECT e.actor FROM {s}.job_events e WHERE e.job_id = p.id
                    ORDER BY e.id LIMIT 1) AS submitted_by,
                   c.rows_done, c.rows_processed,
                   -- Never below the rows done: a low estimate grows to them.
                   CASE WHEN p.row_estimate IS NOT NULL OR c.rows_done > 0
                        THEN greatest(p.row_estimate, c.rows_done) END AS rows_total,
                   p.created_at, p.started_at, p.finished_at, p.job_key, p.history_done,
                   p.max_replica_lag, p.max_active_sessions, p.on_failure, p.revert_target,
                   p.throttled,
                   extract(epoch FROM clock_timestamp() - p.throttled_at) AS throttled_age,
                   c.running, c.succeeded, c.failed, c.cancelled, c.nodes,
                   greatest(p.subtasks_total - c.running - c.succeeded - c.failed
                            - c.cancelled, 0) AS pending,
                   p.revert_total, c.revert_done, c.revert_running,
                   p.step_names, p.step_ranges, p.step_subtasks_total, p.schema_state,
                   c.step_succeeded, c.step_units_partial,
                   extract(epoch FROM coalesce(p.finished_at, clock_timestamp())
                                      - p.started_at) AS elapsed_seconds,
                   c.rows_processed - w.rows_done AS window_rows,
                   extract(epoch FROM clock_timestamp() - w.at) AS window_seconds
            FROM picked p JOIN counts c ON c.id = p.id
            LEFT JOIN LATERAL (
                SELECT at, rows_done FROM {s}.job_progress_sample
                WHERE job_id = p.id
                  AND at >= clock_timestamp() - make_interval(secs => :window)
                ORDER BY at LIMIT 1) w ON true
            ORDER BY p.id DESC"""),
        {**params, "window": RATE_WINDOW_SECONDS},
    ).mappings()
    return [with_rates(dict(r)) for r in rows]


def with_rates(job: dict[str, Any]) -> dict[str, Any]:
    """Add percent, rows/s and ETA. Percent is capped below 100 until the job
    succeeds, so rows written after the estimate never show as 'done early'.
    Rows/s is of ``rows_processed`` (the work of every step); the ETA is of
    the rows still to do of ``rows_total``."""
    done, total = job["rows_done"], job["rows_total"]
    processed = job["rows_processed"]
    elapsed = float(job["elapsed_seconds"] or 0.0)
    if job["state"] == "succeeded":
        percent = 100.0
    elif total:
        percent = min(99.9, 100.0 * done / total)
    else:
        percent = 0.0
    rate = processed / elapsed if elapsed > 0 and processed else 0.0
    window = float(job.pop("window_seconds", None) or 0.0)
    window_rows = job.pop("window_rows", None)
    if job["state"] == "running" and window >= _MIN_SAMPLE_AGE_SECONDS and window_rows is not None:
        rate = max(window_rows, 0) / window  # recent, not lifetime
    remaining = max((total or 0) - done, 0)
    eta = remaining / rate if rate > 0 and job["state"] == "running" else None
    # While a job reverts, its forward figures stay as they were when it
    # stopped; the revert's own progress is the share of its revert subtasks
    # done (``revert_percent``; None when the job has none).
    revert_total = job.get("revert_total") or 0
    job["revert_percent"] = (round(min(100.0, 100.0 * job["revert_done"] / revert_total), 1)
                             if revert_total else None)
    job.update(percent=round(percent, 1), rows_per_sec=round(rate, 1),
               eta_seconds=round(eta, 1) if eta is not None else None,
               elapsed_seconds=round(elapsed, 1))
    return with_step(job)


def with_step(job: dict[str, Any]) -> dict[str, Any]:
    """Add the step's name, its place among the type's steps and its own
    percent (``step_name``, ``step_count``, ``step_percent``). Of a type with
    several steps, the job's ``percent`` becomes the share of all its steps
    done, which never decreases from one step to the next (DESIGN 6); of a
    type of one step it stays the rows' percent. A range step's percent is
    that of the job's rows (they are the step's); a fixed step's is by its
    subtasks' own units (FIXED_SUBTASK_UNITS each), and it has no ETA."""
    names = list(job.pop("step_names", None) or [])
    step, state = job["step"], job["state"]
    succeeded = job.pop("step_succeeded", None) or 0
    partial = job.pop("step_units_partial", None) or 0
    subtasks = job.pop("step_subtasks_total", None) or 0
    ranges = job.pop("step_ranges", True)
    in_step = 1 <= step <= len(names)
    job["step_name"] = names[step - 1] if in_step else None
    job["step_count"] = len(names) or None
    if len(names) <= 1:
        job["step_percent"] = job["percent"] if in_step else None
        return job
    if state == "succeeded":
        job["step_percent"] = job["percent"] = 100.0
        return job
    if not in_step:  # queued, or reverting: the forward figures as they were
        job["step_percent"] = None
        return job
    if ranges:
        total = job["rows_total"] or 0
        fraction = min(job["rows_done"] / total, 0.999) if total else 0.0
    else:
        job["eta_seconds"] = None
        units = subtasks * FIXED_SUBTASK_UNITS
        fraction = min((succeeded * FIXED_SUBTASK_UNITS + partial) / units, 0.999) if units else 0.0
    job["step_percent"] = round(100.0 * fraction, 1)
    job["percent"] = round(min(99.9, 100.0 * (step - 1 + fraction) / len(names)), 1)
    return job


def record_samples(db: Database, conn: Connection, jobs: list[dict[str, Any]]) -> None:
    """Keep a progress sample of each running job in ``jobs`` (rows of
    ``live_jobs_progress``, read in this snapshot) unless it has one from the
    last ``SAMPLE_EVERY_SECONDS``; drop samples past twice the rate window.
    Samples are measurements, not job state: a deposed owner's sample is as
    true as its successor's, so no owner fence is needed. A sample's
    ``rows_done`` column holds the job's ``rows_processed``, which never
    decreases from one step to the next (its rows do)."""
    running = [j for j in jobs if j["state"] == "running"]
    conn.execute(
        db.sql("""
            DELETE FROM {s}.job_progress_sample
            WHERE at < clock_timestamp() - make_interval(secs => :keep)"""),
        {"keep": 2 * RATE_WINDOW_SECONDS},
    )
    if not running:
        return
    conn.execute(
        db.sql("""
            INSERT INTO {s}.job_progress_sample (job_id, at, rows_done)
            SELECT n.job_id, clock_timestamp(), n.rows_done
            FROM unnest(CAST(:ids AS bigint[]), CAST(:rows AS bigint[])) AS n(job_id, rows_done)
            WHERE NOT EXISTS (
                SELECT 1 FROM {s}.job_progress_sample o
                WHERE o.job_id = n.job_id
                  AND o.at > clock_timestamp() - make_interval(secs => :every))
            ON CONFLICT DO NOTHING"""),
        {"ids": [j["id"] for j in running], "rows": [j["rows_processed"] for j in running],
         "every": SAMPLE_EVERY_SECONDS},
    )
