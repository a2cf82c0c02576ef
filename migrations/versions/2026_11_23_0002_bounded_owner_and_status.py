"""Indexes and per-job counters that bound the owner's and ``status``'s work
at any job size.

Why: with 100,000 subtasks in a job, the owner's per-tick statements and every
``reorg status`` scanned every subtask of it: failing exhausted subtasks
walked all pending rows, finding finished jobs whose subtasks still wait for
the history move walked the whole live table, and status summed all live and
history rows. ``subtask_exhausted`` lets the first read only rows past an
attempt count; ``jobs.history_done`` marks a finished job whose subtasks are
all in history. Succeeded subtasks now move to history while their job runs,
and the move adds them to the job's ``moved_*`` counters in the same
statement; with ``subtasks_total`` (added to by every range insert), status
reads the counters plus the few live rows that are not pending.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import context, op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TERMINAL = "state IN ('succeeded', 'cancelled', 'reverted')"
COUNTERS = ("subtasks_total", "moved_succeeded", "moved_failed", "moved_cancelled",
            "moved_rows")


def _schema() -> str:
    return context.config.attributes["schema"]


def upgrade() -> None:
    s = _schema()
    op.create_index(
        "subtask_exhausted", "background_subtask", ["job_id", "attempts"], schema=s,
        postgresql_where=sa.text("state IN ('pending', 'running')"),
    )
    op.add_column("jobs", sa.Column("history_done", sa.Boolean, nullable=False,
                                    server_default=sa.false()), schema=s)
    # Jobs finished before this revision whose subtasks were all moved already.
    op.execute(f"""
        UPDATE "{s}".jobs j SET history_done = true
        WHERE {TERMINAL} AND NOT EXISTS (
            SELECT 1 FROM "{s}".background_subtask st WHERE st.job_id = j.id)""")
    op.create_index("jobs_history_pending", "jobs", ["id"], schema=s,
                    postgresql_where=sa.text(f"{TERMINAL} AND NOT history_done"))
    for column in COUNTERS:
        op.add_column("jobs", sa.Column(column, sa.BigInteger, nullable=False,
                                        server_default="0"), schema=s)
    op.execute(f"""
        UPDATE "{s}".jobs j SET
            subtasks_total = (SELECT count(*) FROM "{s}".background_subtask WHERE job_id = j.id)
                           + h.total,
            moved_succeeded = h.succeeded, moved_failed = h.failed,
            moved_cancelled = h.cancelled, moved_rows = h.row_count
        FROM (SELECT j2.id,
                     count(st.id) AS total,
                     count(*) FILTER (WHERE st.state = 'succeeded') AS succeeded,
                     count(*) FILTER (WHERE st.state = 'failed') AS failed,
                     count(*) FILTER (WHERE st.state = 'cancelled') AS cancelled,
                     coalesce(sum(st.row_count), 0) AS row_count
              FROM "{s}".jobs j2
              LEFT JOIN "{s}".background_subtask_history st ON st.job_id = j2.id
              GROUP BY j2.id) h
        WHERE h.id = j.id""")
    # Rows done by pending subtasks (released part-way): found without reading
    # the job's other pending subtasks.
    op.create_index("subtask_progressed_pending", "background_subtask", ["job_id"], schema=s,
                    postgresql_where=sa.text("state = 'pending' AND row_count > 0"))


def downgrade() -> None:
    s = _schema()
    op.drop_index("subtask_progressed_pending", "background_subtask", schema=s)
    for column in COUNTERS:
        op.drop_column("jobs", column, schema=s)
    op.drop_index("jobs_history_pending", "jobs", schema=s)
    op.drop_column("jobs", "history_done", schema=s)
    op.drop_index("subtask_exhausted", "background_subtask", schema=s)
