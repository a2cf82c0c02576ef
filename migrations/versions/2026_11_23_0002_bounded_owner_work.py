"""Indexes and a flag that bound the owner's work per tick at any job size.

Why: with 100,000 subtasks in a job, the owner's per-tick statements scanned
every subtask of it: failing exhausted subtasks walked all pending rows, and
finding finished jobs whose subtasks still wait for the history move walked
the whole live table. ``subtask_exhausted`` lets the first read only rows
past an attempt count; ``jobs.history_done`` marks a finished job whose
subtasks are all in history, so the owner looks only at the others.

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


def downgrade() -> None:
    s = _schema()
    op.drop_index("jobs_history_pending", "jobs", schema=s)
    op.drop_column("jobs", "history_done", schema=s)
    op.drop_index("subtask_exhausted", "background_subtask", schema=s)
