"""Jobs of several forward steps: the step's name, its own progress counters,
and the schema state a job type reports.

Why: a job type may now declare several forward steps (backfill → verify →
build index → cut-over, docs/design.md "Job-type protocol"). ``reorg status``
shows the step by name with its own percent, without importing the job type
(status stays lazy), so the owner stores the declared step names on the job
row when it starts the job. The step's progress is read like the job's:
counters plus the few live rows. ``step_subtasks_total`` is set when the owner
inserts the step's subtasks; ``step_moved_succeeded`` / ``step_moved_rows``
grow when the history move takes subtasks of the job's current step, and all
three start again at 0 in the statement that moves the job to its next step.
``step_ranges`` says whether the current step is split into key ranges
(percent by rows) or a fixed set of subtasks (percent by their own units).
``schema_state`` is what the job type says the table's schema is in (TiDB's
"write-only", "write-reorg", "public"), shown by status.

Revision ID: 0007_steps
Revises: 0006_ops
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import postgresql

revision = "0007_steps"
down_revision = "0006_ops"
branch_labels = None
depends_on = None

COUNTERS = ("step_subtasks_total", "step_moved_succeeded", "step_moved_rows")


def _schema() -> str:
    return context.config.attributes["schema"]


def upgrade() -> None:
    s = _schema()
    op.add_column("jobs", sa.Column("step_names", postgresql.ARRAY(sa.Text), nullable=True),
                  schema=s)
    op.add_column("jobs", sa.Column("step_ranges", sa.Boolean, nullable=False,
                                    server_default=sa.true()), schema=s)
    op.add_column("jobs", sa.Column("schema_state", sa.Text, nullable=True), schema=s)
    for column in COUNTERS:
        op.add_column("jobs", sa.Column(column, sa.BigInteger, nullable=False,
                                        server_default="0"), schema=s)


def downgrade() -> None:
    s = _schema()
    for column in (*COUNTERS, "schema_state", "step_ranges", "step_names"):
        op.drop_column("jobs", column, schema=s)
