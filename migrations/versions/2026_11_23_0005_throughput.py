"""A few recent progress samples per job, so ``reorg status`` shows rows/s and
ETA over the last minute instead of the job's lifetime average.

Why: a job that was throttled, paused or slowed by load for its first hour
kept showing that hour's rate forever. The owner already reads every live
job's progress once a tick; it now also keeps one sample a few seconds
(job, time, rows done) and drops samples older than a couple of minutes, so
the table holds a handful of rows per live job. ``status`` reads the oldest
sample inside its window through the primary key: no subtask is read for it.

Revision ID: 0005_throughput
Revises: 0003_rollback
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import context, op

revision = "0005_throughput"
down_revision = "0003_rollback"
branch_labels = None
depends_on = None


def _schema() -> str:
    return context.config.attributes["schema"]


def upgrade() -> None:
    op.create_table(
        "job_progress_sample",
        sa.Column("job_id", sa.BigInteger, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("rows_done", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("job_id", "at"),
        schema=_schema(),
    )


def downgrade() -> None:
    op.drop_table("job_progress_sample", schema=_schema())
