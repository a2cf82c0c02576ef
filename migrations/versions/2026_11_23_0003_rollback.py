"""Counters of a job's revert step, kept apart from its forward counters.

Why: rollback is now a step of range subtasks (DESIGN 13), stored in
``background_subtask`` like any other step (step ``-1``, ``framework.steps``).
``reorg status`` reads a job's forward progress from ``subtasks_total`` and
the ``moved_*`` counters; counting revert subtasks into those would show a
cancelled job's work twice. ``revert_total`` is how many revert subtasks the
owner inserted (in the statement that inserts them), ``revert_moved`` how
many of them the history move has taken (in the statement that moves them),
so revert progress is read as counters plus the few live revert rows.

Revision ID: 0003_rollback
Revises: 0002
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import context, op

revision = "0003_rollback"
down_revision = "0002"
branch_labels = None
depends_on = None

COUNTERS = ("revert_total", "revert_moved")


def _schema() -> str:
    return context.config.attributes["schema"]


def upgrade() -> None:
    s = _schema()
    for column in COUNTERS:
        op.add_column("jobs", sa.Column(column, sa.BigInteger, nullable=False,
                                        server_default="0"), schema=s)


def downgrade() -> None:
    s = _schema()
    for column in COUNTERS:
        op.drop_column("jobs", column, schema=s)
