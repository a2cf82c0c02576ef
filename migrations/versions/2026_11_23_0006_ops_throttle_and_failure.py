"""Health throttles and "pause on failure" on jobs.

Why: ``--max-replica-lag`` and ``--max-active-sessions`` hold a job's batches
while the database is unhealthy; both are knobs of the job (changed live by
``reorg alter``) and live on its row like ``max_rows_per_sec``. ``throttled``
and ``throttled_at`` say what holds the job now, written by the worker that
waits (at most once per health interval), so ``reorg status`` can show it.
``on_failure`` picks what a subtask failing for good does: ``rollback`` (the
behaviour so far, the default) or ``pause`` (keep every finished range, wait
for ``reorg retry``). ``rate_due_at`` is the job's rate schedule: every
batch of a job with ``max_rows_per_sec`` books its rows there, so the limit
holds for the job as a whole, whatever the number of workers and slots.

Revision ID: 0006_ops
Revises: 0005_throughput
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import context, op

revision = "0006_ops"
down_revision = "0005_throughput"
branch_labels = None
depends_on = None


def _schema() -> str:
    return context.config.attributes["schema"]


def upgrade() -> None:
    s = _schema()
    op.add_column("jobs", sa.Column("max_replica_lag", sa.Float), schema=s)
    op.add_column("jobs", sa.Column("max_active_sessions", sa.Integer), schema=s)
    op.add_column("jobs", sa.Column("on_failure", sa.Text, nullable=False,
                                    server_default="rollback"), schema=s)
    op.create_check_constraint("jobs_on_failure", "jobs", "on_failure IN ('rollback', 'pause')",
                               schema=s)
    op.add_column("jobs", sa.Column("throttled", sa.Text), schema=s)
    op.add_column("jobs", sa.Column("throttled_at", sa.DateTime(timezone=True)), schema=s)
    op.add_column("jobs", sa.Column("rate_due_at", sa.DateTime(timezone=True)), schema=s)


def downgrade() -> None:
    s = _schema()
    for column in ("rate_due_at", "throttled_at", "throttled"):
        op.drop_column("jobs", column, schema=s)
    op.drop_constraint("jobs_on_failure", "jobs", schema=s)
    for column in ("on_failure", "max_active_sessions", "max_replica_lag"):
        op.drop_column("jobs", column, schema=s)
