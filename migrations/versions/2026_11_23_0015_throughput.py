"""Where a job step's claimable subtasks begin, kept by the owner so a claim
does not walk the finished ones.

Why: the claim takes a job step's candidates from one ordered scan of the
partial index ``subtask_claimable`` (state pending or running). A subtask that
finished leaves its old entries in that index (one per row version: pending,
running, each lease renewal) until vacuum removes them, and they all sit in
front of the first claimable ordinal. Autovacuum on a table churning thousands
of updates a second comes by rarely (once a minute at most, per database), so
every claim of a 100,000-subtask job walked tens of thousands of dead entries
(up to 12,800 buffers a claim at half way): the rate fell with the job's size
(issue 9). Now the owner writes, once a tick, the lowest ordinal of the step
that is pending or running (``claim_from``, for the step ``claim_from_step``),
and the claim scans from there. Subtasks only ever leave the claimable set
(except a retry of failed ones, which resets it), and new ranges come with
higher ordinals, so nothing claimable is below it; a stale value (another
step, or NULL) means "from the start".

Revision ID: 0015_throughput
Revises: 0010_keys
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import context, op

revision = "0015_throughput"
down_revision = "0010_keys"
branch_labels = None
depends_on = None


def _schema() -> str:
    return context.config.attributes["schema"]


def upgrade() -> None:
    s = _schema()
    op.add_column("jobs", sa.Column("claim_from_step", sa.Integer), schema=s)
    op.add_column("jobs", sa.Column("claim_from", sa.Integer), schema=s)


def downgrade() -> None:
    s = _schema()
    op.drop_column("jobs", "claim_from", schema=s)
    op.drop_column("jobs", "claim_from_step", schema=s)
