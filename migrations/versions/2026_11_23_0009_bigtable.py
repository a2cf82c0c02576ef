"""The rest of a big split, waiting to be inserted a chunk per owner tick.

Why: a job of 100,000 ranges inserted them in one statement of about 1.3 s
inside one owner tick, stalling every other duty of the owner (issue 9: a tick
stays under 500 ms). The owner now inserts the first chunk of ranges with the
job's start and keeps the rest of the plan here, one row per job: the ranges
(``los[i]`` to ``his[i]``, with the meta every one of them gets, or one
each in ``metas``) and how many of them are inserted. Each later tick inserts the next chunk and moves
``inserted`` on in the same fenced transaction; a new owner carries on where
the old one stopped. While the row exists the step cannot end (DESIGN 7). The
revert step's ranges (DESIGN 13: one per range that made progress, up to one
per forward range) go in the same way.

Revision ID: 0009_bigtable
Revises: 0007_steps
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import postgresql

revision = "0009_bigtable"
down_revision = "0007_steps"
branch_labels = None
depends_on = None


def _schema() -> str:
    return context.config.attributes["schema"]


def upgrade() -> None:
    op.create_table(
        "job_split_pending",
        sa.Column("job_id", sa.BigInteger, primary_key=True),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("los", postgresql.ARRAY(sa.BigInteger), nullable=False),
        sa.Column("his", postgresql.ARRAY(sa.BigInteger), nullable=False),
        sa.Column("inserted", sa.Integer, nullable=False),
        sa.Column("meta", postgresql.JSONB, nullable=False),
        # A meta per range where they differ (revert ranges name their step).
        sa.Column("metas", postgresql.ARRAY(postgresql.JSONB), nullable=True),
        schema=_schema(),
    )


def downgrade() -> None:
    op.drop_table("job_split_pending", schema=_schema())
